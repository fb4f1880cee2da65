"""Time for the sandbox: the clock hook, a settable test clock and the wire format.

Every timestamp the sandbox stores is UTC truncated to milliseconds, the precision it answers
with (``2026-08-12T08:14:55.392Z``), so a client that sends back a timestamp it was shown (for
example ``created.lte=<created of the last row>``) matches that row exactly.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from receiver.core.clock import Clock, as_utc, utcnow
from receiver.core.wire import format_timestamp

__all__ = [
    "Clock",
    "FrozenClock",
    "format_timestamp",
    "iso_or_none",
    "parse_timestamp",
    "truncate_ms",
    "utcnow",
]


def truncate_ms(when: datetime) -> datetime:
    """``when`` as aware UTC truncated to milliseconds (a naive value is taken as UTC)."""
    aware = as_utc(when)
    return aware.replace(microsecond=aware.microsecond - aware.microsecond % 1000)


def iso_or_none(when: datetime | None) -> str | None:
    """:func:`~receiver.testing.factories.format_timestamp` of ``when``, or ``None``."""
    return None if when is None else format_timestamp(when)


def parse_timestamp(value: object, *, allow_naive: bool) -> datetime | None:
    """Parse an ISO 8601 timestamp; ``None`` when ``value`` is not a valid one.

    With ``allow_naive`` a value without an offset is taken as UTC; without it such a value is
    invalid (Hyperswitch parses list filters as ``OffsetDateTime``, which needs an offset).
    """
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None and not allow_naive:
        return None
    return truncate_ms(parsed)


class FrozenClock:
    """A clock for tests: returns the same instant until it is set or advanced.

    Thread-safe. Pass it as ``now=`` to :class:`~reconcile.sandbox.state.Sandbox` to create many
    objects at the same ``created`` timestamp.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._now = truncate_ms(start or utcnow())

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, when: datetime) -> None:
        """Jump to ``when``."""
        with self._lock:
            self._now = truncate_ms(when)

    def advance(self, seconds: float) -> datetime:
        """Move forward by ``seconds`` and return the new time."""
        with self._lock:
            self._now = truncate_ms(self._now + timedelta(seconds=seconds))
            return self._now

    def __repr__(self) -> str:
        return f"FrozenClock({format_timestamp(self())})"
