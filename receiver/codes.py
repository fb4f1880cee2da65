"""The public path of unified error codes and their retry advice: re-exports
:mod:`receiver.core.codes`, where the code lives (see docs/architecture.md)."""

from receiver.core.codes import (
    FAMILIES as FAMILIES,
)
from receiver.core.codes import (
    LEGACY_CODES as LEGACY_CODES,
)
from receiver.core.codes import (
    UNIFIED_CODES as UNIFIED_CODES,
)
from receiver.core.codes import (
    Retry as Retry,
)
from receiver.core.codes import (
    UnifiedCode as UnifiedCode,
)
from receiver.core.codes import (
    describe_unified_code as describe_unified_code,
)

__all__ = [
    "FAMILIES",
    "LEGACY_CODES",
    "UNIFIED_CODES",
    "Retry",
    "UnifiedCode",
    "describe_unified_code",
]
