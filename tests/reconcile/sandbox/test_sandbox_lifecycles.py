"""Sandbox lifecycles on a frozen sandbox clock, with exactly the webhooks Hyperswitch sends.

Everything runs in-process (the WSGI transport) with the clock-driven webhook delivery, so
days pass in microseconds: ``clock.advance(...)``, ``sb.tick()``, ``sb.deliver_due()``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from reconcile.sandbox import FrozenClock, Sandbox
from tests.reconcile.sandbox.sandbox_support import Api, RecordingSender, card

DAY = timedelta(days=1).total_seconds()
ASYNC_CARD = "4000000000000333"
PARTIAL_CARD = "4000000000000150"


def hooks(sb: Sandbox, sender: RecordingSender) -> list[str]:
    """Deliver what is due; the event types of every webhook sent so far."""
    sb.deliver_due()
    return sender.event_types()


def objects(sender: RecordingSender, event_type: str) -> list[dict[str, Any]]:
    return [
        json.loads(s.body)["content"]["object"]
        for s in sender.sent
        if json.loads(s.body)["event_type"] == event_type
    ]


def error_code(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


# -- authorisation expiry ---------------------------------------------------------------------


def test_an_uncaptured_authorisation_expires_after_seven_days(
    sb: Sandbox, inproc: Api, clock: FrozenClock, sender: RecordingSender
) -> None:
    payment = inproc.pay(capture_method="manual")
    assert payment["status"] == "requires_capture"
    assert hooks(sb, sender) == ["payment_authorized"]
    clock.advance(7 * DAY - 1)
    assert sb.tick()["payments"] == []
    clock.advance(1)
    assert sb.tick()["payments"] == [payment["payment_id"]]
    expired = inproc.ok("GET", f"/payments/{payment['payment_id']}")
    assert expired["status"] == "expired" and expired["amount_capturable"] == 0
    assert hooks(sb, sender) == ["payment_authorized", "payment_expired"]
    assert objects(sender, "payment_expired")[0]["status"] == "expired"
    assert error_code(inproc.post(f"/payments/{payment['payment_id']}/capture")) == (
        409,
        "HE_00",
    )
    clock.advance(30 * DAY)
    sb.tick()
    assert hooks(sb, sender) == ["payment_authorized", "payment_expired"]


def test_expiry_counts_from_the_authorisation_not_the_creation(
    sb: Sandbox, inproc: Api, clock: FrozenClock
) -> None:
    payment = inproc.pay("4000000000000077", capture_method="manual")
    assert payment["status"] == "processing"
    clock.advance(DAY)
    sb.tick()  # authorised now
    clock.advance(6.5 * DAY)
    sb.tick()
    assert sb.get_payment(payment["payment_id"])["status"] == "requires_capture"
    clock.advance(0.5 * DAY)
    sb.tick()
    assert sb.get_payment(payment["payment_id"])["status"] == "expired"


def test_a_partly_captured_multiple_capture_expires_silently(
    sb: Sandbox, inproc: Api, clock: FrozenClock, sender: RecordingSender
) -> None:
    payment = inproc.pay(capture_method="manual_multiple", amount=3000)
    path = f"/payments/{payment['payment_id']}"
    captured = inproc.ok("POST", path + "/capture", {"amount_to_capture": 1000})
    assert captured["status"] == "partially_captured_and_capturable"
    assert captured["amount_capturable"] == 2000
    assert hooks(sb, sender) == ["payment_authorized", "payment_captured"]
    clock.advance(7 * DAY)
    assert sb.tick()["payments"] == [payment["payment_id"]]
    after = inproc.ok("GET", path)
    assert after["status"] == "partially_captured"
    assert (after["amount_received"], after["amount_capturable"]) == (1000, 0)
    # partially_captured maps to payment_captured, already sent: no webhook (as real).
    assert hooks(sb, sender) == ["payment_authorized", "payment_captured"]


def test_partial_authorisation(
    sb: Sandbox, inproc: Api, clock: FrozenClock, sender: RecordingSender
) -> None:
    refused = inproc.pay(PARTIAL_CARD, capture_method="manual")
    assert refused["status"] == "failed" and refused["unified_code"] == "UE_1001"
    manual = inproc.pay(
        PARTIAL_CARD, capture_method="manual", amount=1001, enable_partial_authorization=True
    )
    assert manual["status"] == "partially_authorized_and_requires_capture"
    assert manual["amount_capturable"] == 500
    automatic = inproc.pay(PARTIAL_CARD, enable_partial_authorization=True)
    assert automatic["status"] == "partially_captured" and automatic["amount_received"] == 500
    assert hooks(sb, sender) == [
        "payment_failed",
        "payment_partially_authorized",
        "payment_captured",
    ]
    clock.advance(7 * DAY)
    sb.tick()
    assert sb.get_payment(manual["payment_id"])["status"] == "expired"
    assert hooks(sb, sender)[-1] == "payment_expired"


# -- captures and voids -----------------------------------------------------------------------


def test_asynchronous_capture_and_void(sb: Sandbox, inproc: Api, sender: RecordingSender) -> None:
    payment = inproc.pay(ASYNC_CARD, capture_method="manual")
    path = f"/payments/{payment['payment_id']}"
    assert inproc.ok("POST", path + "/capture")["status"] == "processing"
    assert error_code(inproc.post(path + "/capture")) == (400, "HE_00")  # still processing
    assert error_code(inproc.post(path + "/cancel")) == (400, "HE_00")
    assert sb.tick()["payments"] == [payment["payment_id"]]
    done = inproc.ok("GET", path)
    assert done["status"] == "succeeded" and done["amount_received"] == 1000
    assert hooks(sb, sender) == ["payment_authorized", "payment_processing", "payment_succeeded"]

    voided = inproc.pay(ASYNC_CARD, capture_method="manual")
    void_path = f"/payments/{voided['payment_id']}"
    assert inproc.ok("POST", void_path + "/cancel")["status"] == "processing"
    sb.tick()
    assert inproc.ok("GET", void_path)["status"] == "cancelled"
    assert hooks(sb, sender)[3:] == [
        "payment_authorized",
        "payment_processing",
        "payment_cancelled",
    ]


def test_asynchronous_partial_capture_of_a_single_capture(
    sb: Sandbox, inproc: Api, sender: RecordingSender
) -> None:
    payment = inproc.pay(ASYNC_CARD, capture_method="manual", amount=2000)
    path = f"/payments/{payment['payment_id']}"
    assert inproc.ok("POST", path + "/capture", {"amount_to_capture": 500})["status"] == (
        "processing"
    )
    sb.tick()
    settled = inproc.ok("GET", path)
    assert settled["status"] == "partially_captured"
    assert (settled["amount_received"], settled["amount_capturable"]) == (500, 0)
    assert hooks(sb, sender) == ["payment_authorized", "payment_processing", "payment_captured"]


def test_multiple_captures(sb: Sandbox, inproc: Api, sender: RecordingSender) -> None:
    payment = inproc.pay(capture_method="manual_multiple", amount=3000)
    path = f"/payments/{payment['payment_id']}"
    first = inproc.ok("POST", path + "/capture", {"amount_to_capture": 1000})
    assert first["status"] == "partially_captured_and_capturable"
    second = inproc.ok("POST", path + "/capture", {"amount_to_capture": 500})
    assert second["status"] == "partially_captured_and_capturable"
    assert (second["amount_received"], second["amount_capturable"]) == (1500, 1500)
    too_much = inproc.post(path + "/capture", {"amount_to_capture": 1501})
    assert error_code(too_much) == (400, "IR_04")
    last = inproc.ok("POST", path + "/capture")
    assert last["status"] == "succeeded" and last["amount_received"] == 3000
    assert [(c["capture_sequence"], c["amount"], c["status"]) for c in last["captures"]] == [
        (1, 1000, "charged"),
        (2, 500, "charged"),
        (3, 1500, "charged"),
    ]
    assert hooks(sb, sender) == ["payment_authorized", "payment_captured", "payment_succeeded"]


def test_asynchronous_multiple_captures(sb: Sandbox, inproc: Api, sender: RecordingSender) -> None:
    payment = inproc.pay(ASYNC_CARD, capture_method="manual_multiple", amount=3000)
    path = f"/payments/{payment['payment_id']}"
    first = inproc.ok("POST", path + "/capture", {"amount_to_capture": 1000})
    assert first["status"] == "partially_captured_and_processing"
    assert first["captures"][0]["status"] == "pending"
    sb.tick()
    settled = inproc.ok("GET", path)
    assert settled["status"] == "partially_captured_and_capturable"
    assert settled["captures"][0]["status"] == "charged"
    rest = inproc.ok("POST", path + "/capture")
    assert rest["status"] == "partially_captured_and_processing"
    sb.tick()
    assert inproc.ok("GET", path)["status"] == "succeeded"
    # payment_processing went out once: the second processing status sends nothing.
    assert hooks(sb, sender) == [
        "payment_authorized",
        "payment_processing",
        "payment_captured",
        "payment_succeeded",
    ]


# -- disputes ---------------------------------------------------------------------------------


def test_dispute_reopens_at_pre_arbitration_and_arbitration_without_webhooks(
    sb: Sandbox, inproc: Api, clock: FrozenClock, sender: RecordingSender
) -> None:
    payment = inproc.pay(amount=5000)
    dispute = sb.open_dispute(payment["payment_id"])
    dispute_id = dispute["dispute_id"]
    admin = f"{inproc.base_url}/__sandbox/disputes/{dispute_id}"
    clock.advance(3 * DAY)
    sb.dispute_action(dispute_id, "challenge")
    clock.advance(40 * DAY)  # decided long after it opened
    sb.dispute_action(dispute_id, "win")
    before = hooks(sb, sender)
    assert before[-3:] == ["dispute_opened", "dispute_challenged", "dispute_won"]

    clock.advance(20 * DAY)
    reopened = inproc.session.post(admin + "/pre_arbitration", timeout=5).json()
    assert (reopened["dispute_stage"], reopened["dispute_status"]) == (
        "pre_arbitration",
        "dispute_opened",
    )
    shown = inproc.ok("GET", f"/disputes/{dispute_id}")
    assert shown["dispute_stage"] == "pre_arbitration" and shown["dispute_id"] == dispute_id
    assert shown["connector_updated_at"] is None
    assert shown["challenge_required_by"] > dispute["challenge_required_by"]
    assert hooks(sb, sender) == before  # dispute_opened was already sent for this dispute

    sb.dispute_action(dispute_id, "challenge")  # dispute_challenged already sent: nothing
    sb.dispute_action(dispute_id, "lose")  # dispute_lost is new: sent
    assert hooks(sb, sender) == [*before, "dispute_lost"]
    sb.dispute_action(dispute_id, "arbitration")
    sb.dispute_action(dispute_id, "win")  # dispute_won already sent: nothing
    final = inproc.ok("GET", f"/disputes/{dispute_id}")
    assert (final["dispute_stage"], final["dispute_status"]) == ("arbitration", "dispute_won")
    assert hooks(sb, sender) == [*before, "dispute_lost"]
    listed = inproc.ok("GET", "/disputes/list", params={"dispute_stage": "arbitration"})
    assert [d["dispute_id"] for d in listed] == [dispute_id]


def test_dispute_stage_rules_and_reversal(sb: Sandbox, inproc: Api) -> None:
    payment = inproc.pay(amount=5000)
    open_one = sb.open_dispute(payment["payment_id"], amount=100)["dispute_id"]
    admin = f"{inproc.base_url}/__sandbox/disputes"
    refused = inproc.session.post(f"{admin}/{open_one}/pre_arbitration", timeout=5)
    assert error_code(refused) == (400, "HE_00")  # not decided yet
    sb.dispute_action(open_one, "lose")
    sb.dispute_action(open_one, "arbitration")
    sb.dispute_action(open_one, "lose")
    refused = inproc.session.post(f"{admin}/{open_one}/pre_arbitration", timeout=5)
    assert error_code(refused) == (400, "HE_00")  # stages only move forward
    other = sb.open_dispute(payment["payment_id"], amount=100)["dispute_id"]
    sb.dispute_action(other, "lose")
    reversed_ = inproc.session.post(f"{admin}/{other}/reversal", timeout=5).json()
    assert (reversed_["dispute_stage"], reversed_["dispute_status"]) == (
        "dispute_reversal",
        "dispute_won",
    )
    unknown = inproc.session.post(f"{admin}/{other}/appeal", timeout=5)
    assert error_code(unknown) == (400, "IR_04")


# -- payouts and refunds ----------------------------------------------------------------------


def payout(api: Api, amount: int, **extra: Any) -> dict[str, Any]:
    body = {"amount": amount, "currency": "USD", "auto_fulfill": True, **extra}
    result: dict[str, Any] = api.ok("POST", "/payouts/create", body)
    return result


def test_payout_initiated_then_success_then_reversed_days_later(
    sb: Sandbox, inproc: Api, clock: FrozenClock, sender: RecordingSender
) -> None:
    made = payout(inproc, 1055)
    assert made["status"] == "initiated"
    assert sb.tick()["payouts"] == [made["payout_id"]]
    assert inproc.ok("GET", f"/payouts/{made['payout_id']}")["status"] == "success"
    clock.advance(12 * DAY)
    admin = f"{inproc.base_url}/__sandbox/payouts/{made['payout_id']}"
    reversed_ = inproc.session.post(admin + "/reverse", timeout=5).json()
    assert reversed_["status"] == "reversed" and "modified_at" not in reversed_
    assert hooks(sb, sender) == ["payout_initiated", "payout_success", "payout_reversed"]
    again = inproc.session.post(admin + "/reverse", timeout=5)
    assert error_code(again) == (400, "HE_00")


def test_payout_late_failure(
    sb: Sandbox, inproc: Api, clock: FrozenClock, sender: RecordingSender
) -> None:
    initiated = payout(inproc, 2055)
    pending = payout(inproc, 2077)
    clock.advance(3 * DAY)
    admin = f"{inproc.base_url}/__sandbox/payouts"
    for made in (initiated, pending):
        failed = inproc.session.post(
            f"{admin}/{made['payout_id']}/fail", json={"reason": "account closed"}, timeout=5
        ).json()
        assert failed["status"] == "failed" and failed["error_message"] == "account closed"
    assert hooks(sb, sender) == ["payout_initiated", "payout_failed", "payout_failed"]
    success = payout(inproc, 1000)
    refused = inproc.session.post(f"{admin}/{success['payout_id']}/fail", timeout=5)
    assert error_code(refused) == (400, "HE_00")


def test_refund_fails_days_later(
    sb: Sandbox, inproc: Api, clock: FrozenClock, sender: RecordingSender
) -> None:
    payment = inproc.pay(amount=1000)
    refund = inproc.ok("POST", "/refunds", {"payment_id": payment["payment_id"], "amount": 1000})
    pending = inproc.pay(amount=1000)
    late = inproc.ok("POST", "/refunds", {"payment_id": pending["payment_id"], "amount": 177})
    clock.advance(10 * DAY)
    admin = f"{inproc.base_url}/__sandbox/refunds"
    for made in (refund, late):
        failed = inproc.session.post(f"{admin}/{made['refund_id']}/fail", timeout=5).json()
        assert failed["status"] == "failed" and failed["error_code"] == "refund_failed"
        assert failed["updated_at"] > failed["created_at"]
    assert hooks(sb, sender) == [
        "payment_succeeded",
        "refund_succeeded",
        "payment_succeeded",  # the 177 refund is pending: no event
        "refund_failed",
        "refund_failed",
    ]
    # The failed refund frees the amount again.
    again = inproc.ok("POST", "/refunds", {"payment_id": payment["payment_id"]})
    assert again["amount"] == 1000
    refused = inproc.session.post(f"{admin}/{refund['refund_id']}/fail", timeout=5)
    assert error_code(refused) == (400, "HE_00")


# -- mandates ---------------------------------------------------------------------------------


def test_mandate_set_up_by_a_payment_then_used_and_revoked(
    sb: Sandbox, inproc: Api, sender: RecordingSender
) -> None:
    inproc.ok("POST", "/customers", {"customer_id": "cus_m"})
    payment = inproc.pay(
        customer_id="cus_m",
        setup_future_usage="off_session",
        customer_acceptance={"acceptance_type": "offline"},
    )
    mandate_id = payment["mandate_id"]
    assert mandate_id and payment["payment_method_id"]
    mandate = inproc.ok("GET", f"/mandates/{mandate_id}")
    assert mandate["status"] == "active" and mandate["card"]["last4_digits"] == "4242"
    assert mandate["customer_acceptance"]["acceptance_type"] == "offline"
    assert [m["mandate_id"] for m in inproc.ok("GET", "/customers/cus_m/mandates")] == [mandate_id]
    recurring = inproc.ok(
        "POST",
        "/payments",
        {"amount": 500, "currency": "USD", "confirm": True, "mandate_id": mandate_id},
    )
    assert recurring["status"] == "succeeded" and recurring["off_session"] is True
    revoked = inproc.ok("POST", f"/mandates/revoke/{mandate_id}")
    assert revoked == {
        "mandate_id": mandate_id,
        "status": "revoked",
        "error_code": None,
        "error_message": None,
    }
    assert error_code(inproc.post(f"/mandates/revoke/{mandate_id}")) == (400, "HE_00")
    refused = inproc.post(
        "/payments", {"amount": 5, "currency": "USD", "confirm": True, "mandate_id": mandate_id}
    )
    assert error_code(refused) == (400, "IR_04")
    assert error_code(inproc.get("/mandates/man_nope")) == (404, "IR_05")
    assert error_code(inproc.get("/customers/cus_nobody/mandates")) == (404, "IR_05")
    sent = hooks(sb, sender)
    assert sent == ["mandate_active", "payment_succeeded", "payment_succeeded", "mandate_revoked"]
    bodies = [json.loads(s.body) for s in sender.sent if "mandate" in s.body.decode()[:120]]
    assert {b["content"]["type"] for b in bodies} == {"mandate_details"}


def test_admin_mandates(sb: Sandbox, inproc: Api, sender: RecordingSender) -> None:
    admin = f"{inproc.base_url}/__sandbox/mandates"
    made = inproc.session.post(admin, json={"card_number": "5555555555554444"}, timeout=5)
    mandate = made.json()
    assert made.status_code == 200 and mandate["card"]["card_network"] == "Mastercard"
    revoked = inproc.session.post(f"{admin}/{mandate['mandate_id']}/revoke", timeout=5).json()
    assert revoked["status"] == "revoked"
    bad = inproc.session.post(admin, json={"card_number": "4242424242424241"}, timeout=5)
    assert error_code(bad) == (400, "IR_04")
    assert hooks(sb, sender) == ["mandate_active", "mandate_revoked"]


def test_tick_reports_every_kind(sb: Sandbox) -> None:
    assert sb.tick() == {
        "payments": [],
        "refunds": [],
        "payouts": [],
        "disputes": [],
        "mandates": [],
    }


@pytest.mark.parametrize("body", [card(), None])
def test_confirm_with_mandate_setup(sb: Sandbox, inproc: Api, body: Any) -> None:
    created = inproc.ok(
        "POST",
        "/payments",
        {"amount": 100, "currency": "USD", "payment_method_data": card()},
    )
    confirm: dict[str, Any] = {
        "mandate_data": {"customer_acceptance": {"acceptance_type": "online"}}
    }
    if body is not None:
        confirm["payment_method_data"] = body
    confirmed = inproc.ok("POST", f"/payments/{created['payment_id']}/confirm", confirm)
    assert confirmed["status"] == "succeeded" and confirmed["mandate_id"]
    assert confirmed["mandate_data"]["customer_acceptance"]["acceptance_type"] == "online"
