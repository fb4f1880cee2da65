"""Payments: create, update, confirm (and manual retry), capture, cancel (before and after
capture), 3-D Secure, and the payment state machine (a card's outcome, authorisation,
captures, voids):
:class:`PaymentsMixin`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from reconcile.sandbox import fields
from reconcile.sandbox.cards import (
    AUTHENTICATION_FAILED,
    EXPIRED,
    INSUFFICIENT_FUNDS,
    SUCCESS,
    CardOutcome,
)
from reconcile.sandbox.errors import conflict, duplicate, invalid, missing
from reconcile.sandbox.models import Capture, JSONDict, Payment, customer_acceptance
from reconcile.sandbox.state.base import SandboxBase, new_id
from reconcile.sandbox.state.payment_method_data import payment_method_from

CAPTURE_METHODS: Final = frozenset(
    {"automatic", "manual", "manual_multiple", "scheduled", "sequential_automatic"}
)
CAPTURABLE: Final = frozenset(
    {
        "requires_capture",
        "partially_authorized_and_requires_capture",
        "partially_captured_and_capturable",
    }
)
CANCELLABLE: Final = frozenset(
    {
        "requires_payment_method",
        "requires_confirmation",
        "requires_customer_action",
        "requires_capture",
        "partially_authorized_and_requires_capture",
    }
)
#: Captured payments a void after capture applies to (OpenAPI ``Payments - Cancel Post
#: Capture``): the processor moves them to ``cancelled_post_capture``.
CANCELLABLE_POST_CAPTURE: Final = frozenset(
    {"succeeded", "partially_captured", "partially_captured_and_capturable"}
)
CONFIRMABLE: Final = frozenset({"requires_payment_method", "requires_confirmation"})
#: A confirm may also retry a payment whose attempt failed (Hyperswitch's manual retry: the
#: response's ``manual_retry_allowed``): a new attempt, with the given or the attached card.
RETRYABLE: Final = CONFIRMABLE | {"failed"}


class PaymentsMixin(SandboxBase):
    """The payments API and the payment state machine."""

    # -- payments --------------------------------------------------------------------------

    def create_payment(self, body: fields.Body) -> JSONDict:
        """``POST /payments``; ``confirm: true`` confirms in the same request.

        ``setup_future_usage: "off_session"`` or ``mandate_data`` set up a mandate when the
        payment is authorised; ``mandate_id`` (with ``confirm: true``) charges an active
        mandate's card instead of ``payment_method_data``.
        """
        amount = fields.required_integer(body, "amount", minimum=1)
        currency = fields.currency(body)
        assert currency is not None
        payment_id = fields.identifier(body, "payment_id")
        for name in ("items", "line_items", "cart_items"):
            if name in body:
                raise invalid(
                    f"{name} is not an accepted field: send order contents as order_details"
                )
        capture_method = fields.string(body, "capture_method", choices=CAPTURE_METHODS)
        authentication_type = fields.string(
            body, "authentication_type", choices={"three_ds", "no_three_ds"}
        )
        customer_id = fields.string(body, "customer_id", max_length=64)
        confirm = fields.boolean(body, "confirm")
        details = {
            name: fields.string(body, name, max_length=1024)
            for name in (
                "email",
                "name",
                "phone",
                "description",
                "statement_descriptor",
                "return_url",
            )
        }
        fields.string(body, "phone_country_code", max_length=1024)
        metadata = fields.metadata(body)
        billing = fields.obj(body, "billing")
        shipping = fields.obj(body, "shipping")
        order_details = fields.array(body, "order_details")
        profile_id = self._profile_of_request(fields.string(body, "profile_id"))
        mandate = _mandate_request(body)
        mandate_id = fields.string(body, "mandate_id")
        partial = fields.boolean(body, "enable_partial_authorization")
        card, _payment_method_name, payment_method_type = payment_method_from(body)
        if confirm and card is None and mandate_id is None:
            raise missing("payment_method_data")
        with self.lock:
            if payment_id is None:
                payment_id = new_id("pay_")
            elif payment_id in self._payments:
                raise duplicate(
                    f"The payment with the specified payment_id '{payment_id}' already exists "
                    "in our records"
                )
            customer = self._require_customer(customer_id)
            if mandate_id is not None:
                card = self._mandate_card(mandate_id)
                payment_method_type = "credit"
            now = self.now()
            payment = Payment(
                payment_id=payment_id,
                seq=self._next_seq(),
                merchant_id=self.merchant_id,
                profile_id=profile_id,
                status="requires_confirmation" if card else "requires_payment_method",
                amount=amount,
                currency=currency,
                client_secret=f"{payment_id}_secret_{os.urandom(10).hex()}",
                created=now,
                modified_at=now,
                capture_method=capture_method or "automatic",
                authentication_type=authentication_type,
                customer=customer,
                metadata=metadata,
                billing=billing,
                shipping=shipping,
                order_details=order_details,
                payment_method_type=payment_method_type,
                card=card,
                amount_capturable=amount,
                enable_partial_authorization=partial,
                mandate_id=mandate_id,
                off_session=True if mandate_id is not None else mandate.off_session,
                setup_future_usage=mandate.setup_future_usage,
                mandate_data=mandate.data,
            )
            payment.customer_acceptance = mandate.acceptance
            for name, value in details.items():
                setattr(payment, name, value)
            self._insert_payment(payment)
            if confirm:
                self._confirm(payment)
            return payment.to_api()

    def update_payment(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>``: change an unconfirmed payment (-> ``requires_confirmation``)."""
        amount = fields.integer(body, "amount", minimum=1)
        currency = fields.currency(body, required=False)
        customer_id = fields.string(body, "customer_id", max_length=64)
        capture_method = fields.string(body, "capture_method", choices=CAPTURE_METHODS)
        details = {
            name: fields.string(body, name, max_length=1024)
            for name in (
                "email",
                "name",
                "phone",
                "description",
                "statement_descriptor",
                "return_url",
            )
            if name in body
        }
        metadata = fields.metadata(body)
        billing = fields.obj(body, "billing")
        card, _payment_method_name, payment_method_type = payment_method_from(body)
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status not in CONFIRMABLE:
                raise conflict(_state_message(payment, "updated", CONFIRMABLE))
            customer = self._require_customer(customer_id)
            if amount is not None:
                payment.amount = amount
                payment.amount_capturable = amount
            if currency is not None:
                payment.currency = currency
            if customer is not None:
                payment.customer = customer
            if capture_method is not None:
                payment.capture_method = capture_method
            if metadata is not None:
                payment.metadata = metadata
            if billing is not None:
                payment.billing = billing
            for name, value in details.items():
                setattr(payment, name, value)
            if card is not None:
                payment.card = card
                payment.payment_method_type = payment_method_type
            payment.status = "requires_confirmation"
            payment.modified_at = self.now()
            return payment.to_api()

    def confirm_payment(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>/confirm``: authorise with the attached or the given card
        (also a manual retry of a ``failed`` payment: a new attempt)."""
        card, _payment_method_name, payment_method_type = payment_method_from(body)
        return_url = fields.string(body, "return_url", max_length=1024)
        billing = fields.obj(body, "billing")
        mandate = _mandate_request(body)
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status not in RETRYABLE:
                raise conflict(_state_message(payment, "confirmed", RETRYABLE))
            if payment.status == "failed":
                # A new attempt: the failed one's error no longer describes the payment.
                payment.unified_code = payment.unified_message = None
                payment.error_code = payment.error_message = None
                payment.error_details = None
            if card is not None:
                payment.card = card
                payment.payment_method_type = payment_method_type
            if payment.card is None:
                raise missing("payment_method_data")
            if return_url is not None:
                payment.return_url = return_url
            if billing is not None:
                payment.billing = billing
            if mandate.setup_future_usage is not None:
                payment.setup_future_usage = mandate.setup_future_usage
            if mandate.data is not None:
                payment.mandate_data = mandate.data
            if mandate.acceptance is not None:
                payment.customer_acceptance = mandate.acceptance
            self._confirm(payment)
            return payment.to_api()

    def capture_payment(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>/capture``: full or partial capture of an authorisation.

        ``manual``: one capture (partial -> ``partially_captured``). ``manual_multiple``:
        partial captures -> ``partially_captured_and_capturable`` until the rest is captured
        (-> ``succeeded``). Card 4000000000000333 captures asynchronously (``processing`` /
        ``partially_captured_and_processing`` until the next tick).
        """
        amount = fields.integer(body, "amount_to_capture", minimum=1)
        prefix = fields.string(body, "statement_descriptor_prefix") or ""
        suffix = fields.string(body, "statement_descriptor_suffix") or ""
        if len(prefix) + len(suffix) > 22:
            raise invalid("statement descriptor prefix plus suffix should not exceed 22 characters")
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status in {"succeeded", "partially_captured", "cancelled", "expired"}:
                raise conflict(
                    f"The payment is already {payment.status.replace('_', ' ')}", status=409
                )
            if payment.status not in CAPTURABLE or payment.pending_operation is not None:
                raise conflict(_state_message(payment, "captured", CAPTURABLE))
            amount = payment.amount_capturable if amount is None else amount
            if amount > payment.amount_capturable:
                raise invalid("amount_to_capture is greater than amount_capturable")
            multiple = payment.capture_method == "manual_multiple"
            capture: Capture | None = None
            if multiple:
                capture = Capture(
                    capture_id=f"{payment.payment_id}_capture_{len(payment.captures) + 1}",
                    sequence=len(payment.captures) + 1,
                    amount=amount,
                    status="charged",
                    connector_capture_id=new_id("cap_conn_"),
                )
                payment.captures.append(capture)
            if payment.card is not None and payment.card.outcome.kind == "async":
                payment.pending_operation = ("capture", amount)
                partial = amount < payment.amount_capturable or bool(payment.amount_received)
                if capture is not None:
                    capture.status = "pending"
                status = (
                    "partially_captured_and_processing" if multiple and partial else "processing"
                )
                self._set_payment_status(payment, status)
            else:
                self._settle_capture(payment, amount)
            return payment.to_api()

    def cancel_payment(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>/cancel``: void a payment that is not captured.

        Card 4000000000000333 voids an authorisation asynchronously (``processing`` until the
        next tick, then ``cancelled``).
        """
        reason = fields.string(body, "cancellation_reason", max_length=255)
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status not in CANCELLABLE or payment.pending_operation is not None:
                raise conflict(_state_message(payment, "cancelled", CANCELLABLE))
            payment.cancellation_reason = reason
            payment.next_action = None
            payment.pending_behaviour = None
            authorised = payment.status in CAPTURABLE
            if authorised and payment.card is not None and payment.card.outcome.kind == "async":
                payment.pending_operation = ("void", 0)
                self._set_payment_status(payment, "processing")
            else:
                self._void(payment)
            return payment.to_api()

    def cancel_post_capture(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>/cancel_post_capture``: void a captured payment (before the
        connector settles it), at any later sandbox time: ``cancelled_post_capture``, event
        ``payment_cancelled_post_capture``."""
        reason = fields.string(body, "cancellation_reason", max_length=255)
        with self.lock:
            payment = self._payment(payment_id)
            if (
                payment.status not in CANCELLABLE_POST_CAPTURE
                or payment.pending_operation is not None
            ):
                raise conflict(
                    _state_message(payment, "cancelled post capture", CANCELLABLE_POST_CAPTURE)
                )
            payment.cancellation_reason = reason
            payment.cancelled_at = self.now()
            payment.amount_capturable = 0
            self._set_payment_status(payment, "cancelled_post_capture")
            return payment.to_api()

    def get_payment(self, payment_id: str) -> JSONDict:
        """``GET /payments/<id>``."""
        with self.lock:
            return self._payment(payment_id).to_api()

    def complete_authentication(self, payment_id: str, success: bool = True) -> JSONDict:
        """Finish 3-D Secure of a ``requires_customer_action`` payment (sandbox admin)."""
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status != "requires_customer_action":
                raise conflict(
                    _state_message(payment, "authenticated", {"requires_customer_action"})
                )
            payment.next_action = None
            self._apply_outcome(payment, SUCCESS if success else AUTHENTICATION_FAILED)
            return payment.to_api()

    # -- internals -------------------------------------------------------------------------

    def _confirm(self, payment: Payment) -> None:
        card = payment.card
        assert card is not None
        now = self.now()
        expired = (int(card.exp_year), int(card.exp_month)) < (now.year, now.month)
        self._apply_outcome(payment, EXPIRED if expired else card.outcome)

    def _apply_outcome(self, payment: Payment, outcome: CardOutcome) -> None:
        payment.attempt_count += 1
        payment.connector_transaction_id = new_id("txn_")
        if outcome.kind == "partial_auth" and not payment.enable_partial_authorization:
            outcome = INSUFFICIENT_FUNDS
        if outcome.kind == "decline":
            network = payment.card.network if payment.card else None
            payment.unified_code = outcome.unified_code
            payment.unified_message = outcome.unified_message
            payment.error_code = outcome.error_code
            payment.error_message = outcome.error_message
            payment.error_details = {
                "unified_details": {
                    "category": None,
                    "message": outcome.unified_message,
                    "standardised_code": None,
                    "description": None,
                    "user_guidance_message": None,
                    "recommended_action": None,
                },
                "issuer_details": {
                    "code": outcome.issuer_code,
                    "message": outcome.issuer_message,
                    "network_details": {
                        "name": network,
                        "advice_code": None,
                        "advice_message": None,
                    },
                },
                "connector_details": {
                    "code": outcome.error_code,
                    "message": outcome.error_message,
                    "reason": outcome.error_message,
                },
            }
            payment.amount_capturable = 0
            self._set_payment_status(payment, "failed")
        elif outcome.kind == "three_ds":
            payment.next_action = {
                "type": "redirect_to_url",
                "redirect_to_url": (
                    f"{self.public_url}/__sandbox/payments/{payment.payment_id}/authenticate"
                ),
            }
            self._set_payment_status(payment, "requires_customer_action")
        elif outcome.kind == "processing":
            payment.pending_behaviour = "processing"
            self._set_payment_status(payment, "processing")
        else:
            if outcome.kind == "dispute" and self.auto_dispute:
                payment.pending_behaviour = "dispute"
            partial = outcome.kind == "partial_auth"
            self._authorised(payment, payment.amount // 2 if partial else payment.amount)

    def _authorised(self, payment: Payment, authorised: int) -> None:
        """The issuer approved ``authorised`` (all of the amount, or part of it)."""
        partial = authorised < payment.amount
        now = self.now()
        if payment.capture_method.startswith("manual"):
            payment.amount_capturable = authorised
            payment.authorised_at = now
            status = "partially_authorized_and_requires_capture" if partial else "requires_capture"
        else:
            payment.amount_received = authorised
            payment.amount_capturable = 0
            payment.captured_at = now
            status = "partially_captured" if partial else "succeeded"
        if payment.mandate_id is None and (
            payment.setup_future_usage == "off_session" or payment.mandate_data is not None
        ):
            assert payment.card is not None
            mandate = self._new_mandate(
                payment.card,
                payment.customer.customer_id if payment.customer else None,
                payment.customer_acceptance,
                payment.payment_id,
                payment.profile_id,
            )
            payment.mandate_id = mandate.mandate_id
            payment.payment_method_id = mandate.payment_method_id
        self._set_payment_status(payment, status)

    def _settle_capture(self, payment: Payment, amount: int) -> None:
        """``amount`` is captured: the status that follows, and its event."""
        payment.amount_received = (payment.amount_received or 0) + amount
        payment.captured_at = self.now()
        remaining = payment.amount_capturable - amount
        if payment.capture_method == "manual_multiple" and remaining > 0:
            payment.amount_capturable = remaining
            status = "partially_captured_and_capturable"
        else:
            payment.amount_capturable = 0
            full = payment.amount_received >= payment.amount
            status = "succeeded" if full else "partially_captured"
        self._set_payment_status(payment, status)

    def _void(self, payment: Payment) -> None:
        payment.cancelled_at = self.now()
        payment.amount_capturable = 0
        self._set_payment_status(payment, "cancelled")


def _state_message(payment: Payment, flow: str, expected: Iterable[str]) -> str:
    return (
        f"This Payment could not be {flow} because it has a status of {payment.status}. "
        f"The expected state is {' or '.join(sorted(expected))}"
    )


@dataclass(frozen=True, slots=True)
class _MandateRequest:
    setup_future_usage: str | None
    data: JSONDict | None
    acceptance: JSONDict | None
    off_session: bool | None


def _mandate_request(body: Mapping[str, Any]) -> _MandateRequest:
    """The mandate-related fields of a create or confirm body."""
    usage = fields.string(body, "setup_future_usage", choices={"off_session", "on_session"})
    raw_data = fields.obj(body, "mandate_data")
    raw_acceptance = fields.obj(body, "customer_acceptance")
    if raw_acceptance is None and raw_data is not None:
        nested = raw_data.get("customer_acceptance")
        raw_acceptance = nested if isinstance(nested, dict) else None
    acceptance = customer_acceptance(raw_acceptance) if raw_acceptance is not None else None
    data = (
        None
        if raw_data is None
        else {"update_mandate_id": None, "customer_acceptance": acceptance, "mandate_type": None}
    )
    off_session = body.get("off_session")
    return _MandateRequest(
        setup_future_usage=usage,
        data=data,
        acceptance=acceptance,
        off_session=off_session if isinstance(off_session, bool) else None,
    )
