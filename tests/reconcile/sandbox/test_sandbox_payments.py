"""Sandbox processor: auth, errors, payments, refunds, payouts, customers and disputes."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime

import pytest
import requests
from requests import Session

from receiver.core.errors import ConfigurationError
from reconcile.sandbox import Sandbox, SandboxServer
from tests.reconcile.sandbox.sandbox_support import API_KEY, CARD_OK, Api, card

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def error_of(response: requests.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body["error"]) == {"type", "code", "message"}
    return response.status_code, body["error"]["code"]


# -- auth, errors, headers ------------------------------------------------------------------


def test_health_needs_the_api_key(api: Api) -> None:
    assert api.get("/health").status_code == 200
    for headers in ({"api-key": ""}, {"api-key": "snd_wrong"}):
        response = api.session.get(api.base_url + "/health", headers=headers, timeout=5)
        assert error_of(response) == (401, "AU_01")
        assert response.json()["error"]["type"] == "authentication_error"


def test_every_response_carries_rate_limit_headers(api: Api) -> None:
    responses = [
        api.get("/health"),
        api.get("/payments/nope"),
        api.session.get(api.base_url + "/health", timeout=5),
        api.session.get(api.base_url + "/__sandbox/stats", timeout=5),
    ]
    for response in responses:
        assert int(response.headers["X-RateLimit-Limit"]) > 0
        assert int(response.headers["X-RateLimit-Remaining"]) >= 0
        assert int(response.headers["X-RateLimit-Reset"]) > 1_700_000_000
    first, second = responses[:2]
    if first.headers["X-RateLimit-Reset"] == second.headers["X-RateLimit-Reset"]:
        remaining = [int(r.headers["X-RateLimit-Remaining"]) for r in (first, second)]
        assert remaining[1] == remaining[0] - 1  # same window: one more request counted


def test_the_api_key_must_be_a_sandbox_key() -> None:
    with pytest.raises(ConfigurationError):
        Sandbox("prd_live_key")
    with pytest.raises(ConfigurationError):
        Sandbox("snd_")


def test_reprs_hide_the_key_and_secret(server: SandboxServer) -> None:
    text = repr(server) + repr(server.sandbox) + repr(server.sandbox.webhooks)
    assert API_KEY not in text
    assert server.sandbox.webhook_secret not in text


def test_unknown_route_and_bad_json(api: Api) -> None:
    assert error_of(api.get("/nope")) == (404, "IR_02")
    bad = api.request(
        "POST", "/payments", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert error_of(bad) == (400, "IR_04")


# -- payments -------------------------------------------------------------------------------


def test_create_then_confirm_succeeds(api: Api) -> None:
    created = api.ok("POST", "/payments", {"amount": 6540, "currency": "USD"})
    assert created["status"] == "requires_payment_method"
    assert created["client_secret"].startswith(created["payment_id"] + "_secret_")
    assert TIMESTAMP.fullmatch(created["created"]) and TIMESTAMP.fullmatch(created["modified_at"])
    path = f"/payments/{created['payment_id']}"
    confirmed = api.ok("POST", path + "/confirm", {"payment_method_data": card()})
    assert confirmed["status"] == "succeeded"
    assert confirmed["amount_received"] == 6540 and confirmed["amount_capturable"] == 0
    assert confirmed["payment_method_data"]["card"]["last4"] == "4242"
    assert confirmed["payment_method_data"]["card"]["card_network"] == "Visa"
    assert confirmed["processor_merchant_id"] == confirmed["merchant_id"]
    assert api.ok("GET", path) == confirmed


def test_full_card_number_is_never_echoed_or_stored(server: SandboxServer, api: Api) -> None:
    response = api.post(
        "/payments",
        {"amount": 100, "currency": "EUR", "confirm": True, "payment_method_data": card()},
    )
    assert CARD_OK not in response.text
    stored = repr(vars(server.sandbox)) + str(server.sandbox.events())
    assert CARD_OK not in stored


def test_update_moves_modified_at_and_needs_an_unconfirmed_payment(
    server: SandboxServer, api: Api
) -> None:
    created = api.ok("POST", "/payments", {"amount": 100, "currency": "USD"})
    server.sandbox.set_clock(lambda: datetime(2031, 1, 1, 12))
    updated = api.ok(
        "POST",
        f"/payments/{created['payment_id']}",
        {"amount": 250, "description": "more", "metadata": {"order_id": "o-1"}},
    )
    assert updated["status"] == "requires_confirmation"
    assert updated["amount"] == 250 and updated["metadata"] == {"order_id": "o-1"}
    assert updated["modified_at"] == "2031-01-01T12:00:00.000Z"
    assert updated["created"] == created["created"]
    server.sandbox.set_clock(None)
    paid = api.pay()
    assert error_of(api.post(f"/payments/{paid['payment_id']}", {"amount": 1})) == (400, "HE_00")


def test_create_validation_errors(api: Api) -> None:
    assert error_of(api.post("/payments", {"currency": "USD"})) == (400, "IR_01")
    assert error_of(api.post("/payments", {"amount": 10})) == (400, "IR_01")
    assert error_of(api.post("/payments", {"amount": "10", "currency": "USD"})) == (400, "IR_04")
    assert error_of(api.post("/payments", {"amount": 10, "currency": "usd"})) == (400, "IR_04")
    bad_id = {"amount": 10, "currency": "USD", "payment_id": "has space"}
    assert error_of(api.post("/payments", bad_id)) == (400, "IR_04")
    items = {"amount": 10, "currency": "USD", "line_items": []}
    assert error_of(api.post("/payments", items)) == (400, "IR_04")
    unknown_customer = {"amount": 10, "currency": "USD", "customer_id": "cus_nobody"}
    assert error_of(api.post("/payments", unknown_customer)) == (400, "IR_04")
    confirm_without_card = {"amount": 10, "currency": "USD", "confirm": True}
    assert error_of(api.post("/payments", confirm_without_card)) == (400, "IR_01")
    luhn = {"amount": 10, "currency": "USD", "payment_method_data": card("4242424242424241")}
    assert error_of(api.post("/payments", luhn)) == (400, "IR_04")
    assert error_of(api.get("/payments/pay_missing")) == (404, "IR_05")


def test_duplicate_payment_id_is_he_01(api: Api) -> None:
    body = {"amount": 10, "currency": "USD", "payment_id": "order-42"}
    assert api.ok("POST", "/payments", body)["payment_id"] == "order-42"
    assert error_of(api.post("/payments", body)) == (400, "HE_01")


@pytest.mark.parametrize(
    ("number", "unified", "error_code"),
    [
        ("4000000000000002", "UE_1007", "card_declined"),
        ("4000000000009995", "UE_1001", "insufficient_funds"),
        ("4000000000000069", "UE_1002", "expired_card"),
    ],
)
def test_declines_carry_unified_code(api: Api, number: str, unified: str, error_code: str) -> None:
    payment = api.pay(number)
    assert payment["status"] == "failed"
    assert payment["unified_code"] == unified and payment["unified_message"]
    assert payment["error_code"] == error_code and payment["error_message"]
    assert payment["error_details"]["unified_details"]["message"] == payment["unified_message"]


def test_a_failed_payment_can_be_retried(api: Api) -> None:
    """Hyperswitch's manual retry (``manual_retry_allowed``): confirming a failed payment
    again is a new attempt; its success clears the failed attempt's error."""
    failed = api.pay("4000000000000002")
    assert failed["status"] == "failed" and failed["manual_retry_allowed"] is True
    path = f"/payments/{failed['payment_id']}/confirm"
    retried = api.ok("POST", path, {"payment_method_data": card()})
    assert retried["status"] == "succeeded" and retried["attempt_count"] == 2
    assert retried["unified_code"] is None and retried["error_code"] is None
    assert retried["manual_retry_allowed"] is False
    assert error_of(api.post(path, {"payment_method_data": card()})) == (400, "HE_00")


