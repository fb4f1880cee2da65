"""hookledger's receiver: a verified, durable, deduplicated webhook inbox with typed dispatch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from receiver.core.defer import Defer
from receiver.core.errors import (
    ConfigurationError,
    HandlerTransactionError,
    HookledgerError,
    MalformedEvent,
    NotTheAccounts,
    PayloadTooLarge,
    ReceiveError,
    SignatureError,
    StorageBusy,
    StorageUnavailable,
    UnknownEventType,
)
from receiver.core.events import Event, parse_event
from receiver.core.signature import Secret, sign, verify
from receiver.core.version import __version__

if TYPE_CHECKING:
    from receiver.extension import WebhookReceiver


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
    "HandlerTransactionError",
    "HookledgerError",
    "MalformedEvent",
    "NotTheAccounts",
    "PayloadTooLarge",
    "ReceiveError",
    "Secret",
    "SignatureError",
    "StorageBusy",
    "StorageUnavailable",
    "UnknownEventType",
    "WebhookReceiver",
    "parse_event",
    "sign",
    "verify",
]
