"""A handler's own database error is the handler's failure, not an outage (issue 20, item 1).

SQLite reports almost every SQL error as ``OperationalError``, PostgreSQL a deadlock or a lock
timeout too; the dispatcher used to take every such error for the database being down: the
batch was aborted, no attempt counted, no ``last_error``, the events left ``processing`` until
their leases expired, and then again, for ever. Now the connection is asked: when the
handler's savepoint rolls back and the connection still answers, the handler failed (ledger,
attempt, backoff, dead-letter), and the batch's other events go on. A real outage still
aborts the batch, and the worker gives its leases back as soon as the database answers.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from receiver.core.clock import as_utc
from receiver.core.events import Event, parse_event
from receiver.core.registry import Registry
from receiver.core.retry import RetryPolicy
from receiver.extension import WebhookReceiver
from receiver.storage.database import make_engine, upgrade
from receiver.storage.dispatch import TRANSIENT_RETRY_SECONDS
from receiver.storage.tables import EventStatus
from receiver.store import Store
from receiver.testing import WebhookTestClient
from receiver.testing.factories import build_event, encode
from receiver.worker.runner import Worker, WorkerConfig
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage

#: A statement parameter the ledger and the logs must never show.
PRIVATE = "customer-email-7f3a@example.com"


def _insert(store: Store, event_type: str, **fields: Any) -> Event:
    body = encode(build_event(event_type, **fields))
    event = parse_event(body)
    store.inbox.insert(event, body)
    return event


def test_a_handler_writing_to_a_missing_table_fails_alone_and_is_recorded(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The example shop started before its own table existed: every batch used to abort as a
    'storage unavailable' outage. Now that handler fails (attempts, traceback, dead-letter),
    and the other event of the same batch is done."""
    hooks = WebhookReceiver()
    calls: Counter[str] = Counter()

    @hooks.on("payment_succeeded")
    def ship(event: Event, session: Session) -> None:
        calls["ship"] += 1
        session.execute(
            sa.text("INSERT INTO shop_orders (id, email) VALUES (:i, :e)"),
            {"i": event.event_id, "e": PRIVATE},
        )

    @hooks.on("refund_succeeded")
    def refund(event: Event) -> None:
        calls["refund"] += 1

    app, _ = make_app(hooks, max_attempts=3)
    client = WebhookTestClient(app)
    assert client.send("payment_succeeded", event_id="evt_ship").status_code == 200
    assert client.send("refund_succeeded", event_id="evt_refund").status_code == 200
    client.drain()

    store = WebhookReceiver.state(app).store
    done = store.operations.get("evt_refund")
    assert done is not None and done.status == EventStatus.DONE
    assert calls == Counter(ship=3, refund=1)
    dead = store.operations.get("evt_ship")
    assert dead is not None and dead.status == EventStatus.DEAD and dead.attempts == 3
    assert dead.lease_owner is None
    runs = store.operations.handler_runs(dead.id or 0)
    (run,) = runs.values()
    assert run.status == "failed" and run.attempts == 3
    error = (run.last_error or "").lower()
    assert "shop_orders" in error and ("no such table" in error or "does not exist" in error)
    assert PRIVATE not in (run.last_error or "") and PRIVATE not in (dead.last_error or "")
    assert "storage unavailable" not in caplog.text
    assert PRIVATE not in caplog.text


def test_the_other_events_of_the_batch_commit_with_it(database_url: str) -> None:
    """One claim batch, one transaction (PostgreSQL): a handler's SQL error in the middle
    neither aborts nor delays the events around it."""
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        store = Store(engine, retry=RetryPolicy(max_attempts=5, base_seconds=60.0))
        registry = Registry()
        seen: list[str] = []

        @registry.on("payment_succeeded")
        def handle(event: Event, session: Session) -> None:
            seen.append(ref.object_id if (ref := event.object_ref) else "")
            if seen[-1] == "pay_bad":
                session.execute(sa.text("SELECT * FROM no_such_table"))

        for object_id in ("pay_1", "pay_bad", "pay_2"):
            _insert(store, "payment_succeeded", object_id=object_id, event_id=f"evt_{object_id}")
        worker = Worker(store, registry, WorkerConfig(batch_size=8))
        assert worker.run_once() == 3
        assert sorted(seen) == ["pay_1", "pay_2", "pay_bad"]
        statuses = {
            e: (row.status, row.attempts)
            for e in ("evt_pay_1", "evt_pay_bad", "evt_pay_2")
            if (row := store.operations.get(e)) is not None
        }
        assert statuses == {
            "evt_pay_1": (EventStatus.DONE, 1),
            "evt_pay_bad": (EventStatus.PENDING, 1),
            "evt_pay_2": (EventStatus.DONE, 1),
        }
        bad = store.operations.get("evt_pay_bad")
        assert bad is not None and bad.lease_owner is None
        assert as_utc(bad.next_attempt_at) - store.now() > timedelta(seconds=25)  # the backoff
    finally:
        engine.dispose()


