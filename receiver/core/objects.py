"""Processor API objects: where each kind keeps its id, state and times, and the event body
the processor would send for one (pure, no I/O).

Shared by the two places that turn an object the processor showed into an inbox event:
the shop's own API responses (:meth:`receiver.WebhookReceiver.observe`) and the reconciler
(:mod:`reconcile.core.diff`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from receiver.core.events import parse_timestamp
from receiver.core.transitions import State, make_state
from receiver.core.wire import encode, format_timestamp


@dataclass(frozen=True, slots=True)
class KindSpec:
    """Where a kind's content type, id, status, stage and times live in its API object."""

    content_type: str
    id_field: str
    status_field: str
    #: Creation time fields, preferred first.
    created_fields: tuple[str, ...]
    #: Real modification time fields (changed by every status change), preferred first.
    #: Disputes, payouts and mandates have none in the processor's API.
    modified_fields: tuple[str, ...] = ()
    stage_field: str | None = None


KINDS: Final[Mapping[str, KindSpec]] = {
    "payment": KindSpec(
        "payment_details", "payment_id", "status", ("created",), ("modified_at", "updated")
    ),
    "refund": KindSpec(
        "refund_details", "refund_id", "status", ("created_at", "created"), ("updated_at",)
    ),
    "dispute": KindSpec(
        "dispute_details",
        "dispute_id",
        "dispute_status",
        ("created_at",),
        stage_field="dispute_stage",
    ),
    "payout": KindSpec("payout_details", "payout_id", "status", ("created",)),
    "mandate": KindSpec("mandate_details", "mandate_id", "status", ()),
}

#: The order in which :func:`kind_of` looks for id fields: a refund or dispute also carries
#: its payment's ``payment_id``.
_ID_ORDER: Final = ("dispute", "refund", "payout", "mandate", "payment")


def kind_of(obj: Mapping[str, Any]) -> str | None:
    """The kind of an API object, told by its id field (``refund_id`` before ``payment_id``)."""
    for kind in _ID_ORDER:
        if isinstance(obj.get(KINDS[kind].id_field), str):
            return kind
    return None


def object_id_of(kind: str, obj: Mapping[str, Any]) -> Any:
    return obj.get(KINDS[kind].id_field)


def state_of(kind: str, obj: Mapping[str, Any]) -> State | None:
    """The object's state, or ``None`` when it carries no status string."""
    spec = KINDS[kind]
    status = obj.get(spec.status_field, obj.get("status"))
    if not isinstance(status, str) or not status:
        return None
    stage = obj.get(spec.stage_field) if spec.stage_field else None
    return make_state(kind, status, stage if isinstance(stage, str) else None)


def first_time(obj: Mapping[str, Any], names: tuple[str, ...]) -> datetime | None:
    """The first of ``names`` that holds a readable time (out-of-range years included)."""
    for name in names:
        try:
            parsed = parse_timestamp(obj.get(name))
        except (OverflowError, ValueError):
            parsed = None
        if parsed is not None:
            return parsed
    return None


def created_time(kind: str, obj: Mapping[str, Any]) -> datetime | None:
    return first_time(obj, KINDS[kind].created_fields)


def modified_time(kind: str, obj: Mapping[str, Any]) -> datetime | None:
    """The object's real modification time, for kinds that have one (else ``None``)."""
    return first_time(obj, KINDS[kind].modified_fields)


def event_id_for(prefix: str, *parts: object) -> str:
    """A deterministic event id: ``prefix_`` + 32 hex digits of a hash of ``parts``."""
    material = "\x1f".join(str(part) for part in parts).encode("utf-8", "surrogatepass")
    return f"{prefix}_{hashlib.sha256(material).hexdigest()[:32]}"


def event_body(
    kind: str,
    obj: Mapping[str, Any],
    *,
    event_id: str,
    event_type: str,
    timestamp: datetime,
    merchant_id: str | None = None,
) -> bytes:
    """The body the processor would send for ``obj`` reaching its state: compact JSON in
    Hyperswitch's field order. Raises :class:`ValueError` when the object cannot be encoded
    (an unpaired surrogate, nesting too deep, a NaN).

    Its ``merchant_id`` is the object's own (a payment or a payout names its merchant: a
    seller's is the seller's, whoever reads it), else ``merchant_id``: the merchant of the
    account it is recovered into, for a refund, a dispute or a mandate, which name none."""
    own = obj.get("merchant_id")
    merchant = own if isinstance(own, str) and own else merchant_id
    body = {
        "merchant_id": merchant if isinstance(merchant, str) else None,
        "event_id": event_id,
        "event_type": event_type,
        "content": {"type": KINDS[kind].content_type, "object": dict(obj)},
        "timestamp": format_timestamp(timestamp),
    }
    try:
        return encode(body)
    except (UnicodeEncodeError, RecursionError, ValueError) as exc:
        raise ValueError(f"the object cannot be encoded ({type(exc).__name__})") from None
