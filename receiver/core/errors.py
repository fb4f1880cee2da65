"""One exception root for hookledger.

Every exception hookledger raises derives from :class:`HookledgerError`; the class docstring
is the default message. The receiver's sub-tree maps to HTTP statuses in one place
(:mod:`receiver.web.blueprint`); the reconciler and API client have their own sub-tree in
:mod:`reconcile.core.errors`. Messages never contain secrets, API keys or bodies.
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
    #: The reason code recorded in the rejected-deliveries table (``hookledger_rejection``).
    reason = "rejected"
    #: The reason sent with :data:`receiver.core.signals.event_rejected` and counted in
    #: ``hookledger_rejections_total``: one per code, so an alert on one (a database outage,
    #: a rotated secret) never fires for another.
    signal_reason = "rejected"
    #: Seconds sent in ``Retry-After`` (the 503s: a refusal that is no fault of the request).
    retry_after: int | None = None


class PayloadTooLarge(ReceiveError):
    """The request body exceeds the configured maximum size."""

    http_status = 413
    code = "HL_13"
    reason = "too_large"
    signal_reason = "too_large"


class SignatureError(ReceiveError):
    """The webhook signature is missing or does not match any configured secret."""

    http_status = 401
    code = "HL_01"
    error_type = "authentication_error"
    reason = "signature_mismatch"
    signal_reason = "bad_signature"


class SignatureMissing(SignatureError):
    """The X-Webhook-Signature-512 header is missing."""

    reason = "signature_missing"


class SignatureMalformed(SignatureError):
    """The X-Webhook-Signature-512 header is not a 128-digit hex HMAC-SHA512."""

    reason = "signature_malformed"


class MalformedEvent(ReceiveError):
    """The webhook body is not a valid event (malformed JSON or no event_id)."""

    http_status = 400
    code = "HL_04"
    reason = "malformed_event"
    signal_reason = "malformed"


class EventTooOld(ReceiveError):
    """The event's timestamp is older than HOOKLEDGER_MAX_EVENT_AGE allows."""

    http_status = 400
    code = "HL_06"
    reason = "too_old"
    signal_reason = "too_old"


class AccountUnknown(ReceiveError):
    """The delivery names no account hookledger serves: its URL's account is not configured
    (or was removed), or, at the shared URL, no account (or more than one) owns the body's
    ``merchant_id`` and ``profile_id``. Nothing is stored."""

    http_status = 404
    code = "HL_07"
    reason = "account_unknown"
    signal_reason = "account_unknown"


class AccountMismatch(ReceiveError):
    """The delivery verified with its URL's account's secrets, but its body names another
    merchant or profile: refused, never stored under the wrong account."""

    http_status = 403
    code = "HL_08"
    error_type = "authentication_error"
    reason = "account_mismatch"
    signal_reason = "account_mismatch"


class NotTheAccounts(HookledgerError, ValueError):
    """``observe()``: the object is not the account's (its ``merchant_id`` or ``profile_id``
    is another account's), or no single account owns it: refused, never filed under the
    wrong account (as a delivery to an account's URL naming another merchant is, 403
    ``HL_08``)."""


class StorageUnavailable(ReceiveError):
    """Event storage is unavailable; retry later."""

    http_status = 503
    code = "HL_03"
    error_type = "api_error"
    signal_reason = "storage_unavailable"
    retry_after = 30


class StorageBusy(StorageUnavailable):
    """The database is busy: a lock the delivery needs stayed held past the wait; retry
    later.

    Another writer held it (SQLite's write lock past ``HOOKLEDGER_SQLITE_BUSY_TIMEOUT``, or a
    PostgreSQL row or table lock past the lock or statement timeout, SQLSTATE ``55P03`` or
    ``57014``): the database answers, it did not store this delivery in time. Still a 503
    that the processor retries, answered with its own code (``HL_09``) and counted under its
    own reason (``storage_busy``), so that an alert on ``storage_unavailable`` (the database
    down) never fires for it. A subclass of :class:`StorageUnavailable`: code that catches
    that catches this too."""

    code = "HL_09"
    signal_reason = "storage_busy"
    retry_after = 5


class SchemaNotReady(ReceiveError):
    """hookledger's schema is not at the latest migration: run `hookledger db upgrade`."""

    http_status = 503
    code = "HL_05"
    error_type = "api_error"
    signal_reason = "schema_not_ready"
    retry_after = 60


class UnknownEventType(HookledgerError, ValueError):
    """The event type is not one of the processor's event types."""


class HandlerTransactionError(HookledgerError):
    """A handler tried to end hookledger's transaction: hookledger commits a handler's writes
    together with its ledger row, after the handler returns. Use ``session.flush()`` to send
    writes now, ``session.rollback()`` to undo your own writes, ``session.begin_nested()``
    for a savepoint of your own."""


class EventNotFound(HookledgerError, LookupError):
    """No stored event matches."""


class DataUnavailable(HookledgerError):
    """A stored event's data cannot be read."""


class DataKeyMissing(DataUnavailable):
    """The data is sealed with a data key that is not configured."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"sealed with data key {key_id!r}, which is not configured (HOOKLEDGER_DATA_KEYS)"
        )


class DataNotAuthentic(DataUnavailable):
    """The sealed data does not open with its data key."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"does not open with data key {key_id!r}: that id holds another key value, or "
            "the data was altered or moved from another row"
        )


class BodyRedacted(DataUnavailable):
    """The event's body was redacted (retention): it cannot be dispatched or replayed."""


class RedactedEvents(HookledgerError, ValueError):
    """Some chosen events were redacted: their bodies are gone, so they cannot run again."""
