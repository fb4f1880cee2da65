"""The API clients' transport: one authenticated, retrying JSON call with typed errors.

:class:`ApiClient` is the transport; :class:`~reconcile.client.processor.ProcessorClient` (a
merchant's secret key) and :class:`~reconcile.client.events_api.EventsClient` (the admin key,
events API) are built on it. What it does for every call:

* sends ``api-key``, ``Content-Type: application/json``, ``Accept: application/json`` and
  ``User-Agent: hookledger/<version>``; never follows redirects (a redirect to another host
  would carry the key along), they surface as :class:`~reconcile.core.errors.ApiError`;
* turns error answers into the typed errors of :mod:`reconcile.core.errors`;
* retries what may succeed later, up to ``RetryPolicy.max_attempts`` attempts in all:

  - 5xx, ``CE_01``, connection errors and timeouts: exponential backoff with *full* jitter,
    a delay drawn uniformly from ``[0, min(max_delay, base_delay * 2 ** (retry - 1))]``;
  - 429: waits until ``X-RateLimit-Reset`` (a Unix time, compared with the injected ``clock``),
    else ``Retry-After`` seconds, else the backoff above. A 429 counts as an attempt. When the
    required wait is longer than ``max_delay`` the client does not sleep at all and raises
    :class:`~reconcile.core.errors.RateLimited` at once, with ``reset_at`` for the caller to
    schedule around (sleeping less would only earn another 429);
  - never: 401/403/``AU_01``/``AU_02`` and the other 4xx.

  Reads (retrieve, list) are always safe to retry. A call that is not a read is sent with
  ``idempotent=False`` (only :meth:`EventsClient.retry_event
  <reconcile.client.events_api.EventsClient.retry_event>`): it is retried only when the server
  surely did not act on it: a 429, or a connection that was never made (refused, connect
  timeout); never after a 5xx or a read timeout.
* decodes the body with :func:`reconcile.core.jsondecode.loads`: valid JSON of any depth (a
  ``metadata`` nested 100,000 levels deep) or with huge integers decodes instead of raising
  ``RecursionError``; invalid UTF-8 is replaced (U+FFFD), lone surrogate escapes are kept;
* logs each attempt at DEBUG on the ``reconcile.client`` logger: method, path (without the
  query), status, attempt, elapsed time; never headers, the key or bodies. The key never
  appears in a log line, an error or a repr (it is redacted from anything the server echoes).

When a client is built, its base URL is checked against its environment: a sandbox client on a
production host (or the reverse), and a production key over plain HTTP to anything but the
local machine, raise :class:`~reconcile.core.errors.EnvironmentMismatch` (so every client has
these checks). :func:`path_segment` quotes an id as one URL path segment, or refuses it.
"""

from __future__ import annotations

import email.utils
import importlib.metadata
import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal, Self
from urllib.parse import quote, urlsplit

import requests
from urllib3.exceptions import NewConnectionError

from reconcile.core.errors import (
    ApiError,
    EnvironmentMismatch,
    ProcessorError,
    RateLimited,
    TransportError,
    api_error_from_response,
    id_defect,
    safe_excerpt,
)
from reconcile.core.jsondecode import loads as json_loads

__all__ = [
    "USER_AGENT",
    "ApiClient",
    "Environment",
    "RetryPolicy",
    "path_segment",
]

logger = logging.getLogger("reconcile.client")

Environment = Literal["sandbox", "production"]

#: Hosts known to serve one environment (Hyperswitch's own); other hosts are not checked.
_PRODUCTION_HOSTS: Final = frozenset({"api.hyperswitch.io"})
_LOOPBACK_HOSTS: Final = frozenset({"localhost", "127.0.0.1", "::1"})
#: Transport failures worth another attempt (a TLS failure is not).
_RETRYABLE_TRANSPORT: Final = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
)


def _version() -> str:
    try:
        return importlib.metadata.version("hookledger")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


