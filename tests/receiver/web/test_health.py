"""Health checks are cheap, lock-free and show no counts (issue hole 3).

``GET /webhooks/health`` used to count the whole inbox, unauthenticated, in a transaction that
took SQLite's write lock: with a large inbox, a few clients polling it starved the receipt of
webhooks. Now liveness (``/health/live``) touches no database; readiness (``/health/ready``,
and ``/health`` as before) reads one row of a one-row table in a read-only transaction; the
counts are the ``hookledger stats`` command's.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

import receiver.storage.database as db
from receiver.core.events import parse_event
from receiver.extension import WebhookReceiver
from receiver.storage.sql.tables import EVENT
from receiver.store import Store
from receiver.testing.factories import build_event, encode
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage

READINESS = ["/webhooks/health", "/webhooks/health/ready"]


def _fill(store: Store, count: int) -> None:
    """``count`` finished events, inserted in bulk (one executemany, no receive path)."""
    body = encode(build_event("payment_succeeded", object_id="pay_template"))
    template = store.inbox.row(parse_event(body), body, headers=[("Content-Type", "json")])
    rows = [
        {
            **template,
            "event_id": f"evt_bulk_{i:07d}",
            "object_id": f"pay_bulk_{i}",
            "object_key": f"payment:pay_bulk_{i}",
            "status": "done" if i % 10 else "pending",
        }
        for i in range(count)
    ]
    with store.engine.begin() as conn:
        for start in range(0, count, 5000):
            conn.execute(sa.insert(EVENT), rows[start : start + 5000])


@contextmanager
def _statements(engine: sa.Engine) -> Iterator[list[str]]:
    """The SQL statements ``engine`` sends meanwhile (BEGIN included, as SQLite gets it)."""
    seen: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(" ".join(statement.split()))

    sa.event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)


def _sqlite_path(app: Flask) -> str:
    database = WebhookReceiver.state(app).store.engine.url.database
    assert database is not None
    return database


def test_liveness_touches_no_database(make_app: AppFactory) -> None:
    app, _ = make_app()
    store = WebhookReceiver.state(app).store
    with _statements(store.engine) as seen:
        response = app.test_client().get("/webhooks/health/live")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}
    assert seen == []
    # Still alive when the database is gone: liveness says nothing about it.
    with store.engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {db.VERSION_TABLE}"))
    assert app.test_client().get("/webhooks/health/live").status_code == 200
    assert app.test_client().get("/webhooks/health/ready").status_code == 503


@pytest.mark.parametrize("path", READINESS)
def test_readiness_is_one_read_of_the_schema_version_and_shows_no_counts(
    make_app: AppFactory, path: str
) -> None:
    app, _ = make_app()
    store = WebhookReceiver.state(app).store
    _fill(store, 50)
    with _statements(store.engine) as seen:
        response = app.test_client().get(path)
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}  # no counts, no ages
    selects = [s for s in seen if s.upper().startswith("SELECT")]
    assert len(selects) == 1 and db.VERSION_TABLE in selects[0], seen
    assert not [s for s in seen if "hookledger_event" in s or "IMMEDIATE" in s.upper()], seen


@pytest.mark.parametrize("path", READINESS)
def test_readiness_fails_when_the_schema_is_behind_or_missing(
    make_app: AppFactory, path: str
) -> None:
    app, _ = make_app()
    store = WebhookReceiver.state(app).store
    with store.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {db.VERSION_TABLE} SET version_num = '0002'"))
    behind = app.test_client().get(path)
    assert behind.status_code == 503
    assert behind.get_json()["error"]["code"] == "HL_05"
    with store.engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {db.VERSION_TABLE}"))
    missing = app.test_client().get(path)
    assert missing.status_code == 503
    assert missing.get_json()["error"]["code"] == "HL_03"


@pytest.mark.parametrize("path", READINESS)
def test_readiness_costs_the_same_whatever_the_size_of_the_inbox(
    make_app: AppFactory, path: str
) -> None:
    """Cost measured in work, not time: on SQLite the virtual machine instructions the
    check executes (rows read make them grow); on both databases the statements it sends."""
    app, _ = make_app()
    store = WebhookReceiver.state(app).store
    sqlite_db = store.engine.dialect.name == "sqlite"
    steps = {"n": 0}
    handled: list[Any] = []

    def count_steps(conn: Any, *_args: Any) -> None:
        dbapi = conn.connection.dbapi_connection
        if dbapi not in handled:
            handled.append(dbapi)
            dbapi.set_progress_handler(lambda: steps.__setitem__("n", steps["n"] + 1) or 0, 10)

    def measure() -> tuple[int, list[str]]:
        steps["n"] = 0
        if sqlite_db:
            sa.event.listen(store.engine, "before_cursor_execute", count_steps)
        try:
            with _statements(store.engine) as seen:
                assert app.test_client().get(path).status_code == 200
        finally:
            if sqlite_db:
                sa.event.remove(store.engine, "before_cursor_execute", count_steps)
                for dbapi in handled:
                    dbapi.set_progress_handler(None, 10)
                handled.clear()
        return steps["n"], seen

    app.test_client().get(path)  # warm: connections, caches
    small = measure()
    _fill(store, 20_000)
    large = measure()
    assert large[1] == small[1]  # the same statements
    if sqlite_db:
        assert large[0] <= small[0] + 1, (small[0], large[0])


def test_sqlite_readiness_neither_waits_for_nor_holds_the_write_lock(
    make_app: AppFactory,
) -> None:
    app, _ = make_app(sqlite_busy_timeout=1.0)
    store = WebhookReceiver.state(app).store
    if store.engine.dialect.name != "sqlite":
        pytest.skip("SQLite's write lock")
    _fill(store, 1000)
    path = _sqlite_path(app)

    # 1. Another process's writer holds the lock: health answers, at once.
    writer = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        for route in READINESS:
            assert app.test_client().get(route).status_code == 200, route
    finally:
        writer.execute("ROLLBACK")
        writer.close()

    # 2. While a health check is inside its transaction, a writer takes the lock at once and
    # a webhook is stored (the check would make them wait if it held the lock).
    seen: dict[str, Any] = {}

    def during(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if db.VERSION_TABLE not in statement or "concurrent" in seen:
            return
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
            seen["concurrent"] = "lock taken"
        except sqlite3.OperationalError as exc:
            seen["concurrent"] = str(exc)
        finally:
            other.close()
        body = encode(build_event("payment_succeeded", event_id="evt_during_health"))
        insert = threading.Thread(
            target=lambda: seen.setdefault(
                "insert", store.inbox.insert(parse_event(body), body).result
            )
        )
        insert.start()
        insert.join(5)
        seen.setdefault("insert", "still waiting")

    sa.event.listen(store.engine, "after_cursor_execute", during)
    try:
        for route in READINESS:
            seen.clear()
            assert app.test_client().get(route).status_code == 200, route
            assert seen == {"concurrent": "lock taken", "insert": "inserted"}, (route, seen)
            with store.engine.begin() as conn:
                conn.execute(sa.delete(EVENT).where(EVENT.c.event_id == "evt_during_health"))
    finally:
        sa.event.remove(store.engine, "after_cursor_execute", during)


def test_the_counts_are_the_stats_commands(make_app: AppFactory) -> None:
    app, _ = make_app()
    store = WebhookReceiver.state(app).store
    _fill(store, 30)
    result = app.test_cli_runner().invoke(args=["hookledger", "stats", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["events"] == {"done": 27, "pending": 3}
    assert payload["oldest_open_age_seconds"] is not None
    assert store.operations.health()[0] == store.operations.stats()[0]  # the former name
