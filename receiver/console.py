"""The public path of the ops console: re-exports :mod:`receiver.web.console`, where the code lives
(see docs/architecture.md)."""

from receiver.web.console import (
    BLUEPRINT as BLUEPRINT,
)
from receiver.web.console import (
    CSRF_FIELD as CSRF_FIELD,
)
from receiver.web.console import (
    CSRF_KEY as CSRF_KEY,
)
from receiver.web.console import (
    PAGE_SIZE as PAGE_SIZE,
)
from receiver.web.console import (
    SECURITY_HEADERS as SECURITY_HEADERS,
)
from receiver.web.console import (
    Console as Console,
)

__all__ = [
    "Console",
    "SECURITY_HEADERS",
    "BLUEPRINT",
    "CSRF_KEY",
    "CSRF_FIELD",
    "PAGE_SIZE",
]
