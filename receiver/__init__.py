"""hookledger's receiver: a verified, durable, deduplicated webhook inbox with typed dispatch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from receiver.defer import Defer
from receiver.errors import (
    ConfigurationError,
    HookledgerError,
    MalformedEvent,
    PayloadTooLarge,
    ReceiveError,
    SignatureError,
    StorageUnavailable,
    UnknownEventType,
)
from receiver.events import Event, parse_event
from receiver.signature import Secret, sign, verify

if TYPE_CHECKING:
    from receiver.extension import WebhookReceiver

#: hookledger's version (the distribution's; ``hookledger --version``).
__version__ = "0.1.0.dev0"


def __getattr__(name: str) -> Any:
    # The Flask extension pulls in Flask, SQLAlchemy and Alembic: import it only when asked,
    # so the pure core (events, signatures) stays light for scripts and the reconciler.
    if name == "WebhookReceiver":
        from receiver.extension import WebhookReceiver

        return WebhookReceiver
    raise AttributeError(f"module 'receiver' has no attribute {name!r}")


__all__ = [
    "__version__",
    "ConfigurationError",
    "Defer",
    "Event",
    "HookledgerError",
    "MalformedEvent",
    "PayloadTooLarge",
    "ReceiveError",
    "Secret",
    "SignatureError",
    "StorageUnavailable",
    "UnknownEventType",
    "WebhookReceiver",
    "parse_event",
    "sign",
    "verify",
]
