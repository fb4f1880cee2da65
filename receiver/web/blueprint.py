"""The receive path: cap, read raw bytes once, verify, parse, insert-or-ignore, acknowledge.

Nothing is acknowledged before it is committed, and the request does no handler work.
Errors share the processor's error shape: ``{"error": {"type", "code", "message"}}``.

Accounts (:mod:`receiver.core.accounts`): ``POST /<account>/`` is that account's URL, its
deliveries verified with its secrets only, and refused if the body names another merchant
or profile. ``POST /`` is the shared URL: with one account it takes every delivery, as it
always did (when that account names its merchant id, a body naming another merchant goes to
the stored account that owns it, if any); with several, the body's ``merchant_id`` (and its
object's ``profile_id``) choose the one account that owns it, whose secrets alone then
verify it (never "any secret of any account").
"""

from __future__ import annotations

import json
import logging
from json.encoder import encode_basestring_ascii as _json_text

from flask import Blueprint, Response, jsonify, request
from werkzeug.exceptions import ClientDisconnected

import receiver.core.signals as signals
from receiver.atrest.rejected_deliveries import declared_size
from receiver.config.data_at_rest import check_event_age
from receiver.core.accounts import Account, is_account_id
from receiver.core.errors import (
    AccountMismatch,
    AccountUnknown,
    PayloadTooLarge,
    ReceiveError,
    SchemaNotReady,
    SignatureError,
    StorageBusy,
    StorageUnavailable,
)
from receiver.core.events import Event, parse_event
from receiver.core.headers import environ_headers
from receiver.core.signature import SIGNATURE_HEADER, verify
from receiver.storage.database import head_revision
from receiver.web.state import ReceiverState, receiver_state

log = logging.getLogger("receiver.blueprint")

#: The answers' content type (``mimetype="application/json"`` gives the same header, through
#: one more function).
_JSON = "application/json"


def error_response(exc: ReceiveError) -> tuple[Response, int]:
    """The processor's error shape; a 503 (busy, unavailable, schema behind) with
    ``Retry-After``."""
    body = {"error": {"type": exc.error_type, "code": exc.code, "message": exc.message}}
    response = jsonify(body)
    if exc.retry_after is not None:
        response.headers["Retry-After"] = str(exc.retry_after)
    return response, exc.http_status


def _read_body(limit: int) -> bytes:
    """The body, refused with :class:`PayloadTooLarge` past ``limit`` bytes: unread when its
    declared length says so, else after reading ``limit + 1`` bytes at most.

    Read exactly as ``request.stream.read(limit + 1)`` read it. A server that ends the input
    itself (``wsgi.input_terminated``: gunicorn), or a host app that caps bodies too
    (Flask's ``MAX_CONTENT_LENGTH``, whose 413 its stream raises), gets that very read.
    Otherwise werkzeug's stream is a ``LimitedStream`` of the declared length, which
    allocates and zeroes a ``limit + 1`` byte buffer for every read (a megabyte by default,
    whatever the body's size): here the declared length is read from the WSGI input in one
    call, as it reads it, and a read that gets nothing or fails is the client gone
    (werkzeug's :class:`ClientDisconnected`, its 400), as it makes it. Without a declared
    length (none, or chunked) such a server's body is empty, as werkzeug's stream is."""
    declared = request.content_length  # None: no header, or Transfer-Encoding: chunked
    if declared is not None and declared > limit:
        raise PayloadTooLarge()
    environ = request.environ
    if "wsgi.input_terminated" in environ or request.max_content_length is not None:
        body: bytes = request.stream.read(limit + 1)
        if len(body) > limit:
            raise PayloadTooLarge()
        return body
    if not declared:
        return b""
    try:
        body = environ["wsgi.input"].read(declared)
    except (OSError, ValueError):
        raise ClientDisconnected() from None
    if not body:
        raise ClientDisconnected()
    return body


def _declared_length() -> int | None:
    """The body size the request declared, for a request refused unread: the raw
    ``Content-Length`` parsed and clamped
    (:func:`receiver.atrest.rejected_deliveries.declared_size`: a
    non-negative integer no larger than a 64-bit column holds, else unknown), never the
    header's text or an unbounded integer; unknown for a chunked body."""
    if request.content_length is None:  # no header, or Transfer-Encoding: chunked
        return None
    return declared_size(request.headers.get("Content-Length"))