def test_past_expiry_declines_as_expired(api: Api) -> None:
    body = {
        "amount": 10,
        "currency": "USD",
        "confirm": True,
        "payment_method_data": card(card_exp_year="2001"),
    }
    assert api.ok("POST", "/payments", body)["unified_code"] == "UE_1002"


def test_manual_capture_partial_then_conflicts(api: Api) -> None:
    payment = api.pay(capture_method="manual", amount=5000)
    assert payment["status"] == "requires_capture" and payment["amount_capturable"] == 5000
    path = f"/payments/{payment['payment_id']}"
    too_much = api.post(path + "/capture", {"amount_to_capture": 5001})
    assert error_of(too_much) == (400, "IR_04")
    captured = api.ok("POST", path + "/capture", {"amount_to_capture": 3000})
    assert captured["status"] == "partially_captured"
    assert captured["amount_received"] == 3000 and captured["amount_capturable"] == 0
    assert "captured_at" not in captured  # not a PaymentsResponse field
    assert error_of(api.post(path + "/capture")) == (409, "HE_00")
    assert error_of(api.post(path + "/cancel")) == (400, "HE_00")


def test_full_capture_succeeds_and_cancel(api: Api) -> None:
    payment = api.pay(capture_method="manual")
    path = f"/payments/{payment['payment_id']}"
    assert api.ok("POST", path + "/capture")["status"] == "succeeded"
    other = api.pay(capture_method="manual")
    other_path = f"/payments/{other['payment_id']}"
    cancelled = api.ok("POST", other_path + "/cancel", {"cancellation_reason": "duplicate"})
    assert cancelled["status"] == "cancelled" and cancelled["cancellation_reason"] == "duplicate"
    assert "cancelled_at" not in cancelled  # not a PaymentsResponse field
    assert error_of(api.post(other_path + "/capture")) == (409, "HE_00")
    assert error_of(api.post("/payments/nope/capture")) == (404, "IR_05")
    assert error_of(api.post("/payments/nope/cancel")) == (404, "IR_05")


