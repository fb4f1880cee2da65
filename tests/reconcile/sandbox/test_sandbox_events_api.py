"""The events API (admin key): list, delivery attempts and manual retry, as Hyperswitch serves it.

This is how reconciliation recovers a lost webhook with its original signed bytes: a dropped
event is listed as undelivered, its stored request is the exact body with the real signature.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import requests

from receiver.core.signature import SIGNATURE_HEADER, Secret, verify
from reconcile.sandbox import FrozenClock, Sandbox, SandboxServer, create_app, mount_wsgi
from tests.reconcile.sandbox.sandbox_support import (
    ADMIN_KEY,
    API_KEY,
    BASE_URL,
    SECRET,
    Api,
    RecordingSender,
    WebhookSink,
    card,
)

DAY = timedelta(days=1).total_seconds()


class Admin:
    """The events API with the admin key."""

    def __init__(self, api: Api, merchant_id: str) -> None:
        self.api = api
        self.prefix = f"/events/{merchant_id}"

    def list(self, **constraints: Any) -> dict[str, Any]:
        response = self.api.post(self.prefix, constraints, headers={"api-key": ADMIN_KEY})
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    def attempts(self, event_id: str) -> list[dict[str, Any]]:
        response = self.api.get(
            f"{self.prefix}/{event_id}/attempts", headers={"api-key": ADMIN_KEY}
        )
        assert response.status_code == 200, response.text
        data: list[dict[str, Any]] = response.json()
        return data

    def retry(self, event_id: str) -> requests.Response:
        return self.api.post(f"{self.prefix}/{event_id}/retry", headers={"api-key": ADMIN_KEY})


@pytest.fixture
def admin(sb: Sandbox, inproc: Api) -> Admin:
    return Admin(inproc, sb.merchant_id)


def headers_of(row: dict[str, Any]) -> dict[str, str]:
    return {name: value for name, value in row["request"]["headers"]}


def verifies(body: bytes, signature: str | None) -> bool:
    try:
        verify(body, signature, [Secret.of("test", SECRET)])
    except Exception:
        return False
    return True


def test_the_events_api_takes_the_admin_key_only(sb: Sandbox, inproc: Api) -> None:
    prefix = f"/events/{sb.merchant_id}"
    assert inproc.post(prefix, {}).status_code == 401  # the merchant key is not enough
    assert inproc.post(prefix, {}, headers={"api-key": "wrong"}).status_code == 401
    assert inproc.post(prefix, {}, headers={"api-key": ADMIN_KEY}).status_code == 200
    assert inproc.get("/payments/list", headers={"api-key": ADMIN_KEY}).status_code == 401
    without = Sandbox(API_KEY)  # no admin key: the events routes always answer 401
    with requests.Session() as session:
        mount_wsgi(session, BASE_URL, create_app(without))
        api = Api(session, BASE_URL, key=ADMIN_KEY)
        response = api.post(f"/events/{without.merchant_id}", {})
        assert response.status_code == 401 and response.json()["error"]["code"] == "AU_01"


def test_a_dropped_webhook_is_listed_with_its_exact_signed_bytes(
    sb: Sandbox, inproc: Api, admin: Admin, sender: RecordingSender
) -> None:
    sb.faults.once("drop", event_type="payment_succeeded")
    payment = inproc.pay()
    assert sb.deliver_due().attempts == () and sender.sent == []
    (event,) = sb.webhooks.events()
    listed = admin.list(is_delivered=False)
    assert listed["total_count"] == 1
    (item,) = listed["events"]
    assert item == {
        "event_id": event.event_id,
        "merchant_id": sb.merchant_id,
        "profile_id": sb.profile_id,
        "object_id": payment["payment_id"],
        "event_type": "payment_succeeded",
        "event_class": "payments",
        "is_delivery_successful": False,
        "initial_attempt_id": event.event_id,
        "created": item["created"],
    }
    (row,) = admin.attempts(event.event_id)
    body = row["request"]["body"].encode("utf-8")
    assert body == event.body  # the exact bytes that would have been sent
    assert json.loads(body)["event_id"] == event.event_id
    headers = headers_of(row)
    assert verifies(body, headers[SIGNATURE_HEADER])
    assert headers["Content-Type"] == "application/json"
    assert row["delivery_attempt"] == "initial_attempt"
    assert row["response"]["status_code"] is None and row["response"]["body"] is None
    # A manual retry sends those bytes and that signature, synchronously.
    retried = admin.retry(event.event_id)
    assert retried.status_code == 200
    attempt = retried.json()
    assert attempt["delivery_attempt"] == "manual_retry"
    assert attempt["event_id"] != event.event_id
    assert attempt["initial_attempt_id"] == event.event_id
    assert attempt["response"]["status_code"] == 200 and attempt["is_delivery_successful"]
    (sent,) = sender.sent
    assert sent.body == event.body and sent.signature == headers[SIGNATURE_HEADER]
    assert admin.list(is_delivered=False)["total_count"] == 0
    assert admin.list()["events"][0]["is_delivery_successful"] is True
    assert [r["delivery_attempt"] for r in admin.attempts(event.event_id)] == [
        "initial_attempt",
        "manual_retry",
    ]
    # Any attempt's id finds the event.
    assert len(admin.attempts(attempt["event_id"])) == 2


def test_an_event_listed_before_its_request_is_recorded(
    sb: Sandbox, inproc: Api, admin: Admin
) -> None:
    """A process killed mid-delivery: the event is listed, its attempt has no request yet."""
    sb.faults.once("drop", event_type="payment_succeeded")
    inproc.pay()
    sb.deliver_due()
    (event,) = sb.webhooks.events()
    sb.webhooks.unrecord_request(event.event_id)
    assert admin.list(is_delivered=False)["total_count"] == 1
    (row,) = admin.attempts(event.event_id)
    assert row["request"] is None and row["delivery_attempt"] == "initial_attempt"
    sb.webhooks.record_request(event.event_id)
    (row,) = admin.attempts(event.event_id)
    assert row["request"]["body"].encode("utf-8") == event.body
    with pytest.raises(LookupError):
        sb.webhooks.unrecord_request("evt_unknown")


def test_a_corrupted_signature_is_only_on_the_wire(
    sb: Sandbox, inproc: Api, admin: Admin, sender: RecordingSender
) -> None:
    sb.faults.once("corrupt_signature")
    inproc.pay()
    sb.deliver_due()
    (wire,) = sender.sent
    assert not wire.verified()
    (event,) = sb.webhooks.events()
    (row,) = admin.attempts(event.event_id)
    stored = headers_of(row)[SIGNATURE_HEADER]
    assert stored != wire.signature and verifies(event.body, stored)
    assert row["is_delivery_successful"] is True  # the receiver answered 200 anyway
    admin.retry(event.event_id)
    assert sender.sent[-1].verified() and sender.sent[-1].body == wire.body


def test_automatic_retries_are_recorded_as_attempts(
    sb: Sandbox, inproc: Api, admin: Admin, sender: RecordingSender, clock: FrozenClock
) -> None:
    sender.answers = [500, 503]
    inproc.pay()
    sb.deliver_due()
    clock.advance(60)
    sb.deliver_due()
    clock.advance(300)
    sb.deliver_due()
    (event,) = sb.webhooks.events()
    rows = admin.attempts(event.event_id)
    assert [(r["delivery_attempt"], r["response"]["status_code"]) for r in rows] == [
        ("initial_attempt", 500),
        ("automatic_retry", 503),
        ("automatic_retry", 200),
    ]
    assert len({r["event_id"] for r in rows}) == 3
    assert {r["initial_attempt_id"] for r in rows} == {event.event_id}
    assert [r["is_delivery_successful"] for r in rows] == [True, False, True]
    assert len({s.body for s in sender.sent}) == 1 and len({s.signature for s in sender.sent}) == 1
    assert rows[1]["created"] > rows[0]["created"]
    (item,) = admin.list()["events"]
    assert item["is_delivery_successful"] is True and item["event_id"] == event.event_id


def test_list_filters_and_paging(
    sb: Sandbox, inproc: Api, admin: Admin, clock: FrozenClock
) -> None:
    first = inproc.pay()
    clock.advance(60)
    inproc.pay("4000000000000002")
    clock.advance(60)
    inproc.pay("4000000000000150", capture_method="manual", enable_partial_authorization=True)
    clock.advance(60)
    inproc.ok("POST", "/refunds", {"payment_id": first["payment_id"], "amount": 100})
    clock.advance(60)
    sb.faults.once("drop")
    inproc.ok("POST", "/payouts/create", {"amount": 100, "currency": "USD", "auto_fulfill": True})
    sb.deliver_due()
    everything = admin.list()
    types = [e["event_type"] for e in everything["events"]]
    assert types == [
        "payout_success",
        "refund_succeeded",
        "payment_partially_authorized",
        "payment_failed",
        "payment_succeeded",
    ]  # newest first
    assert everything["total_count"] == 5
    assert [e["event_type"] for e in admin.list(event_classes=["payments"])["events"]] == [
        "payment_failed",
        "payment_succeeded",
    ]  # Hyperswitch's quirk: payment_partially_authorized is not in the payments class
    assert admin.list(event_types=["payment_partially_authorized"])["total_count"] == 1
    assert [e["event_type"] for e in admin.list(is_delivered=False)["events"]] == ["payout_success"]
    page = admin.list(limit=2, offset=1)
    assert [e["event_type"] for e in page["events"]] == types[1:3]
    assert page["total_count"] == 5
    by_object = admin.list(object_id=first["payment_id"])
    assert [e["event_type"] for e in by_object["events"]] == ["payment_succeeded"]
    one = everything["events"][1]["event_id"]
    assert [e["event_id"] for e in admin.list(event_id=one)["events"]] == [one]
    created = [e["created"] for e in everything["events"]]
    window = admin.list(created_after=created[3], created_before=created[1])
    assert [e["event_type"] for e in window["events"]] == types[1:4]
    assert admin.list(profile_id=sb.profile_id)["total_count"] == 5
    # A profile the merchant does not have is Hyperswitch's ProfileNotFound, not an empty list.
    other = admin.api.post(
        admin.prefix, {"profile_id": "pro_other"}, headers={"api-key": ADMIN_KEY}
    )
    assert other.status_code == 404 and "profile" in other.json()["error"]["message"].lower()


def test_list_validation_and_the_90_day_window(
    sb: Sandbox, inproc: Api, admin: Admin, clock: FrozenClock
) -> None:
    inproc.pay()
    clock.advance(91 * DAY)
    inproc.pay()
    assert admin.list()["total_count"] == 1  # only the last 90 days are listed
    prefix = f"/events/{sb.merchant_id}"
    key = {"api-key": ADMIN_KEY}

    def status(body: dict[str, Any], path: str = prefix) -> int:
        return inproc.post(path, body, headers=key).status_code

    old = (clock() - timedelta(days=91)).isoformat()
    assert status({"created_after": old}) == 400
    assert status({"created_before": old}) == 400
    assert status({"created_after": "2026-03-01T00:00:00"}) == 400  # no offset
    assert status({"limit": 101}) == 400
    assert status({"limit": 100}) == 200
    assert status({"event_types": ["payment_teleported"]}) == 400
    assert status({"sort": "asc"}) == 400  # unknown field
    assert status({}, "/events/merchant_other") == 404
    missing = inproc.get(f"{prefix}/evt_nope/attempts", headers=key)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "IR_05"
    assert inproc.post(f"{prefix}/evt_nope/retry", headers=key).status_code == 404
    profile = inproc.post(f"/events/{sb.profile_id}", {}, headers=key)
    assert profile.status_code == 200 and profile.json()["total_count"] == 1


def test_manual_retry_needs_a_webhook_url(sb: Sandbox, inproc: Api, admin: Admin) -> None:
    inproc.pay()
    sb.webhook_url = None
    (event,) = sb.webhooks.events()
    refused = admin.retry(event.event_id)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "IR_04"


def test_manual_retry_in_the_threaded_mode_over_http(
    start_sandbox: Callable[..., SandboxServer], sink: WebhookSink
) -> None:
    server = start_sandbox(webhook_url=sink.url, admin_api_key=ADMIN_KEY)
    sandbox = server.sandbox
    sandbox.faults.once("drop")
    sandbox.create_payment(
        {"amount": 10, "currency": "USD", "confirm": True, "payment_method_data": card()}
    )
    assert sandbox.flush_webhooks(5) and sink.deliveries == []
    (event,) = sandbox.webhooks.events()
    with requests.Session() as session:
        url = f"{server.base_url}/events/{sandbox.merchant_id}/{event.event_id}/retry"
        answer = session.post(url, headers={"api-key": ADMIN_KEY}, timeout=5)
    assert answer.status_code == 200
    retried = answer.json()
    assert retried["response"]["status_code"] == 200 and retried["response"]["body"] == "ok"
    assert ["content-type", "text/html; charset=utf-8"] in [
        [name.lower(), value] for name, value in retried["response"]["headers"]
    ]
    (delivery,) = sink.deliveries
    assert delivery.body == event.body and delivery.verified()


def test_the_admin_key_stays_out_of_reprs(start_sandbox: Callable[..., SandboxServer]) -> None:
    server = start_sandbox(admin_api_key=ADMIN_KEY)
    assert ADMIN_KEY not in repr(server) + repr(server.sandbox) + repr(server.sandbox.webhooks)