USER_AGENT: Final = f"hookledger/{_version()}"


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long the client retries (see the module docstring for what).

    ``max_attempts`` counts every attempt, the first one included; ``base_delay`` is the backoff
    ceiling of the first retry, doubling per retry up to ``max_delay``, which also caps how long
    the client waits for a rate limit to reset.
    """

    max_attempts: int = 3
    base_delay: float = 0.5
    max_delay: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("delays must not be negative")

    def backoff_ceiling(self, retry: int) -> float:
        """The largest delay before retry number ``retry`` (1 for the first retry)."""
        exponent = min(retry - 1, 62)  # 2 ** 62 already exceeds any sane max_delay
        return min(self.max_delay, self.base_delay * 2.0**exponent)

    def backoff(self, retry: int, rng: random.Random) -> float:
        """A full-jitter delay before retry number ``retry``: uniform in ``[0, ceiling]``."""
        return rng.uniform(0.0, self.backoff_ceiling(retry))


def _nothing_sent(exc: requests.RequestException) -> bool:
    """Whether a failed call surely never reached the server (no connection was made)."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    if isinstance(exc, requests.ConnectionError) and exc.args:
        return isinstance(getattr(exc.args[0], "reason", None), NewConnectionError)
    return False


def path_segment(value: str, name: str) -> str:
    """``value`` URL-quoted as one path segment; ``ValueError`` unless it is a clean id.

    The message never quotes the value (it may be foreign text).
    """
    defect = id_defect(value)
    if defect is None and value.strip() in (".", ".."):
        defect = "is a dot segment"
    if defect is not None:
        raise ValueError(f"{name} must be a clean id: it {defect}")
    return quote(value, safe="")


def _host_environment(host: str) -> Environment | None:
    if host in _PRODUCTION_HOSTS:
        return "production"
    if any(label.startswith("sandbox") for label in host.split(".")):
        return "sandbox"
    return None