def test_a_captured_payment_is_voided_after_capture(api: Api) -> None:
    """``POST /payments/{id}/cancel_post_capture`` (OpenAPI: a succeeded, partially
    captured or partially captured and capturable payment): ``cancelled_post_capture``."""
    paid = api.pay()
    path = f"/payments/{paid['payment_id']}"
    voided = api.ok("POST", path + "/cancel_post_capture", {"cancellation_reason": "fraudulent"})
    assert voided["status"] == "cancelled_post_capture"
    assert voided["cancellation_reason"] == "fraudulent"
    assert error_of(api.post(path + "/cancel_post_capture")) == (400, "HE_00")
    held = api.pay(capture_method="manual")
    held_path = f"/payments/{held['payment_id']}"
    assert error_of(api.post(held_path + "/cancel_post_capture")) == (400, "HE_00")
    partial = api.ok("POST", held_path + "/capture", {"amount_to_capture": 100})
    assert partial["status"] == "partially_captured"
    assert api.ok("POST", held_path + "/cancel_post_capture")["status"] == (
        "cancelled_post_capture"
    )
    assert error_of(api.post("/payments/nope/cancel_post_capture")) == (404, "IR_05")


def test_three_ds_then_admin_authentication(api: Api) -> None:
    payment = api.pay("4000000000003220")
    assert payment["status"] == "requires_customer_action"
    assert payment["next_action"]["type"] == "redirect_to_url"
    assert payment["next_action"]["redirect_to_url"].startswith(api.base_url)
    done = api.session.post(payment["next_action"]["redirect_to_url"], json={}, timeout=5)
    assert done.json()["status"] == "succeeded"
    failing = api.pay("4000000000003220")
    url = f"{api.base_url}/__sandbox/payments/{failing['payment_id']}/authenticate"
    failed = api.session.post(url, json={"result": "failure"}, timeout=5).json()
    assert failed["status"] == "failed" and failed["unified_code"] == "UE_5001"


def test_processing_card_settles_on_tick(api: Api) -> None:
    payment = api.pay("4000000000000077")
    assert payment["status"] == "processing"
    tick = api.session.post(api.base_url + "/__sandbox/tick", timeout=5).json()
    assert tick["changed"]["payments"] == [payment["payment_id"]]
    assert api.ok("GET", f"/payments/{payment['payment_id']}")["status"] == "succeeded"


# -- customers ------------------------------------------------------------------------------


def test_customers(api: Api) -> None:
    customer = api.ok("POST", "/customers", {"customer_id": "cus_1", "email": "a@example.com"})
    assert customer["customer_id"] == "cus_1"
    assert api.ok("GET", "/customers/cus_1")["email"] == "a@example.com"
    assert error_of(api.post("/customers", {"customer_id": "cus_1"})) == (400, "HE_01")
    assert error_of(api.get("/customers/cus_nobody")) == (404, "IR_05")
    paid = api.pay(customer_id="cus_1")
    assert paid["customer_id"] == "cus_1"


# -- refunds --------------------------------------------------------------------------------


