"""One exception root for hookledger.

Every exception hookledger raises derives from :class:`HookledgerError`; the class docstring
is the default message. The receiver's sub-tree maps to HTTP statuses in one place
(:mod:`receiver.blueprint`); the reconciler and API client have their own sub-tree in
:mod:`reconcile.errors`. Messages never contain secrets, API keys or bodies.
"""

from __future__ import annotations


class HookledgerError(Exception):
    """A hookledger error occurred."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or " ".join((self.__doc__ or "").split()))

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigurationError(HookledgerError):
    """hookledger is misconfigured."""


class ReceiveError(HookledgerError):
    """The webhook request was rejected."""

    http_status = 400
    code = "HL_00"
    error_type = "invalid_request"


class PayloadTooLarge(ReceiveError):
    """The request body exceeds the configured maximum size."""

    http_status = 413
    code = "HL_13"


class SignatureError(ReceiveError):
    """The webhook signature is missing or does not match any configured secret."""

    http_status = 401
    code = "HL_01"
    error_type = "authentication_error"


class MalformedEvent(ReceiveError):
    """The webhook body is not a valid event (malformed JSON or no event_id)."""

    http_status = 400
    code = "HL_04"


class StorageUnavailable(ReceiveError):
    """Event storage is unavailable; retry later."""

    http_status = 503
    code = "HL_03"
    error_type = "api_error"


class SchemaNotReady(ReceiveError):
    """hookledger's schema is not at the latest migration: run `hookledger db upgrade`."""

    http_status = 503
    code = "HL_05"
    error_type = "api_error"


class UnknownEventType(HookledgerError, ValueError):
    """The event type is not one of the processor's event types."""


class EventNotFound(HookledgerError, LookupError):
    """No stored event matches."""
