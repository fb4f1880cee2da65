"""The public path of worker heartbeats and health: re-exports :mod:`receiver.worker.heartbeat`,
where the code lives (see docs/architecture.md)."""

from receiver.worker.heartbeat import (
    BEAT_SECONDS as BEAT_SECONDS,
)
from receiver.worker.heartbeat import (
    DEFAULT_WORKER_TIMEOUT as DEFAULT_WORKER_TIMEOUT,
)
from receiver.worker.heartbeat import (
    Beater as Beater,
)
from receiver.worker.heartbeat import (
    E as E,
)
from receiver.worker.heartbeat import (
    OpsStatus as OpsStatus,
)
from receiver.worker.heartbeat import (
    W as W,
)
from receiver.worker.heartbeat import (
    WorkerSeen as WorkerSeen,
)
from receiver.worker.heartbeat import (
    check as check,
)
from receiver.worker.heartbeat import (
    forget_older_than as forget_older_than,
)
from receiver.worker.heartbeat import (
    record as record,
)
from receiver.worker.heartbeat import (
    remove as remove,
)

__all__ = [
    "W",
    "E",
    "BEAT_SECONDS",
    "DEFAULT_WORKER_TIMEOUT",
    "record",
    "remove",
    "forget_older_than",
    "WorkerSeen",
    "OpsStatus",
    "check",
    "Beater",
]
