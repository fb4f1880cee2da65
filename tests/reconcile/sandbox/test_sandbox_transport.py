"""The in-process transport: requests served from a WSGI app with no socket, as over HTTP."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
import requests
from flask import Flask, Response, request

from reconcile.client.processor import ProcessorClient
from reconcile.sandbox import Sandbox, create_app, mount_wsgi, wsgi_sender
from tests.reconcile.sandbox.sandbox_support import API_KEY, BASE_URL, HOOK_URL, SECRET, Api, card


def test_the_processor_client_talks_to_the_app_in_process(sb: Sandbox) -> None:
    sb.seed_payments(3, sb.now())
    with requests.Session() as session:
        mount_wsgi(session, BASE_URL, create_app(sb))
        client = ProcessorClient(BASE_URL, API_KEY, session=session)
        payment = sb.create_payment(
            {"amount": 10, "currency": "USD", "confirm": True, "payment_method_data": card()}
        )
        fetched = client.get_payment(payment["payment_id"])
        assert fetched["payment_id"] == payment["payment_id"]


def test_status_headers_body_json_query_and_errors_as_over_http(inproc: Api) -> None:
    ok = inproc.get("/payments/list", params={"limit": "2", "created.gte": "2026-01-01T00:00:00Z"})
    assert ok.status_code == 200 and ok.reason == "OK"
    assert ok.headers["content-type"] == "application/json"
    assert int(ok.headers["X-RateLimit-Remaining"]) >= 0
    assert ok.json() == {"size": 0, "data": []} and ok.url.startswith(BASE_URL + "/payments/list?")
    assert ok.encoding == "utf-8" and json.loads(ok.content) == ok.json()
    unknown = inproc.get("/payments/list", params={"offset": "0"})
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "IR_04"
    assert inproc.get("/nope").status_code == 404
    unauthorised = inproc.session.get(BASE_URL + "/health", timeout=5)
    assert unauthorised.status_code == 401 and not unauthorised.ok
    with pytest.raises(requests.HTTPError):
        unauthorised.raise_for_status()
    bad_json = inproc.request("POST", "/payments", data=b"{nope", headers={"X": "1"})
    assert bad_json.status_code == 400
    assert list(inproc.get("/health").iter_content(4))  # a body that can be streamed again


def test_a_timeout_fault_times_the_request_out(sb: Sandbox, inproc: Api) -> None:
    sb.faults.once("timeout", seconds=0.5, path="/health")
    started = time.monotonic()
    with pytest.raises(requests.ReadTimeout):
        inproc.get("/health", timeout=0.1)
    assert time.monotonic() - started < 0.45
    assert inproc.get("/health", timeout=(1, 2)).status_code == 200


def test_an_app_that_crashes_is_a_dropped_connection() -> None:
    def broken(environ: object, start_response: object) -> list[bytes]:
        raise RuntimeError("boom")

    with requests.Session() as session:
        mount_wsgi(session, "http://broken.test", broken)
        with pytest.raises(requests.ConnectionError):
            session.get("http://broken.test/x", timeout=1)


def test_webhooks_go_into_a_flask_app_in_process() -> None:
    received: list[tuple[bytes, dict[str, str]]] = []
    app = Flask("receiver")

    @app.post("/webhooks")
    def hook() -> Response:
        received.append((request.get_data(), dict(request.headers)))
        return Response("ok", status=202 if len(received) > 1 else 500)

    sb = Sandbox(API_KEY, webhook_url=HOOK_URL, webhook_secret=SECRET, send=wsgi_sender(app))
    sb.create_payment(
        {"amount": 10, "currency": "USD", "confirm": True, "payment_method_data": card()}
    )
    (first,) = sb.deliver_due()
    assert first.status_code == 500
    later = sb.now() + timedelta(minutes=1)
    sb.set_clock(lambda: later)
    (second,) = sb.deliver_due()
    assert second.status_code == 202 and second.successful
    (event,) = sb.webhooks.events()
    assert [body for body, _ in received] == [event.body, event.body]
    headers = received[0][1]
    assert headers["X-Webhook-Signature-512"] == event.signature
    assert headers["User-Agent"] == "Hyperswitch-Backend-Server"
    assert headers["Content-Type"] == "application/json"
