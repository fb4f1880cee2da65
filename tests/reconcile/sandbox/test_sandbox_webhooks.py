"""Sandbox processor: signed webhooks, retries, dedupe and fault injection."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import requests

from receiver.core.signature import sign
from receiver.core.status import event_type_for_status
from reconcile.sandbox import (
    ApiFaultConfig,
    Sandbox,
    SandboxServer,
    WebhookFaultConfig,
    parse_retry_schedule,
)
from reconcile.sandbox.webhooks import HYPERSWITCH_RETRY_SCHEDULE, encode_body, new_event_id
from tests.reconcile.sandbox.sandbox_support import SECRET, Api, Delivery, WebhookSink, card

EVENT_ID = re.compile(r"evt_[0-9a-f]{32}")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def events_of(deliveries: list[Delivery]) -> list[dict[str, Any]]:
    return [json.loads(d.body) for d in deliveries]


# -- body, headers, signature ---------------------------------------------------------------


def test_webhook_bytes_headers_and_signature(
    hooked: SandboxServer, hooked_api: Api, sink: WebhookSink
) -> None:
    payment = hooked_api.pay(description="café ☕")
    assert hooked.sandbox.flush_webhooks(5)
    (delivery,) = sink.wait_for(1)
    assert delivery.verified()
    assert delivery.signature == sign(delivery.body, SECRET)
    assert delivery.headers["Content-Type"] == "application/json"
    assert delivery.headers["User-Agent"] == "Hyperswitch-Backend-Server"
    event = json.loads(delivery.body)
    assert list(event) == ["merchant_id", "event_id", "event_type", "content", "timestamp"]
    assert list(event["content"]) == ["type", "object"]
    # Compact, UTF-8 (not \\u escapes), exactly what json.dumps gives with those settings.
    assert b", " not in delivery.body and "café ☕".encode() in delivery.body
    assert delivery.body == json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
    assert event["merchant_id"] == "merchant_sandbox"
    assert EVENT_ID.fullmatch(event["event_id"]) and TIMESTAMP.fullmatch(event["timestamp"])
    assert event["event_type"] == "payment_succeeded"
    assert event["content"]["type"] == "payment_details"
    assert event["content"]["object"] == hooked_api.ok("GET", f"/payments/{payment['payment_id']}")


def test_event_ids_are_time_ordered() -> None:
    ids = [new_event_id() for _ in range(2000)]
    assert ids == sorted(ids) and len(set(ids)) == 2000
    assert all(EVENT_ID.fullmatch(i) and i[16] == "7" for i in ids)  # UUID version 7


def test_encode_body_matches_hyperswitch_format() -> None:
    when = datetime(2026, 8, 12, 8, 14, 55, 392_999, tzinfo=UTC)
    body = encode_body(
        merchant_id="m",
        event_id="evt_1",
        event_type="refund_succeeded",
        kind="refund",
        obj={"refund_id": "r", "amount": 1},
        when=when,
    )
    assert body == (
        b'{"merchant_id":"m","event_id":"evt_1","event_type":"refund_succeeded",'
        b'"content":{"type":"refund_details","object":{"refund_id":"r","amount":1}},'
        b'"timestamp":"2026-08-12T08:14:55.392Z"}'
    )


def test_every_kind_of_object_emits_its_events(
    hooked: SandboxServer, hooked_api: Api, sink: WebhookSink
) -> None:
    api = hooked_api
    paid = api.pay(amount=5000)
    api.pay("4000000000000002")
    api.pay("4000000000003220")
    manual = api.pay(capture_method="manual")
    api.ok("POST", f"/payments/{manual['payment_id']}/cancel")
    api.pay("4000000000000077")
    api.ok("POST", "/refunds", {"payment_id": paid["payment_id"], "amount": 100})
    api.ok("POST", "/refunds", {"payment_id": paid["payment_id"], "amount": 102})
    api.ok("POST", "/payouts/create", {"amount": 100, "currency": "USD", "auto_fulfill": True})
    api.ok("POST", "/payouts/create", {"amount": 102, "currency": "USD", "auto_fulfill": True})
    dispute = hooked.sandbox.open_dispute(paid["payment_id"], amount=1000)
    hooked.sandbox.dispute_action(dispute["dispute_id"], "challenge")
    hooked.sandbox.dispute_action(dispute["dispute_id"], "lose")
    hooked.sandbox.tick()
    assert hooked.sandbox.flush_webhooks(5)
    events = events_of(sink.deliveries)
    assert all(d.verified() for d in sink.deliveries)
    types = Counter(e["event_type"] for e in events)
    assert types == {
        "payment_succeeded": 2,  # the plain payment, then the processing one after the tick
        "payment_failed": 1,
        "action_required": 1,
        "payment_authorized": 1,
        "payment_cancelled": 1,
        "payment_processing": 1,
        "refund_succeeded": 1,
        "refund_failed": 1,
        "payout_success": 1,
        "payout_failed": 1,
        "dispute_opened": 1,
        "dispute_challenged": 1,
        "dispute_lost": 1,
    }
    content_types = {e["content"]["type"] for e in events}
    assert content_types == {
        "payment_details",
        "refund_details",
        "payout_details",
        "dispute_details",
    }
    for event in events:
        kind = event["content"]["type"].removesuffix("_details")
        obj = event["content"]["object"]
        status = obj.get("dispute_status") or obj["status"]
        assert event_type_for_status(kind, status) == event["event_type"]
    failed = next(e for e in events if e["event_type"] == "payment_failed")
    assert failed["content"]["object"]["unified_code"] == "UE_1007"


def test_at_most_one_event_per_object_and_type(hooked: SandboxServer, sink: WebhookSink) -> None:
    sandbox = hooked.sandbox
    [payment_id] = sandbox.seed_payments(1, datetime.now(UTC), emit_webhooks=True)
    obj = sandbox.get_payment(payment_id)
    assert (
        sandbox.webhooks.emit("payment", payment_id, "payment_succeeded", obj, sandbox.now())
        is None
    )
    # Opening two disputes and refunding twice are separate objects: one event each.
    sandbox.open_dispute(payment_id, amount=10)
    sandbox.open_dispute(payment_id, amount=10)
    assert sandbox.flush_webhooks(5)
    keys = [
        (
            e["content"]["object"].get("dispute_id") or e["content"]["object"]["payment_id"],
            e["event_type"],
        )
        for e in events_of(sink.deliveries)
    ]
    assert len(keys) == len(set(keys)) == 3


# -- delivery and retries -------------------------------------------------------------------


def test_retries_send_identical_bytes_and_signature(
    hooked: SandboxServer, hooked_api: Api, sink: WebhookSink
) -> None:
    sink.fail_first = 2
    hooked_api.pay()
    assert hooked.sandbox.flush_webhooks(5)
    deliveries = sink.wait_for(3)
    assert len(deliveries) == 3
    assert len({d.body for d in deliveries}) == 1
    assert len({d.signature for d in deliveries}) == 1 and deliveries[0].verified()
    (event,) = hooked.sandbox.events()
    assert event["state"] == "delivered" and event["attempts"] == 3
    assert event["responses"] == ["HTTP 500", "HTTP 500", "2xx"]


def test_gives_up_after_the_schedule(
    hooked: SandboxServer, hooked_api: Api, sink: WebhookSink
) -> None:
    sink.status = 503
    hooked_api.pay()
    assert hooked.sandbox.flush_webhooks(5)
    assert len(sink.deliveries) == 1 + 3  # the first attempt and three retries
    stats = hooked.sandbox.stats()["webhooks"]
    assert stats["states"] == {"failed": 1} and len(stats["given_up"]) == 1


def test_unreachable_url_is_retried_then_given_up(
    start_sandbox: Callable[..., SandboxServer],
) -> None:
    server = start_sandbox(webhook_url="http://127.0.0.1:9/unreachable", webhook_timeout=0.5)
    server.sandbox.create_payment(
        {"amount": 1, "currency": "USD", "confirm": True, "payment_method_data": card()}
    )
    assert server.sandbox.flush_webhooks(5)
    (event,) = server.sandbox.events()
    assert event["state"] == "failed" and event["attempts"] == 4


def test_flush_times_out_while_retries_are_pending(
    start_sandbox: Callable[..., SandboxServer], sink: WebhookSink, session: requests.Session
) -> None:
    sink.status = 500
    server = start_sandbox(webhook_url=sink.url, retry_schedule=(30.0,))
    Api(session, server.base_url).pay()
    started = time.monotonic()
    assert server.sandbox.flush_webhooks(0.3) is False
    assert time.monotonic() - started < 2


def test_retry_schedule_parsing() -> None:
    assert len(HYPERSWITCH_RETRY_SCHEDULE) == 16 and sum(HYPERSWITCH_RETRY_SCHEDULE) > 86_000
    assert HYPERSWITCH_RETRY_SCHEDULE[:4] == (60, 300, 300, 600)
    assert parse_retry_schedule("hyperswitch") == HYPERSWITCH_RETRY_SCHEDULE
    assert parse_retry_schedule("0.2x3,1") == (0.2, 0.2, 0.2, 1.0)
    assert parse_retry_schedule("none") == ()
    with pytest.raises(ValueError):
        parse_retry_schedule("fast")


# -- webhook faults -------------------------------------------------------------------------


def test_drop_duplicate_and_corrupt(
    hooked: SandboxServer, hooked_api: Api, sink: WebhookSink
) -> None:
    faults = hooked.sandbox.faults
    faults.once("drop", event_type="payment_failed")
    faults.once("duplicate", event_type="payment_succeeded")
    faults.once("corrupt_signature", event_type="action_required")
    hooked_api.pay("4000000000000002")
    hooked_api.pay()
    hooked_api.pay("4000000000003220")
    assert hooked.sandbox.flush_webhooks(5)
    by_type: dict[str, list[Delivery]] = {}
    for delivery in sink.deliveries:
        by_type.setdefault(json.loads(delivery.body)["event_type"], []).append(delivery)
    assert "payment_failed" not in by_type
    twice = by_type["payment_succeeded"]
    assert len(twice) == 2 and twice[0].body == twice[1].body and all(d.verified() for d in twice)
    corrupted = by_type["action_required"]
    assert not any(d.verified() for d in corrupted)
    assert len(corrupted) == 1  # the sink answered 200 anyway
    applied = hooked.sandbox.stats()["faults"]["webhooks"]
    events = {e["event_type"]: e["event_id"] for e in hooked.sandbox.events()}
    assert applied["drop"] == [events["payment_failed"]]
    assert applied["duplicate"] == [events["payment_succeeded"]]
    assert applied["corrupt_signature"] == [events["action_required"]]


def test_corrupted_signature_stays_identical_across_retries(
    hooked: SandboxServer, hooked_api: Api, sink: WebhookSink
) -> None:
    sink.fail_first = 2
    hooked.sandbox.faults.once("corrupt_signature")
    hooked_api.pay()
    assert hooked.sandbox.flush_webhooks(5)
    assert len(sink.deliveries) == 3
    assert len({(d.body, d.signature) for d in sink.deliveries}) == 1
    assert not sink.deliveries[0].verified()


def test_delay_and_reorder(hooked: SandboxServer, hooked_api: Api, sink: WebhookSink) -> None:
    hooked.sandbox.faults.once("reorder")
    first = hooked_api.pay()
    time.sleep(0.1)
    assert sink.deliveries == []  # held back until the next event
    second = hooked_api.pay()
    assert hooked.sandbox.flush_webhooks(5)
    order = [json.loads(d.body)["content"]["object"]["payment_id"] for d in sink.deliveries]
    assert order == [second["payment_id"], first["payment_id"]]
    hooked.sandbox.faults.once("delay", seconds=0.4)
    started = time.monotonic()
    hooked_api.pay()
    deliveries = sink.wait_for(3)
    assert deliveries[2].at - started >= 0.35
    assert len(hooked.sandbox.stats()["faults"]["webhooks"]["delay"]) == 1


def test_a_held_event_is_released_by_flush(
    hooked: SandboxServer, hooked_api: Api, sink: WebhookSink
) -> None:
    hooked.sandbox.faults.once("reorder")
    hooked_api.pay()
    assert hooked.sandbox.flush_webhooks(5)
    assert len(sink.deliveries) == 1


def test_probabilistic_faults_are_reproducible_with_a_seed() -> None:
    def decisions(seed: int) -> list[tuple[bool, bool]]:
        sandbox = Sandbox("snd_x", seed=seed, webhook_url="http://127.0.0.1:9/")
        sandbox.faults.configure(webhooks=WebhookFaultConfig(drop=0.3, duplicate=0.3))
        plans = [sandbox.faults.plan_webhook(f"evt_{i}", "payment_succeeded") for i in range(200)]
        return [(p.drop, p.duplicate) for p in plans]

    assert decisions(7) == decisions(7) != decisions(8)
    drops = sum(d for d, _ in decisions(7))
    assert 30 < drops < 90


def test_faults_over_http(hooked: SandboxServer, hooked_api: Api, sink: WebhookSink) -> None:
    admin = hooked.base_url + "/__sandbox/faults"
    session = hooked_api.session
    config = {"seed": 3, "webhooks": {"drop": 1.0, "event_types": ["payment_succeeded"]}}
    answer = session.post(admin, json=config, timeout=5).json()
    assert answer["webhooks"]["drop"] == 1.0 and answer["seed"] == 3
    hooked_api.pay()
    hooked_api.pay("4000000000000002")
    assert hooked.sandbox.flush_webhooks(5)
    assert [json.loads(d.body)["event_type"] for d in sink.deliveries] == ["payment_failed"]
    stats = session.get(hooked.base_url + "/__sandbox/stats", timeout=5).json()
    assert len(stats["faults"]["webhooks"]["drop"]) == 1
    assert stats["webhooks"]["states"] == {"dropped": 1, "delivered": 1}
    assert session.delete(admin, timeout=5).json()["webhooks"]["drop"] == 0.0
    bad = session.post(admin, json={"webhooks": {"drop": 2}}, timeout=5)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "IR_04"
    unknown = session.post(admin, json={"chaos": True}, timeout=5)
    assert unknown.status_code == 400


# -- API faults -----------------------------------------------------------------------------


def test_api_5xx_429_and_error_after_processing(server: SandboxServer, api: Api) -> None:
    faults = server.sandbox.faults
    faults.once("error", status=503, path="/payments")
    failed = api.post("/payments", {"amount": 1, "currency": "USD", "payment_id": "p-1"})
    assert failed.status_code == 503
    assert failed.json()["error"] == {
        "type": "connector_error",
        "code": "CE_01",
        "message": failed.json()["error"]["message"],
    }
    assert api.get("/payments/p-1").status_code == 404  # nothing was done
    faults.once("rate_limit", seconds=7)
    limited = api.get("/health")
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "RL_01"
    assert limited.headers["Retry-After"] == "7"
    reset = int(limited.headers["X-RateLimit-Reset"])
    assert abs(reset - (time.time() + 7)) < 3
    assert limited.headers["X-RateLimit-Remaining"] == "0"
    faults.once("error_after_processing", status=502)
    ambiguous = api.post("/payments", {"amount": 1, "currency": "USD", "payment_id": "p-2"})
    assert ambiguous.status_code == 502 and ambiguous.json()["error"]["code"] == "CE_01"
    retried = api.post("/payments", {"amount": 1, "currency": "USD", "payment_id": "p-2"})
    assert retried.json()["error"]["code"] == "HE_01"  # the first attempt was processed
    applied = server.sandbox.stats()["faults"]["api"]
    assert applied == {
        "error": 1,
        "rate_limit": 1,
        "timeout": 0,
        "error_after_processing": 1,
        "ignore_filters": 0,
        "repeat_pages": 0,
    }
    assert api.get("/health").status_code == 200
    admin = api.session.get(server.base_url + "/__sandbox/stats", timeout=5)
    assert admin.status_code == 200  # admin routes never get faults


def test_api_timeout_and_error_rate(server: SandboxServer, api: Api) -> None:
    server.sandbox.faults.once("timeout", seconds=1.0, path="/health")
    with pytest.raises(requests.ReadTimeout):
        api.get("/health", timeout=0.3)
    server.sandbox.faults.configure(api=ApiFaultConfig(error_rate=1.0, paths=("/payments",)))
    assert api.get("/payments/x").status_code in {500, 502, 503}
    assert api.get("/health").status_code == 200  # outside the configured paths
    server.sandbox.faults.reset()
    assert api.get("/payments/x").status_code == 404


def test_real_rate_limit_window(
    start_sandbox: Callable[..., SandboxServer], session: requests.Session
) -> None:
    if 60 - time.time() % 60 < 3:  # keep the three requests inside one window
        time.sleep(60 - time.time() % 60 + 0.1)
    server = start_sandbox(rate_limit_per_minute=2)
    api = Api(session, server.base_url)
    remaining = [api.get("/health").headers["X-RateLimit-Remaining"] for _ in range(2)]
    assert remaining == ["1", "0"]
    limited = api.get("/health")
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "RL_01"
    assert int(limited.headers["Retry-After"]) <= 60
    assert limited.headers["X-RateLimit-Limit"] == "2"


def test_admin_events_and_flush(hooked: SandboxServer, hooked_api: Api, sink: WebhookSink) -> None:
    payment = hooked_api.pay()
    session = hooked_api.session
    flushed = session.post(hooked.base_url + "/__sandbox/webhooks/flush", json={"timeout": 5})
    assert flushed.json() == {"drained": True}
    (event,) = session.get(hooked.base_url + "/__sandbox/events", timeout=5).json()
    assert event["object_id"] == payment["payment_id"] and event["state"] == "delivered"
    assert event["body"].encode() == sink.deliveries[0].body
