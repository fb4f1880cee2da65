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
    (conn,) = list(held._held)
    assert held.fetchall("SELECT %(x)s::int", {"x": 2}) == [(2,)]
    assert list(held._held) == [conn]


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
    assert len(held._held) in (0, 1, 2, 3)  # ended threads' connections may be collected


def test_a_forked_child_opens_its_own(held: HeldConnections) -> None:
    parent = held.fetchall("SELECT pg_backend_pid()", {})[0][0]
    pid, conn = held._local.held
    held._local.held = (pid + 1, conn)  # as a child process sees its parent's
    child = held.fetchall("SELECT pg_backend_pid()", {})[0][0]
    assert child != parent
    assert not conn.closed  # the parent's connection is left alone, not closed
    assert os.getpid() == held._local.held[0]


def test_disposing_the_engine_closes_them(engine: sa.Engine, held: HeldConnections) -> None:
    held.fetchall("SELECT 1", {})
    (conn,) = list(held._held)
    engine.dispose()
    assert conn.closed and not held._held
    assert held.fetchall("SELECT 1", {}) == [(1,)]  # a new one, when next used
