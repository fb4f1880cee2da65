"""The public path of the receiver's tables: re-exports :mod:`receiver.storage.tables`, where the
code lives (see docs/architecture.md)."""

from receiver.storage.tables import (
    CUTOVER_NAME as CUTOVER_NAME,
)
from receiver.storage.tables import (
    DEFERRED_PREFIX as DEFERRED_PREFIX,
)
from receiver.storage.tables import (
    Base as Base,
)
from receiver.storage.tables import (
    CutOver as CutOver,
)
from receiver.storage.tables import (
    EventConflict as EventConflict,
)
from receiver.storage.tables import (
    EventStatus as EventStatus,
)
from receiver.storage.tables import (
    HandlerRun as HandlerRun,
)
from receiver.storage.tables import (
    InboxEvent as InboxEvent,
)
from receiver.storage.tables import (
    ObjectLease as ObjectLease,
)
from receiver.storage.tables import (
    Projection as Projection,
)
from receiver.storage.tables import (
    Rejection as Rejection,
)
from receiver.storage.tables import (
    Source as Source,
)
from receiver.storage.tables import (
    Transition as Transition,
)
from receiver.storage.tables import (
    WorkerHeartbeat as WorkerHeartbeat,
)
from receiver.storage.tables import (
    metadata as metadata,
)

__all__ = [
    "metadata",
    "Base",
    "EventStatus",
    "DEFERRED_PREFIX",
    "Source",
    "InboxEvent",
    "EventConflict",
    "HandlerRun",
    "Projection",
    "Transition",
    "CUTOVER_NAME",
    "CutOver",
    "ObjectLease",
    "WorkerHeartbeat",
    "Rejection",
]
