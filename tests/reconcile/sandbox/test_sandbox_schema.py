"""Every sandbox answer and webhook body validates against Hyperswitch's (patched) contract.

The validator (:mod:`tests.reconcile.sandbox.contract_schema`) closes every object schema that
declares
``properties``, so a field the real API does not have fails the test. One world of objects in
every reachable status is built through the in-process transport; every response of every
route is validated against the 200 schema of its OpenAPI operation, and every webhook body
against ``OutgoingWebhook``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
import requests

from reconcile.sandbox import FrozenClock, Sandbox, create_app, mount_wsgi
from tests.reconcile.sandbox.contract_schema import (
    component_properties,
    errors,
    patched_spec,
    ref,
    response_schema,
    validate,
)
from tests.reconcile.sandbox.sandbox_support import (
    ADMIN_KEY,
    BASE_URL,
    RecordingSender,
    card,
)

#: Payment statuses the sandbox can reach (``requires_merchant_action`` and ``conflicted``
#: need flows the sandbox does not offer).
PAYMENT_STATUSES = {
    "requires_payment_method",
    "requires_confirmation",
    "requires_customer_action",
    "processing",
    "requires_capture",
    "partially_authorized_and_requires_capture",
    "partially_captured",
    "partially_captured_and_capturable",
    "partially_captured_and_processing",
    "succeeded",
    "failed",
    "cancelled",
    "cancelled_post_capture",
    "expired",
}
REFUND_STATUSES = {"pending", "review", "succeeded", "failed"}
DISPUTE_STATUSES = {
    "dispute_opened",
    "dispute_expired",
    "dispute_accepted",
    "dispute_cancelled",
    "dispute_challenged",
    "dispute_won",
    "dispute_lost",
}
DISPUTE_STAGES = {"pre_dispute", "dispute", "pre_arbitration", "arbitration", "dispute_reversal"}
PAYOUT_STATUSES = {"requires_fulfillment", "pending", "initiated", "success", "failed", "reversed"}
MANDATE_STATUSES = {"active", "revoked"}


def _templates() -> list[tuple[str, re.Pattern[str], str]]:
    found = []
    for template, item in patched_spec()["paths"].items():
        pattern = re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$")
        for method in item:
            found.append((method.upper(), pattern, template))
    # Literal segments win over parameters (/payments/list before /payments/{payment_id}).
    found.sort(key=lambda entry: entry[2].count("{"))
    return found


TEMPLATES = _templates()


def spec_path(method: str, path: str) -> str:
    """The OpenAPI path template of a concrete request path."""
    lookup = "POST" if method == "PUT" and path.startswith("/payouts/") else method
    for candidate, pattern, template in TEMPLATES:
        if candidate == lookup and pattern.match(path):
            return template
    raise AssertionError(f"no OpenAPI operation for {method} {path}")


@dataclass
class Recorder:
    """Calls the sandbox in-process and validates every answer as it comes."""

    session: requests.Session
    seen: dict[tuple[str, str], int] = field(default_factory=dict)
    statuses: dict[str, set[str]] = field(default_factory=dict)

    def call(self, method: str, path: str, body: Any = None, *, admin: bool = False) -> Any:
        key = ADMIN_KEY if admin else "snd_test_key_0123456789"
        kwargs: dict[str, Any] = {"headers": {"api-key": key}, "timeout": 5}
        if body is not None:
            if method == "GET":
                kwargs["params"] = body
            else:
                kwargs["json"] = body
        response = self.session.request(method, BASE_URL + path, **kwargs)
        assert response.status_code == 200, (method, path, response.text)
        data = response.json()
        template = spec_path(method, path.split("?")[0])
        operation = (method if method != "PUT" else "POST", template)
        if template == "/payments/{payment_id}/cancel":
            # The spec documents no body for cancel; the server answers PaymentsResponse.
            schema = ref("PaymentsResponse")
        else:
            schema = response_schema(operation[0], template)
        problems = errors(schema, data)
        assert not problems, f"{method} {path}:\n" + "\n".join(problems)
        self.seen[(method, template)] = self.seen.get((method, template), 0) + 1
        self._note(data)
        return data

    def _note(self, data: Any) -> None:
        rows = data if isinstance(data, list) else [data]
        if isinstance(data, dict):
            for key in ("data", "events"):
                if isinstance(data.get(key), list):
                    rows = data[key]
        for row in rows:
            if not isinstance(row, dict):
                continue
            if "payment_id" in row and "net_amount" in row:
                self.statuses.setdefault("payment", set()).add(row["status"])
            elif "refund_id" in row:
                self.statuses.setdefault("refund", set()).add(row["status"])
            elif "dispute_id" in row:
                self.statuses.setdefault("dispute", set()).add(row["dispute_status"])
                self.statuses.setdefault("dispute_stage", set()).add(row["dispute_stage"])
            elif "payout_id" in row:
                self.statuses.setdefault("payout", set()).add(row["status"])
            elif "mandate_id" in row:
                self.statuses.setdefault("mandate", set()).add(row["status"])


@pytest.fixture
def recorder(sb: Sandbox) -> Iterator[Recorder]:
    with requests.Session() as session:
        mount_wsgi(session, BASE_URL, create_app(sb))
        yield Recorder(session)


def pay(rec: Recorder, number: str = "4242424242424242", **body: Any) -> Any:
    payload = {
        "amount": 1000,
        "currency": "USD",
        "confirm": True,
        "payment_method": "card",
        "payment_method_data": card(number),
        **body,
    }
    return rec.call("POST", "/payments", payload)


def build_world(rec: Recorder, sb: Sandbox, clock: FrozenClock) -> None:
    """Objects in every reachable status, through every route."""
    call = rec.call
    call("POST", "/customers", {"customer_id": "cus_w", "email": "w@example.com", "name": "W"})
    call("GET", "/customers/cus_w")
    # Payments.
    created = call("POST", "/payments", {"amount": 700, "currency": "USD", "customer_id": "cus_w"})
    pid = created["payment_id"]
    call("POST", f"/payments/{pid}", {"amount": 800, "description": "more"})
    call("POST", f"/payments/{pid}/confirm", {"payment_method_data": card()})
    call(
        "POST",
        "/payments",
        {"amount": 500, "currency": "EUR", "payment_method_data": card()},
    )  # requires_confirmation
    pay(rec, "4000000000000002")  # failed
    three_ds = pay(rec, "4000000000003220")  # requires_customer_action
    processing = pay(rec, "4000000000000077")  # processing
    manual = pay(rec, capture_method="manual", amount=5000)
    call("POST", f"/payments/{manual['payment_id']}/capture", {"amount_to_capture": 2000})
    voided = pay(rec, capture_method="manual")
    call("POST", f"/payments/{voided['payment_id']}/cancel", {"cancellation_reason": "dup"})
    captured_then_voided = pay(rec)
    call(
        "POST",
        f"/payments/{captured_then_voided['payment_id']}/cancel_post_capture",
        {"cancellation_reason": "requested_by_customer"},
    )
    partial = pay(
        rec, "4000000000000150", capture_method="manual", enable_partial_authorization=True
    )
    assert partial["status"] == "partially_authorized_and_requires_capture"
    multiple = pay(rec, "4000000000000333", capture_method="manual_multiple", amount=3000)
    call("POST", f"/payments/{multiple['payment_id']}/capture", {"amount_to_capture": 1000})
    asynch = pay(rec, "4000000000000333", capture_method="manual")
    call("POST", f"/payments/{asynch['payment_id']}/capture")  # processing
    multi_sync = pay(rec, capture_method="manual_multiple", amount=4000)
    call("POST", f"/payments/{multi_sync['payment_id']}/capture", {"amount_to_capture": 1000})
    call(
        "POST",
        "/payments",
        {
            "amount": 300,
            "currency": "USD",
            "confirm": True,
            "customer_id": "cus_w",
            "setup_future_usage": "off_session",
            "customer_acceptance": {
                "acceptance_type": "online",
                "accepted_at": "2026-03-01T12:00:00Z",
                "online": {"ip_address": "203.0.113.7", "user_agent": "Mozilla/5.0"},
            },
            "payment_method_data": card(),
            "billing": {
                "address": {"line1": "1 Main St", "city": "Springfield", "country": "US"},
                "phone": {"number": "5555550100", "country_code": "+1"},
                "unknown": "dropped",
            },
            "order_details": [{"name": "shirt", "quantity": 1, "amount": 300}],
        },
    )
    expiring = pay(rec, capture_method="manual")
    for payment_id in (three_ds["payment_id"], processing["payment_id"], manual["payment_id"]):
        call("GET", f"/payments/{payment_id}")
    call("GET", "/payments/list", {"limit": 100})
    call("POST", "/payments/list", {"limit": 100})
    # Refunds.
    paid = pay(rec, amount=100_000)
    for amount in (1000, 1002, 1077, 1088):
        call("POST", "/refunds", {"payment_id": paid["payment_id"], "amount": amount})
    refund = call("POST", "/refunds", {"payment_id": paid["payment_id"], "amount": 500})
    call("POST", f"/refunds/{refund['refund_id']}", {"reason": "changed mind"})
    call("GET", f"/refunds/{refund['refund_id']}")
    call("POST", "/refunds/list", {"limit": 100})
    # Payouts.
    bank = {
        "bank": {
            "bank_account_number": "000123456789",
            "bank_routing_number": "110000000",
            "bank_name": "Chase",
            "bank_country_code": "US",
            "bank_city": "Springfield",
        }
    }
    payouts = {}
    for amount in (1000, 1002, 1077, 1055, 2000):
        payouts[amount] = call(
            "POST",
            "/payouts/create",
            {
                "amount": amount,
                "currency": "USD",
                "payout_type": "bank",
                "payout_method_data": bank,
                "customer": {"id": "cus_payee", "name": "Jane", "email": "j@example.com"},
                "auto_fulfill": amount != 2000,
            },
        )
    unfulfilled = payouts[2000]["payout_id"]
    call("PUT", f"/payouts/{unfulfilled}", {"description": "rent"})
    call("GET", f"/payouts/{unfulfilled}")
    card_payout = call(
        "POST",
        "/payouts/create",
        {
            "amount": 900,
            "currency": "USD",
            "payout_type": "card",
            "payout_method_data": {
                "card": {
                    "card_number": "4242424242424242",
                    "expiry_month": "12",
                    "expiry_year": "2030",
                    "card_holder_name": "Jane Doe",
                }
            },
        },
    )
    call(
        "POST",
        f"/payouts/{card_payout['payout_id']}/fulfill",
        {"payout_id": card_payout["payout_id"]},
    )
    call(
        "POST",
        "/payouts/create",
        {
            "amount": 800,
            "currency": "EUR",
            "payout_type": "wallet",
            "payout_method_data": {
                "wallet": {"paypal": {"email": "p@example.com", "paypal_id": "P1"}}
            },
        },
    )
    call(
        "POST",
        "/payouts/create",
        {
            "amount": 700,
            "currency": "EUR",
            "payout_type": "bank",
            "payout_method_data": {"bank_transfer": {"iban": "DE89370400440532013000", "bic": "X"}},
        },
    )
    sb.reverse_payout(payouts[1000]["payout_id"])
    # Disputes and mandates.
    for actions in (
        ("challenge", "win", "pre_arbitration", "challenge", "lose", "arbitration"),
        ("accept",),
        ("expire",),
        ("cancel",),
        ("lose", "reversal"),
        ("challenge",),
    ):
        dispute = sb.open_dispute(paid["payment_id"], amount=100)
        for action in actions:
            sb.dispute_action(dispute["dispute_id"], action)
            call("GET", f"/disputes/{dispute['dispute_id']}")
    sb.open_dispute(paid["payment_id"], amount=100, stage="pre_dispute")
    call("GET", f"/disputes/{dispute['dispute_id']}")
    call("GET", "/disputes/list")
    mandate = sb.create_mandate(customer_id="cus_w")
    call("GET", f"/mandates/{mandate['mandate_id']}")
    call("GET", "/customers/cus_w/mandates")
    call("POST", f"/mandates/revoke/{mandate['mandate_id']}")
    # Time passes: async operations settle, then authorisations expire.
    sb.tick()
    call("POST", f"/payments/{multiple['payment_id']}/capture", {"amount_to_capture": 500})
    call("GET", f"/payments/{multiple['payment_id']}")  # partially_captured_and_processing
    sb.tick()
    clock.advance(timedelta(days=7).total_seconds())
    sb.tick()
    call("GET", f"/payments/{expiring['payment_id']}")  # expired
    call("GET", f"/payments/{multiple['payment_id']}")  # partially_captured (expired rest)
    call("GET", "/payments/list", {"limit": 100})
    call("POST", "/payments/list", {"limit": 100})
    call("POST", "/refunds/list", {"limit": 100})
    call("GET", "/payouts/list", {"limit": 100})
    call("POST", "/payouts/list", {"limit": 20})
    call("GET", "/disputes/list")
    call("GET", "/customers/cus_w/mandates")
    # The events API.
    sb.deliver_due()
    listing = call("POST", f"/events/{sb.merchant_id}", {}, admin=True)
    first = listing["events"][-1]["event_id"]
    call("GET", f"/events/{sb.merchant_id}/{first}/attempts", admin=True)
    call("POST", f"/events/{sb.merchant_id}/{first}/retry", admin=True)


@pytest.fixture
def world(recorder: Recorder, sb: Sandbox, clock: FrozenClock) -> Recorder:
    build_world(recorder, sb, clock)
    return recorder


# -- the tests --------------------------------------------------------------------------------


def test_every_route_answers_the_contract(world: Recorder) -> None:
    expected = {
        ("POST", "/customers"),
        ("GET", "/customers/{customer_id}"),
        ("GET", "/customers/{customer_id}/mandates"),
        ("POST", "/payments"),
        ("POST", "/payments/{payment_id}"),
        ("POST", "/payments/{payment_id}/confirm"),
        ("POST", "/payments/{payment_id}/capture"),
        ("POST", "/payments/{payment_id}/cancel"),
        ("POST", "/payments/{payment_id}/cancel_post_capture"),
        ("GET", "/payments/{payment_id}"),
        ("GET", "/payments/list"),
        ("POST", "/payments/list"),
        ("POST", "/refunds"),
        ("POST", "/refunds/{refund_id}"),
        ("GET", "/refunds/{refund_id}"),
        ("POST", "/refunds/list"),
        ("POST", "/payouts/create"),
        ("PUT", "/payouts/{payout_id}"),
        ("GET", "/payouts/{payout_id}"),
        ("POST", "/payouts/{payout_id}/fulfill"),
        ("GET", "/payouts/list"),
        ("POST", "/payouts/list"),
        ("GET", "/disputes/list"),
        ("GET", "/disputes/{dispute_id}"),
        ("GET", "/mandates/{mandate_id}"),
        ("POST", "/mandates/revoke/{mandate_id}"),
        ("POST", "/events/{merchant_id}"),
        ("GET", "/events/{merchant_id}/{event_id}/attempts"),
        ("POST", "/events/{merchant_id}/{event_id}/retry"),
    }
    assert expected <= set(world.seen), expected - set(world.seen)


def test_every_reachable_status_was_validated(world: Recorder) -> None:
    assert world.statuses["payment"] >= PAYMENT_STATUSES, (
        PAYMENT_STATUSES - world.statuses["payment"]
    )
    assert world.statuses["refund"] >= REFUND_STATUSES
    assert world.statuses["dispute"] >= DISPUTE_STATUSES
    assert world.statuses["dispute_stage"] >= DISPUTE_STAGES
    assert world.statuses["payout"] >= PAYOUT_STATUSES
    assert world.statuses["mandate"] >= MANDATE_STATUSES


def test_every_webhook_body_is_an_outgoing_webhook(
    world: Recorder, sb: Sandbox, sender: RecordingSender
) -> None:
    events = sb.webhooks.events()
    content_types = set()
    for event in events:
        body = json.loads(event.body)
        validate("OutgoingWebhook", body)
        content_types.add(body["content"]["type"])
        assert list(body) == ["merchant_id", "event_id", "event_type", "content", "timestamp"]
    assert content_types == {
        "payment_details",
        "refund_details",
        "dispute_details",
        "payout_details",
        "mandate_details",
    }
    assert {json.loads(s.body)["event_id"] for s in sender.sent} <= {e.event_id for e in events}
    types = {e.event_type for e in events}
    assert {
        "payment_partially_authorized",
        "payment_expired",
        "payment_captured",
        "payment_processing",
        "payout_initiated",
        "payout_reversed",
        "mandate_active",
        "mandate_revoked",
    } <= types


@pytest.mark.parametrize(
    ("schema", "make", "path"),
    [
        ("PaymentsResponse", "payment", ("invented",)),
        ("PaymentsResponse", "payment", ("payment_method_data", "card", "brand")),
        ("PaymentsResponse", "payment", ("error_details", "unified_details", "extra")),
        ("RefundResponse", "refund", ("created",)),
        ("RefundResponse", "refund", ("modified_at",)),
        ("DisputeResponse", "dispute", ("modified_at",)),
        ("PayoutCreateResponse", "payout", ("modified_at",)),
        ("PayoutCreateResponse", "payout", ("payout_method_data", "bank", "account_holder_name")),
        ("MandateResponse", "mandate", ("card", "brand")),
        ("CustomerResponse", "customer", ("created",)),
    ],
)
def test_an_invented_field_fails_validation(
    sb: Sandbox, schema: str, make: str, path: tuple[str, ...]
) -> None:
    sample = sample_of(sb, make)
    validate(schema, sample)
    node = sample
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = "invented"
    found = errors(ref(schema), sample)
    assert found and any("Additional properties" in e or "additional" in e.lower() for e in found)


def sample_of(sb: Sandbox, kind: str) -> dict[str, Any]:
    body = {"amount": 1000, "currency": "USD", "confirm": True, "payment_method_data": card()}
    payment = sb.create_payment(body)
    if kind == "payment":
        # A declined payment carries error_details too.
        return sb.create_payment({**body, "payment_method_data": card("4000000000000002")})
    if kind == "refund":
        return sb.create_refund({"payment_id": payment["payment_id"], "amount": 300})
    if kind == "dispute":
        return sb.open_dispute(payment["payment_id"])
    if kind == "payout":
        return sb.create_payout(
            {
                "amount": 100,
                "currency": "USD",
                "payout_type": "bank",
                "payout_method_data": {
                    "bank": {"bank_account_number": "0001234567", "bank_routing_number": "110"}
                },
            }
        )
    if kind == "mandate":
        return sb.create_mandate()
    return sb.create_customer({"customer_id": "cus_sample"})


def test_the_create_schema_differs_from_payments_response_only_in_known_fields() -> None:
    """Pins the decision to validate create/update/confirm answers as PaymentsResponse."""
    create = component_properties("PaymentsCreateResponseOpenApi")
    response = component_properties("PaymentsResponse")
    assert create <= response
    assert response - create == {"unified_code", "unified_message", "customer", "capture_on"}


def test_sandbox_payment_fields_are_real() -> None:
    """The fields the old sandbox invented are not in the real schemas."""
    assert not {"captured_at", "cancelled_at", "statement_descriptor", "phone_country_code"} & (
        component_properties("PaymentsResponse")
    )
    assert "brand" not in component_properties("CardResponse")
    assert not {"created", "modified_at"} & component_properties("RefundResponse")
    assert "modified_at" not in component_properties("DisputeResponse")
    assert "modified_at" not in component_properties("PayoutCreateResponse")