def test_refunds_full_partial_and_limits(api: Api) -> None:
    payment = api.pay(amount=1000)
    partial = api.ok("POST", "/refunds", {"payment_id": payment["payment_id"], "amount": 300})
    assert partial["status"] == "succeeded" and partial["amount"] == 300
    assert TIMESTAMP.fullmatch(partial["created_at"]) and TIMESTAMP.fullmatch(partial["updated_at"])
    assert "created" not in partial and "modified_at" not in partial  # not RefundResponse fields
    too_much = api.post("/refunds", {"payment_id": payment["payment_id"], "amount": 701})
    assert error_of(too_much) == (400, "IR_04")
    rest = api.ok("POST", "/refunds", {"payment_id": payment["payment_id"]})
    assert rest["amount"] == 700
    empty = api.post("/refunds", {"payment_id": payment["payment_id"]})
    assert error_of(empty) == (400, "IR_04")
    assert api.ok("GET", f"/refunds/{rest['refund_id']}") == rest
    assert error_of(api.post("/refunds", {})) == (400, "IR_01")
    assert error_of(api.post("/refunds", {"payment_id": "pay_nope"})) == (404, "IR_05")
    unpaid = api.ok("POST", "/payments", {"amount": 10, "currency": "USD"})
    assert error_of(api.post("/refunds", {"payment_id": unpaid["payment_id"]})) == (400, "HE_00")
    assert error_of(api.get("/refunds/ref_nope")) == (404, "IR_05")


def test_refund_amount_rules_and_duplicate_id(api: Api) -> None:
    payment = api.pay(amount=10_000)
    pid = payment["payment_id"]
    failed = api.ok("POST", "/refunds", {"payment_id": pid, "amount": 102, "refund_id": "r-1"})
    assert failed["status"] == "failed" and failed["unified_code"] and failed["error_code"]
    dup = api.post("/refunds", {"payment_id": pid, "amount": 5, "refund_id": "r-1"})
    assert error_of(dup) == (400, "HE_01")
    pending = api.ok("POST", "/refunds", {"payment_id": pid, "amount": 177})
    review = api.ok("POST", "/refunds", {"payment_id": pid, "amount": 188})
    assert (pending["status"], review["status"]) == ("pending", "review")
    changed = api.session.post(api.base_url + "/__sandbox/tick", timeout=5).json()["changed"]
    assert set(changed["refunds"]) == {pending["refund_id"], review["refund_id"]}
    assert api.ok("GET", f"/refunds/{pending['refund_id']}")["status"] == "succeeded"
    # A failed refund does not use up the refundable amount.
    assert api.ok("POST", "/refunds", {"payment_id": pid})["amount"] == 10_000 - 177 - 188


# -- payouts --------------------------------------------------------------------------------


def payout_body(**extra: object) -> dict[str, object]:
    return {
        "amount": 1000,
        "currency": "USD",
        "payout_type": "bank",
        "payout_method_data": {
            "bank_transfer": {
                "bank_account_number": "000123456789",
                "bank_routing_number": "110000000",
                "account_holder_name": "Jane Doe",
            }
        },
        "customer": {"id": "cus_payee", "name": "Jane Doe", "email": "jane@example.com"},
        **extra,
    }


def test_payout_create_fulfill_and_update(api: Api) -> None:
    payout = api.ok("POST", "/payouts/create", payout_body())
    assert payout["status"] == "requires_fulfillment"
    bank = payout["payout_method_data"]["bank"]
    assert bank["bank_account_number"].endswith("6789") and "000123" not in str(bank)
    assert payout["customer"]["id"] == payout["customer_id"] == "cus_payee"
    path = f"/payouts/{payout['payout_id']}"
    assert error_of(api.post(path + "/fulfill", {})) == (400, "IR_01")
    assert error_of(api.post(path + "/fulfill", {"payout_id": "other"})) == (400, "IR_04")
    done = api.ok("POST", path + "/fulfill", {"payout_id": payout["payout_id"]})
    assert done["status"] == "success" and done["attempts"][0]["status"] == "success"
    again = api.post(path + "/fulfill", {"payout_id": payout["payout_id"]})
    assert error_of(again) == (400, "HE_00")
    updated = api.ok("PUT", path, {"description": "rent", "metadata": {"k": "v"}})
    assert updated["description"] == "rent" and "modified_at" not in updated
    assert TIMESTAMP.fullmatch(updated["created"])
    assert api.ok("GET", path)["description"] == "rent"
    assert error_of(api.get("/payouts/nope")) == (404, "IR_05")
    assert error_of(api.post("/payouts/create", {"currency": "USD"})) == (400, "IR_01")


