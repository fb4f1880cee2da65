"""The envelope of the sandbox's outgoing webhooks, byte-compatible with Hyperswitch's.

**Body.** Compact JSON (``separators=(",", ":")``, ``ensure_ascii=False``) with the keys in
Hyperswitch's struct order ``merchant_id, event_id, event_type, content{type, object},
timestamp``; ``event_id`` is ``"evt_"`` + a time-ordered UUIDv7 in 32 hex digits and
``timestamp`` (the sandbox clock when the event was emitted) looks like
``2026-08-12T08:14:55.392Z``. Content types: ``payment_details``, ``refund_details``,
``dispute_details``, ``payout_details``, ``mandate_details``.

**Headers.** ``Content-Type: application/json``, ``User-Agent: Hyperswitch-Backend-Server``
and ``X-Webhook-Signature-512`` = :func:`receiver.core.signature.sign` (lowercase hex HMAC-SHA512
of the body with the profile's key).
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime
from typing import Any, Final

from receiver.core.signature import SIGNATURE_HEADER
from receiver.core.wire import encode
from reconcile.sandbox.clock import format_timestamp

USER_AGENT: Final = "Hyperswitch-Backend-Server"

#: ``content.type`` per object kind.
CONTENT_TYPES: Final = {
    "payment": "payment_details",
    "refund": "refund_details",
    "payout": "payout_details",
    "dispute": "dispute_details",
    "mandate": "mandate_details",
}
#: Hyperswitch ``EventClass`` per object kind.
EVENT_CLASSES: Final = {
    "payment": "payments",
    "refund": "refunds",
    "payout": "payouts",
    "dispute": "disputes",
    "mandate": "mandates",
}


_id_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_event_id() -> str:
    """``"evt_"`` + a UUIDv7 (32 lowercase hex digits), strictly increasing within a process."""
    global _last_ms, _counter
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, int.from_bytes(os.urandom(2), "big") & 0x3FF
        else:
            _counter += 1
            if _counter > 0xFFF:
                _last_ms, _counter = _last_ms + 1, 0
        value = (_last_ms & 0xFFFF_FFFF_FFFF) << 80
        value |= 0x7 << 76 | _counter << 64
        value |= 0b10 << 62 | int.from_bytes(os.urandom(8), "big") >> 2
    return f"evt_{value:032x}"


def encode_body(
    *, merchant_id: str, event_id: str, event_type: str, kind: str, obj: Any, when: datetime
) -> bytes:
    """The exact bytes Hyperswitch would send for this event."""
    return encode(
        {
            "merchant_id": merchant_id,
            "event_id": event_id,
            "event_type": event_type,
            "content": {"type": CONTENT_TYPES[kind], "object": obj},
            "timestamp": format_timestamp(when),
        }
    )


def request_headers(signature: str) -> dict[str, str]:
    """The headers of a webhook request carrying ``signature``."""
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature,
    }
