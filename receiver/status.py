"""Status vocabulary, precedence and the status-to-event mapping (pure, no I/O).

Each object kind has a precedence order over its statuses. The staleness guard refuses an
event whose status ranks below the object's projected status: a ``processing`` event that
arrives after ``succeeded`` must not move the merchant's order back. Two statuses of the same
rank (for example the terminal ``failed`` and ``succeeded``) are ordered by event time.

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

_PAYMENT_RANK: Final[Mapping[str, int]] = {
    "requires_payment_method": 10,
    "requires_confirmation": 20,
    "requires_customer_action": 30,
    "requires_merchant_action": 30,
    "conflicted": 30,
    "processing": 40,
    "partially_authorized_and_requires_capture": 50,
    "requires_capture": 50,
    "partially_captured_and_processing": 55,
    "partially_captured_and_capturable": 60,
    "partially_captured": 70,
    "succeeded": 80,
    "failed": 80,
    "cancelled": 80,
    "expired": 80,
    "cancelled_post_capture": 90,
}

_REFUND_RANK: Final[Mapping[str, int]] = {
    "pending": 10,
    "review": 20,
    "succeeded": 80,
    "failed": 80,
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

_DISPUTE_RANK: Final[Mapping[str, int]] = {
    "dispute_opened": 10,
    "dispute_challenged": 30,
    "dispute_accepted": 80,
    "dispute_cancelled": 80,
    "dispute_expired": 80,
    "dispute_won": 80,
    "dispute_lost": 80,
}

_MANDATE_RANK: Final[Mapping[str, int]] = {
    "pending": 10,
    "active": 20,
    "inactive": 20,
    "revoked": 80,
}

_PAYOUT_RANK: Final[Mapping[str, int]] = {
    "requires_creation": 5,
    "requires_vendor_account_creation": 7,
    "requires_payout_method_data": 8,
    "requires_confirmation": 10,
    "requires_fulfillment": 20,
    "pending": 30,
    "initiated": 40,
    "success": 80,
    "failed": 80,
    "cancelled": 80,
    "expired": 80,
    "ineligible": 80,
    "reversed": 90,
}

_INVOICE_RANK: Final[Mapping[str, int]] = {
    "payment_pending": 10,
    "invoice_paid": 80,
}

RANKS: Final[Mapping[str, Mapping[str, int]]] = {
    "payment": _PAYMENT_RANK,
    "refund": _REFUND_RANK,
    "dispute": _DISPUTE_RANK,
    "mandate": _MANDATE_RANK,
    "payout": _PAYOUT_RANK,
    "invoice": _INVOICE_RANK,
}

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
    "dispute": {status: status for status in _DISPUTE_RANK},
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
    **{status: ("dispute", status) for status in _DISPUTE_RANK},
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


def rank(kind: str, status: str | None) -> int | None:
    """Precedence of ``status`` within ``kind``; ``None`` for an unknown kind or status."""
    normalized = normalize_status(kind, status)
    if normalized is None:
        return None
    return RANKS.get(kind, {}).get(normalized)


def event_type_for_status(kind: str, status: str | None) -> str | None:
    """The event Hyperswitch emits when an object of ``kind`` reaches ``status`` (or ``None``)."""
    normalized = normalize_status(kind, status)
    if normalized is None:
        return None
    return _EVENT_FOR_STATUS.get(kind, {}).get(normalized)


def is_backwards(kind: str, current: str | None, incoming: str | None) -> bool:
    """True when moving an object of ``kind`` from ``current`` to ``incoming`` goes backwards.

    Unknown statuses never count as backwards (they are stored and dispatched; a newer
    processor may add statuses). Equal ranks are not backwards here: the caller orders them by
    event time.
    """
    current_rank = rank(kind, current)
    incoming_rank = rank(kind, incoming)
    if current_rank is None or incoming_rank is None:
        return False
    return incoming_rank < current_rank
