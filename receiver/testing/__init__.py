"""The merchant test kit: sign bodies, build events of any type, post them, run handlers inline.

::

    from receiver.testing import WebhookTestClient

    def test_paid(app):
        hooks = WebhookTestClient(app)
        response = hooks.send("payment_succeeded", object_id="pay_1", metadata={"order_id": "o1"})
        assert response.status_code == 200
        hooks.drain()                       # run the handlers inline
        assert Order.get("o1").status == "paid"

A pytest fixture, ``webhook_client``, is installed with the package (it needs an ``app``
fixture in your tests, as pytest-flask does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Flask
from werkzeug.test import TestResponse

from receiver.core.signature import SIGNATURE_HEADER, Secret, sign
from receiver.extension import WebhookReceiver
from receiver.testing.factories import build_event, encode, format_timestamp, new_event_id

__all__ = [
    "SIGNATURE_HEADER",
    "WebhookTestClient",
    "build_event",
    "encode",
    "format_timestamp",
    "new_event_id",
    "sign",
    "signed_headers",
]


def signed_headers(body: bytes, secret: str | bytes | Secret) -> dict[str, str]:
    """Headers the processor sends with ``body``: the signature and the JSON content type."""
    return {
        SIGNATURE_HEADER: sign(body, secret),
        "Content-Type": "application/json",
        "User-Agent": "Hyperswitch-Backend-Server",
    }


class WebhookTestClient:
    """Posts signed events to ``app`` through Flask's test client and runs handlers inline."""

    def __init__(
        self,
        app: Flask,
        *,
        secret: str | bytes | Secret | None = None,
        account: str | None = None,
    ) -> None:
        """``account``: post to that account's URL, signed with its first secret (default:
        the shared URL, signed with the first configured account's first secret)."""
        self.app = app
        state = WebhookReceiver.state(app)
        if secret is None:
            chosen = state.account(account) if account is not None else state.settings.accounts[0]
            if not chosen.secrets:
                raise ValueError(f"account {chosen.id!r} has no secret: pass secret=")
            secret = chosen.secrets[0]
        self.secret: str | bytes | Secret = secret
        self.account = account
        self.url = state.settings.url_prefix.rstrip("/") + "/"
        if account is not None:
            self.url += account + "/"
        self.client = app.test_client()

    def __repr__(self) -> str:
        return f"WebhookTestClient(url={self.url!r})"

    def post(
        self,
        body: bytes | Mapping[str, Any],
        *,
        sign_with: str | bytes | Secret | None = None,
        signature: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> TestResponse:
        """Post raw bytes (or a dict, encoded like the processor does), signed by default."""
        raw = body if isinstance(body, bytes) else encode(body)
        sent = signed_headers(raw, sign_with if sign_with is not None else self.secret)
        if signature is not None:
            sent[SIGNATURE_HEADER] = signature
        sent.update(headers or {})
        return self.client.post(self.url, data=raw, headers=sent)

    def send(self, event_type: str, **fields: Any) -> TestResponse:
        """Build a realistic event of ``event_type`` (see :func:`build_event`) and post it."""
        return self.post(build_event(event_type, **fields))

    def drain(self) -> int:
        """Run every due event's handlers inline; return how many events were processed."""
        return WebhookReceiver.state(self.app).worker(name="test-kit").drain()
