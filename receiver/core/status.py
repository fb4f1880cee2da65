"""Status vocabulary and the status-to-event mapping (pure, no I/O).

Which moves between statuses are forward is the transition model's business
(:mod:`receiver.core.transitions`); this module names the statuses and events.

The status-to-event mapping follows Hyperswitch (``common_enums/src/transformers.rs``), see
``hyperswitch-facts.md`` section 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

#: Object kinds hookledger tracks. ``invoice`` is the object of ``invoice_paid`` (a subscription's
#: invoice): each invoice is its own object, so every billing cycle is a new transition.
OBJECT_KINDS: Final = ("payment", "refund", "dispute", "mandate", "payout", "invoice")

#: Content type (``content.type``) to object kind.
CONTENT_TYPE_KIND: Final[Mapping[str, str]] = {
    "payment_details": "payment",
    "refund_details": "refund",
    "dispute_details": "dispute",
    "mandate_details": "mandate",
    "payout_details": "payout",
    "subscription_details": "invoice",
}

#: Hyperswitch's internal refund enum (used in list filters and profile configs) to the API enum.
REFUND_STATUS_ALIASES: Final[Mapping[str, str]] = {
    "success": "succeeded",
    "failure": "failed",
    "transaction_failure": "failed",
    "manual_review": "review",
    "Success": "succeeded",
    "Failure": "failed",
    "TransactionFailure": "failed",
    "ManualReview": "review",
    "Pending": "pending",
}

#: Hyperswitch ``DisputeStatus``: each status is also the name of its event.
DISPUTE_STATUSES: Final = (
    "dispute_opened",
    "dispute_expired",
    "dispute_accepted",
    "dispute_cancelled",
    "dispute_challenged",
    "dispute_won",
    "dispute_lost",
)

_PAYMENT_EVENTS: Final[Mapping[str, str]] = {
    "succeeded": "payment_succeeded",
    "failed": "payment_failed",
    "processing": "payment_processing",
    "partially_captured_and_processing": "payment_processing",
    "requires_merchant_action": "action_required",
    "requires_customer_action": "action_required",
    "conflicted": "action_required",
    "cancelled": "payment_cancelled",
    "cancelled_post_capture": "payment_cancelled_post_capture",
    "expired": "payment_expired",
    "partially_captured": "payment_captured",
    "partially_captured_and_capturable": "payment_captured",
    "requires_capture": "payment_authorized",
    "partially_authorized_and_requires_capture": "payment_partially_authorized",
}

_EVENT_FOR_STATUS: Final[Mapping[str, Mapping[str, str]]] = {
    "payment": _PAYMENT_EVENTS,
    "refund": {"succeeded": "refund_succeeded", "failed": "refund_failed"},
    "dispute": {status: status for status in DISPUTE_STATUSES},
    "mandate": {"active": "mandate_active", "revoked": "mandate_revoked"},
    "payout": {
        "success": "payout_success",
        "failed": "payout_failed",
        "cancelled": "payout_cancelled",
        "initiated": "payout_initiated",
        "expired": "payout_expired",
        "reversed": "payout_reversed",
    },
    "invoice": {"invoice_paid": "invoice_paid"},
}

#: The status an event type implies when its object carries none (for example a sparse body).
STATUS_FOR_EVENT: Final[Mapping[str, tuple[str, str]]] = {
    "payment_succeeded": ("payment", "succeeded"),
    "payment_failed": ("payment", "failed"),
    "payment_processing": ("payment", "processing"),
    "payment_cancelled": ("payment", "cancelled"),
    "payment_cancelled_post_capture": ("payment", "cancelled_post_capture"),
    "payment_authorized": ("payment", "requires_capture"),
    "payment_partially_authorized": ("payment", "partially_authorized_and_requires_capture"),
    "payment_captured": ("payment", "partially_captured"),
    "payment_expired": ("payment", "expired"),
    "action_required": ("payment", "requires_customer_action"),
    "refund_succeeded": ("refund", "succeeded"),
    "refund_failed": ("refund", "failed"),
    **{status: ("dispute", status) for status in DISPUTE_STATUSES},
    "mandate_active": ("mandate", "active"),
    "mandate_revoked": ("mandate", "revoked"),
    "payout_success": ("payout", "success"),
    "payout_failed": ("payout", "failed"),
    "payout_initiated": ("payout", "initiated"),
    "payout_processing": ("payout", "pending"),
    "payout_cancelled": ("payout", "cancelled"),
    "payout_expired": ("payout", "expired"),
    "payout_reversed": ("payout", "reversed"),
    "invoice_paid": ("invoice", "invoice_paid"),
}


def normalize_status(kind: str, status: str | None) -> str | None:
    """Return the API spelling of ``status`` (refund statuses arrive in two enums)."""
    if status is None:
        return None
    if kind == "refund":
        return REFUND_STATUS_ALIASES.get(status, status)
    return status


def event_type_for_status(kind: str, status: str | None) -> str | None:
    """The event Hyperswitch emits when an object of ``kind`` reaches ``status`` (or ``None``)."""
    normalized = normalize_status(kind, status)
    if normalized is None:
        return None
    return _EVENT_FOR_STATUS.get(kind, {}).get(normalized)
