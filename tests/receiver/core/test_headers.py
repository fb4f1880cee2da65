"""The stored-headers allowlist as a pure function (issue hole 5)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from receiver.core.errors import ConfigurationError
from receiver.core.headers import (
    DEFAULT_STORED_HEADERS,
    REDACTED_HEADERS,
    clean_headers,
    environ_headers,
    parse_header_names,
    stored_headers,
)


def test_only_allowed_names_are_kept_whatever_their_case() -> None:
    sent = [
        ("content-type", "application/json"),
        ("X-WEBHOOK-SIGNATURE-512", "ab" * 64),
        ("X-Shared-Secret", "s3cr3t"),
        ("Host", "shop.example"),
        ("Authorization", "Bearer t"),
    ]
    kept = json.loads(clean_headers(sent))
    assert kept == {"content-type": "application/json", "X-WEBHOOK-SIGNATURE-512": "ab" * 64}
    extended = json.loads(clean_headers(sent, stored_headers(["Host", " X-Shared-Secret "])))
    assert set(extended) == {"content-type", "X-WEBHOOK-SIGNATURE-512", "Host", "X-Shared-Secret"}


def test_credentials_are_never_kept_even_when_listed() -> None:
    keep = DEFAULT_STORED_HEADERS | REDACTED_HEADERS
    assert json.loads(clean_headers([("Cookie", "a"), ("Api-Key", "b")], keep)) == {}


def test_configured_names() -> None:
    assert parse_header_names(None) == ()
    assert parse_header_names(" X-Tenant, ,x-tenant,X-Region ") == ("x-tenant", "x-region")
    assert parse_header_names(["X-Tenant"]) == ("x-tenant",)
    for bad in ("Cookie", "x-api-key", "X Tenant", "X-Tenant:1", "é"):
        with pytest.raises(ConfigurationError):
            parse_header_names(bad)


_NAMES = st.sampled_from(
    [
        "Content-Type",
        "Content-Length",
        "X-Request-Id",
        "X-Webhook-Signature-512",
        "Traceparent",
        "X-Tenant",
        "X_Tenant",
        "Authorization",
        "Cookie",
        "X-Shared-Secret",
        "User-Agent",
    ]
)


@given(
    headers=st.dictionaries(
        _NAMES, st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=8), max_size=8
    ),
    extra=st.sets(st.sampled_from(["x-tenant", "x_tenant", "x-shared-secret"]), max_size=2),
)
def test_headers_read_from_the_environ_are_those_werkzeug_would_show(
    headers: dict[str, str], extra: set[str]
) -> None:
    """The receive path looks the kept headers up in the WSGI environ by name; what it
    stores is what filtering werkzeug's view of every header stores."""
    from werkzeug.datastructures import EnvironHeaders
    from werkzeug.test import EnvironBuilder

    environ = EnvironBuilder(method="POST", headers=headers).get_environ()
    keep = stored_headers(extra)
    assert clean_headers(environ_headers(environ, keep), keep) == clean_headers(
        EnvironHeaders(environ).items(), keep
    )
