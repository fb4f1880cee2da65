"""``Defer``: a handler's way to say "not yet" (the order it needs does not exist yet).

::

    @hooks.on("payment_succeeded")
    def fulfil(event: Event, session: Session) -> None:
        order = session.get(Order, event.payment.metadata["order_id"])
        if order is None:                      # the webhook beat the shop's own commit
            raise Defer(5, "order not written yet")
        ...

A deferred event is waiting, not failing: it is tried again after ``seconds`` without using
up one of its attempts, its handlers that already succeeded do not run again, and later
events of the same object keep waiting behind it (per-object order holds). Past the
deferral limit (``HOOKLEDGER_DEFER_LIMIT``, counted from when the event was received) it is
dead-lettered with the reason. ``hookledger events --deferred`` lists deferred events and why.
"""

from __future__ import annotations

from typing import Final

#: Shortest and longest deferral a handler can ask for, in seconds.
MIN_DEFER: Final = 0.5
MAX_DEFER: Final = 3600.0


class Defer(Exception):  # noqa: N818 - it is a request, not an error
    """Raised by a handler: try this event again after ``seconds`` (not a failure)."""

    def __init__(self, seconds: float = 10.0, reason: str = "deferred by a handler") -> None:
        try:
            value = float(seconds)
        except (TypeError, ValueError):
            value = 10.0
        if value != value:  # NaN
            value = 10.0
        self.seconds = min(max(value, MIN_DEFER), MAX_DEFER)
        self.reason = reason
        super().__init__(f"{reason} (again in {self.seconds:g} s)")
