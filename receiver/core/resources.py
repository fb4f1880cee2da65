"""The typed resources an event carries: payments, refunds, disputes, mandates, payouts,
invoices and subscriptions (pure, no I/O). Frozen, keyword-only, read leniently from the
body's ``content.object``; a repr never shows card data or ``raw``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, ClassVar, Final, TypeAlias

from receiver.core.codes import UnifiedCode, describe_unified_code
from receiver.core.fields import (
    read_bool,
    read_card,
    read_datetime,
    read_int,
    read_mapping,
    read_minor_unit,
    read_str,
)
from receiver.core.status import normalize_status


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


@dataclass(frozen=True, slots=True)
class Reference:
    """What the receive path needs of a resource: the object's kind, id, status, dispute
    stage, business profile and creation time, read from ``content.object`` as the typed
    resource reads them (each class's ``reference``), without building the resource.
    ``tests/receiver/core/test_event_reference.py`` holds them equal for any body."""

    kind: str
    object_id: str | None
    status: str | None
    stage: str | None = None
    profile_id: str | None = None
    created_time: datetime | None = None

    @classmethod
    def of(cls, resource: Resource) -> Reference:
        """The reference of a typed resource."""
        profile = getattr(resource, "profile_id", None)
        return cls(
            kind=resource.kind,
            object_id=resource.object_id,
            status=resource.status,
            stage=resource.dispute_stage if isinstance(resource, Dispute) else None,
            profile_id=profile if isinstance(profile, str) else None,
            created_time=resource.created_time,
        )


def _read_reference(
    kind: str,
    data: Mapping[str, Any],
    id_key: str,
    *,
    status_key: str = "status",
    stage_key: str | None = None,
    created_key: str | None = None,
    profile: bool = True,
) -> Reference:
    """A reference read from ``data`` by the keys its resource class reads them from."""
    status = read_str(data.get(status_key))
    return Reference(
        kind=kind,
        object_id=read_str(data.get(id_key)),
        status=normalize_status(kind, status),
        stage=read_str(data.get(stage_key)) if stage_key else None,
        profile_id=read_str(data.get("profile_id")) if profile else None,
        created_time=read_datetime(data.get(created_key)) if created_key else None,
    )


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
    def reference(cls, data: Mapping[str, Any]) -> Reference:
        """:meth:`Reference.of` ``from_dict(data)``, read without building the resource."""
        return _read_reference(cls.kind, data, "payment_id", created_key="created")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Payment:
        """Build from a ``PaymentsResponse`` dict; wrong-typed fields become ``None``."""
        card = read_card(data, "payment_method_data") or {}
        return cls(
            payment_id=read_str(data.get("payment_id")),
            merchant_id=read_str(data.get("merchant_id")),
            status=read_str(data.get("status")),
            amount=read_int(data.get("amount")),
            net_amount=read_int(data.get("net_amount")),
            amount_capturable=read_int(data.get("amount_capturable")),
            amount_received=read_int(data.get("amount_received")),
            currency=read_str(data.get("currency")),
            capture_method=read_str(data.get("capture_method")),
            payment_method=read_str(data.get("payment_method")),
            payment_method_type=read_str(data.get("payment_method_type")),
            card_last4=read_str(card.get("last4")),
            card_network=read_str(card.get("card_network")),
            customer_id=read_str(data.get("customer_id")),
            description=read_str(data.get("description")),
            metadata=read_mapping(data.get("metadata")),
            connector=read_str(data.get("connector")),
            connector_transaction_id=read_str(data.get("connector_transaction_id")),
            profile_id=read_str(data.get("profile_id")),
            mandate_id=read_str(data.get("mandate_id")),
            merchant_order_reference_id=read_str(data.get("merchant_order_reference_id")),
            attempt_count=read_int(data.get("attempt_count")),
            error_code=read_str(data.get("error_code")),
            error_message=read_str(data.get("error_message")),
            unified_code=read_str(data.get("unified_code")),
            unified_message=read_str(data.get("unified_message")),
            cancellation_reason=read_str(data.get("cancellation_reason")),
            created=read_datetime(data.get("created")),
            modified_at=read_datetime(data.get("modified_at")),
            updated=read_datetime(data.get("updated")),
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
    def reference(cls, data: Mapping[str, Any]) -> Reference:
        """:meth:`Reference.of` ``from_dict(data)``, read without building the resource."""
        return _read_reference(cls.kind, data, "refund_id", created_key="created_at")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Refund:
        """Build from a ``RefundResponse`` dict; wrong-typed fields become ``None``."""
        return cls(
            refund_id=read_str(data.get("refund_id")),
            payment_id=read_str(data.get("payment_id")),
            status=normalize_status("refund", read_str(data.get("status"))),
            amount=read_int(data.get("amount")),
            currency=read_str(data.get("currency")),
            reason=read_str(data.get("reason")),
            metadata=read_mapping(data.get("metadata")),
            connector=read_str(data.get("connector")),
            profile_id=read_str(data.get("profile_id")),
            merchant_connector_id=read_str(data.get("merchant_connector_id")),
            error_code=read_str(data.get("error_code")),
            error_message=read_str(data.get("error_message")),
            unified_code=read_str(data.get("unified_code")),
            unified_message=read_str(data.get("unified_message")),
            created_at=read_datetime(data.get("created_at")),
            updated_at=read_datetime(data.get("updated_at")),
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
    def reference(cls, data: Mapping[str, Any]) -> Reference:
        """:meth:`Reference.of` ``from_dict(data)``, read without building the resource."""
        return _read_reference(
            cls.kind,
            data,
            "dispute_id",
            status_key="dispute_status",
            stage_key="dispute_stage",
            created_key="created_at",
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Dispute:
        """Build from a ``DisputeResponse`` dict; wrong-typed fields become ``None``."""
        return cls(
            dispute_id=read_str(data.get("dispute_id")),
            payment_id=read_str(data.get("payment_id")),
            attempt_id=read_str(data.get("attempt_id")),
            amount=read_minor_unit(data.get("amount")),
            currency=read_str(data.get("currency")),
            dispute_stage=read_str(data.get("dispute_stage")),
            dispute_status=read_str(data.get("dispute_status")),
            connector=read_str(data.get("connector")),
            connector_status=read_str(data.get("connector_status")),
            connector_dispute_id=read_str(data.get("connector_dispute_id")),
            connector_reason=read_str(data.get("connector_reason")),
            connector_reason_code=read_str(data.get("connector_reason_code")),
            challenge_required_by=read_datetime(data.get("challenge_required_by")),
            connector_created_at=read_datetime(data.get("connector_created_at")),
            connector_updated_at=read_datetime(data.get("connector_updated_at")),
            created_at=read_datetime(data.get("created_at")),
            profile_id=read_str(data.get("profile_id")),
            merchant_connector_id=read_str(data.get("merchant_connector_id")),
            is_already_refunded=read_bool(data.get("is_already_refunded")),
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
    def reference(cls, data: Mapping[str, Any]) -> Reference:
        """:meth:`Reference.of` ``from_dict(data)``, read without building the resource."""
        return _read_reference(cls.kind, data, "mandate_id", profile=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Mandate:
        """Build from a ``MandateResponse`` dict; wrong-typed fields become ``None``."""
        card = read_mapping(data.get("card")) or {}
        return cls(
            mandate_id=read_str(data.get("mandate_id")),
            status=read_str(data.get("status")),
            payment_method_id=read_str(data.get("payment_method_id")),
            payment_method=read_str(data.get("payment_method")),
            payment_method_type=read_str(data.get("payment_method_type")),
            card_last4=read_str(card.get("last4_digits")),
            card_network=read_str(card.get("card_network")),
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
    def reference(cls, data: Mapping[str, Any]) -> Reference:
        """:meth:`Reference.of` ``from_dict(data)``, read without building the resource."""
        return _read_reference(cls.kind, data, "payout_id", created_key="created")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Payout:
        """Build from a ``PayoutCreateResponse`` dict; wrong-typed fields become ``None``."""
        return cls(
            payout_id=read_str(data.get("payout_id")),
            merchant_id=read_str(data.get("merchant_id")),
            merchant_order_reference_id=read_str(data.get("merchant_order_reference_id")),
            status=read_str(data.get("status")),
            amount=read_int(data.get("amount")),
            currency=read_str(data.get("currency")),
            payout_type=read_str(data.get("payout_type")),
            connector=read_str(data.get("connector")),
            connector_transaction_id=read_str(data.get("connector_transaction_id")),
            customer_id=read_str(data.get("customer_id")),
            description=read_str(data.get("description")),
            entity_type=read_str(data.get("entity_type")),
            auto_fulfill=read_bool(data.get("auto_fulfill")),
            recurring=read_bool(data.get("recurring")),
            metadata=read_mapping(data.get("metadata")),
            profile_id=read_str(data.get("profile_id")),
            merchant_connector_id=read_str(data.get("merchant_connector_id")),
            payout_method_id=read_str(data.get("payout_method_id")),
            error_code=read_str(data.get("error_code")),
            error_message=read_str(data.get("error_message")),
            unified_code=read_str(data.get("unified_code")),
            unified_message=read_str(data.get("unified_message")),
            created=read_datetime(data.get("created")),
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
            id=read_str(data.get("id")),
            subscription_id=read_str(data.get("subscription_id")),
            merchant_id=read_str(data.get("merchant_id")),
            profile_id=read_str(data.get("profile_id")),
            merchant_connector_id=read_str(data.get("merchant_connector_id")),
            payment_intent_id=read_str(data.get("payment_intent_id")),
            payment_method_id=read_str(data.get("payment_method_id")),
            customer_id=read_str(data.get("customer_id")),
            amount=read_minor_unit(data.get("amount")),
            currency=read_str(data.get("currency")),
            status=read_str(data.get("status")),
            billing_processor_invoice_id=read_str(data.get("billing_processor_invoice_id")),
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
    def reference(cls, data: Mapping[str, Any]) -> Reference:
        """:meth:`Reference.of` ``from_dict(data)``, read without building the resource."""
        return Reference.of(cls.from_dict(data))  # the invoice nested in it: rare, typed

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Subscription:
        """Build from a ``ConfirmSubscriptionResponse`` dict; wrong-typed fields become ``None``."""
        invoice_data = read_mapping(data.get("invoice"))
        payment = read_mapping(data.get("payment")) or {}
        return cls(
            id=read_str(data.get("id")),
            subscription_status=read_str(data.get("status")),
            merchant_id=read_str(data.get("merchant_id")),
            merchant_reference_id=read_str(data.get("merchant_reference_id")),
            plan_id=read_str(data.get("plan_id")),
            item_price_id=read_str(data.get("item_price_id")),
            coupon=read_str(data.get("coupon")),
            profile_id=read_str(data.get("profile_id")),
            customer_id=read_str(data.get("customer_id")),
            billing_processor_subscription_id=read_str(
                data.get("billing_processor_subscription_id")
            ),
            payment_id=read_str(payment.get("payment_id")),
            payment_status=read_str(payment.get("status")),
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


def reference_of(content_type: str | None, data: Mapping[str, Any]) -> Reference | None:
    """:meth:`Reference.of` ``parse_resource(content_type, data)``, without parsing it."""
    resource_type = _resource_type(content_type)
    return None if resource_type is None else resource_type.reference(data)


def parse_resource(content_type: str | None, data: Mapping[str, Any]) -> Resource | None:
    resource_type = _resource_type(content_type)
    return None if resource_type is None else resource_type.from_dict(data)


def _resource_type(content_type: str | None) -> type[Resource] | None:
    return None if content_type is None else RESOURCE_TYPES.get(content_type)
