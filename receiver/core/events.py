"""Typed, immutable webhook events parsed from Hyperswitch bodies (pure, no I/O).

A Hyperswitch webhook body is
``{"merchant_id", "event_id", "event_type", "content": {"type", "object"}, "timestamp"}``
(see ``hyperswitch-facts.md`` section 2). :func:`parse_event` validates the *envelope* only:
the body must be a UTF-8 JSON object with a usable ``event_id``. Everything else is parsed
leniently: an unknown ``event_type`` or content type, unknown fields, or a field of the wrong
type never raise (the wrong-typed field becomes ``None``), because the receiver stores every
authentic event, even one it does not understand. The whole parsed dict is kept in ``raw``.

Resources never show card data in their ``repr``: only kind, id, status, amount and currency.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, ClassVar, Final, TypeAlias, TypeVar

from receiver.core.codes import UnifiedCode, describe_unified_code
from receiver.core.errors import MalformedEvent, UnknownEventType
from receiver.core.status import CONTENT_TYPE_KIND, STATUS_FOR_EVENT, normalize_status

__all__ = [
    "CONTENT_TYPES",
    "CONTENT_TYPE_FOR_CLASS",
    "EVENT_CLASSES",
    "EVENT_TYPES",
    "MAX_EVENT_ID_LENGTH",
    "RESOURCE_TYPES",
    "Dispute",
    "Event",
    "Invoice",
    "Mandate",
    "ObjectRef",
    "Payment",
    "Payout",
    "Refund",
    "Resource",
    "Subscription",
    "parse_event",
    "validate_event_type",
]

#: Event classes (Hyperswitch ``EventClass``), in the processor's order.
EVENT_CLASSES: Final = ("payments", "refunds", "disputes", "mandates", "payouts", "subscriptions")

#: Content types (``content.type``, Hyperswitch ``EventObjectType``).
CONTENT_TYPES: Final = (
    "payment_details",
    "refund_details",
    "dispute_details",
    "mandate_details",
    "payout_details",
    "subscription_details",
)

#: The content type an event of each class carries.
CONTENT_TYPE_FOR_CLASS: Final[Mapping[str, str]] = MappingProxyType(
    dict(zip(EVENT_CLASSES, CONTENT_TYPES, strict=True))
)

#: All 29 Hyperswitch event types to their event class.
EVENT_TYPES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "payment_succeeded": "payments",
        "payment_failed": "payments",
        "payment_processing": "payments",
        "payment_cancelled": "payments",
        "payment_cancelled_post_capture": "payments",
        "payment_authorized": "payments",
        "payment_partially_authorized": "payments",
        "payment_captured": "payments",
        "payment_expired": "payments",
        "action_required": "payments",
        "refund_succeeded": "refunds",
        "refund_failed": "refunds",
        "dispute_opened": "disputes",
        "dispute_expired": "disputes",
        "dispute_accepted": "disputes",
        "dispute_cancelled": "disputes",
        "dispute_challenged": "disputes",
        "dispute_won": "disputes",
        "dispute_lost": "disputes",
        "mandate_active": "mandates",
        "mandate_revoked": "mandates",
        "payout_success": "payouts",
        "payout_failed": "payouts",
        "payout_initiated": "payouts",
        "payout_processing": "payouts",
        "payout_cancelled": "payouts",
        "payout_expired": "payouts",
        "payout_reversed": "payouts",
        "invoice_paid": "subscriptions",
    }
)

#: Longest accepted ``event_id`` (Hyperswitch sends ``evt_`` + 32 hex characters).
MAX_EVENT_ID_LENGTH: Final = 255


# --------------------------------------------------------------------------------------------
# Lenient field readers: the wrong type becomes ``None``, never an exception.
# --------------------------------------------------------------------------------------------


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _minor_unit(value: object) -> int | None:
    """An amount in the lowest unit sent as an integer or as a string of digits (``"1000"``)."""
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text[:1] == "-" else text
        if digits.isascii() and digits.isdigit():
            return int(text)
        return None
    return _int(value)


def _mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, dict) else None


def _datetime(value: object) -> datetime | None:
    """An ISO 8601 timestamp as an aware UTC datetime; naive values are taken as UTC."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        return None


