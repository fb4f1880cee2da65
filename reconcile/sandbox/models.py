"""The sandbox's records and how the API renders them (pure, no I/O, no locking).

Records are mutable and owned by :class:`~reconcile.sandbox.state.Sandbox`, which changes them
only under its lock. ``to_api()`` renders a record the way Hyperswitch's API answers and the
way webhook ``content.object`` carries it: only fields the OpenAPI contract declares for that
response (``PaymentsResponse``, ``RefundResponse``, ``DisputeResponse``,
``PayoutCreateResponse``, ``MandateResponse``, ``CustomerResponse``), ``null`` when a field has
no value, timestamps as ISO 8601 UTC with milliseconds and ``Z``.

Some records keep times the API does not show, because Hyperswitch has no such field:

- a dispute has no modification time at all (``DisputeResponse`` carries ``created_at`` and
  the connector's ``connector_created_at``/``connector_updated_at``; the sandbox, being the
  connector, sends ``connector_updated_at: null``: Hyperswitch's own status changes do not
  move it, only a connector that reports one does);
- a payout keeps ``modified_at`` internally (``PayoutCreateResponse`` has only ``created``);
- a refund answers ``created_at``/``updated_at`` (there is no ``created``/``modified_at``).

Request objects that are echoed back (``billing``, ``shipping``, ``order_details``, a
customer's ``address``, ``customer_acceptance``) are projected onto the fields the response
schema declares, so an unknown key a caller sends never leaks into an answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from reconcile.sandbox.cards import CardOutcome
from reconcile.sandbox.clock import format_timestamp, iso_or_none

JSONDict = dict[str, Any]

CONNECTOR = "sandbox"
MERCHANT_CONNECTOR_ID = "mca_sandbox"

_COUNTRY: Final = re.compile(r"[A-Z]{2}")
_ADDRESS_FIELDS: Final = (
    "city",
    "line1",
    "line2",
    "line3",
    "zip",
    "state",
    "first_name",
    "last_name",
    "origin_zip",
)
_ORDER_STRINGS: Final = (
    "product_img_link",
    "product_id",
    "category",
    "sub_category",
    "brand",
    "product_tax_code",
    "description",
    "sku",
    "upc",
    "commodity_code",
    "unit_of_measure",
)
_ORDER_INTEGERS: Final = ("total_tax_amount", "total_amount", "unit_discount_amount")

#: ``connector_status`` the sandbox (as the connector) reports for each dispute status.
DISPUTE_CONNECTOR_STATUS: Final[Mapping[str, str]] = {
    "dispute_opened": "needs_response",
    "dispute_expired": "expired",
    "dispute_accepted": "accepted",
    "dispute_cancelled": "warning_closed",
    "dispute_challenged": "under_review",
    "dispute_won": "won",
    "dispute_lost": "lost",
}


# -- projections of request objects ----------------------------------------------------------


def _string(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def address_details(value: object) -> JSONDict | None:
    """``AddressDetails``: the string fields, ``country`` only when a two-letter code."""
    if not isinstance(value, Mapping):
        return None
    out: JSONDict = {name: _string(value.get(name)) for name in _ADDRESS_FIELDS}
    country = value.get("country")
    out["country"] = country if isinstance(country, str) and _COUNTRY.fullmatch(country) else None
    return out


def address(value: object) -> JSONDict | None:
    """``Address``: ``address`` (``AddressDetails``), ``phone`` and ``email``."""
    if not isinstance(value, Mapping):
        return None
    phone = value.get("phone")
    return {
        "address": address_details(value.get("address")),
        "phone": (
            {
                "number": _string(phone.get("number")),
                "country_code": _string(phone.get("country_code")),
            }
            if isinstance(phone, Mapping)
            else None
        ),
        "email": _string(value.get("email")),
    }


def order_details(items: object) -> list[JSONDict] | None:
    """``OrderDetailsWithAmount`` items (the seed's ``name`` is read as ``product_name``)."""
    if not isinstance(items, list):
        return None
    out: list[JSONDict] = []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        name = _string(item.get("product_name")) or _string(item.get("name"))
        quantity = _integer(item.get("quantity"))
        amount = _integer(item.get("amount"))
        if name is None or quantity is None or amount is None:
            continue
        row: JSONDict = {"product_name": name, "quantity": max(quantity, 0), "amount": amount}
        row.update({k: item[k] for k in _ORDER_STRINGS if isinstance(item.get(k), str)})
        row.update({k: item[k] for k in _ORDER_INTEGERS if _integer(item.get(k)) is not None})
        if isinstance(item.get("requires_shipping"), bool):
            row["requires_shipping"] = item["requires_shipping"]
        out.append(row)
    return out


def customer_acceptance(value: object) -> JSONDict | None:
    """``CustomerAcceptance`` (``acceptance_type`` online/offline, ``accepted_at``, ``online``)."""
    if not isinstance(value, Mapping):
        return None
    kind = value.get("acceptance_type")
    online = value.get("online")
    return {
        "acceptance_type": kind if kind in ("online", "offline") else "online",
        "accepted_at": _string(value.get("accepted_at")),
        "online": (
            {
                "ip_address": _string(online.get("ip_address")) or "",
                "user_agent": _string(online.get("user_agent")) or "",
            }
            if isinstance(online, Mapping)
            else None
        ),
    }


# -- records ---------------------------------------------------------------------------------


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
        """``CustomerResponse``."""
        return {
            "customer_id": self.customer_id,
            "name": self.name,
            "email": self.email,
            "phone": self.phone,
            "phone_country_code": self.phone_country_code,
            "description": self.description,
            "address": address_details(self.address),
            "created_at": format_timestamp(self.created),
            "metadata": self.metadata,
            "default_payment_method_id": None,
            "tax_registration_id": None,
            "document_details": None,
        }

    def details(self) -> JSONDict:
        """``CustomerDetailsResponse`` (the ``customer`` of a payment or payout)."""
        return {
            "id": self.customer_id,
            "name": self.name,
            "email": self.email,
            "phone": self.phone if self.phone is None or len(self.phone) <= 10 else None,
            "phone_country_code": (
                self.phone_country_code
                if self.phone_country_code is None or len(self.phone_country_code) <= 2
                else None
            ),
        }


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
        """``RefundResponse`` (``created_at``/``updated_at``; no ``created``/``modified_at``)."""
        return {
            "refund_id": self.refund_id,
            "payment_id": self.payment_id,
            "amount": self.amount,
            "currency": self.currency,
            "status": self.status,
            "reason": self.reason,
            "metadata": self.metadata,
            "error_message": self.error_message,
            "error_code": self.error_code,
            "unified_code": self.unified_code,
            "unified_message": self.unified_message,
            "created_at": format_timestamp(self.created),
            "updated_at": format_timestamp(self.updated_at),
            "connector": CONNECTOR,
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
    customer: Customer
    client_secret: str
    created: datetime
    #: Internal only: ``PayoutCreateResponse`` has no modification time.
    modified_at: datetime
    return_url: str
    business_country: str
    entity_type: str
    merchant_order_reference_id: str | None = None
    payout_type: str | None = None
    payout_method_data: JSONDict | None = None
    billing: JSONDict | None = None
    auto_fulfill: bool = False
    recurring: bool = False
    description: str | None = None
    priority: str | None = None
    metadata: JSONDict | None = None
    payout_method_id: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    unified_code: str | None = None
    unified_message: str | None = None
    connector_transaction_id: str | None = None

    def to_api(self) -> JSONDict:
        """``PayoutCreateResponse`` (``created`` only: no modification time)."""
        attempt = {
            "attempt_id": f"{self.payout_id}_1",
            "status": self.status,
            "amount": self.amount,
            "currency": self.currency,
            "connector": CONNECTOR,
            "error_code": self.error_code,
            "error_message": self.error_message,
            "payment_method": self.payout_type,
            "payout_method_type": None,
            "connector_transaction_id": self.connector_transaction_id,
            "cancellation_reason": None,
            "unified_code": self.unified_code,
            "unified_message": self.unified_message,
        }
        customer = self.customer.details()
        return {
            "payout_id": self.payout_id,
            "merchant_id": self.merchant_id,
            "merchant_order_reference_id": self.merchant_order_reference_id,
            "amount": self.amount,
            "currency": self.currency,
            "connector": CONNECTOR,
            "payout_type": self.payout_type,
            "payout_method_data": self.payout_method_data,
            "billing": address(self.billing),
            "auto_fulfill": self.auto_fulfill,
            "customer_id": self.customer.customer_id,
            "customer": customer,
            "client_secret": self.client_secret,
            "return_url": self.return_url,
            "business_country": self.business_country,
            "business_label": None,
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
            "connector_transaction_id": self.connector_transaction_id,
            "priority": self.priority,
            "attempts": [attempt] if self.connector_transaction_id else None,
            "payout_link": None,
            "email": customer["email"],
            "name": customer["name"],
            "phone": customer["phone"],
            "phone_country_code": customer["phone_country_code"],
            "unified_code": self.unified_code,
            "unified_message": self.unified_message,
            "payout_method_id": self.payout_method_id,
        }


@dataclass(slots=True, kw_only=True, eq=False)
class Dispute:
    """A dispute. No modification time: ``DisputeResponse`` has none (see the module doc)."""

    dispute_id: str
    seq: int
    payment_id: str
    attempt_id: str
    profile_id: str
    amount: int
    currency: str
    status: str
    created: datetime
    challenge_required_by: datetime
    stage: str = "dispute"
    reason: str = "fraudulent"
    reason_code: str = "10.4"
    connector_dispute_id: str = ""
    is_already_refunded: bool = False

    def to_api(self) -> JSONDict:
        """``DisputeResponse``."""
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
            "connector_status": DISPUTE_CONNECTOR_STATUS.get(self.status, self.status),
            "connector_dispute_id": self.connector_dispute_id,
            "connector_reason": self.reason,
            "connector_reason_code": self.reason_code,
            "challenge_required_by": format_timestamp(self.challenge_required_by),
            "connector_created_at": format_timestamp(self.created),
            # Hyperswitch's own status changes never move it; the sandbox connector sends none.
            "connector_updated_at": None,
            "created_at": format_timestamp(self.created),
            "profile_id": self.profile_id,
            "merchant_connector_id": MERCHANT_CONNECTOR_ID,
            "is_already_refunded": self.is_already_refunded,
        }


@dataclass(slots=True, kw_only=True, eq=False)
class Mandate:
    """A card mandate (``MandateResponse``): ``active`` until revoked."""

    mandate_id: str
    seq: int
    customer_id: str | None
    payment_method_id: str
    card: CardInfo
    status: str
    created: datetime
    customer_acceptance: JSONDict | None = None
    #: The payment that set it up (``None`` for one made by the sandbox admin).
    payment_id: str | None = None
    revoked_at: datetime | None = None

    def to_api(self) -> JSONDict:
        """``MandateResponse``."""
        return {
            "mandate_id": self.mandate_id,
            "status": self.status,
            "payment_method_id": self.payment_method_id,
            "payment_method": "card",
            "payment_method_type": "credit",
            "card": self.card.to_mandate_api(),
            "customer_acceptance": self.customer_acceptance,
        }

    def to_revoked_api(self) -> JSONDict:
        """``MandateRevokedResponse``."""
        return {
            "mandate_id": self.mandate_id,
            "status": self.status,
            "error_code": None,
            "error_message": None,
        }


__all__ = [
    "CONNECTOR",
    "DISPUTE_CONNECTOR_STATUS",
    "MERCHANT_CONNECTOR_ID",
    "Capture",
    "CardInfo",
    "Customer",
    "Dispute",
    "JSONDict",
    "Mandate",
    "Payment",
    "Payout",
    "Refund",
    "address",
    "address_details",
    "customer_acceptance",
    "iso_or_none",
    "order_details",
]
