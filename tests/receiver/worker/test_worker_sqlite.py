"""The worker on a SQLite file: its transactions take the web processes' writers' lock, a
batch is committed in turns, and an idle worker finds an empty queue without writing."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from receiver.core.events import parse_event
from receiver.core.registry import Registry
from receiver.storage.filelock import WritersLock
from receiver.storage.inbox import WRITERS_LOCK_SUFFIX
from receiver.store import Store
from receiver.testing.factories import build_event, encode
from receiver.worker.runner import Worker, WorkerConfig, writers_lock
from tests.conftest import backend

pytestmark = [
    pytest.mark.storage,
    pytest.mark.skipif(backend() != "sqlite", reason="SQLite's writers' lock"),
]


def _insert(store: Store, n: int, *, at: datetime | None = None) -> None:
    for i in range(n):
        body = encode(
            build_event(
                "payment_succeeded", object_id=f"pay_{i}", timestamp=at or datetime.now(UTC)
            )
        )
        store.inbox.insert(parse_event(body), body)


def _worker(store: Store, seen: list[str]) -> Worker:
    registry = Registry()
    registry.on_any(name="record")(lambda event: seen.append(event.event_id))
    return Worker(store, registry, WorkerConfig(batch_size=16))


def test_worker_uses_the_web_processes_lock_file(store: Store) -> None:
    lock = writers_lock(store)
    assert lock is not None
    assert lock.path == f"{store.engine.url.database}{WRITERS_LOCK_SUFFIX}"


def test_a_batch_is_committed_in_turns_under_the_writers_lock(store: Store) -> None:
    seen: list[str] = []
    worker = _worker(store, seen)
    _insert(store, 40)
    assert worker.drain() == 40
    assert len(seen) == 40
    assert store.operations.counts().get("done") == 40


def test_a_turn_waits_for_a_writer_holding_the_lock(store: Store) -> None:
    """The worker queues on the writers' lock, as the web processes do: while another
    process's writer holds it, nothing of the worker commits."""
    seen: list[str] = []
    worker = _worker(store, seen)
    _insert(store, 3)
    other = WritersLock(f"{store.engine.url.database}{WRITERS_LOCK_SUFFIX}")
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with other.hold(5.0):
            held.set()
            release.wait(5.0)

    # A lock taken by another thread of this process excludes as another process would: its
    # own open file (flock is per open file).
    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5.0)
    done = threading.Thread(target=worker.drain)
    done.start()
    done.join(0.3)
    assert done.is_alive() and seen == []
    release.set()
    holder.join(5.0)
    done.join(10.0)
    assert not done.is_alive()
    assert len(seen) == 3


def test_an_idle_worker_does_not_claim(store: Store) -> None:
    seen: list[str] = []
    worker = _worker(store, seen)
    assert store.queue.any_due() is False
    assert worker.run_once() == 0
    _insert(store, 1, at=datetime.now(UTC) - timedelta(minutes=1))
    assert store.queue.any_due() is True
    assert worker.run_once() == 1 and len(seen) == 1
    assert store.queue.any_due() is False


def test_lock_file_is_beside_the_database(store: Store, tmp_path: Path) -> None:
    database = Path(store.engine.url.database or "")
    seen: list[str] = []
    _insert(store, 1)
    _worker(store, seen).drain()
    assert Path(f"{database}{WRITERS_LOCK_SUFFIX}").exists()


def test_claim_reads_do_not_read_the_backlog(store: Store) -> None:
    """A claim's reads seek the open-events index in order and the object index: never a
    read of every open event and a sort of them (a cost of the backlog). No statistics."""
    from sqlalchemy import event as sa_event

    seen: list[str] = []
    worker = _worker(store, seen)
    _insert(store, 200, at=datetime.now(UTC) - timedelta(minutes=1))
    selects: list[tuple[str, object]] = []

    def capture(conn: object, cursor: object, statement: str, params: object, *_: object) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "hookledger_event" in statement:
            selects.append((statement, params))

    sa_event.listen(store.engine, "before_cursor_execute", capture)
    try:
        assert worker.run_once() > 0
    finally:
        sa_event.remove(store.engine, "before_cursor_execute", capture)
    assert selects
    with store.engine.connect() as conn:
        for statement, params in selects:
            plan = " | ".join(
                str(row[-1])
                for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params)  # type: ignore[arg-type]
            )
            assert "TEMP B-TREE" not in plan, (statement, plan)  # a sort of what it read
            assert "SCAN hookledger_event" not in plan, (statement, plan)


def _held_by_another(store: Store, seconds: float) -> tuple[threading.Thread, threading.Event]:
    """Another process's writer (another worker whose handler runs in its turn) takes the
    writers' lock as soon as it is free and holds it for ``seconds``; set the event to let
    go sooner."""
    other = WritersLock(f"{store.engine.url.database}{WRITERS_LOCK_SUFFIX}")
    release = threading.Event()

    def hold() -> None:
        with other.hold(30.0):
            release.wait(seconds)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    return holder, release


def test_a_claim_that_waits_past_the_busy_timeout_ends_the_round_not_the_worker(
    engine: sa.Engine,
) -> None:
    # Two workers, one running a handler longer than the busy timeout in its turn: the
    # other's claim gave up on the writers' lock with a TimeoutError that nothing caught,
    # and that worker process died.
    store = Store(engine, write_wait=0.3)
    seen: list[str] = []
    worker = _worker(store, seen)
    _insert(store, 1, at=datetime.now(UTC) - timedelta(minutes=1))
    holder, release = _held_by_another(store, 30.0)
    try:
        for _ in range(100):  # until the other writer holds it
            if Path(f"{store.engine.url.database}{WRITERS_LOCK_SUFFIX}").read_bytes()[:8] != bytes(
                8
            ):
                break
            threading.Event().wait(0.01)
        assert worker.run_once() == 0
    finally:
        release.set()
        holder.join(30)
    assert worker.run_once() == 1 and len(seen) == 1


def test_a_turn_that_waits_past_the_busy_timeout_waits_on(engine: sa.Engine) -> None:
    # The batch's first turn ends; another worker takes the writers' lock for longer than
    # the busy timeout before the second turn: the turn gave up with a TimeoutError that
    # ended the worker, its leased events left until their leases ran out.
    store = Store(engine, write_wait=0.3)
    seen: list[str] = []
    started: list[threading.Thread] = []
    registry = Registry()

    def record(event: Any) -> None:
        seen.append(event.event_id)
        if len(seen) == 1:  # takes the lock once this turn lets go, for 1 s
            started.append(_held_by_another(store, 1.0)[0])

    registry.on_any(name="record")(record)
    worker = Worker(store, registry, WorkerConfig(batch_size=2))
    _insert(store, 2, at=datetime.now(UTC) - timedelta(minutes=1))
    assert worker.run_once() == 2
    assert len(seen) == 2
    for holder in started:
        holder.join(30)
