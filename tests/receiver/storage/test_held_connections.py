"""The driver connections the receive path holds per thread on PostgreSQL
(:mod:`receiver.storage.held_connections`): errors as SQLAlchemy's, a broken connection
replaced once, one connection per thread, none shared with a forked child, all closed with
the engine."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import sqlalchemy as sa

from receiver.storage.context import is_unavailable
from receiver.storage.database import make_engine
from receiver.storage.held_connections import HeldConnections

pytestmark = pytest.mark.storage


@pytest.fixture
def held(engine: sa.Engine) -> HeldConnections:
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's driver connections")
    return HeldConnections(engine)


def test_a_refused_connection_is_an_outage_not_a_crash() -> None:
    pytest.importorskip("psycopg")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    engine = make_engine(f"postgresql+psycopg://nobody@127.0.0.1:{port}/none")
    try:
        with pytest.raises(sa.exc.OperationalError) as caught:
            HeldConnections(engine).fetchall("SELECT 1", {})
        assert is_unavailable(caught.value)
    finally:
        engine.dispose()


def test_a_bad_statement_is_sqlalchemys_error_without_its_parameters(
    held: HeldConnections,
) -> None:
    with pytest.raises(sa.exc.DataError) as caught:
        held.fetchall("SELECT 1 / %(zero)s", {"zero": 0})
    assert not is_unavailable(caught.value)
    assert caught.value.params is None and "zero" not in repr(caught.value.params)
    # The connection was not broken by it: the next statement runs on the same one.
    (conn,) = held.connections()
    assert held.fetchall("SELECT %(x)s::int", {"x": 2}) == [(2,)]
    assert held.connections() == [conn]


def test_each_thread_holds_its_own_connection(held: HeldConnections) -> None:
    pids: list[int] = []

    def run() -> None:
        pids.append(held.fetchall("SELECT pg_backend_pid()", {})[0][0])
        pids.append(held.fetchall("SELECT pg_backend_pid()", {})[0][0])

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(pids)) == 3  # one per thread, the same one for a thread's statements
    assert len(held.connections()) <= 3  # ended threads' connections may be collected


def test_a_forked_child_opens_its_own(held: HeldConnections) -> None:
    parent = held.fetchall("SELECT pg_backend_pid()", {})[0][0]
    mine = held._local.held
    mine.pid += 1  # as a child process sees its parent's
    child = held.fetchall("SELECT pg_backend_pid()", {})[0][0]
    assert child != parent
    assert not mine.conn.closed  # the parent's connection is left alone, not closed
    held.close()
    assert not mine.conn.closed  # even when the child closes its own
    assert os.getpid() == held._local.held.pid


def test_disposing_the_engine_closes_them(engine: sa.Engine, held: HeldConnections) -> None:
    held.fetchall("SELECT 1", {})
    (conn,) = held.connections()
    engine.dispose()
    assert conn.closed and not held.connections()
    assert held.fetchall("SELECT 1", {}) == [(1,)]  # a new one, when next used


@pytest.fixture
def sqlite_held(engine: sa.Engine) -> HeldConnections:
    if engine.dialect.name != "sqlite":
        pytest.skip("SQLite's driver connections")
    return HeldConnections(engine)


def test_sqlite_a_failed_transaction_is_rolled_back_and_the_connection_kept(
    engine: sa.Engine, sqlite_held: HeldConnections
) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (k INTEGER PRIMARY KEY)")

    def twice(conn: object) -> None:
        conn.execute("INSERT INTO t VALUES (1)")  # type: ignore[attr-defined]
        conn.execute("INSERT INTO t VALUES (1)")  # type: ignore[attr-defined]

    with pytest.raises(sa.exc.IntegrityError) as caught:
        sqlite_held.transaction(twice)
    assert not is_unavailable(caught.value) and caught.value.params is None
    (conn,) = sqlite_held.connections()
    assert not conn.in_transaction
    assert sqlite_held.fetchall("SELECT count(*) FROM t", ()) == [(0,)]  # nothing kept
    sqlite_held.transaction(lambda c: c.execute("INSERT INTO t VALUES (2)"))
    assert sqlite_held.connections() == [conn]
    with engine.connect() as other:
        assert other.exec_driver_sql("SELECT k FROM t").scalars().all() == [2]


def test_sqlite_a_locked_database_is_an_outage(
    engine: sa.Engine, sqlite_held: HeldConnections
) -> None:
    quick = make_engine(str(engine.url), sqlite_busy_timeout=0.05)
    held = HeldConnections(quick)
    try:
        with engine.begin() as conn:  # BEGIN IMMEDIATE: the write lock, held
            conn.exec_driver_sql("CREATE TABLE t (k INTEGER PRIMARY KEY)")
            with pytest.raises(sa.exc.OperationalError) as caught:
                held.transaction(lambda c: c.execute("INSERT INTO t VALUES (1)"))
        assert is_unavailable(caught.value)
        assert held.transaction(lambda c: c.execute("INSERT INTO t VALUES (1)").rowcount) == 1
    finally:
        quick.dispose()


def test_sqlite_the_busy_timeout_is_said_once_per_connection_and_value(
    engine: sa.Engine, sqlite_held: HeldConnections
) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    said: list[str] = []
    sqlite_held.transaction(lambda c: c.set_trace_callback(said.append))
    for k, busy_ms in enumerate((40, 40, 40, 5000, 40), start=1):
        sqlite_held.transaction(
            lambda c, k=k: c.execute("INSERT INTO t VALUES (?)", (k,)), busy_ms=busy_ms
        )
        (conn,) = sqlite_held.connections()
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (busy_ms,)
    pragmas = [s for s in said if s.startswith("PRAGMA busy_timeout=")]
    assert pragmas == [
        "PRAGMA busy_timeout=40",
        "PRAGMA busy_timeout=5000",
        "PRAGMA busy_timeout=40",
    ]
    # A connection replaced (closed with the engine) is told again.
    engine.dispose()
    said.clear()
    sqlite_held.transaction(lambda c: c.set_trace_callback(said.append))
    sqlite_held.transaction(lambda c: c.execute("INSERT INTO t VALUES (9)"), busy_ms=40)
    (conn,) = sqlite_held.connections()
    assert conn.execute("PRAGMA busy_timeout").fetchone() == (40,)
    assert "PRAGMA busy_timeout=40" in said
