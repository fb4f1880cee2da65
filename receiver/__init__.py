"""hookledger's receiver: a verified, durable, deduplicated webhook inbox with typed dispatch."""

from __future__ import annotations

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
from receiver.extension import WebhookReceiver
from receiver.signature import Secret, sign, verify

__all__ = [
    "ConfigurationError",
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
