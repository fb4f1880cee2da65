"""Time for the sandbox: the clock hook, a settable test clock and the wire format.

Every timestamp the sandbox stores is UTC truncated to milliseconds, the precision it answers
with (``2026-08-12T08:14:55.392Z``), so a client that sends back a timestamp it was shown (for
example ``created.lte=<created of the last row>``) matches that row exactly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The current time, timezone-aware UTC (the default clock)."""
    return datetime.now(UTC)


def truncate_ms(when: datetime) -> datetime:
    """``when`` as aware UTC truncated to milliseconds (a naive value is taken as UTC)."""
    aware = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    return aware.replace(microsecond=aware.microsecond - aware.microsecond % 1000)


def iso_ms(when: datetime) -> str:
    """``when`` as ISO 8601 UTC with milliseconds and ``Z``: ``2026-08-12T08:14:55.392Z``."""
    utc = truncate_ms(when)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def iso_or_none(when: datetime | None) -> str | None:
    """:func:`iso_ms` of ``when``, or ``None``."""
    return None if when is None else iso_ms(when)


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
        self._now = truncate_ms(start or utc_now())

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
        return f"FrozenClock({iso_ms(self())})"
