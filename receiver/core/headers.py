"""Which request headers are stored with a delivery (pure: no I/O).

Only an allowlist is kept. The processor can be configured to send custom headers with every
webhook (Hyperswitch's ``outgoing_webhook_custom_http_headers``), typically a static shared
secret, and proxies add their own: none of that may reach the database, its logs or its
error messages. Everything not allowed is dropped before the row is built.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from receiver.core.errors import ConfigurationError

#: The request headers kept with a delivery by default (names, lower case): what the processor
#: sends to describe the body and sign it, and request-tracing ids. Every other header is
#: dropped before anything is written (before it is even a SQL parameter): the processor can
#: be configured to send custom headers (``outgoing_webhook_custom_http_headers``), typically a
#: static shared secret, and proxies add their own. ``HOOKLEDGER_STORED_HEADERS`` adds names.
DEFAULT_STORED_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "user-agent",
        "x-webhook-signature-512",
        "x-request-id",
        "x-correlation-id",
        "traceparent",
        "tracestate",
    }
)

#: Headers that carry credentials: never stored, whatever the configuration says.
REDACTED_HEADERS = frozenset(
    {"authorization", "cookie", "proxy-authorization", "api-key", "x-api-key", "set-cookie"}
)

#: ``json.dumps(..., ensure_ascii=False, sort_keys=True)`` without building an encoder per call.
_HEADERS_JSON = json.JSONEncoder(ensure_ascii=False, sort_keys=True).encode

_TOKEN = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


def clean_headers(
    headers: Iterable[tuple[str, str]], keep: frozenset[str] = DEFAULT_STORED_HEADERS
) -> str:
    """The headers kept with a delivery, as JSON: those named in ``keep`` (lower case), never
    a credential header (:data:`REDACTED_HEADERS`)."""
    kept = {k: v for k, v in headers if k.lower() in keep and k.lower() not in REDACTED_HEADERS}
    return _HEADERS_JSON(kept)


def environ_headers(
    environ: Mapping[str, Any], keep: frozenset[str] = DEFAULT_STORED_HEADERS
) -> list[tuple[str, str]]:
    """Those request headers of a WSGI ``environ`` that :func:`clean_headers` would keep,
    named as werkzeug names them (``X-Request-Id``): looked up by name, instead of
    iterating over every header of the request and every variable of the environ."""
    found = []
    for name, key in _environ_keys(keep):
        value = environ.get(key)
        if value is not None and (value or not key.startswith("CONTENT_")):
            found.append((name, value))
    return found


@functools.lru_cache(maxsize=16)
def _environ_keys(keep: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """``(werkzeug's name, WSGI environ key)`` of each header kept (never a credential)."""
    pairs = []
    for name in sorted(keep - REDACTED_HEADERS):
        if "_" in name:  # werkzeug names a header from its environ key, ``_`` as ``-``
            continue
        key = name.upper().replace("-", "_")
        pairs.append((name.title(), key if key in _CGI_HEADERS else f"HTTP_{key}"))
    return tuple(pairs)


#: The two headers WSGI passes without the ``HTTP_`` prefix (PEP 3333).
_CGI_HEADERS = frozenset({"CONTENT_TYPE", "CONTENT_LENGTH"})


def stored_headers(extra: Iterable[str] = ()) -> frozenset[str]:
    """The header names to store: :data:`DEFAULT_STORED_HEADERS` and ``extra`` (any case)."""
    return DEFAULT_STORED_HEADERS | {name.strip().lower() for name in extra}


def parse_header_names(spec: str | Iterable[str] | None) -> tuple[str, ...]:
    """Header names from configuration (``"X-Request-Tag, X-Tenant"`` or a list), lower case.

    Raises :class:`ConfigurationError` for a name that is not an HTTP header name, or that
    names a credential header (those are never stored).
    """
    if spec is None:
        return ()
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for raw in names:
        if not isinstance(raw, str):
            raise ConfigurationError("HOOKLEDGER_STORED_HEADERS must list header names")
        name = raw.strip().lower()
        if not name:
            continue
        if not _TOKEN.match(name):
            raise ConfigurationError(
                f"HOOKLEDGER_STORED_HEADERS: {name[:40]!r} is not an HTTP header name"
            )
        if name in REDACTED_HEADERS:
            raise ConfigurationError(
                f"HOOKLEDGER_STORED_HEADERS: {name!r} carries credentials and is never stored"
            )
        if name not in out:
            out.append(name)
    return tuple(out)
