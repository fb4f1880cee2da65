"""The public path of log output: re-exports :mod:`receiver.config.logs`, where the code lives
(see docs/architecture.md)."""

from receiver.config.logs import (
    FORMATS as FORMATS,
)
from receiver.config.logs import (
    LEVELS as LEVELS,
)
from receiver.config.logs import (
    JsonFormatter as JsonFormatter,
)
from receiver.config.logs import (
    TextFormatter as TextFormatter,
)
from receiver.config.logs import (
    configure_logging as configure_logging,
)

__all__ = [
    "FORMATS",
    "LEVELS",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
]
