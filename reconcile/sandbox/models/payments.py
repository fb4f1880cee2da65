"""The sandbox's payment records and how the API renders them: the payment
(``PaymentsResponse``), its card (only the last four digits are kept) and its captures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reconcile.sandbox.cards import CardOutcome
from reconcile.sandbox.clock import format_timestamp
from reconcile.sandbox.models.customers import Customer
from reconcile.sandbox.models.shaping import (
    CONNECTOR,
    MERCHANT_CONNECTOR_ID,
    JSONDict,
    address,
    order_details,
)


@dataclass(slots=True, kw_only=True)
class CardInfo:
    """What the sandbox keeps of a card: never the number, only its last four digits."""

    last4: str
    brand: str
    exp_month: str
    exp_year: str
    holder_name: str | None
    isin: str
    outcome: CardOutcome = field(repr=False)

    def to_api(self) -> JSONDict:
        """``CardResponse`` (``payment_method_data.card``)."""
        return {
            "last4": self.last4,
            "card_type": "CREDIT",
            "card_network": self.network,
            "card_issuer": None,
            "card_issuing_country": None,
            "card_isin": self.isin,
            "card_extended_bin": None,
            "card_exp_month": self.exp_month,
            "card_exp_year": self.exp_year,
            "card_holder_name": self.holder_name,
            "payment_checks": None,
            "authentication_data": None,
        }

    def to_mandate_api(self) -> JSONDict:
        """``MandateCardDetails``."""
        return {
            "last4_digits": self.last4,
            "card_exp_month": self.exp_month,
            "card_exp_year": self.exp_year,
            "card_holder_name": self.holder_name,
            "card_token": None,
            "scheme": self.network,
            "issuer_country": None,
            "card_fingerprint": None,
            "card_isin": self.isin,
            "card_issuer": None,
            "card_network": self.network,
            "card_type": "CREDIT",
            "nick_name": None,
        }

    @property
    def network(self) -> str | None:
        """The ``CardNetwork`` value, ``None`` for a network the enum does not know."""
        return None if self.brand == "Unknown" else self.brand


@dataclass(slots=True, kw_only=True, eq=False)
class Capture:
    """One capture of a ``manual_multiple`` payment (``CaptureResponse``)."""

    capture_id: str
    sequence: int
    amount: int
    #: ``started``/``pending`` (asynchronous, not yet settled), ``charged`` or ``failed``.
    status: str
    connector_capture_id: str

    def to_api(self, payment: Payment) -> JSONDict:
        return {
            "capture_id": self.capture_id,
            "status": self.status,
            "amount": self.amount,
            "currency": payment.currency,
            "connector": CONNECTOR,
            "authorized_attempt_id": payment.attempt_id,
            "connector_capture_id": self.connector_capture_id,
            "capture_sequence": self.sequence,
            "error_message": None,
            "error_code": None,
            "error_reason": None,
            "reference_id": None,
        }


@dataclass(slots=True, kw_only=True, eq=False)
class Payment:
    payment_id: str
    seq: int
    merchant_id: str
    profile_id: str
    status: str
    amount: int
    currency: str
    client_secret: str
    created: datetime
    modified_at: datetime
    capture_method: str = "automatic"
    authentication_type: str | None = None
    customer: Customer | None = None
    email: str | None = None
    name: str | None = None
    phone: str | None = None
    description: str | None = None
    statement_descriptor: str | None = None
    return_url: str | None = None
    metadata: JSONDict | None = None
    billing: JSONDict | None = None
    shipping: JSONDict | None = None
    order_details: list[Any] | None = None
    payment_method_type: str | None = None
    card: CardInfo | None = None
    amount_received: int | None = None
    amount_capturable: int = 0
    #: When the authorisation was granted (manual capture); it expires 7 days later.
    authorised_at: datetime | None = None
    captured_at: datetime | None = None
    cancelled_at: datetime | None = None
    cancellation_reason: str | None = None
    unified_code: str | None = None
    unified_message: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    error_details: JSONDict | None = None
    connector_transaction_id: str | None = None
    next_action: JSONDict | None = None
    attempt_count: int = 0
    enable_partial_authorization: bool = False
    setup_future_usage: str | None = None
    off_session: bool | None = None
    mandate_data: JSONDict | None = None
    #: Kept to set up a mandate on authorisation (``PaymentsResponse`` does not show it).
    customer_acceptance: JSONDict | None = None
    mandate_id: str | None = None
    payment_method_id: str | None = None
    captures: list[Capture] = field(default_factory=list)
    #: A later step the test card asked for: ``"processing"`` or ``"dispute"`` (see cards).
    pending_behaviour: str | None = None
    #: An asynchronous capture or void waiting for the next tick: ``("capture", amount)`` or
    #: ``("void", 0)``.
    pending_operation: tuple[str, int] | None = None

    @property
    def attempt_id(self) -> str:
        """The id of the payment's (only) attempt."""
        return f"{self.payment_id}_1"

    def to_api(self) -> JSONDict:
        """``PaymentsResponse``."""
        failed = self.status == "failed"
        return {
            "payment_id": self.payment_id,
            "merchant_id": self.merchant_id,
            "status": self.status,
            "amount": self.amount,
            "net_amount": self.amount,
            "shipping_cost": None,
            "amount_capturable": self.amount_capturable,
            "amount_received": self.amount_received,
            "processor_merchant_id": self.merchant_id,
            "connector": CONNECTOR if self.attempt_count else None,
            "client_secret": self.client_secret,
            "created": format_timestamp(self.created),
            "modified_at": format_timestamp(self.modified_at),
            "currency": self.currency,
            "customer_id": self.customer.customer_id if self.customer else None,
            "customer": self.customer.details() if self.customer else None,
            "description": self.description,
            "refunds": None,
            "disputes": None,
            "attempts": None,
            "captures": (
                [capture.to_api(self) for capture in self.captures]
                if self.capture_method == "manual_multiple"
                else None
            ),
            "mandate_id": self.mandate_id,
            "mandate_data": self.mandate_data,
            "setup_future_usage": self.setup_future_usage,
            "off_session": self.off_session,
            "capture_method": self.capture_method,
            # The sandbox processes cards only, so the method is known from the start.
            "payment_method": "card",
            "payment_method_data": (
                {"card": self.card.to_api(), "billing": None} if self.card is not None else None
            ),
            "payment_token": None,
            "shipping": address(self.shipping),
            "billing": address(self.billing),
            "order_details": order_details(self.order_details),
            "email": self.email,
            "name": self.name,
            "phone": self.phone,
            "return_url": self.return_url,
            "authentication_type": self.authentication_type,
            "statement_descriptor_name": self.statement_descriptor,
            "statement_descriptor_suffix": None,
            "next_action": self.next_action,
            "cancellation_reason": self.cancellation_reason,
            "error_code": self.error_code,
            "error_message": self.error_message,
            "unified_code": self.unified_code,
            "unified_message": self.unified_message,
            "error_details": self.error_details,
            "payment_experience": None,
            "payment_method_type": self.payment_method_type,
            "connector_label": None,
            "business_country": None,
            "business_label": None,
            "business_sub_label": None,
            "allowed_payment_method_types": None,
            "manual_retry_allowed": failed,
            "connector_transaction_id": self.connector_transaction_id,
            "metadata": self.metadata,
            "profile_id": self.profile_id,
            "attempt_count": self.attempt_count,
            "merchant_connector_id": MERCHANT_CONNECTOR_ID if self.attempt_count else None,
            "payment_method_id": self.payment_method_id,
            "updated": format_timestamp(self.modified_at),
            "expires_on": None,
            "capture_before": None,
            "issuer_error_code": None,
            "issuer_error_message": None,
        }