def _db_reason(exc: BaseException) -> str:
    """The driver's first line only: SQLAlchemy's own text repeats the SQL and parameters
    (the whole body), which must not reach the logs."""
    cause = exc.__cause__ or exc
    original = getattr(cause, "orig", None) or cause
    text = str(original).strip().splitlines()
    return f"{type(original).__name__}: {text[0][:300] if text else ''}"


def _account_of(
    state: ReceiverState, account_id: str | None, body: bytes
) -> tuple[Account, Event | None]:
    """The account a delivery is for: its URL's, the only one, or the one that owns the
    body (:class:`AccountUnknown` if none does); with the body's parsed event when reading
    the body was needed to choose (so it is not parsed twice)."""
    if account_id is not None:
        found = state.accounts.get(account_id) if is_account_id(account_id) else None
        if found is None or not found.active:
            raise AccountUnknown(f"no account {account_id[:64]!r} receives webhooks here")
        return found, None
    if state.single is not None:
        return _single_or_stored(state, state.single, body)
    event = parse_event(body)
    owner = state.accounts.for_body(event.merchant_id, event.profile_id)
    if owner is None:
        raise AccountUnknown(
            "no single account owns this delivery's merchant_id and profile_id; "
            "post it to its account's URL"
        )
    return _receiving(owner), event


def _receiving(owner: Account) -> Account:
    """``owner``, unless it was deactivated: its deliveries are refused, never handed to
    another account (:func:`receiver.core.accounts.only_owner`)."""
    if not owner.active:
        raise AccountUnknown(f"account {owner.id!r} that owns this delivery is deactivated")
    return owner


def _single_or_stored(
    state: ReceiverState, single: Account, body: bytes
) -> tuple[Account, Event | None]:
    """The shared URL of an installation configured with one account: it takes every
    delivery, as before accounts existed, without reading the body or the account table,
    unless it names its merchant id; then a body naming another merchant goes to the stored
    account that owns it (``hookledger accounts add``), if one does."""
    if single.merchant_id is None:
        return single, None
    try:
        event = parse_event(body)
    except ReceiveError:
        return single, None  # refused as before (its signature is checked first)
    # Every account's rule, the configured one's included: a stored account naming a
    # profile of the configured account's merchant owns that profile's deliveries, as
    # observe() and the reconciler file them (a deactivated one: refused).
    owner = state.accounts.for_body(event.merchant_id, event.profile_id)
    if owner is None:
        return single, event  # nobody owns it (or not one alone): the one account's
    return _receiving(owner), event


def _check_owner(state: ReceiverState, account: Account, event: Event) -> None:
    """A delivery to ``account``'s own URL must be its: its merchant and profile are the
    account's, and the shared URL would not route it to another account (a brand that names
    the profile, beside a catch-all naming only the merchant: the profiles of one merchant
    sign with the merchant's key unless given their own, so the signature does not tell)."""
    if not account.owns(event.merchant_id, event.profile_id):
        raise AccountMismatch(
            f"this delivery names another merchant or profile than account {account.id!r}"
        )
    single = state.single
    if single is not None and single.id == account.id and single.merchant_id is None:
        return  # the one account that takes every delivery (the table is never read)
    owner = state.accounts.for_body(event.merchant_id, event.profile_id)
    if owner is not None and owner.id != account.id:
        raise AccountMismatch(
            f"this delivery's merchant and profile are account {owner.id!r}'s, not "
            f"{account.id!r}'s: the processor must send them to {owner.id!r}'s URL"
        )


