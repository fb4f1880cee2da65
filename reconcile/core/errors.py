"""Errors of the processor API client and the reconciler.

Everything here derives from :class:`ProcessorError`, itself a
:class:`~receiver.core.errors.HookledgerError`, so callers can catch the whole sub-tree at once::

    HookledgerError
    └── ProcessorError
        ├── ApiError                   the processor answered with an error body / status
        │   ├── AuthenticationError    401, 403, AU_01, AU_02 (never retried)
        │   ├── NotFound               404, IR_05
        │   ├── InvalidRequest         any other 4xx (IR_*, HE_*, ...)
        │   ├── RateLimited            429, RL_01 (retryable, carries ``reset_at``)
        │   └── ServerError            5xx, CE_01 (retryable)
        ├── TransportError             connection refused, timeout, broken response (retryable)
        ├── PagingError                a list window that cannot be paged through
        ├── EnvironmentMismatch        key prefix vs configured environment / base URL
        └── InvalidApiKey              not a usable secret key (publishable, admin, malformed)

``EnvironmentMismatch`` and ``InvalidApiKey`` are also
:class:`~receiver.core.errors.ConfigurationError`\\ s.

Texts and reprs never contain the API key: the client redacts it from anything the processor
sends back before building an error, and bodies are only ever quoted as a short, cleaned excerpt.
Remote ids (foreign text) never appear raw in a message: :func:`escape_id` renders one printable
and bounded, for reports.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

from receiver.core.errors import ConfigurationError, HookledgerError
from receiver.core.events import json_type
from reconcile.core.jsondecode import loads as json_loads

__all__ = [
    "AdoptionInProgress",
    "ApiError",
    "AuthenticationError",
    "EnvironmentMismatch",
    "InvalidApiKey",
    "InvalidRequest",
    "NotAdopted",
    "NotFound",
    "PagingError",
    "ProcessorError",
    "RateLimited",
    "RequestBudgetExhausted",
    "ServerError",
    "TransportError",
    "api_error_from_response",
    "escape_id",
    "id_defect",
    "json_type",
    "safe_excerpt",
]

#: Longest excerpt of a foreign text (error message, HTML page) kept in an exception.
EXCERPT_LIMIT = 200
#: Default longest rendering of a foreign id by :func:`escape_id`.
ID_LIMIT = 80
#: Longest id :func:`id_defect` accepts (Hyperswitch's own ids are at most 64 characters).
MAX_ID_LENGTH = 255


class ProcessorError(HookledgerError):
    """The payment processor API could not be used."""

    #: Whether the client may retry the request that raised this error.
    retryable: ClassVar[bool] = False


class ApiError(ProcessorError):
    """The processor answered with an error.

    ``status`` is the HTTP status; ``type``, ``code`` and ``message`` come from the
    ``{"error": {"type", "code", "message"}}`` body (``type``/``code`` are ``None`` when the body
    is not such a document, for example an HTML page from a proxy; ``message`` is then a short,
    cleaned excerpt of it). ``str(exc)`` adds the status, code and request line; ``exc.message``
    is the processor's own message only.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        status: int | None = None,
        type: str | None = None,
        code: str | None = None,
        method: str | None = None,
        path: str | None = None,
    ) -> None:
        self.status = status
        self.type = type
        self.code = code
        self.method = method
        self.path = path
        self._api_message = message if message is not None else (self.__doc__ or "").strip()
        super().__init__(self._describe())

    @property
    def message(self) -> str:
        """The processor's error message (or a cleaned excerpt of a non-JSON body)."""
        return self._api_message

    def _describe(self) -> str:
        head = []
        if self.status is not None:
            head.append(f"HTTP {self.status}")
        if self.code:
            head.append(self.code)
        if self.type:
            head.append(f"({self.type})")
        text = " ".join(head)
        text = f"{text}: {self._api_message}" if text else self._api_message
        if self.method and self.path:
            text = f"{text} [{self.method} {self.path}]"
        return text

    def __str__(self) -> str:
        return self._describe()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, "
            f"type={self.type!r}, message={self._api_message!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only attributes survive pickling (multiprocessing, logging handlers).
        return (_rebuild, (type(self), dict(self.__dict__)))


def _rebuild(cls: type[ApiError], state: dict[str, Any]) -> ApiError:
    exc = cls.__new__(cls)
    exc.__dict__.update(state)
    exc.args = (exc._describe(),)
    return exc


class AuthenticationError(ApiError):
    """The API key was refused (invalid, revoked or without permission); never retried."""


class NotFound(ApiError):
    """The requested object does not exist."""


