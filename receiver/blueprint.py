"""The receive path: cap, read raw bytes once, verify, parse, insert-or-ignore, acknowledge.

Nothing is acknowledged before it is committed, and the request does no handler work.
Errors share the processor's error shape: ``{"error": {"type", "code", "message"}}``.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Response, current_app, jsonify, request

from receiver import signals
from receiver.errors import PayloadTooLarge, ReceiveError, SignatureError, StorageUnavailable
from receiver.events import parse_event
from receiver.signature import SIGNATURE_HEADER, verify

if TYPE_CHECKING:
    from receiver.extension import ReceiverState

log = logging.getLogger("receiver.blueprint")


def _state() -> ReceiverState:
    state: ReceiverState = current_app.extensions["hookledger"]
    return state


def error_response(exc: ReceiveError) -> tuple[Response, int]:
    body = {"error": {"type": exc.error_type, "code": exc.code, "message": exc.message}}
    return jsonify(body), exc.http_status


def _read_body(limit: int) -> bytes:
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge()
    body = request.stream.read(limit + 1)
    if len(body) > limit:
        raise PayloadTooLarge()
    return body


def _db_reason(exc: BaseException) -> str:
    """The driver's first line only: SQLAlchemy's own text repeats the SQL and parameters
    (the whole body), which must not reach the logs."""
    cause = exc.__cause__ or exc
    original = getattr(cause, "orig", None) or cause
    text = str(original).strip().splitlines()
    return f"{type(original).__name__}: {text[0][:300] if text else ''}"


def receive() -> tuple[Response, int]:
    state = _state()
    remote = request.remote_addr
    try:
        body = _read_body(state.settings.max_body_bytes)
        secret_id = verify(body, request.headers.get(SIGNATURE_HEADER), state.settings.secrets)
        event = parse_event(body)
        outcome = state.store.insert(
            event, body, headers=request.headers.items(), secret_id=secret_id
        )
    except ReceiveError as exc:
        level = logging.ERROR if isinstance(exc, StorageUnavailable) else logging.WARNING
        if isinstance(exc, StorageUnavailable):
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
        signals.rejected(exc)
        return error_response(exc)
    signals.received(event, outcome.result, secret_id)
    log.info(
        "webhook %s",
        outcome.result,
        extra={
            "action": "received",
            "result": outcome.result,
            "event_id": event.event_id,
            "event_type": event.event_type,
            "secret_id": secret_id,
        },
    )
    # Built directly: Flask's jsonify costs more than the rest of the response path.
    payload = json.dumps({"status": outcome.result, "event_id": event.event_id})
    return Response(payload, mimetype="application/json"), 200


def health() -> tuple[Response, int]:
    state = _state()
    try:
        counts, age = state.store.health()
    except Exception as exc:  # noqa: BLE001 - any storage failure means "not healthy"
        log.error("health check failed: %s", type(exc).__name__, extra={"action": "health"})
        return error_response(StorageUnavailable())
    payload: dict[str, Any] = {"status": "ok", "events": counts, "oldest_open_age_seconds": age}
    return jsonify(payload), 200


def make_blueprint() -> Blueprint:
    bp = Blueprint("hookledger", __name__)
    bp.add_url_rule("/", "receive", receive, methods=["POST"], strict_slashes=False)
    bp.add_url_rule("/health", "health", health, methods=["GET"])
    return bp
