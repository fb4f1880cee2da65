"""Only an allowlist of request headers is stored with a webhook (issue hole 5).

The processor can send custom headers with every webhook (Hyperswitch's
``outgoing_webhook_custom_http_headers``), typically a static shared secret. Only four header
names used to be dropped, so such a secret was stored in clear and, when an insert failed,
reached SQLAlchemy's parameter logging and the error's text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask, got_request_exception

from receiver.core.errors import ConfigurationError
from receiver.core.events import parse_event
from receiver.extension import WebhookReceiver
from receiver.storage.held_connections import HeldConnections
from receiver.storage.sql.sqlite import SQLiteStatements
from receiver.storage.tables import EventConflict
from receiver.testing import signed_headers
from receiver.testing.factories import build_event, encode
from tests.conftest import SECRETS, AppFactory

pytestmark = pytest.mark.storage

SHARED_SECRET = "shared-4c1d0e9f7a2b6c8d-custom-header-value"
SENT = {
    "X-Shared-Secret": SHARED_SECRET,
    "X-Request-Id": "req-123",
    "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "X-Forwarded-For": "203.0.113.7",
    "Accept": "*/*",
    "Cookie": "session=abc",
    "Authorization": "Bearer xyz",
}


def _post(app: Flask, body: bytes, **extra: str) -> Any:
    headers = {**signed_headers(body, SECRETS["primary"]), **SENT, **extra}
    return app.test_client().post("/webhooks/", data=body, headers=headers)


@contextmanager
def _sql_parameters(engine: sa.Engine) -> Iterator[list[str]]:
    """Every parameter set sent to the database meanwhile, in full (not the logs' excerpt):
    through SQLAlchemy, and on the driver connections the receive path holds (PostgreSQL)."""
    sent: list[str] = []

    def before(_c: Any, _cur: Any, statement: str, parameters: Any, *_a: Any) -> None:
        sent.append(f"{statement} {parameters!r}")

    original = HeldConnections.fetchall
    original_sqlite = SQLiteStatements.insert_delivery_on_driver

    def held(self: HeldConnections, statement: str, params: Any) -> Any:
        sent.append(f"{statement} {params!r}")
        return original(self, statement, params)

    def held_sqlite(self: SQLiteStatements, conn: Any, values: dict[str, Any]) -> Any:
        sent.append(f"INSERT INTO hookledger_event {values!r}")
        return original_sqlite(self, conn, values)

    sa.event.listen(engine, "before_cursor_execute", before)
    HeldConnections.fetchall = held  # type: ignore[method-assign]
    SQLiteStatements.insert_delivery_on_driver = held_sqlite  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        HeldConnections.fetchall = original  # type: ignore[method-assign]
        SQLiteStatements.insert_delivery_on_driver = original_sqlite  # type: ignore[method-assign]
        sa.event.remove(engine, "before_cursor_execute", before)


def test_only_allowed_headers_are_stored(make_app: AppFactory) -> None:
    app, _ = make_app()
    store = WebhookReceiver.state(app).store
    body = encode(build_event("payment_succeeded", event_id="evt_headers"))
    with _sql_parameters(store.engine) as sent:
        assert _post(app, body).status_code == 200
    row = store.operations.get("evt_headers")
    assert row is not None
    stored = json.loads(row.headers)
    assert set(stored) == {
        "Content-Length",
        "Content-Type",
        "Traceparent",
        "User-Agent",
        "X-Request-Id",
        "X-Webhook-Signature-512",
    }
    assert stored["X-Request-Id"] == "req-123"
    assert not [p for p in sent if SHARED_SECRET in p or "203.0.113.7" in p]

    # A conflicting copy (same id, other body) is stored with the same allowlist.
    other = encode(build_event("payment_failed", event_id="evt_headers"))
    assert _post(app, other).status_code == 200
    with store.engine.connect() as conn:
        (conflict,) = conn.execute(sa.select(EventConflict.__table__.c.headers)).scalars()  # type: ignore[attr-defined]
    assert SHARED_SECRET not in conflict and "X-Shared-Secret" not in conflict


def test_a_failed_insert_shows_no_custom_header_in_logs_or_errors(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = make_app()
    store = WebhookReceiver.state(app).store
    _refuse_event(store.engine, "evt_refused")
    errors: list[BaseException] = []

    def record(_sender: Any, exception: BaseException, **_extra: Any) -> None:
        errors.append(exception)

    got_request_exception.connect(record, app)
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")  # parameter logging on
    body = encode(build_event("payment_succeeded", event_id="evt_refused"))
    with _sql_parameters(store.engine) as sent:
        response = _post(app, body)
    assert response.status_code == 500  # a refusal that is not an outage
    assert errors and isinstance(errors[0], sa.exc.DBAPIError)
    error = errors[0]
    assert "refused by a trigger" in str(error)
    texts = [
        caplog.text,
        str(error),
        repr(error.params),
        *sent,
        *(record.getMessage() for record in caplog.records),
    ]
    assert not [t for t in texts if SHARED_SECRET in t or "X-Shared-Secret" in t]
    # The header's absence is the allowlist's doing, not the log's truncation: the same
    # parameters carry the headers that are allowed.
    assert [t for t in sent if "evt_refused" in t and "req-123" in t]
    # On PostgreSQL the failed statement's error carries no parameters at all (the body).
    assert error.params is None or "req-123" in repr(error.params)


def test_the_allowlist_can_be_extended_never_to_credentials(make_app: AppFactory) -> None:
    app, _ = make_app(WebhookReceiver(stored_headers="X-Tenant, x-forwarded-for"))
    body = encode(build_event("payment_succeeded", event_id="evt_extended"))
    assert _post(app, body, **{"X-Tenant": "shop-7"}).status_code == 200
    row = WebhookReceiver.state(app).store.operations.get("evt_extended")
    assert row is not None
    stored = json.loads(row.headers)
    assert stored["X-Tenant"] == "shop-7" and stored["X-Forwarded-For"] == "203.0.113.7"
    assert "X-Shared-Secret" not in stored and "Cookie" not in stored
    for spec, message in [
        ("Authorization", "carries credentials"),
        ("X-Tenant, api-key", "carries credentials"),
        ("X Tenant", "is not an HTTP header name"),
        ("X-Tenant:1", "is not an HTTP header name"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            make_app(WebhookReceiver(stored_headers=spec))


def test_every_source_goes_through_the_allowlist(make_app: AppFactory) -> None:
    # Undelivered events recovered from the processor's events API carry the request headers
    # the processor stored, custom ones included.
    app, _ = make_app()
    store = WebhookReceiver.state(app).store
    body = encode(build_event("refund_succeeded", event_id="evt_recovered"))
    headers = [("X-Shared-Secret", SHARED_SECRET), ("Content-Type", "application/json")]
    store.inbox.insert(parse_event(body), body, headers=headers, source="recovered")
    row = store.operations.get("evt_recovered")
    assert row is not None and json.loads(row.headers) == {"Content-Type": "application/json"}


def _refuse_event(engine: sa.Engine, event_id: str) -> None:
    """A trigger that refuses one event id: an insert that fails for a reason other than an
    outage (a constraint, a bad value), with the whole row in SQLAlchemy's error."""
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse_event BEFORE INSERT ON hookledger_event "
                f"WHEN NEW.event_id = '{event_id}' "
                "BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
            )
            return
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse_event() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.event_id = '{event_id}' THEN RAISE EXCEPTION 'refused by a trigger'; "
            "END IF; RETURN NEW; END $$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse_event BEFORE INSERT ON hookledger_event "
            "FOR EACH ROW EXECUTE FUNCTION refuse_event()"
        )