class InvalidRequest(ApiError):
    """The processor rejected the request as invalid."""


class RateLimited(ApiError):
    """The processor's rate limit was exceeded.

    ``reset_at`` is the Unix time at which the limit resets (from ``X-RateLimit-Reset``) and
    ``retry_after`` the seconds from ``Retry-After``, when the response carried them.
    """

    retryable: ClassVar[bool] = True

    def __init__(
        self,
        message: str | None = None,
        *,
        reset_at: float | None = None,
        retry_after: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.reset_at = reset_at
        self.retry_after = retry_after
        super().__init__(message, **kwargs)

    def _describe(self) -> str:
        text = super()._describe()
        if self.reset_at is not None:
            try:
                when = datetime.fromtimestamp(self.reset_at, UTC).isoformat(timespec="seconds")
            except (OverflowError, OSError, ValueError):
                when = f"unix time {self.reset_at:.0f}"
            text = f"{text} (limit resets at {when})"
        return text


class ServerError(ApiError):
    """The processor failed (5xx, or its upstream connector is unavailable); retryable."""

    retryable: ClassVar[bool] = True


class TransportError(ProcessorError):
    """The processor could not be reached or its answer could not be read; retryable."""

    retryable: ClassVar[bool] = True


class PagingError(ProcessorError):
    """A list window cannot be paged through completely.

    ``start``/``end`` bound the part of the window that could not be read and ``reason`` says
    why (typically: more objects share one timestamp than a page holds).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        reason: str | None = None,
    ) -> None:
        self.start = start
        self.end = end
        self.reason = reason
        super().__init__(message)


class RequestBudgetExhausted(PagingError):
    """A list iterator spent its request budget before the end of its window.

    Raised by a pager with ``on_stuck="raise"`` (the default of the client's ``iter_*``
    methods) instead of paging on: a server whose pages always look like progress would
    otherwise be paged for as long as it answers. ``kind`` names the list (``"refunds"``),
    ``requests``/``max_requests`` the calls made and the budget, ``start``/``end`` the part of
    the window not read, ``cursor`` where paging stood (an offset, an upper time bound, a
    slice). The message says how to raise the budget (``max_requests=`` per call,
    ``max_list_requests=`` on the client).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        kind: str | None = None,
        requests: int | None = None,
        max_requests: int | None = None,
        cursor: str | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        reason: str | None = None,
    ) -> None:
        self.kind = kind
        self.requests = requests
        self.max_requests = max_requests
        self.cursor = cursor
        super().__init__(message, start=start, end=end, reason=reason)


class EnvironmentMismatch(ProcessorError, ConfigurationError):
    """The API key, the configured environment and the base URL do not agree."""


class InvalidApiKey(ProcessorError, ConfigurationError):
    """The API key is not a usable secret key (``snd_...`` sandbox, ``prd_...`` production)."""


# --------------------------------------------------------------------------------------------
# Turning an error response into a typed exception
# --------------------------------------------------------------------------------------------

_DROP_BLOCKS = re.compile(r"<(script|style)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_TAGS = re.compile(r"<[^>]*>")
_SPACE = re.compile(r"\s+")


def safe_excerpt(text: str, limit: int = EXCERPT_LIMIT) -> str:
    """A short, printable, single-line excerpt of foreign text (HTML tags and scripts removed)."""
    if "<" in text and ">" in text:
        text = _TAGS.sub(" ", _DROP_BLOCKS.sub(" ", text))
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = _SPACE.sub(" ", text).strip()
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def escape_id(value: object, limit: int = ID_LIMIT) -> str:
    """A printable, bounded rendering of a foreign id (or any JSON scalar), for reports.

    Printable characters are kept, ``\\`` is doubled, and NUL, control characters, lone
    surrogates and every other non-printable character are escaped (``\\x00``, ``\\x1b``,
    ``\\ud800``, ``\\u200b``, ``\\U000e0001``), so the result is one line that always encodes to
    UTF-8 and cannot be confused with another id. A rendering longer than ``limit`` characters
    is cut (never inside an escape) and ends with ``…``. ``None``, booleans, numbers are shown
    as Python literals (a huge integer by its size only); other values (objects, arrays) only by
    their type name, as ``<dict>``: their content is never rendered (it may be deep or huge).
    """
    if limit < 2:
        raise ValueError("limit must be at least 2")
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, bool | float):
        text = repr(value)
    elif isinstance(value, int):
        # str() of an int over 4300 digits raises; the size says enough about such an "id".
        text = str(value) if value.bit_length() <= 256 else f"<int of {value.bit_length()} bits>"
    else:
        text = f"<{type(value).__name__}>"
    pieces: list[str] = []
    size = 0
    for ch in text:
        if ch == "\\":
            piece = "\\\\"
        elif ch.isprintable():
            piece = ch
        else:
            code = ord(ch)
            if code < 0x100:
                piece = f"\\x{code:02x}"
            elif code < 0x10000:
                piece = f"\\u{code:04x}"
            else:
                piece = f"\\U{code:08x}"
        pieces.append(piece)
        size += len(piece)
        if size > limit:  # no need to look at the rest of a long text
            break
    if size <= limit:
        return "".join(pieces)
    kept: list[str] = []
    size = 0
    for piece in pieces:
        if size + len(piece) > limit - 1:
            break
        kept.append(piece)
        size += len(piece)
    return "".join(kept) + "…"