def parse_timestamp(value: object) -> datetime | None:
    """Parse a processor timestamp (ISO 8601) to an aware UTC datetime; ``None`` if invalid."""
    return _datetime(value)


def _card(data: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    container = _mapping(data.get(key))
    if container is None:
        return None
    return _mapping(container.get("card"))


# --------------------------------------------------------------------------------------------
# Resources
# --------------------------------------------------------------------------------------------


class _ResourceBase:
    """Shared behaviour of the resources: a repr that never shows card data or ``raw``."""

    __slots__ = ()

    kind: ClassVar[str]

    def __repr__(self) -> str:
        parts = [
            f"kind={self.kind!r}",
            f"id={getattr(self, 'object_id', None)!r}",
            f"status={getattr(self, 'status', None)!r}",
        ]
        amount = getattr(self, "amount", None)
        currency = getattr(self, "currency", None)
        if amount is not None:
            parts.append(f"amount={amount!r}")
        if currency is not None:
            parts.append(f"currency={currency!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    @property
    def created_time(self) -> datetime | None:
        """When the processor created the object (``created`` or ``created_at``), if known."""
        value = getattr(self, "created", None) or getattr(self, "created_at", None)
        return value if isinstance(value, datetime) else None


@dataclass(frozen=True, kw_only=True, slots=True, repr=False)
class Payment(_ResourceBase):
    """A payment (Hyperswitch ``PaymentsResponse``, content type ``payment_details``)."""

    kind: ClassVar[str] = "payment"

    payment_id: str | None
    merchant_id: str | None = None
    status: str | None = None
    amount: int | None = None
    net_amount: int | None = None
    amount_capturable: int | None = None
    amount_received: int | None = None
    currency: str | None = None
    capture_method: str | None = None
    payment_method: str | None = None
    payment_method_type: str | None = None
    card_last4: str | None = None
    card_network: str | None = None
    customer_id: str | None = None
    description: str | None = None
    metadata: Mapping[str, Any] | None = None
    connector: str | None = None
    connector_transaction_id: str | None = None
    profile_id: str | None = None
    mandate_id: str | None = None
    merchant_order_reference_id: str | None = None
    attempt_count: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    unified_code: str | None = None
    unified_message: str | None = None
    cancellation_reason: str | None = None
    created: datetime | None = None
    modified_at: datetime | None = None
    updated: datetime | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def object_id(self) -> str | None:
        """The payment id."""
        return self.payment_id

    @property
    def failure(self) -> UnifiedCode | None:
        """The unified decline code with retry advice, or ``None`` when there is none."""
        return describe_unified_code(self.unified_code)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Payment:
        """Build from a ``PaymentsResponse`` dict; wrong-typed fields become ``None``."""
        card = _card(data, "payment_method_data") or {}
        return cls(
            payment_id=_str(data.get("payment_id")),
            merchant_id=_str(data.get("merchant_id")),
            status=_str(data.get("status")),
            amount=_int(data.get("amount")),
            net_amount=_int(data.get("net_amount")),
            amount_capturable=_int(data.get("amount_capturable")),
            amount_received=_int(data.get("amount_received")),
            currency=_str(data.get("currency")),
            capture_method=_str(data.get("capture_method")),
            payment_method=_str(data.get("payment_method")),
            payment_method_type=_str(data.get("payment_method_type")),
            card_last4=_str(card.get("last4")),
            card_network=_str(card.get("card_network")),
            customer_id=_str(data.get("customer_id")),
            description=_str(data.get("description")),
            metadata=_mapping(data.get("metadata")),
            connector=_str(data.get("connector")),
            connector_transaction_id=_str(data.get("connector_transaction_id")),
            profile_id=_str(data.get("profile_id")),
            mandate_id=_str(data.get("mandate_id")),
            merchant_order_reference_id=_str(data.get("merchant_order_reference_id")),
            attempt_count=_int(data.get("attempt_count")),
            error_code=_str(data.get("error_code")),
            error_message=_str(data.get("error_message")),
            unified_code=_str(data.get("unified_code")),
            unified_message=_str(data.get("unified_message")),
            cancellation_reason=_str(data.get("cancellation_reason")),
            created=_datetime(data.get("created")),
            modified_at=_datetime(data.get("modified_at")),
            updated=_datetime(data.get("updated")),
            raw=data,
        )


@dataclass(frozen=True, kw_only=True, slots=True, repr=False)
class Refund(_ResourceBase):
    """A refund (Hyperswitch ``RefundResponse``, content type ``refund_details``).

    ``status`` is normalised to the API enum (``succeeded``, ``failed``, ``pending``,
    ``review``) when it arrives in Hyperswitch's internal spelling (``success``, ...).
    """

    kind: ClassVar[str] = "refund"

    refund_id: str | None
    payment_id: str | None = None
    status: str | None = None
    amount: int | None = None
    currency: str | None = None
    reason: str | None = None
    metadata: Mapping[str, Any] | None = None
    connector: str | None = None
    profile_id: str | None = None
    merchant_connector_id: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    unified_code: str | None = None
    unified_message: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def object_id(self) -> str | None:
        """The refund id."""
        return self.refund_id

    @property
    def failure(self) -> UnifiedCode | None:
        """The unified error code with retry advice, or ``None`` when there is none."""
        return describe_unified_code(self.unified_code)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Refund:
        """Build from a ``RefundResponse`` dict; wrong-typed fields become ``None``."""
        return cls(
            refund_id=_str(data.get("refund_id")),
            payment_id=_str(data.get("payment_id")),
            status=normalize_status("refund", _str(data.get("status"))),
            amount=_int(data.get("amount")),
            currency=_str(data.get("currency")),
            reason=_str(data.get("reason")),
            metadata=_mapping(data.get("metadata")),
            connector=_str(data.get("connector")),
            profile_id=_str(data.get("profile_id")),
            merchant_connector_id=_str(data.get("merchant_connector_id")),
            error_code=_str(data.get("error_code")),
            error_message=_str(data.get("error_message")),
            unified_code=_str(data.get("unified_code")),
            unified_message=_str(data.get("unified_message")),
            created_at=_datetime(data.get("created_at")),
            updated_at=_datetime(data.get("updated_at")),
            raw=data,
        )


@dataclass(frozen=True, kw_only=True, slots=True, repr=False)
class Dispute(_ResourceBase):
    """A dispute (Hyperswitch ``DisputeResponse``, content type ``dispute_details``).

    Hyperswitch sends ``amount`` as a *string* minor unit (``"1000"``); :attr:`amount` is
    the parsed integer (``None`` when it is not a whole number) and ``raw`` keeps the string.
    """

    kind: ClassVar[str] = "dispute"

    dispute_id: str | None
    payment_id: str | None = None
    attempt_id: str | None = None
    amount: int | None = None
    currency: str | None = None
    dispute_stage: str | None = None
    dispute_status: str | None = None
    connector: str | None = None
    connector_status: str | None = None
    connector_dispute_id: str | None = None
    connector_reason: str | None = None
    connector_reason_code: str | None = None
    challenge_required_by: datetime | None = None
    connector_created_at: datetime | None = None
    connector_updated_at: datetime | None = None
    created_at: datetime | None = None
    profile_id: str | None = None
    merchant_connector_id: str | None = None
    is_already_refunded: bool | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def object_id(self) -> str | None:
        """The dispute id."""
        return self.dispute_id

    @property
    def status(self) -> str | None:
        """The dispute status (``dispute_status``), for example ``dispute_opened``."""
        return self.dispute_status

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Dispute:
        """Build from a ``DisputeResponse`` dict; wrong-typed fields become ``None``."""
        return cls(
            dispute_id=_str(data.get("dispute_id")),
            payment_id=_str(data.get("payment_id")),
            attempt_id=_str(data.get("attempt_id")),
            amount=_minor_unit(data.get("amount")),
            currency=_str(data.get("currency")),
            dispute_stage=_str(data.get("dispute_stage")),
            dispute_status=_str(data.get("dispute_status")),
            connector=_str(data.get("connector")),
            connector_status=_str(data.get("connector_status")),
            connector_dispute_id=_str(data.get("connector_dispute_id")),
            connector_reason=_str(data.get("connector_reason")),
            connector_reason_code=_str(data.get("connector_reason_code")),
            challenge_required_by=_datetime(data.get("challenge_required_by")),
            connector_created_at=_datetime(data.get("connector_created_at")),
            connector_updated_at=_datetime(data.get("connector_updated_at")),
            created_at=_datetime(data.get("created_at")),
            profile_id=_str(data.get("profile_id")),
            merchant_connector_id=_str(data.get("merchant_connector_id")),
            is_already_refunded=_bool(data.get("is_already_refunded")),
            raw=data,
        )


@dataclass(frozen=True, kw_only=True, slots=True, repr=False)
class Mandate(_ResourceBase):
    """A mandate (Hyperswitch ``MandateResponse``, content type ``mandate_details``)."""

    kind: ClassVar[str] = "mandate"

    mandate_id: str | None
    status: str | None = None
    payment_method_id: str | None = None
    payment_method: str | None = None
    payment_method_type: str | None = None
    card_last4: str | None = None
    card_network: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def object_id(self) -> str | None:
        """The mandate id."""
        return self.mandate_id

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Mandate:
        """Build from a ``MandateResponse`` dict; wrong-typed fields become ``None``."""
        card = _mapping(data.get("card")) or {}
        return cls(
            mandate_id=_str(data.get("mandate_id")),
            status=_str(data.get("status")),
            payment_method_id=_str(data.get("payment_method_id")),
            payment_method=_str(data.get("payment_method")),
            payment_method_type=_str(data.get("payment_method_type")),
            card_last4=_str(card.get("last4_digits")),
            card_network=_str(card.get("card_network")),
            raw=data,
        )


@dataclass(frozen=True, kw_only=True, slots=True, repr=False)
class Payout(_ResourceBase):
    """A payout (Hyperswitch ``PayoutCreateResponse``, content type ``payout_details``)."""

    kind: ClassVar[str] = "payout"

    payout_id: str | None
    merchant_id: str | None = None
    merchant_order_reference_id: str | None = None
    status: str | None = None
    amount: int | None = None
    currency: str | None = None
    payout_type: str | None = None
    connector: str | None = None
    connector_transaction_id: str | None = None
    customer_id: str | None = None
    description: str | None = None
    entity_type: str | None = None
    auto_fulfill: bool | None = None
    recurring: bool | None = None
    metadata: Mapping[str, Any] | None = None
    profile_id: str | None = None
    merchant_connector_id: str | None = None
    payout_method_id: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    unified_code: str | None = None
    unified_message: str | None = None
    created: datetime | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def object_id(self) -> str | None:
        """The payout id."""
        return self.payout_id

    @property
    def failure(self) -> UnifiedCode | None:
        """The unified error code with retry advice, or ``None`` when there is none."""
        return describe_unified_code(self.unified_code)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Payout:
        """Build from a ``PayoutCreateResponse`` dict; wrong-typed fields become ``None``."""
        return cls(
            payout_id=_str(data.get("payout_id")),
            merchant_id=_str(data.get("merchant_id")),
            merchant_order_reference_id=_str(data.get("merchant_order_reference_id")),
            status=_str(data.get("status")),
            amount=_int(data.get("amount")),
            currency=_str(data.get("currency")),
            payout_type=_str(data.get("payout_type")),
            connector=_str(data.get("connector")),
            connector_transaction_id=_str(data.get("connector_transaction_id")),
            customer_id=_str(data.get("customer_id")),
            description=_str(data.get("description")),
            entity_type=_str(data.get("entity_type")),
            auto_fulfill=_bool(data.get("auto_fulfill")),
            recurring=_bool(data.get("recurring")),
            metadata=_mapping(data.get("metadata")),
            profile_id=_str(data.get("profile_id")),
            merchant_connector_id=_str(data.get("merchant_connector_id")),
            payout_method_id=_str(data.get("payout_method_id")),
            error_code=_str(data.get("error_code")),
            error_message=_str(data.get("error_message")),
            unified_code=_str(data.get("unified_code")),
            unified_message=_str(data.get("unified_message")),
            created=_datetime(data.get("created")),
            raw=data,
        )


@dataclass(frozen=True, kw_only=True, slots=True, repr=False)
class Invoice(_ResourceBase):
    """A subscription's invoice (Hyperswitch ``Invoice``), nested in :class:`Subscription`."""

    kind: ClassVar[str] = "invoice"

    id: str | None
    subscription_id: str | None = None
    merchant_id: str | None = None
    profile_id: str | None = None
    merchant_connector_id: str | None = None
    payment_intent_id: str | None = None
    payment_method_id: str | None = None
    customer_id: str | None = None
    amount: int | None = None
    currency: str | None = None
    status: str | None = None
    billing_processor_invoice_id: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def object_id(self) -> str | None:
        """The invoice id."""
        return self.id

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Invoice:
        """Build from an ``Invoice`` dict; wrong-typed fields become ``None``."""
        return cls(
            id=_str(data.get("id")),
            subscription_id=_str(data.get("subscription_id")),
            merchant_id=_str(data.get("merchant_id")),
            profile_id=_str(data.get("profile_id")),
            merchant_connector_id=_str(data.get("merchant_connector_id")),
            payment_intent_id=_str(data.get("payment_intent_id")),
            payment_method_id=_str(data.get("payment_method_id")),
            customer_id=_str(data.get("customer_id")),
            amount=_minor_unit(data.get("amount")),
            currency=_str(data.get("currency")),
            status=_str(data.get("status")),
            billing_processor_invoice_id=_str(data.get("billing_processor_invoice_id")),
            raw=data,
        )


@dataclass(frozen=True, kw_only=True, slots=True, repr=False)
class Subscription(_ResourceBase):
    """A subscription (``ConfirmSubscriptionResponse``, content type ``subscription_details``).

    The object hookledger tracks is the subscription's *invoice* (kind ``invoice``): every
    billing cycle is its own object. So :attr:`object_id` is the invoice id (falling back to
    the subscription id), :attr:`status` is the invoice status, and the subscription's own
    status (``active``, ``unpaid``, ...) is :attr:`subscription_status`.
    """

    kind: ClassVar[str] = "invoice"

    id: str | None
    subscription_status: str | None = None
    merchant_id: str | None = None
    merchant_reference_id: str | None = None
    plan_id: str | None = None
    item_price_id: str | None = None
    coupon: str | None = None
    profile_id: str | None = None
    customer_id: str | None = None
    billing_processor_subscription_id: str | None = None
    payment_id: str | None = None
    payment_status: str | None = None
    invoice: Invoice | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def object_id(self) -> str | None:
        """The invoice id, or the subscription id when the body has no invoice id."""
        if self.invoice is not None and self.invoice.id is not None:
            return self.invoice.id
        return self.id

    @property
    def status(self) -> str | None:
        """The invoice status (for example ``invoice_paid``), ``None`` without an invoice."""
        return self.invoice.status if self.invoice is not None else None

    @property
    def amount(self) -> int | None:
        """The invoice amount in the lowest unit."""
        return self.invoice.amount if self.invoice is not None else None

    @property
    def currency(self) -> str | None:
        """The invoice currency."""
        return self.invoice.currency if self.invoice is not None else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Subscription:
        """Build from a ``ConfirmSubscriptionResponse`` dict; wrong-typed fields become ``None``."""
        invoice_data = _mapping(data.get("invoice"))
        payment = _mapping(data.get("payment")) or {}
        return cls(
            id=_str(data.get("id")),
            subscription_status=_str(data.get("status")),
            merchant_id=_str(data.get("merchant_id")),
            merchant_reference_id=_str(data.get("merchant_reference_id")),
            plan_id=_str(data.get("plan_id")),
            item_price_id=_str(data.get("item_price_id")),
            coupon=_str(data.get("coupon")),
            profile_id=_str(data.get("profile_id")),
            customer_id=_str(data.get("customer_id")),
            billing_processor_subscription_id=_str(data.get("billing_processor_subscription_id")),
            payment_id=_str(payment.get("payment_id")),
            payment_status=_str(payment.get("status")),
            invoice=Invoice.from_dict(invoice_data) if invoice_data is not None else None,
            raw=data,
        )


#: Any resource an event can carry.
Resource: TypeAlias = Payment | Refund | Dispute | Mandate | Payout | Subscription

#: Content type to the resource class that parses it.
RESOURCE_TYPES: Final[Mapping[str, type[Resource]]] = MappingProxyType(
    {
        "payment_details": Payment,
        "refund_details": Refund,
        "dispute_details": Dispute,
        "mandate_details": Mandate,
        "payout_details": Payout,
        "subscription_details": Subscription,
    }
)


_R = TypeVar("_R", Payment, Refund, Dispute, Mandate, Payout, Subscription)


def _parse_resource(content_type: str | None, data: Mapping[str, Any]) -> Resource | None:
    if content_type is None:
        return None
    resource_type = RESOURCE_TYPES.get(content_type)
    if resource_type is None:
        return None
    return resource_type.from_dict(data)


# --------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an event is about: its kind, id, the status the event reports and, for a
    dispute, its stage."""

    kind: str
    object_id: str
    status: str | None
    stage: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """A parsed webhook event.

    Only the envelope is validated (see :func:`parse_event`); the content is parsed leniently
    into a typed resource (``object``), which is ``None`` for a missing or unknown content
    type. ``raw`` is the whole parsed body.
    """

    event_id: str
    event_type: str
    event_class: str | None = None
    merchant_id: str | None = None
    timestamp: datetime | None = None
    content_type: str | None = None
    object: Resource | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Event:
        """Build an event from a parsed body; raises :class:`MalformedEvent` on a bad envelope.

        The envelope needs a non-empty string ``event_id`` of at most 255 characters. An
        unknown ``event_type`` (a missing or non-string one becomes ``""``), an unknown or
        missing content type and unknown fields are accepted.
        """
        if not isinstance(data, Mapping):
            raise MalformedEvent(f"webhook body must be a JSON object, not {json_type(data)}")
        event_id = data.get("event_id")
        if event_id is None:
            raise MalformedEvent("webhook body has no event_id")
        if not isinstance(event_id, str):
            raise MalformedEvent(f"event_id must be a string, not {json_type(event_id)}")
        if not event_id.strip():
            raise MalformedEvent("event_id is empty")
        if len(event_id) > MAX_EVENT_ID_LENGTH:
            raise MalformedEvent(
                f"event_id is {len(event_id)} characters long (at most {MAX_EVENT_ID_LENGTH})"
            )
        event_type = _str(data.get("event_type")) or ""
        content = _mapping(data.get("content")) or {}
        content_type = _str(content.get("type"))
        obj = _mapping(content.get("object"))
        return cls(
            event_id=event_id,
            event_type=event_type,
            event_class=EVENT_TYPES.get(event_type),
            merchant_id=_str(data.get("merchant_id")),
            timestamp=_datetime(data.get("timestamp")),
            content_type=content_type,
            object=_parse_resource(content_type, obj) if obj is not None else None,
            raw=data,
        )

    @property
    def is_known(self) -> bool:
        """True when ``event_type`` is one of the 29 Hyperswitch event types."""
        return self.event_type in EVENT_TYPES

    @property
    def kind(self) -> str | None:
        """The object kind of the content type (``payment``, ..., ``invoice``), else ``None``."""
        if self.content_type is None:
            return None
        return CONTENT_TYPE_KIND.get(self.content_type)

    @property
    def object_ref(self) -> ObjectRef | None:
        """Kind, id and status of the object; ``None`` without a typed object or a non-empty id.

        When the object carries no status, the status the event type implies is used
        (``receiver.core.status.STATUS_FOR_EVENT``), provided the event type is about that kind.
        """
        resource = self.object
        if resource is None:
            return None
        object_id = resource.object_id
        if object_id is None or not object_id.strip():
            return None
        status = resource.status
        if status is None:
            implied = STATUS_FOR_EVENT.get(self.event_type)
            if implied is not None and implied[0] == resource.kind:
                status = implied[1]
        stage = resource.dispute_stage if isinstance(resource, Dispute) else None
        return ObjectRef(kind=resource.kind, object_id=object_id, status=status, stage=stage)

    def _expect(self, resource_type: type[_R], content_type: str) -> _R:
        if isinstance(self.object, resource_type):
            return self.object
        if self.object is None and self.content_type == content_type:
            actual = f"{content_type!r} content without an object"
        else:
            actual = f"content type {self.content_type!r}"
        raise AttributeError(
            f"event {self.event_id} ({self.event_type or 'no event_type'}) carries {actual}, "
            f"not {content_type!r}"
        )

    @property
    def payment(self) -> Payment:
        """The payment; ``AttributeError`` when the content is not ``payment_details``."""
        return self._expect(Payment, "payment_details")

    @property
    def refund(self) -> Refund:
        """The refund; ``AttributeError`` when the content is not ``refund_details``."""
        return self._expect(Refund, "refund_details")

    @property
    def dispute(self) -> Dispute:
        """The dispute; ``AttributeError`` when the content is not ``dispute_details``."""
        return self._expect(Dispute, "dispute_details")

    @property
    def mandate(self) -> Mandate:
        """The mandate; ``AttributeError`` when the content is not ``mandate_details``."""
        return self._expect(Mandate, "mandate_details")

    @property
    def payout(self) -> Payout:
        """The payout; ``AttributeError`` when the content is not ``payout_details``."""
        return self._expect(Payout, "payout_details")

    @property
    def subscription(self) -> Subscription:
        """The subscription; ``AttributeError`` when the content is not ``subscription_details``."""
        return self._expect(Subscription, "subscription_details")


def json_type(value: object) -> str:
    """The JSON type of a decoded value, as a noun phrase (``"an object"``, ``"null"``...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_event(body: bytes) -> Event:
    """Parse a raw webhook body into an :class:`Event`.

    Raises :class:`MalformedEvent` when the body is not UTF-8, not JSON (``NaN`` and
    ``Infinity`` included), not a JSON object, nested too deeply to parse, or has no usable
    ``event_id`` (missing, not a string, empty or longer than 255 characters).
    """
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedEvent(
            f"webhook body is not valid UTF-8 (bad byte at position {exc.start})"
        ) from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise MalformedEvent("webhook body is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise MalformedEvent(
            f"webhook body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except ValueError as exc:
        raise MalformedEvent(f"webhook body is not valid JSON: {exc}") from None
    event = Event.from_dict(data)
    _check_storable(event)
    return event


def _check_storable(event: Event) -> None:
    """Refuse text no database column can hold: NUL characters (PostgreSQL rejects them) and
    unpaired surrogates (from JSON escapes like ``\\ud800``; not encodable as UTF-8)."""
    ref = event.object_ref
    fields = {
        "event_id": event.event_id,
        "event_type": event.event_type,
        "merchant_id": event.merchant_id,
        "content.type": event.content_type,
        "object id": ref.object_id if ref else None,
        "object status": ref.status if ref else None,
        "dispute stage": ref.stage if ref else None,
    }
    for name, value in fields.items():
        if value is None:
            continue
        if "\x00" in value:
            raise MalformedEvent(f"{name} contains a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedEvent(f"{name} contains an unpaired surrogate escape") from None


def validate_event_type(name: str) -> str:
    """Return ``name`` if it is a Hyperswitch event type, else raise :class:`UnknownEventType`.

    The error suggests the closest event type ("did you mean ...?") when one is close.
    """
    if isinstance(name, str) and name in EVENT_TYPES:
        return name
    if not isinstance(name, str):
        raise UnknownEventType(f"event type must be a string, not {type(name).__name__}")
    probe = name.strip().lower().replace(".", "_").replace("-", "_").replace(" ", "_")
    # Prefer an event type of the same family (``payout_succeeded`` -> ``payout_success``,
    # not ``payment_succeeded``), then any close one.
    family = [known for known in EVENT_TYPES if known.split("_")[0] == probe.split("_")[0]]
    matches = difflib.get_close_matches(probe, family, n=1, cutoff=0.6)
    matches = matches or difflib.get_close_matches(probe, list(EVENT_TYPES), n=1, cutoff=0.6)
    hint = f"; did you mean {matches[0]!r}?" if matches else ""
    raise UnknownEventType(f"unknown event type {name!r}{hint}")
