"""Clock-driven webhook delivery: retries and faults in sandbox time, nothing in the background."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import requests
from freezegun import freeze_time

from reconcile.sandbox import HYPERSWITCH_RETRY_SCHEDULE, FrozenClock, Sandbox
from tests.reconcile.sandbox.sandbox_support import (
    API_KEY,
    HOOK_URL,
    SECRET,
    Api,
    RecordingSender,
    card,
)


def payment_body(number: str = "4242424242424242", **extra: object) -> dict[str, object]:
    return {
        "amount": 1000,
        "currency": "USD",
        "confirm": True,
        "payment_method_data": card(number),
        **extra,
    }


def test_the_retry_schedule_runs_in_sandbox_time(
    sb: Sandbox, sender: RecordingSender, clock: FrozenClock
) -> None:
    sender.status = 500
    sb.create_payment(payment_body())
    started = clock()
    assert sender.sent == []  # nothing happens until deliver_due()
    report = sb.deliver_due()
    assert len(report) == 1 and report.failed and not report.given_up
    assert sb.next_delivery_due() == started + timedelta(seconds=60)
    clock.advance(59)
    assert len(sb.deliver_due()) == 0
    times = [started]
    while (due := sb.next_delivery_due()) is not None:
        clock.set(due)
        report = sb.deliver_due()
        assert len(report) == 1
        times.append(clock())
    gaps = tuple((b - a).total_seconds() for a, b in zip(times, times[1:], strict=False))
    assert gaps == HYPERSWITCH_RETRY_SCHEDULE
    assert len(sender.sent) == 17  # the first attempt and 16 retries over about a day
    (event,) = sb.webhooks.events()
    assert report.given_up == [event.event_id] and event.state == "failed"
    assert len({(s.body, s.signature) for s in sender.sent}) == 1


def test_a_transport_failure_is_retried(
    sb: Sandbox, sender: RecordingSender, clock: FrozenClock
) -> None:
    sender.answers = [requests.ConnectionError("refused")]
    sb.create_payment(payment_body())
    (failed,) = sb.deliver_due()
    assert failed.error == "ConnectionError" and failed.status_code is None
    clock.advance(60)
    (delivered,) = sb.deliver_due()
    assert delivered.successful and delivered.delivery_attempt == "automatic_retry"
    assert sb.deliver_due().delivered == []


def test_faults_in_sandbox_time(sb: Sandbox, sender: RecordingSender, clock: FrozenClock) -> None:
    faults = sb.faults
    faults.once("drop", event_type="payment_failed")
    faults.once("duplicate", event_type="payment_succeeded")
    faults.once("delay", event_type="action_required", seconds=300)
    sb.create_payment(payment_body("4000000000000002"))
    sb.create_payment(payment_body())
    sb.create_payment(payment_body("4000000000003220"))
    report = sb.deliver_due()
    assert [r.event_type for r in report] == ["payment_succeeded", "payment_succeeded"]
    assert sender.sent[0].body == sender.sent[1].body and all(s.verified() for s in sender.sent)
    clock.advance(299)
    assert len(sb.deliver_due()) == 0
    clock.advance(1)
    assert [r.event_type for r in sb.deliver_due()] == ["action_required"]
    assert "payment_failed" not in sender.event_types()

    faults.once("reorder")
    faults.once("corrupt_signature", event_type="payment_authorized")
    first = sb.create_payment(payment_body(capture_method="manual"))
    assert len(sb.deliver_due()) == 0  # held until the next event
    second = sb.create_payment(payment_body())
    report = sb.deliver_due()
    ids = [json.loads(s.body)["content"]["object"]["payment_id"] for s in sender.sent[-2:]]
    assert ids == [second["payment_id"], first["payment_id"]]
    assert not sender.sent[-1].verified()
    faults.once("reorder")
    sb.create_payment(payment_body())
    assert len(sb.deliver_due()) == 0
    assert len(sb.deliver_due(release_held=True)) == 1
    assert sb.webhooks.pending() == 0 and sb.flush_webhooks(0)


def test_deliver_due_needs_the_clock_driven_mode() -> None:
    threaded = Sandbox(API_KEY, webhook_url=HOOK_URL)
    with pytest.raises(RuntimeError):
        threaded.deliver_due()
    assert threaded.next_delivery_due() is None


def test_deliver_over_the_admin_route(
    sb: Sandbox, inproc: Api, sender: RecordingSender, clock: FrozenClock
) -> None:
    sender.answers = [500]
    inproc.pay()
    url = inproc.base_url + "/__sandbox/webhooks/deliver"
    first = inproc.session.post(url, json={}, timeout=5).json()
    assert [a["status_code"] for a in first["attempts"]] == [500]
    assert first["next_due"] == "2026-03-01T12:01:00.000Z"
    clock.advance(60)
    second = inproc.session.post(url, json={}, timeout=5).json()
    assert second["attempts"][0]["delivery_attempt"] == "automatic_retry"
    assert second["attempts"][0]["final"] is True and second["next_due"] is None


def test_a_120_day_lifecycle_under_freezegun(sender: RecordingSender) -> None:
    """No thread and no monotonic delay: freezegun drives everything, weeks at a time."""
    with freeze_time("2026-01-01T00:00:00Z") as frozen:
        sb = Sandbox(API_KEY, webhook_url=HOOK_URL, webhook_secret=SECRET, send=sender)
        sender.answers = [503] * 3
        manual = sb.create_payment(payment_body(capture_method="manual"))
        paid = sb.create_payment(payment_body(amount=5000))
        dispute = sb.open_dispute(paid["payment_id"])
        payout = sb.create_payout({"amount": 1055, "currency": "USD", "auto_fulfill": True})
        delivered_at: dict[str, datetime] = {}
        for _day in range(120):
            for _hour in range(24):
                for record in sb.deliver_due():
                    if record.successful:
                        delivered_at.setdefault(record.event_type, record.at)
                frozen.tick(timedelta(hours=1))
            sb.tick()
            if _day == 30:
                sb.dispute_action(dispute["dispute_id"], "challenge")
            if _day == 60:
                sb.dispute_action(dispute["dispute_id"], "win")
            if _day == 90:
                sb.reverse_payout(payout["payout_id"])
        assert sb.get_payment(manual["payment_id"])["status"] == "expired"
        assert sb.get_dispute(dispute["dispute_id"])["dispute_status"] == "dispute_won"
        start = datetime(2026, 1, 1, tzinfo=UTC)
        assert delivered_at["payment_expired"] - start == timedelta(days=7)
        assert delivered_at["dispute_won"] - start == timedelta(days=61)
        assert delivered_at["payout_reversed"] - start == timedelta(days=91)
        # The first three sends failed; their retries went through at the next hourly pump.
        assert delivered_at["payment_authorized"] - start == timedelta(hours=1)
        assert sb.webhooks.pending() == 0
        assert {e.state for e in sb.webhooks.events()} == {"delivered"}