def id_defect(value: object) -> str | None:
    """Why ``value`` is not a clean id, or ``None`` when it is one.

    A clean id is a string of 1 to :data:`MAX_ID_LENGTH` printable characters, not all blank:
    no NUL, control character, lone surrogate or other non-printable character. The answer
    (``"contains NUL"``, ``"is a number, not a string"``, ...) never quotes the value.
    """
    if not isinstance(value, str):
        return f"is {json_type(value)}, not a string"
    if not value:
        return "is empty"
    if len(value) > MAX_ID_LENGTH:
        return f"is longer than {MAX_ID_LENGTH} characters"
    if value.isprintable():
        return None if value.strip() else "is blank"
    for ch in value:
        if ch == "\x00":
            return "contains NUL"
        if "\ud800" <= ch <= "\udfff":
            return "contains a lone surrogate"
        if ch < " " or "\x7f" <= ch <= "\x9f":
            return "contains a control character"
    return "contains a non-printable character"


def _field(error: dict[str, Any], name: str, redact: Callable[[str], str]) -> str | None:
    value = error.get(name)
    if value is None:
        return None
    return safe_excerpt(redact(str(value)), 500) or None


def api_error_from_response(
    status: int,
    body: bytes,
    *,
    method: str | None = None,
    path: str | None = None,
    redact: Callable[[str], str] = lambda text: text,
    reset_at: float | None = None,
    retry_after: float | None = None,
) -> ApiError:
    """Build the typed :class:`ApiError` for an error response.

    The class is chosen from the error code, the error type and the HTTP status, in this order
    of precedence: authentication (401/403/``AU_*``), rate limit (429/``RL_01``), not found
    (404/``IR_05``), server (5xx/``CE_01``), invalid request (other 4xx), else :class:`ApiError`.
    ``redact`` is applied to every text taken from the body (the client removes its key).
    """
    err_type: str | None = None
    code: str | None = None
    message: str | None = None
    text = body.decode("utf-8", errors="replace")
    try:
        # The safe decoder: an error body nested 100,000 deep must not raise RecursionError.
        document: Any = json_loads(text) if text.strip() else None
    except ValueError:
        document = None
    if isinstance(document, dict):
        error = document.get("error")
        if isinstance(error, dict):
            err_type = _field(error, "type", redact)
            code = _field(error, "code", redact)
            message = _field(error, "message", redact)
        elif isinstance(document.get("message"), str):
            message = _field(document, "message", redact)
    if message is None:
        message = safe_excerpt(redact(text)) or f"HTTP {status} without a body"

    cls: type[ApiError]
    upper_code = (code or "").upper()
    if status in (401, 403) or upper_code.startswith("AU_") or err_type == "authentication_error":
        cls = AuthenticationError
    elif status == 429 or upper_code == "RL_01" or err_type == "rate_limit_error":
        return RateLimited(
            message,
            status=status,
            type=err_type,
            code=code,
            method=method,
            path=path,
            reset_at=reset_at,
            retry_after=retry_after,
        )
    elif status == 404 or upper_code == "IR_05":
        cls = NotFound
    elif status >= 500 or upper_code == "CE_01" or err_type == "connector_error":
        cls = ServerError
    elif 400 <= status < 500:
        cls = InvalidRequest
    else:
        cls = ApiError
    return cls(message, status=status, type=err_type, code=code, method=method, path=path)


class ReconcileError(HookledgerError):
    """Reconciliation failed."""


class ReconcileLocked(ReconcileError):
    """Another reconcile run is in progress."""


class NotAdopted(ReconcileError):
    """This database has no adoption record: run `reconcile adopt` (an account with history)
    or `reconcile adopt --new-account` (an account with nothing before hookledger)."""


class AdoptionInProgress(ReconcileError):
    """An adoption has begun but not finished: run `reconcile adopt` again to finish it."""
