"""Helpers for the sandbox processor tests: real HTTP over loopback, real HMAC."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
from flask import Flask, Response, request

from receiver.core.signature import Secret, verify

API_KEY = "snd_test_key_0123456789"
SECRET = "whsec_test_secret_abcdefghijklmnopqrstuvwxyz"
FAST_RETRIES = (0.05, 0.05, 0.05)
CARD_OK = "4242424242424242"


def card(number: str = CARD_OK, **extra: Any) -> dict[str, Any]:
    """A ``payment_method_data`` body for ``number``."""
    return {
        "card": {
            "card_number": number,
            "card_exp_month": "12",
            "card_exp_year": "2099",
            "card_cvc": "123",
            "card_holder_name": "Joseph Doe",
            **extra,
        }
    }


@dataclass(frozen=True)
class Delivery:
    """One webhook request as the sink received it."""

    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def signature(self) -> str | None:
        return self.headers.get("X-Webhook-Signature-512")

    def verified(self, secret: str = SECRET) -> bool:
        try:
            verify(self.body, self.signature, [Secret.of("test", secret)])
        except Exception:
            return False
        return True


class WebhookSink:
    """A tiny local webhook receiver: records raw bodies and headers, answers ``status``.

    ``fail_first`` answers 500 to that many requests before answering ``status``. Serve
    :attr:`app` (for example with :func:`tests.support.serve`) and set :attr:`url`.
    """

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.fail_first = 0
        self.status = 200
        self.url = ""
        self._cond = threading.Condition()
        self.app = Flask("sandbox_webhook_sink")
        self.app.add_url_rule("/webhooks", view_func=self._receive, methods=["POST"])

    def _receive(self) -> Response:
        body = request.get_data()
        with self._cond:
            self.deliveries.append(Delivery(dict(request.headers), body, time.monotonic()))
            if self.fail_first > 0:
                self.fail_first -= 1
                status = 500
            else:
                status = self.status
            self._cond.notify_all()
        return Response("ok", status=status)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Delivery]:
        """Wait until at least ``count`` requests arrived; return all of them."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.deliveries) >= count, timeout)
            return list(self.deliveries)


class Api:
    """A requests session bound to a sandbox's base URL and api key."""

    def __init__(self, session: requests.Session, base_url: str, key: str = API_KEY) -> None:
        self.session = session
        self.base_url = base_url
        self.key = key

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"api-key": self.key, **kwargs.pop("headers", {})}
        kwargs.setdefault("timeout", 5)
        return self.session.request(method, self.base_url + path, headers=headers, **kwargs)

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, json: Any = None, **kwargs: Any) -> requests.Response:
        return self.request("POST", path, json={} if json is None else json, **kwargs)

    def put(self, path: str, json: Any = None, **kwargs: Any) -> requests.Response:
        return self.request("PUT", path, json={} if json is None else json, **kwargs)

    def ok(self, method: str, path: str, json: Any = None, **kwargs: Any) -> Any:
        """The JSON of a request that must answer 200."""
        if json is not None:
            kwargs["json"] = json
        response = self.request(method, path, **kwargs)
        assert response.status_code == 200, response.text
        return response.json()

    def pay(self, number: str = CARD_OK, **body: Any) -> Any:
        """Create and confirm a payment with ``number``."""
        payload = {
            "amount": 1000,
            "currency": "USD",
            "confirm": True,
            "payment_method": "card",
            "payment_method_data": card(number),
            **body,
        }
        return self.ok("POST", "/payments", payload)


ADMIN_KEY = "admin_test_key_0123456789"
BASE_URL = "http://sandbox.test"
HOOK_URL = "http://shop.test/webhooks"


@dataclass(frozen=True)
class Sent:
    """One webhook request a :class:`RecordingSender` was given."""

    url: str
    body: bytes
    headers: dict[str, str]

    @property
    def signature(self) -> str | None:
        return self.headers.get("X-Webhook-Signature-512")

    def verified(self, secret: str = SECRET) -> bool:
        try:
            verify(self.body, self.signature, [Secret.of("test", secret)])
        except Exception:
            return False
        return True


class RecordingSender:
    """A ``send(url, body, headers) -> status`` for the clock-driven delivery mode.

    Answers the next value of :attr:`answers` (an ``int`` status, or an exception to raise
    as a transport failure), then :attr:`status`; records every request in :attr:`sent`.
    """

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.answers: list[int | Exception] = []
        self.status = 200

    def __call__(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        self.sent.append(Sent(url, body, dict(headers)))
        answer: int | Exception = self.answers.pop(0) if self.answers else self.status
        if isinstance(answer, Exception):
            raise answer
        return answer

    def event_types(self) -> list[str]:
        import json

        return [json.loads(s.body)["event_type"] for s in self.sent]