def test_a_conflict_with_another_transaction_is_tried_again_soon(database_url: str) -> None:
    """A lock the handler cannot get in time (PostgreSQL 55P03 under lock_timeout; SQLite
    busy for a second connection) is a conflict: the attempt counts, the next one comes
    within a second instead of the backoff, and once the lock is free it succeeds."""
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE shop_stock (sku TEXT PRIMARY KEY, n INTEGER)"))
            conn.execute(sa.text("INSERT INTO shop_stock VALUES ('sku_1', 5)"))
        store = Store(engine, retry=RetryPolicy(max_attempts=5, base_seconds=600.0))
        registry = Registry()
        postgres = engine.dialect.name == "postgresql"
    except BaseException:
        engine.dispose()
        raise
    holder = engine.connect()
    try:
        if postgres:  # another transaction holds the row
            holder.begin()
            holder.execute(sa.text("SELECT n FROM shop_stock WHERE sku = 'sku_1' FOR UPDATE"))
        blocked = {"yes": True}

        @registry.on("payment_succeeded")
        def reserve(event: Event, session: Session) -> None:
            if postgres:
                session.execute(sa.text("SET LOCAL lock_timeout = '50ms'"))
                session.execute(sa.text("UPDATE shop_stock SET n = n - 1 WHERE sku = 'sku_1'"))
                return
            # SQLite: the shop's own connection to the same file, while the worker writes.
            path = engine.url.database or ""
            own = sqlite3.connect(path, timeout=0.05 if blocked["yes"] else 5.0)
            try:
                if blocked["yes"]:
                    own.execute("BEGIN IMMEDIATE")
                own.rollback()
            finally:
                own.close()

        _insert(store, "payment_succeeded", object_id="pay_1", event_id="evt_lock")
        worker = Worker(store, registry)
        assert worker.run_once() == 1
        row = store.operations.get("evt_lock")
        assert row is not None and row.status == EventStatus.PENDING and row.attempts == 1
        wait = as_utc(row.next_attempt_at) - store.now()
        assert wait <= timedelta(seconds=TRANSIENT_RETRY_SECONDS)  # not the 600 s backoff
        (run,) = store.operations.handler_runs(row.id or 0).values()
        assert run.status == "failed"
        error = run.last_error or ""
        assert ("55P03" in error) if postgres else ("locked" in error)

        if postgres:
            holder.rollback()
        blocked["yes"] = False
        due = as_utc(row.next_attempt_at) + timedelta(seconds=1)
        store.clock = lambda: due
        assert worker.run_once() == 1
        again = store.operations.get("evt_lock")
        assert again is not None and again.status == EventStatus.DONE and again.attempts == 2
    finally:
        holder.close()
        engine.dispose()


def test_an_outage_under_a_batch_gives_the_leases_back_and_burst_ends_holding_none(
    database_url: str,
) -> None:
    """The connection dies under a handler: the batch is aborted (the database failed, not
    the handler), and ``run(burst=True)`` gives the event back as soon as the database
    answers, runs it to done and returns holding no lease. It used to return at once,
    leaving the event ``processing`` until its lease expired."""
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        store = Store(engine, retry=RetryPolicy(max_attempts=5, base_seconds=600.0))
        registry = Registry()
        calls: Counter[str] = Counter()

        @registry.on("payment_succeeded")
        def handle(event: Event, session: Session) -> None:
            calls["handle"] += 1
            if calls["handle"] == 1:  # the database goes away under the first attempt
                session.connection().connection.dbapi_connection.close()  # type: ignore[union-attr]
                session.execute(sa.text("SELECT 1"))

        _insert(store, "payment_succeeded", object_id="pay_1", event_id="evt_outage")
        worker = Worker(store, registry, WorkerConfig(lease_seconds=600.0, poll_interval=0.05))
        worker.heartbeat = False
        worker.run(burst=True)
        row = store.operations.get("evt_outage")
        assert row is not None and row.status == EventStatus.DONE, row
        assert row.lease_owner is None and row.attempts == 1  # the outage's attempt returned
        assert calls["handle"] == 2
        (run,) = store.operations.handler_runs(row.id or 0).values()
        assert run.status == "succeeded" and run.attempts == 1
    finally:
        engine.dispose()


def test_observe_dispatch_records_a_handlers_database_error_as_its_failure(
    make_app: AppFactory,
) -> None:
    """``observe(..., dispatch=True)`` runs the handlers inline through the same dispatcher:
    a handler's SQL error is the handler's failure (recorded, retried by a worker later), not
    an exception out of the shop's request."""
    hooks = WebhookReceiver()

    @hooks.on("payment_succeeded")
    def ship(event: Event, session: Session) -> None:
        session.execute(sa.text("INSERT INTO shop_orders (id) VALUES (:i)"), {"i": PRIVATE})

    app, _ = make_app(hooks, max_attempts=3)
    payment = dict(build_event("payment_succeeded", object_id="pay_api")["content"]["object"])
    with app.app_context():
        seen = hooks.observe(payment, dispatch=True)
    assert seen.stored == "inserted" and seen.status == EventStatus.PENDING
    assert not seen.dispatched_here
    store = WebhookReceiver.state(app).store
    row = store.operations.get(seen.event_id or "")
    assert row is not None and row.status == EventStatus.PENDING and row.attempts == 1
    (run,) = store.operations.handler_runs(row.id or 0).values()
    assert run.status == "failed" and PRIVATE not in (run.last_error or "")
