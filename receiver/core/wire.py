"""The processor's wire format, written the way Hyperswitch writes it (pure, no I/O):
bodies as ``serde_json`` serialises them, timestamps in UTC with milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any


def format_timestamp(dt: datetime) -> str:
    """Format ``dt`` like Hyperswitch: UTC, millisecond precision, ``Z`` (naive means UTC).

    >>> format_timestamp(datetime(2026, 8, 12, 8, 14, 55, 392512, tzinfo=UTC))
    '2026-08-12T08:14:55.392Z'
    """
    utc = dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    return (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T"
        f"{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}.{utc.microsecond // 1000:03d}Z"
    )


def encode(body: Mapping[str, Any]) -> bytes:
    """Serialise ``body`` exactly like ``serde_json::to_string``: compact, UTF-8, in order.

    Separators are ``,`` and ``:`` with no whitespace, non-ASCII stays UTF-8 (no ``\\u``
    escapes), key order is kept, and NaN or infinity raise ``ValueError``. (Floats are
    outside the contract: Hyperswitch bodies carry none.)
    """
    text = json.dumps(dict(body), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")
