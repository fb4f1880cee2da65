"""The public path of Prometheus metrics: re-exports :mod:`receiver.web.metrics`, where the code
lives (see docs/architecture.md)."""

from receiver.web.metrics import (
    NAMES as NAMES,
)
from receiver.web.metrics import (
    DatabaseCollector as DatabaseCollector,
)
from receiver.web.metrics import (
    Metrics as Metrics,
)
from receiver.web.metrics import (
    exposition as exposition,
)
from receiver.web.metrics import (
    instruments as instruments,
)
from receiver.web.metrics import (
    serve_worker_metrics as serve_worker_metrics,
)

__all__ = [
    "NAMES",
    "DatabaseCollector",
    "Metrics",
    "exposition",
    "instruments",
    "serve_worker_metrics",
]
