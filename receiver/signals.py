"""The public path of the blinker signals: re-exports :mod:`receiver.core.signals`, where the code
lives (see docs/architecture.md)."""

from receiver.core.signals import (
    ALL as ALL,
)
from receiver.core.signals import (
    default_sender as default_sender,
)
from receiver.core.signals import (
    event_conflict as event_conflict,
)
from receiver.core.signals import (
    event_dead_lettered as event_dead_lettered,
)
from receiver.core.signals import (
    event_dispatched as event_dispatched,
)
from receiver.core.signals import (
    event_duplicate as event_duplicate,
)
from receiver.core.signals import (
    event_received as event_received,
)
from receiver.core.signals import (
    event_rejected as event_rejected,
)
from receiver.core.signals import (
    event_stale as event_stale,
)
from receiver.core.signals import (
    handler_failed as handler_failed,
)
from receiver.core.signals import (
    handler_finished as handler_finished,
)
from receiver.core.signals import (
    received as received,
)
from receiver.core.signals import (
    reconcile_finished as reconcile_finished,
)
from receiver.core.signals import (
    rejected as rejected,
)
from receiver.core.signals import (
    send as send,
)

__all__ = [
    "ALL",
    "event_conflict",
    "event_dead_lettered",
    "event_dispatched",
    "event_duplicate",
    "event_received",
    "event_rejected",
    "event_stale",
    "handler_failed",
    "handler_finished",
    "reconcile_finished",
    "send",
    "default_sender",
    "rejected",
    "received",
]