def receive(account_id: str | None = None) -> tuple[Response, int]:
    state = receiver_state()
    remote = request.remote_addr
    body: bytes | None = None
    account: Account | None = None
    try:
        body = _read_body(state.settings.max_body_bytes)
        account, parsed = _account_of(state, account_id, body)
        secret_id = verify(body, request.headers.get(SIGNATURE_HEADER), account.secrets)
        event = parsed if parsed is not None else parse_event(body)
        if account_id is not None:
            _check_owner(state, account, event)
        # A signed delivery of this account's, stored or not (too old, say): the first one
        # bounds the go-live deploy (written once per process and account, before the
        # delivery). Another account's delivery refused above says nothing of this one's.
        state.store.operations.note_delivery(state.store.now(), account=account.id)
        if account.id != event.account:
            event = event.for_account(account.id)
        check_event_age(event, state.settings.data.max_event_age, state.store.now)
        outcome = state.store.inbox.insert(
            event,
            body,
            headers=environ_headers(request.environ, state.store.inbox.headers),
            secret_id=secret_id,
            account=account.id,
            may_stage=True,
        )
    except ReceiveError as exc:
        if exc.http_status < 500:  # the request's fault: kept (bounded) in hookledger_rejection
            state.store.rejections.record(
                reason=exc.reason,
                http_status=exc.http_status,
                remote_addr=remote,
                size=len(body) if body is not None else _declared_length(),
                header_names=request.headers.keys(),
                secrets=account.secrets if account is not None else (),
                body=body,
                account=account.id
                if account is not None
                else (account_id if is_account_id(account_id) else None),
            )
        level = logging.ERROR if isinstance(exc, StorageUnavailable) else logging.WARNING
        if isinstance(exc, StorageBusy):  # the database answers; a lock stayed held
            log.warning(
                "webhook not stored, the database is busy: %s",
                _db_reason(exc),
                extra={"action": "rejected", "reason": exc.code, "remote_addr": remote},
            )
        elif isinstance(exc, StorageUnavailable):
            log.log(
                level,
                "webhook not stored: %s",
                _db_reason(exc),
                extra={"action": "rejected", "reason": exc.code, "remote_addr": remote},
            )
        else:
            log.log(
                level,
                "webhook rejected: %s",
                exc.message,
                extra={
                    "action": "rejected",
                    "reason": exc.code,
                    "remote_addr": remote,
                    "signature_failure": isinstance(exc, SignatureError),
                },
            )
        signals.rejected(exc, account.id if account is not None else None)
        return error_response(exc)
    signals.received(event, outcome.result, secret_id)
    if log.isEnabledFor(logging.INFO):  # its record's fields are not even gathered otherwise
        log.info(
            "webhook %s%s",
            outcome.result,
            " (in the intake: the database was locked)" if outcome.staged else "",
            extra={
                "action": "received",
                "result": outcome.result,
                "event_id": event.event_id,
                "event_type": event.event_type,
                "secret_id": secret_id,
                "account": account.id,
                **({"intake": True} if outcome.staged else {}),
            },
        )
    # Built directly: Flask's jsonify costs more than the rest of the response path.
    return Response(_received(outcome.result, event.event_id), content_type=_JSON), 200


def _received(result: str, event_id: str) -> str:
    """``json.dumps({"status": result, "event_id": event_id})``, its two strings escaped by
    the encoder's own function, without the encoder's dispatch on the value's type."""
    return f'{{"status": {_json_text(result)}, "event_id": {_json_text(event_id)}}}'


_OK = json.dumps({"status": "ok"})


def live() -> tuple[Response, int]:
    """Liveness: the process answers. No database, no lock, no state: restart it if not."""
    return Response(_OK, mimetype="application/json"), 200


def ready() -> tuple[Response, int]:
    """Readiness: the database answers a trivial read and hookledger's schema is at head.

    One read of a one-row table in a read-only transaction, whatever the size of the inbox:
    on SQLite it never takes or waits for the write lock, so health checks neither slow down
    nor are slowed down by the receipt of webhooks. It shows no counts (they are for
    operators: ``hookledger stats``).
    """
    state = receiver_state()
    try:
        revision = state.store.operations.schema_revision()
    except Exception as exc:  # noqa: BLE001 - any storage failure means "not ready"
        log.error("readiness check failed: %s", _db_reason(exc), extra={"action": "health"})
        return error_response(StorageUnavailable())
    if revision != head_revision():
        log.error(
            "readiness check failed: schema at %s, expected %s",
            revision,
            head_revision(),
            extra={"action": "health"},
        )
        return error_response(SchemaNotReady())
    return Response(_OK, mimetype="application/json"), 200


def make_blueprint() -> Blueprint:
    """``POST /`` receives; ``GET /health/live`` and ``GET /health/ready`` probe; ``GET
    /health`` is readiness too (the route's former name, kept for existing monitors)."""
    bp = Blueprint("hookledger", __name__)
    bp.add_url_rule("/", "receive", receive, methods=["POST"], strict_slashes=False)
    bp.add_url_rule(
        "/<account_id>/", "receive_account", receive, methods=["POST"], strict_slashes=False
    )
    bp.add_url_rule("/health/live", "live", live, methods=["GET"])
    bp.add_url_rule("/health/ready", "ready", ready, methods=["GET"])
    bp.add_url_rule("/health", "health", ready, methods=["GET"])
    return bp
