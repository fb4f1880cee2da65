"""The sandbox's records and how the API renders them (pure, no I/O, no locking).

Records are mutable and owned by :class:`~reconcile.sandbox.state.Sandbox`, which changes them
only under its lock. ``to_api()`` renders a record the way the API answers and the way webhook
``content.object`` carries it: every documented field present, ``null`` when it has no value,
timestamps as ISO 8601 UTC with milliseconds and ``Z``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reconcile.sandbox.cards import CardOutcome
from reconcile.sandbox.clock import format_timestamp, iso_or_none

JSONDict = dict[str, Any]

CONNECTOR = "sandbox"
MERCHANT_CONNECTOR_ID = "mca_sandbox"


@dataclass(slots=True, kw_only=True)
class CardInfo:
    """What the sandbox keeps of a card: never the number, only its last four digits."""

    last4: str
    brand: str
    exp_month: str
    exp_year: str
    holder_name: str | None
    outcome: CardOutcome = field(repr=False)

    def to_api(self) -> JSONDict:
        return {
            "last4": self.last4,
            "brand": self.brand,
            "card_network": self.brand,
            "card_type": "CREDIT",
            "exp_month": self.exp_month,
            "exp_year": self.exp_year,
            "card_exp_month": self.exp_month,
            "card_exp_year": self.exp_year,
            "card_holder_name": self.holder_name,
        }


@dataclass(slots=True, kw_only=True, eq=False)
class Customer:
    customer_id: str
    created: datetime
    name: str | None = None
    email: str | None = None
    phone: str | None = None
    phone_country_code: str | None = None
    description: str | None = None
    address: JSONDict | None = None
    metadata: JSONDict | None = None

    def to_api(self) -> JSONDict:
        return {
            "customer_id": self.customer_id,
            "name": self.name,
            "email": self.email,
            "phone": self.phone,
            "phone_country_code": self.phone_country_code,
            "description": self.description,
            "address": self.address,
            "created_at": format_timestamp(self.created),
            "metadata": self.metadata,
            "default_payment_method_id": None,
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
    customer_id: str | None = None
    email: str | None = None
    name: str | None = None
    phone: str | None = None
    phone_country_code: str | None = None
    description: str | None = None
    statement_descriptor: str | None = None
    return_url: str | None = None
    metadata: JSONDict | None = None
    billing: JSONDict | None = None
    shipping: JSONDict | None = None
    order_details: list[Any] | None = None
    payment_method: str | None = None
    payment_method_type: str | None = None
    card: CardInfo | None = None
    amount_received: int | None = None
    amount_capturable: int = 0
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
    #: A later step the test card asked for: ``"processing"`` or ``"dispute"`` (see cards).
    pending_behaviour: str | None = None

    def to_api(self) -> JSONDict:
        return {
            "payment_id": self.payment_id,
            "merchant_id": self.merchant_id,
            "status": self.status,
            "amount": self.amount,
            "net_amount": self.amount,
            "amount_capturable": self.amount_capturable,
            "amount_received": self.amount_received,
            "currency": self.currency,
            "capture_method": self.capture_method,
            "authentication_type": self.authentication_type,
            "payment_method": self.payment_method,
            "payment_method_type": self.payment_method_type,
            "payment_method_data": (
                {"card": self.card.to_api(), "billing": None} if self.card is not None else None
            ),
            "customer_id": self.customer_id,
            "email": self.email,
            "name": self.name,
            "phone": self.phone,
            "phone_country_code": self.phone_country_code,
            "description": self.description,
            "statement_descriptor": self.statement_descriptor,
            "return_url": self.return_url,
            "metadata": self.metadata,
            "billing": self.billing,
            "shipping": self.shipping,
            "order_details": self.order_details,
            "client_secret": self.client_secret,
            "created": format_timestamp(self.created),
            "modified_at": format_timestamp(self.modified_at),
            "captured_at": iso_or_none(self.captured_at),
            "cancellation_reason": self.cancellation_reason,
            "cancelled_at": iso_or_none(self.cancelled_at),
            "unified_code": self.unified_code,
            "unified_message": self.unified_message,
            "error_code": self.error_code,
            "error_message": self.error_message,
            "error_details": self.error_details,
            "next_action": self.next_action,
            "connector": CONNECTOR if self.attempt_count else None,
            "connector_transaction_id": self.connector_transaction_id,
            "merchant_connector_id": MERCHANT_CONNECTOR_ID if self.attempt_count else None,
            "attempt_count": self.attempt_count,
            "profile_id": self.profile_id,
        }


@dataclass(slots=True, kw_only=True, eq=False)
class Refund:
    refund_id: str
    seq: int
    payment_id: str
    merchant_id: str
    profile_id: str
    amount: int
    currency: str
    status: str
    created: datetime
    updated_at: datetime
    reason: str | None = None
    refund_type: str = "instant"
    metadata: JSONDict | None = None
    error_code: str | None = None
    error_message: str | None = None
    unified_code: str | None = None
    unified_message: str | None = None
    connector_refund_id: str | None = None

    def to_api(self) -> JSONDict:
        created = format_timestamp(self.created)
        updated = format_timestamp(self.updated_at)
        return {
            "refund_id": self.refund_id,
            "payment_id": self.payment_id,
            "amount": self.amount,
            "currency": self.currency,
            "status": self.status,
            "reason": self.reason,
            "refund_type": self.refund_type,
            "metadata": self.metadata,
            "error_code": self.error_code,
            "error_message": self.error_message,
            "unified_code": self.unified_code,
            "unified_message": self.unified_message,
            "created": created,
            "created_at": created,
            "updated_at": updated,
            "modified_at": updated,
            "connector": CONNECTOR,
            "connector_refund_id": self.connector_refund_id,
            "profile_id": self.profile_id,
            "merchant_connector_id": MERCHANT_CONNECTOR_ID,
            "split_refunds": None,
            "issuer_error_code": None,
            "issuer_error_message": None,
        }


@dataclass(slots=True, kw_only=True, eq=False)
class Payout:
    payout_id: str
    seq: int
    merchant_id: str
    profile_id: str
    amount: int
    currency: str
    status: str
    customer_id: str
    client_secret: str
    created: datetime
    modified_at: datetime
    customer: JSONDict | None = None
    merchant_order_reference_id: str | None = None
    payout_type: str | None = None
    payout_method_data: JSONDict | None = None
    billing: JSONDict | None = None
    auto_fulfill: bool = False
    recurring: bool = False
    return_url: str | None = None
    business_country: str | None = None
    description: str | None = None
    entity_type: str | None = None
    priority: str | None = None
    metadata: JSONDict | None = None
    payout_link: bool = False
    payout_method_id: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    unified_code: str | None = None
    unified_message: str | None = None
    connector_transaction_id: str | None = None

    def to_api(self) -> JSONDict:
        attempt = {
            "attempt_id": f"{self.payout_id}_1",
            "status": self.status,
            "amount": self.amount,
            "currency": self.currency,
            "connector": CONNECTOR,
            "connector_transaction_id": self.connector_transaction_id,
        }
        return {
            "payout_id": self.payout_id,
            "merchant_id": self.merchant_id,
            "merchant_order_reference_id": self.merchant_order_reference_id,
            "amount": self.amount,
            "currency": self.currency,
            "connector": CONNECTOR,
            "payout_type": self.payout_type,
            "payout_method_data": self.payout_method_data,
            "billing": self.billing,
            "auto_fulfill": self.auto_fulfill,
            "customer_id": self.customer_id,
            "customer": self.customer,
            "client_secret": self.client_secret,
            "return_url": self.return_url,
            "business_country": self.business_country,
            "description": self.description,
            "entity_type": self.entity_type,
            "recurring": self.recurring,
            "metadata": self.metadata,
            "merchant_connector_id": MERCHANT_CONNECTOR_ID,
            "status": self.status,
            "error_message": self.error_message,
            "error_code": self.error_code,
            "profile_id": self.profile_id,
            "created": format_timestamp(self.created),
            "modified_at": format_timestamp(self.modified_at),
            "connector_transaction_id": self.connector_transaction_id,
            "priority": self.priority,
            "attempts": [attempt],
            "payout_link": None,
            "unified_code": self.unified_code,
            "unified_message": self.unified_message,
            "payout_method_id": self.payout_method_id,
        }


@dataclass(slots=True, kw_only=True, eq=False)
class Dispute:
    dispute_id: str
    seq: int
    payment_id: str
    attempt_id: str
    profile_id: str
    amount: int
    currency: str
    status: str
    created: datetime
    modified_at: datetime
    challenge_required_by: datetime
    stage: str = "dispute"
    reason: str = "fraudulent"
    reason_code: str = "10.4"
    connector_dispute_id: str = ""
    is_already_refunded: bool = False

    def to_api(self) -> JSONDict:
        return {
            "dispute_id": self.dispute_id,
            "payment_id": self.payment_id,
            "attempt_id": self.attempt_id,
            # DisputeResponse.amount is a StringMinorUnit in Hyperswitch: a string.
            "amount": str(self.amount),
            "currency": self.currency,
            "dispute_stage": self.stage,
            "dispute_status": self.status,
            "connector": CONNECTOR,
            "connector_status": self.status.removeprefix("dispute_"),
            "connector_dispute_id": self.connector_dispute_id,
            "connector_reason": self.reason,
            "connector_reason_code": self.reason_code,
            "challenge_required_by": format_timestamp(self.challenge_required_by),
            "connector_created_at": format_timestamp(self.created),
            "connector_updated_at": format_timestamp(self.modified_at),
            "created_at": format_timestamp(self.created),
            "profile_id": self.profile_id,
            "merchant_connector_id": MERCHANT_CONNECTOR_ID,
            "is_already_refunded": self.is_already_refunded,
        }