def test_payout_outcomes_by_amount(api: Api) -> None:
    failed = api.ok("POST", "/payouts/create", payout_body(amount=1002, auto_fulfill=True))
    assert failed["status"] == "failed" and failed["error_code"] and failed["unified_code"]
    pending = api.ok("POST", "/payouts/create", payout_body(amount=1077, auto_fulfill=True))
    assert pending["status"] == "pending"
    api.session.post(api.base_url + "/__sandbox/tick", timeout=5)
    assert api.ok("GET", f"/payouts/{pending['payout_id']}")["status"] == "success"


# -- disputes -------------------------------------------------------------------------------


def test_dispute_card_opens_a_dispute_on_tick(api: Api) -> None:
    payment = api.pay("4000000000000259")
    assert payment["status"] == "succeeded"
    changed = api.session.post(api.base_url + "/__sandbox/tick", timeout=5).json()["changed"]
    (dispute_id,) = changed["disputes"]
    disputes = api.ok("GET", "/disputes/list")
    assert isinstance(disputes, list) and [d["dispute_id"] for d in disputes] == [dispute_id]
    dispute = api.ok("GET", f"/disputes/{dispute_id}")
    assert dispute["payment_id"] == payment["payment_id"]
    assert dispute["dispute_status"] == "dispute_opened" and dispute["amount"] == "1000"
    # Only once per payment, however often time passes.
    api.session.post(api.base_url + "/__sandbox/tick", timeout=5)
    assert len(api.ok("GET", "/disputes/list")) == 1


def test_admin_disputes_and_transitions(api: Api) -> None:
    payment = api.pay()
    admin = api.base_url + "/__sandbox/disputes"
    opened = api.session.post(admin, json={"payment_id": payment["payment_id"]}, timeout=5).json()
    dispute_id = opened["dispute_id"]
    challenged = api.session.post(f"{admin}/{dispute_id}/challenge", timeout=5).json()
    assert challenged["dispute_status"] == "dispute_challenged"
    won = api.session.post(f"{admin}/{dispute_id}/win", timeout=5).json()
    assert won["dispute_status"] == "dispute_won"
    late = api.session.post(f"{admin}/{dispute_id}/lose", timeout=5)
    assert error_of(late) == (400, "HE_00")
    unpaid = api.ok("POST", "/payments", {"amount": 10, "currency": "USD"})
    refused = api.session.post(admin, json={"payment_id": unpaid["payment_id"]}, timeout=5)
    assert error_of(refused) == (400, "HE_00")
    assert error_of(api.get("/disputes/dp_nope")) == (404, "IR_05")


def test_python_api_without_http() -> None:
    sandbox = Sandbox("snd_direct")
    payment = sandbox.create_payment(
        {"amount": 10, "currency": "USD", "confirm": True, "payment_method_data": card()}
    )
    assert payment["status"] == "succeeded"
    assert sandbox.events()[0]["state"] == "undeliverable"
    sandbox.close()


def test_automatic_ticks(start_sandbox: Callable[..., SandboxServer], session: Session) -> None:
    server = start_sandbox(tick_interval=0.05)
    api = Api(session, server.base_url)
    payment = api.pay("4000000000000077")
    deadline = time.monotonic() + 5
    status = payment["status"]
    while status == "processing" and time.monotonic() < deadline:
        time.sleep(0.05)
        status = api.ok("GET", f"/payments/{payment['payment_id']}")["status"]
    assert status == "succeeded"


def test_admin_clock(server: SandboxServer, api: Api) -> None:
    clock_url = server.base_url + "/__sandbox/clock"
    frozen = api.session.post(clock_url, json={"now": "2030-05-01T10:00:00Z"}, timeout=5).json()
    assert frozen == {"now": "2030-05-01T10:00:00.000Z", "frozen": True}
    first = api.ok("POST", "/payments", {"amount": 1, "currency": "USD"})
    second = api.ok("POST", "/payments", {"amount": 1, "currency": "USD"})
    assert first["created"] == second["created"] == "2030-05-01T10:00:00.000Z"
    moved = api.session.post(clock_url, json={"advance_seconds": 1.5}, timeout=5).json()
    assert moved["now"] == "2030-05-01T10:00:01.500Z"
    real = api.session.post(clock_url, json={"real": True}, timeout=5).json()
    assert real["frozen"] is False and not real["now"].startswith("2030")
    bad = api.session.post(clock_url, json={"now": "yesterday"}, timeout=5)
    assert error_of(bad) == (400, "IR_04")
