"""The worker process: claim events under leases, run their handlers, write heartbeats.

``from receiver.worker.runner import Worker, WorkerConfig`` is the public path; the loop lives in
:mod:`receiver.worker.runner`, the heartbeats in :mod:`receiver.worker.heartbeat`.
"""

from receiver.worker.runner import Worker as Worker
from receiver.worker.runner import WorkerConfig as WorkerConfig
from receiver.worker.runner import worker_name as worker_name

__all__ = ["Worker", "WorkerConfig", "worker_name"]
