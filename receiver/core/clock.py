"""Time helpers: hookledger stores and compares aware UTC datetimes only."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """The current time, aware, in UTC (freezegun-friendly: looked up at call time)."""
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """Return ``value`` in UTC; a naive value is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