class ApiClient:
    """The transport common to the API clients: one authenticated, retrying JSON call.

    ``environment`` is resolved by the subclass (from the key, or given); the base URL is
    checked against it here. ``sleep``, ``clock`` (Unix time, for ``X-RateLimit-Reset``) and
    ``rng`` (the jitter) are injectable for tests. A ``session`` passed in is used but not
    closed by :meth:`close`.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        environment: Environment,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 - frozen, hence shareable
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        if environment not in ("sandbox", "production"):
            raise ValueError("environment must be 'sandbox' or 'production'")
        parts = urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an http(s) URL with a host")
        if parts.query or parts.fragment:
            raise ValueError("base_url must not have a query or fragment")
        host = parts.hostname.lower()
        host_environment = _host_environment(host)
        if host_environment is not None and host_environment != environment:
            raise EnvironmentMismatch(
                f"a {environment} client cannot use {host}, which serves {host_environment}"
            )
        if environment == "production" and parts.scheme != "https" and host not in _LOOPBACK_HOSTS:
            raise EnvironmentMismatch("a production key must only be sent over https")
        if connect_timeout <= 0 or read_timeout <= 0:
            raise ValueError("timeouts must be positive")

        self.base_url = base_url.strip().rstrip("/")
        self.environment: Environment = environment
        self.retry = retry
        self.timeout = (connect_timeout, read_timeout)
        self._api_key = api_key
        self._headers = {
            "api-key": api_key,
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        self._sleep = sleep
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the HTTP session (unless it was passed in)."""
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(base_url={self.base_url!r}, "
            f"environment={self.environment!r}, api_key={self._key_hint()!r})"
        )

    def _key_hint(self) -> str:
        """What a repr may show of the key: nothing but a mask."""
        return "***"

    # -- transport ----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Mapping[str, Any] | None = None,
        allow_text: bool = False,
        idempotent: bool = True,
    ) -> Any:
        """Send one API call with retries and return its decoded JSON body.

        ``path`` is relative to ``base_url`` and starts with ``/``. With ``allow_text`` a 2xx
        body that is not JSON is returned as text instead of raising :class:`ApiError`.
        ``idempotent=False`` marks a call that must not be repeated once the server may have
        acted on it: it is retried only after a 429 or when no connection was made.
        """
        if not path.startswith("/"):
            raise ValueError("path must start with '/'")
        url = self.base_url + path
        headers = self._headers
        if allow_text:  # /health answers text/plain
            headers = {**headers, "Accept": "application/json, text/plain;q=0.9"}
        policy = self.retry
        attempt = 0
        while True:
            attempt += 1
            started = time.perf_counter()
            try:
                response = self._session.request(
                    method,
                    url,
                    params=params,
                    json=json,
                    headers=headers,
                    timeout=self.timeout,
                    allow_redirects=False,
                )
            except requests.RequestException as exc:
                elapsed = time.perf_counter() - started
                logger.debug(
                    "%s %s failed: %s (attempt %d, %.1f ms)",
                    method,
                    path,
                    type(exc).__name__,
                    attempt,
                    elapsed * 1000,
                )
                error = TransportError(
                    f"{method} {path}: {type(exc).__name__}: "
                    f"{safe_excerpt(self._redact(str(exc)), 300)}"
                )
                retryable = isinstance(exc, _RETRYABLE_TRANSPORT) and not isinstance(
                    exc, requests.exceptions.SSLError
                )
                if not idempotent:
                    retryable = _nothing_sent(exc)
                if not retryable or attempt >= policy.max_attempts:
                    raise error from exc
                self._wait(policy.backoff(attempt, self._rng), method, path, attempt, error)
                continue

            with response:
                status = response.status_code
                content = response.content
                reply_headers = response.headers
            elapsed = time.perf_counter() - started
            logger.debug(
                "%s %s -> %d (attempt %d, %.1f ms)",
                method,
                path,
                status,
                attempt,
                elapsed * 1000,
            )
            if 200 <= status < 300:
                return self._decode(content, status, method, path, allow_text)

            reset_at = self._reset_at(reply_headers.get("X-RateLimit-Reset"))
            retry_after = self._retry_after(reply_headers.get("Retry-After"))
            api_error = api_error_from_response(
                status,
                content,
                method=method,
                path=path,
                redact=self._redact,
                reset_at=reset_at,
                retry_after=retry_after,
            )
            retryable = api_error.retryable and (idempotent or isinstance(api_error, RateLimited))
            if not retryable or attempt >= policy.max_attempts:
                raise api_error
            if isinstance(api_error, RateLimited):
                if reset_at is not None:
                    delay = max(0.0, reset_at - self._clock())
                elif retry_after is not None:
                    delay = retry_after
                else:
                    delay = policy.backoff(attempt, self._rng)
                if delay > policy.max_delay:
                    logger.info(
                        "%s %s rate limited; the reset is %.1f s away, over max_delay %.1f s",
                        method,
                        path,
                        delay,
                        policy.max_delay,
                    )
                    raise api_error
            else:
                delay = policy.backoff(attempt, self._rng)
            self._wait(delay, method, path, attempt, api_error)

    def _wait(
        self, delay: float, method: str, path: str, attempt: int, error: ProcessorError
    ) -> None:
        logger.info(
            "%s %s attempt %d failed (%s); retrying in %.2f s",
            method,
            path,
            attempt,
            type(error).__name__,
            delay,
        )
        self._sleep(delay)

    def _decode(self, content: bytes, status: int, method: str, path: str, allow_text: bool) -> Any:
        text = content.decode("utf-8", errors="replace")
        try:
            return json_loads(text)
        except ValueError:
            if allow_text:
                return self._redact(text)
            raise ApiError(
                f"the response is not JSON: {safe_excerpt(self._redact(text))!r}",
                status=status,
                method=method,
                path=path,
            ) from None

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[api-key]") if self._api_key in text else text

    def _reset_at(self, value: str | None) -> float | None:
        """``X-RateLimit-Reset`` as a Unix time (also accepts milliseconds or a delta)."""
        number = _number(value)
        if number is None:
            return None
        if number > 1e12:  # milliseconds since the epoch
            return number / 1000.0
        if number < 1e9:  # a count of seconds rather than a date (before 2001)
            return self._clock() + number
        return number

    def _retry_after(self, value: str | None) -> float | None:
        """``Retry-After`` in seconds (delta-seconds or an HTTP date)."""
        number = _number(value)
        if number is not None:
            return max(0.0, number)
        if not value:
            return None
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        return max(0.0, when.timestamp() - self._clock())


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None
