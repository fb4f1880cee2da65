"""A worker that lost an object's lease never commits handler effects (issue hole 1).

The scenario: worker A stalls past its lease inside a handler; a late event of the same
object, earlier in event time, arrives; worker B claims it as the object's new head (taking
the object lease). A's event row still names A as its lease owner, so a commit that checks
only the event row's lease lets both workers commit. The commit must also check, atomically
with its writes, that the worker still holds the object lease, unexpired.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import receiver.storage.database as db
from receiver.core.events import Event, parse_event
from receiver.core.registry import Registry
from receiver.core.retry import RetryPolicy
from receiver.store import Store
from receiver.testing.factories import build_event, encode
from receiver.worker.runner import Worker, WorkerConfig

pytestmark = pytest.mark.storage

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
LEASE = 60.0


class _Clock:
    """A clock the test moves (shared by every worker's store)."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def _insert(store: Store, event_type: str, *, at: datetime, object_id: str) -> Event:
    body = encode(build_event(event_type, timestamp=at, object_id=object_id))
    event = parse_event(body)
    store.inbox.insert(event, body)
    return event


def _effects_table(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE lease_effect (who VARCHAR(32), event_id VARCHAR(64))"))


def _effects(engine: sa.Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT who, event_id FROM lease_effect ORDER BY who"))
        return sorted((r[0], r[1]) for r in rows)


def _effect(who: str, event_id: str) -> Any:
    def write(session: Session) -> None:
        session.execute(
            sa.text("INSERT INTO lease_effect (who, event_id) VALUES (:w, :e)"),
            {"w": who, "e": event_id},
        )

    return write


def test_a_worker_whose_object_a_late_earlier_event_took_over_commits_nothing(
    engine: sa.Engine,
) -> None:
    # Deterministic interleaving, on both databases: A's commit comes while B holds the
    # object's lease for the late, earlier event.
    clock = _Clock()
    a = Store(engine, clock=clock, retry=RetryPolicy(max_attempts=5))
    b = Store(engine, clock=clock, retry=RetryPolicy(max_attempts=5))
    _effects_table(engine)
    later = _insert(a, "payment_succeeded", at=T0 + timedelta(seconds=10), object_id="pay_x")
    slow = a.queue.claim("worker-a", LEASE)
    assert slow is not None and slow.event_id == later.event_id
    clock.now += timedelta(seconds=LEASE + 1)  # A stalls past its lease
    earlier = _insert(b, "payment_processing", at=T0, object_id="pay_x")
    fast = b.queue.claim("worker-b", LEASE)
    assert fast is not None and fast.event_id == earlier.event_id  # the object's new head

    late = a.dispatcher.dispatch(slow, [("h", _effect("worker-a", slow.event_id), True)])
    assert late.status == "lease_lost"
    assert (
        b.dispatcher.dispatch(fast, [("h", _effect("worker-b", fast.event_id), True)]).status
        == "done"
    )
    # A's event is still open; once B is done with the object it is claimed again, once.
    again = b.queue.claim("worker-b", LEASE)
    assert again is not None and again.event_id == later.event_id
    assert (
        b.dispatcher.dispatch(again, [("h", _effect("worker-b", again.event_id), True)]).status
        == "done"
    )

    assert _effects(engine) == sorted(
        [("worker-b", earlier.event_id), ("worker-b", later.event_id)]
    )
    for event in (earlier, later):
        row = b.operations.get(event.event_id)
        assert row is not None and row.status == "done"
        runs = b.operations.handler_runs(row.id or 0)
        assert (runs["h"].status, runs["h"].attempts) == ("succeeded", 1)
    assert b.queue.claim("worker-c", LEASE) is None


def test_an_expired_lease_nobody_took_is_lost_on_postgresql_and_still_held_on_sqlite(
    engine: sa.Engine,
) -> None:
    """PostgreSQL: another worker may take an expired lease at any moment, so the worker
    whose lease expired commits nothing. SQLite: a dispatch holds the only write lock from
    before its handlers run to its commit, and taking a lease writes the taker's name, so a
    lease that still names the worker is its own however late (issue 20, item 2)."""
    clock = _Clock()
    store = Store(engine, clock=clock, retry=RetryPolicy(max_attempts=5))
    _effects_table(engine)
    event = _insert(store, "payment_succeeded", at=T0, object_id="pay_expired")
    claimed = store.queue.claim("worker-a", LEASE)
    assert claimed is not None
    clock.now += timedelta(seconds=LEASE + 1)
    outcome = store.dispatcher.dispatch(claimed, [("h", _effect("worker-a", event.event_id), True)])
    if engine.dialect.name == "sqlite":
        assert outcome.status == "done"
        assert _effects(engine) == [("worker-a", event.event_id)]
        assert store.queue.claim("worker-b", LEASE) is None
        return
    assert outcome.status == "lease_lost"
    assert store.dispatcher.finish(claimed, status="dead", error="gave up") is None
    assert _effects(engine) == []
    retaken = store.queue.claim("worker-b", LEASE)
    assert retaken is not None and retaken.pk == claimed.pk
    assert store.dispatcher.dispatch(
        retaken, [("h", _effect("worker-b", event.event_id), True)]
    ).status == ("done")
    assert _effects(engine) == [("worker-b", event.event_id)]


def test_a_worker_whose_expired_lease_was_taken_runs_none_of_its_handlers(
    engine: sa.Engine,
) -> None:
    """Worker A's lease expired and B took the object over before A's dispatch began: A
    must not run its handlers at all (B runs them), on either database."""
    clock = _Clock()
    a = Store(engine, clock=clock, retry=RetryPolicy(max_attempts=5))
    _effects_table(engine)
    event = _insert(a, "payment_succeeded", at=T0, object_id="pay_taken")
    claimed = a.queue.claim("worker-a", LEASE)
    assert claimed is not None
    clock.now += timedelta(seconds=LEASE + 1)
    taken = a.queue.claim("worker-b", LEASE)
    assert taken is not None and taken.pk == claimed.pk
    ran: list[str] = []

    def handler(session: Session) -> None:
        ran.append("worker-a")

    assert a.dispatcher.dispatch(claimed, [("h", handler, False)]).status == "lease_lost"
    assert ran == []
    assert a.dispatcher.dispatch(
        taken, [("h", _effect("worker-b", event.event_id), True)]
    ).status == ("done")
    assert _effects(engine) == [("worker-b", event.event_id)]


def test_two_workers_never_both_commit_one_object_when_one_stalls_past_its_lease(
    database_url: str, engine: sa.Engine
) -> None:
    """Two workers, each with its own engine (its own connections), in threads, on one
    controllable clock: A's handler blocks past A's lease; a late, earlier event of the
    same payment arrives; B claims it and runs its handler while A's is still running. A
    then tries to commit while B holds the object: A's writes (its handler's included) roll
    back, B's commit, and A's event is then processed once, after B's."""
    if engine.dialect.name != "postgresql":
        pytest.skip(
            "on SQLite a dispatch holds the database's write lock while its handlers run, so "
            "no second worker can claim meanwhile (the deterministic test covers SQLite)"
        )
    clock = _Clock()
    _effects_table(engine)
    running: set[str] = set()
    overlapped: list[tuple[str, ...]] = []
    entered = {"a": threading.Event(), "b": threading.Event()}
    release = {"a": threading.Event(), "b": threading.Event()}
    guard = threading.Lock()
    registry = Registry()

    @registry.on_class("payments", name="effect")
    def effect(event: Event, session: Session) -> None:
        who = threading.current_thread().name
        with guard:
            running.add(who)
            if len(running) > 1:
                overlapped.append(tuple(sorted(running)))
        try:
            session.execute(
                sa.text("INSERT INTO lease_effect (who, event_id) VALUES (:w, :e)"),
                {"w": who, "e": event.event_id},
            )
            gate = who[-1] if who in ("worker-a", "worker-b") else None
            if gate is not None and not entered[gate].is_set():
                entered[gate].set()
                assert release[gate].wait(30), "the test never released the handler"
        finally:
            with guard:
                running.discard(who)

    engines = [db.make_engine(database_url) for _ in range(2)]
    try:
        retry = RetryPolicy(max_attempts=5, base_seconds=0, max_seconds=0)
        config = WorkerConfig(lease_seconds=LEASE, poll_interval=0.01, batch_size=4)
        worker_a = Worker(Store(engines[0], clock=clock, retry=retry), registry, config, name="a")
        worker_b = Worker(Store(engines[1], clock=clock, retry=retry), registry, config, name="b")
        later = _insert(
            worker_a.store, "payment_succeeded", at=T0 + timedelta(seconds=10), object_id="pay_x"
        )
        counts: dict[str, int] = {}

        def run(worker: Worker, key: str) -> None:
            counts[key] = worker.run_once()

        thread_a = threading.Thread(target=run, args=(worker_a, "a"), name="worker-a")
        thread_a.start()
        assert entered["a"].wait(10), "worker A never reached its handler"
        clock.now += timedelta(seconds=LEASE + 1)  # A's handler is stuck past the lease
        earlier = _insert(worker_b.store, "payment_processing", at=T0, object_id="pay_x")
        thread_b = threading.Thread(target=run, args=(worker_b, "b"), name="worker-b")
        thread_b.start()
        assert entered["b"].wait(10), "worker B never claimed the late, earlier event"
        assert overlapped  # both handlers are running at once: A has not noticed yet

        release["a"].set()  # A tries to commit while B holds the object's lease
        thread_a.join(30)
        assert not thread_a.is_alive() and counts["a"] == 1
        assert _effects(engine) == []  # A's handler effect rolled back with its batch
        stuck = worker_b.store.operations.get(later.event_id)
        assert stuck is not None and stuck.status == "processing"
        assert worker_b.store.operations.handler_runs(stuck.id or 0) == {}  # A's ledger row too

        release["b"].set()
        thread_b.join(30)
        assert not thread_b.is_alive() and counts["b"] == 1
        assert _effects(engine) == [("worker-b", earlier.event_id)]

        # A's event is claimed again now that B is done with the object: once.
        drained = threading.Thread(target=run, args=(worker_b, "drain"), name="worker-b-drain")
        drained.start()
        drained.join(30)
        assert counts["drain"] == 1
        assert worker_b.drain() == 0
        assert _effects(engine) == sorted(
            [("worker-b", earlier.event_id), ("worker-b-drain", later.event_id)]
        )
        for event in (earlier, later):
            row = worker_b.store.operations.get(event.event_id)
            assert row is not None and row.status == "done", row
            runs = worker_b.store.operations.handler_runs(row.id or 0)
            assert (runs["effect"].status, runs["effect"].attempts) == ("succeeded", 1)
        projection = worker_b.store.operations.projection("payment", "pay_x")
        assert projection is not None and projection.status == "succeeded"
    finally:
        for event in release.values():
            event.set()
        for eng in engines:
            eng.dispose()
