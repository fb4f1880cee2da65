"""Realistic Hyperswitch webhook payloads for tests (the merchant test kit; pure, no I/O).

:func:`build_event` returns a body shaped like the processor's ``OutgoingWebhook``
(``merchant_id, event_id, event_type, content{type, object}, timestamp`` in that order) with
a realistic object for the event's class, taken from the OpenAPI schemas
(``PaymentsResponse``, ``RefundResponse``, ``DisputeResponse``, ``MandateResponse``,
``PayoutCreateResponse``, ``ConfirmSubscriptionResponse``). Card data is never a full card
number: only ``last4``, the network and the six-digit BIN, as Hyperswitch sends them.

:func:`encode` serialises like ``serde_json`` (compact, UTF-8, key order kept), so
``sign(encode(body), secret)`` is what the processor would send::

    body = build_event("payment_succeeded", object_id="pay_123", metadata={"order_id": "42"})
    raw = encode(body)
    headers = {"X-Webhook-Signature-512": sign(raw, "secret")}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Final

from receiver.core.events import CONTENT_TYPE_FOR_CLASS, EVENT_TYPES, validate_event_type
from receiver.core.status import STATUS_FOR_EVENT
from receiver.core.wire import encode, format_timestamp
from receiver.testing.objects import (
    OBJECT_BUILDERS,
    new_id,
)

__all__ = [
    "OMIT",
    "Omit",
    "build_event",
    "encode",
    "format_timestamp",
    "new_event_id",
    "new_id",
]

DEFAULT_MERCHANT_ID: Final = "merchant_1234"
DEFAULT_AMOUNT: Final = 6540
DEFAULT_CURRENCY: Final = "USD"


class Omit(Enum):
    """The type of :data:`OMIT`."""

    OMIT = "OMIT"

    def __repr__(self) -> str:
        return "OMIT"


#: Pass as a value in ``object_fields`` (or as ``status``) to remove that field from
#: ``content.object``.
OMIT: Final = Omit.OMIT


def new_event_id(at: datetime | None = None) -> str:
    """A Hyperswitch-style event id: ``"evt_"`` + a UUIDv7 as 32 lowercase hex characters.

    The id is time ordered: its first 48 bits are the Unix time in milliseconds of ``at``
    (default: now), the rest is random.
    """
    moment = at if at is not None else datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    millis = int(moment.timestamp() * 1000) & ((1 << 48) - 1)
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = rand >> 68  # 12 bits
    rand_b = rand & ((1 << 62) - 1)  # 62 bits
    value = (millis << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return f"evt_{value:032x}"


#: Event-type prefix to event class, used to shape bodies of unknown event types.
_PREFIX_CLASS: Final[Mapping[str, str]] = {
    "payment": "payments",
    "refund": "refunds",
    "dispute": "disputes",
    "mandate": "mandates",
    "payout": "payouts",
    "invoice": "subscriptions",
    "subscription": "subscriptions",
}


def _drop_status(obj: dict[str, Any], content_type: str) -> None:
    if content_type == "dispute_details":
        obj.pop("dispute_status", None)
    elif content_type == "subscription_details" and isinstance(obj.get("invoice"), dict):
        obj["invoice"].pop("status", None)
    else:
        obj.pop("status", None)


def _unknown_object(object_id: str, status: str | None) -> dict[str, Any]:
    return {"id": object_id, "status": status}


def build_event(
    event_type: str,
    *,
    object_id: str | None = None,
    event_id: str | None = None,
    timestamp: datetime | None = None,
    merchant_id: str = DEFAULT_MERCHANT_ID,
    status: str | Omit | None = None,
    allow_unknown: bool = False,
    **object_fields: Any,
) -> dict[str, Any]:
    """Build a Hyperswitch-shaped webhook body for ``event_type``.

    - ``object_id``: the id of ``content.object`` (``payment_id``, ``refund_id``, ...; for
      ``invoice_paid`` the invoice id); a random Hyperswitch-style id by default.
    - ``event_id``: default ``"evt_"`` + a time-ordered UUIDv7 hex (see :func:`new_event_id`).
    - ``timestamp``: the event time (default now); the object's timestamps are derived from it.
    - ``status``: the object's status (for ``invoice_paid`` the invoice status); defaults to
      what ``receiver.core.status.STATUS_FOR_EVENT`` says the event type implies. :data:`OMIT`
      leaves the status field out (a sparse body).
    - ``object_fields`` override or add fields of ``content.object`` (datetimes are formatted
      like Hyperswitch; :data:`OMIT` removes a field). An integer ``amount`` also drives the
      derived amounts (``net_amount``, ``amount_received``, ...) and is sent as a string for
      disputes; ``currency`` likewise. For ``invoice_paid`` the fields apply to the
      subscription; pass ``invoice={...}`` to replace the invoice.

    An unknown ``event_type`` raises :class:`~receiver.core.errors.UnknownEventType` unless
    ``allow_unknown`` is true; its object is then shaped after the type's prefix
    (``payment_...`` gives a payment) or is a bare ``{"id", "status"}`` object.
    """
    event_class = EVENT_TYPES.get(event_type)
    if event_class is None and not allow_unknown:
        validate_event_type(event_type)  # raises UnknownEventType with a suggestion
    now = timestamp if timestamp is not None else datetime.now(UTC)
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    omit_status = status is OMIT
    if (status is None or status is OMIT) and event_type in STATUS_FOR_EVENT:
        status = STATUS_FOR_EVENT[event_type][1]
    object_status = status if isinstance(status, str) else None
    fields = dict(object_fields)
    amount = fields.get("amount")
    if isinstance(amount, int) and not isinstance(amount, bool):
        del fields["amount"]
    else:
        amount = DEFAULT_AMOUNT
    currency = fields.get("currency")
    if isinstance(currency, str):
        del fields["currency"]
    else:
        currency = DEFAULT_CURRENCY

    shape_class = event_class or _PREFIX_CLASS.get(event_type.partition("_")[0])
    if shape_class is not None:
        builder, prefix = OBJECT_BUILDERS[shape_class]
        oid = object_id if object_id is not None else new_id(prefix)
        obj = builder(oid, object_status, amount, currency, merchant_id, now)
        content_type = CONTENT_TYPE_FOR_CLASS[shape_class]
    else:
        oid = object_id if object_id is not None else new_id("obj")
        obj = _unknown_object(oid, object_status)
        obj["amount"] = amount
        obj["currency"] = currency
        content_type = f"{event_type.partition('_')[0] or 'unknown'}_details"

    if omit_status:
        _drop_status(obj, content_type)
    for key, value in fields.items():
        if value is OMIT:
            obj.pop(key, None)
        elif isinstance(value, datetime):
            obj[key] = format_timestamp(value)
        else:
            obj[key] = value

    return {
        "merchant_id": merchant_id,
        "event_id": event_id if event_id is not None else new_event_id(now),
        "event_type": event_type,
        "content": {"type": content_type, "object": obj},
        "timestamp": format_timestamp(now),
    }
