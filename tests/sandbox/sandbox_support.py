"""Helpers and fixtures for the sandbox processor tests: real HTTP over loopback, real HMAC.

A uniquely named module (not ``conftest``) so tests can import the helpers by name.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from receiver.signature import Secret, verify
from reconcile.sandbox import SandboxServer

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


class _Quiet(WSGIRequestHandler):
    def log(self, type: str, message: str, *args: Any) -> None:
        pass


class WebhookSink:
    """A tiny local webhook receiver: records raw bodies and headers, answers ``status``.

    ``fail_first`` answers 500 to that many requests before answering 200.
    """

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.fail_first = 0
        self.status = 200
        self._cond = threading.Condition()
        self._server: BaseWSGIServer = make_server(
            "127.0.0.1", 0, self._app, threaded=True, request_handler=_Quiet
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}/webhooks"

    def _app(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        body = request.get_data()
        with self._cond:
            self.deliveries.append(Delivery(dict(request.headers), body, time.monotonic()))
            if self.fail_first > 0:
                self.fail_first -= 1
                status = 500
            else:
                status = self.status
            self._cond.notify_all()
        return Response("ok", status=status)(environ, start_response)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Delivery]:
        """Wait until at least ``count`` requests arrived; return all of them."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.deliveries) >= count, timeout)
            return list(self.deliveries)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


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


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    server = WebhookSink()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


@pytest.fixture
def start_sandbox() -> Iterator[Callable[..., SandboxServer]]:
    """Start sandbox servers (``api_key`` and fast retries by default); stopped afterwards."""
    servers: list[SandboxServer] = []

    def start(**options: Any) -> SandboxServer:
        options.setdefault("retry_schedule", FAST_RETRIES)
        options.setdefault("webhook_secret", SECRET)
        server = SandboxServer(options.pop("api_key", API_KEY), **options)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(start_sandbox: Callable[..., SandboxServer]) -> SandboxServer:
    """A sandbox without a webhook URL."""
    return start_sandbox()


@pytest.fixture
def hooked(start_sandbox: Callable[..., SandboxServer], sink: WebhookSink) -> SandboxServer:
    """A sandbox that delivers webhooks to ``sink``."""
    return start_sandbox(webhook_url=sink.url)


@pytest.fixture
def api(server: SandboxServer, session: requests.Session) -> Api:
    return Api(session, server.base_url)


@pytest.fixture
def hooked_api(hooked: SandboxServer, session: requests.Session) -> Api:
    return Api(session, hooked.base_url)
