"""A handler slower than the lease runs once (issue 20, items 2 and 3).

Real threads, real clock, a short lease (1 s) and a handler that sleeps 2.5 s, on both
databases: two workers polling the queue (item 2), and ``observe(..., dispatch=True)`` with a
worker polling beside it (item 3). Before the fix, on SQLite the dispatch held the write lock
while the handler ran, so the lease could not be renewed, the commit found it expired and
rolled back, and the handler ran again, up to ``MAX_ATTEMPTS`` times; the inline dispatch of
``observe`` renewed no lease at all, so on PostgreSQL a worker took the object over.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import receiver.storage.database as db
from receiver.core.events import Event, parse_event
from receiver.core.registry import Registry
from receiver.core.retry import RetryPolicy
from receiver.extension import WebhookReceiver
from receiver.store import Store
from receiver.testing.factories import build_event, encode
from receiver.worker.runner import Worker, WorkerConfig
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage

LEASE = 1.0
SLOW = 2.5
#: Long enough for eight runs of the slow handler: the test never waits for a deadline
#: unless the fix is missing, and then it stops as soon as the handler runs a second time.
PATIENCE = 60.0


class SlowShop:
    """A handler that takes longer than the lease, counting its runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: Counter[str] = Counter()
        self.second_run = threading.Event()

    def ship(self, event: Event) -> None:
        with self.lock:
            self.runs[event.event_id] += 1
            if self.runs[event.event_id] > 1:
                self.second_run.set()
        time.sleep(SLOW)


def _wait_until(predicate: Any, give_up: threading.Event) -> None:
    deadline = time.monotonic() + PATIENCE
    while not predicate() and not give_up.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_handler_slower_than_the_lease_runs_once_with_two_workers_polling(
    database_url: str, engine: sa.Engine
) -> None:
    shop = SlowShop()
    registry = Registry()
    registry.on("payment_succeeded", name="ship")(shop.ship)
    engines = [db.make_engine(database_url) for _ in range(2)]
    retry = RetryPolicy(max_attempts=8, base_seconds=0, max_seconds=0)
    config = WorkerConfig(lease_seconds=LEASE, poll_interval=0.05, batch_size=4)
    workers = [
        Worker(Store(eng, retry=retry), registry, config, name=f"slow-{i}")
        for i, eng in enumerate(engines)
    ]
    body = encode(build_event("payment_succeeded", object_id="pay_slow"))
    event = parse_event(body)
    store = workers[0].store
    store.inbox.insert(event, body)
    threads = [threading.Thread(target=w.run, name=w.name) for w in workers]
    try:
        for thread in threads:
            thread.start()
        pk = _pk(store, event.event_id)
        _wait_until(
            lambda: store.queue.status_of(pk) not in ("pending", "processing"), shop.second_run
        )
        time.sleep(0.3)  # a second run, if one were coming, would have begun by now
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(PATIENCE)
        for eng in engines:
            eng.dispose()
    assert shop.runs == Counter({event.event_id: 1})
    row = store.operations.get(event.event_id)
    assert row is not None and row.status == "done", row
    runs = store.operations.handler_runs(row.id or 0)
    assert (runs["ship"].status, runs["ship"].attempts) == ("succeeded", 1)
    assert row.attempts == 1


def test_observe_dispatching_a_slow_handler_inline_runs_it_once_beside_a_worker(
    make_app: AppFactory,
) -> None:
    shop = SlowShop()
    hooks = WebhookReceiver()
    hooks.on("payment_succeeded", name="ship")(shop.ship)
    app, hooks = make_app(hooks, LEASE_SECONDS=LEASE, POLL_INTERVAL=0.05)
    state = WebhookReceiver.state(app)
    worker = state.worker(name="beside")
    thread = threading.Thread(target=worker.run, name="beside")
    thread.start()
    try:
        built = build_event("payment_succeeded", object_id="pay_inline")
        resource = dict(built["content"]["object"])
        with app.app_context():
            seen = hooks.observe(resource, dispatch=True, wait=PATIENCE)
        time.sleep(0.3)  # the worker polls meanwhile: it finds nothing to run
    finally:
        worker.stop()
        thread.join(PATIENCE)
    assert (seen.stored, seen.status, seen.dispatched_here) == ("inserted", "done", True)
    assert shop.runs == Counter({seen.event_id: 1})
    row = state.store.operations.get(str(seen.event_id))
    assert row is not None and row.status == "done" and row.attempts == 1, row


def _pk(store: Store, event_id: str) -> int:
    row = store.operations.get(event_id)
    assert row is not None and row.id is not None
    return row.id


def test_observe_whose_lease_another_worker_took_answers_none_and_that_worker_runs_it(
    engine: sa.Engine,
) -> None:
    """The documented answer when the inline dispatch loses its lease (its renewals failed
    for longer than the lease, here played by a clock the handler moves): ``None``, queued,
    its session writes rolled back; the worker that took the object runs the handlers."""
    if engine.dialect.name != "postgresql":
        pytest.skip(
            "on SQLite nobody can take a lease while a dispatch holds the write lock: the "
            "inline dispatch keeps it however long its handlers take (tests above)"
        )
    clock = _Clock()
    retry = RetryPolicy(max_attempts=5, base_seconds=0, max_seconds=0)
    store = Store(engine, clock=clock, retry=retry)
    registry = Registry()
    taken: list[Any] = []

    @registry.on("payment_succeeded", name="ship")
    def ship(event: Event, session: Any) -> None:
        session.execute(sa.text("CREATE TABLE IF NOT EXISTS shipped (event_id VARCHAR(64))"))
        session.execute(sa.text("INSERT INTO shipped VALUES (:e)"), {"e": event.event_id})
        if not taken:  # the inline run: its lease is taken over while it runs
            clock.now += timedelta(seconds=120)
            taken.append(Store(engine, clock=clock, retry=retry).queue.claim("other", 60.0))

    body = encode(build_event("payment_succeeded", object_id="pay_taken_inline"))
    event = parse_event(body)
    inserted = store.inbox.insert(event, body)
    inline = Worker(store, registry, WorkerConfig(lease_seconds=60.0), name="inline:test")
    assert inline.process_object("payment:pay_taken_inline", inserted.pk, wait=0.0) is None
    assert taken[0] is not None and taken[0].pk == inserted.pk  # the other worker has it
    row = store.operations.get(event.event_id)
    assert row is not None and row.status == "processing" and row.lease_owner == "other"
    assert not sa.inspect(engine).has_table("shipped")  # the inline run's writes rolled back
    outcome = store.dispatcher.dispatch(taken[0], [("ship", lambda session: None, True)])
    assert outcome.status == "done"


class _Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def test_lifecycles_with_handlers_slower_than_the_lease_at_random_dispatch_each_transition_once(
    database_url: str, engine: sa.Engine
) -> None:
    """A focused lifecycle check with slow handlers (the 120-day property test runs under a
    frozen clock with an inline worker, where a handler slower than the lease would have to
    move the clock and, on PostgreSQL, then wait in real time for the heartbeat thread at
    every slow call; here time is real): payments that go ``processing`` then
    ``succeeded``, delivered shuffled, with a second delivery of the success under another
    event id, two workers polling, and a handler that sleeps past the lease (0.5 s) for a
    random half of the events. Every event ends closed (none dead), every transition reaches
    the handler exactly once, and every payment ends ``succeeded``."""
    rng = random.Random(20)
    lease = 0.5
    lock = threading.Lock()
    calls: Counter[tuple[str, str]] = Counter()
    by_event: Counter[str] = Counter()
    slow: set[str] = set()
    registry = Registry()

    @registry.on("payment_processing", "payment_succeeded", name="record")
    def record(event: Event) -> None:
        with lock:
            calls[(event.payment.payment_id or "", event.event_type or "")] += 1
            by_event[event.event_id] += 1
        if event.event_id in slow:
            time.sleep(2 * lease)

    engines = [db.make_engine(database_url) for _ in range(2)]
    retry = RetryPolicy(max_attempts=8, base_seconds=0, max_seconds=0)
    config = WorkerConfig(lease_seconds=lease, poll_interval=0.05, batch_size=4)
    workers = [
        Worker(Store(eng, retry=retry), registry, config, name=f"life-{i}")
        for i, eng in enumerate(engines)
    ]
    store = workers[0].store
    t0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
    bodies = []
    payments = [f"pay_life{i}" for i in range(4)]
    for i, payment in enumerate(payments):
        at = t0 + timedelta(minutes=i)
        bodies.append(encode(build_event("payment_processing", object_id=payment, timestamp=at)))
        for _ in range(2):  # the success, delivered twice under two event ids
            succeeded = build_event(
                "payment_succeeded", object_id=payment, timestamp=at + timedelta(seconds=10)
            )
            bodies.append(encode(succeeded))
    rng.shuffle(bodies)
    events = [parse_event(body) for body in bodies]
    slow.update(e.event_id for e in events if rng.random() < 0.5)
    assert slow
    threads = [threading.Thread(target=w.run, name=w.name) for w in workers]
    try:
        for thread in threads:
            thread.start()
        for event, body in zip(events, bodies, strict=True):
            store.inbox.insert(event, body)
        pks = [_pk(store, e.event_id) for e in events]
        _wait_until(
            lambda: all(store.queue.status_of(pk) not in ("pending", "processing") for pk in pks),
            threading.Event(),
        )
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(PATIENCE)
        for eng in engines:
            eng.dispose()
    statuses = {e.event_id: store.queue.status_of(_pk(store, e.event_id)) for e in events}
    assert set(statuses.values()) <= {"done", "stale", "duplicate"}, statuses
    assert all(n == 1 for n in by_event.values()), by_event
    for payment in payments:
        assert calls[(payment, "payment_succeeded")] == 1, calls
        assert calls[(payment, "payment_processing")] <= 1, calls
        projection = store.operations.projection("payment", payment)
        assert projection is not None and projection.status == "succeeded"


def test_a_lease_renewal_meeting_the_batch_outcome_write_waits_instead_of_deadlocking(
    engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (CI, PostgreSQL): the outcome write locks the events' rows, then their
    object leases; a renewal locks the leases, then the events. When the heartbeat was between
    its two updates as the batch's write began, PostgreSQL found a deadlock and aborted one
    of them: the batch (its handlers then ran again) or the renewal (its lease then
    expired, with the same result). The interleaving is forced here: the renewal pauses
    after locking the leases until the write has started (at most 1 s); with the fix the
    write waits for the renewal instead, and the handler ran once."""
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time: no row locks to take in two orders")
    lease = 3.0  # renewed every second; outlasts the renewal's pause
    paused = threading.Event()
    writing = threading.Event()
    runs: Counter[str] = Counter()

    def hook(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        thread = threading.current_thread().name
        if statement.startswith("WITH closed AS"):
            writing.set()
            return
        if (
            thread == "hookledger-heartbeat"
            and statement.startswith("UPDATE hookledger_event SET lease_expires_at")
            and not paused.is_set()
        ):
            paused.set()  # the leases are locked by this transaction now
            if writing.wait(1.0):
                time.sleep(0.2)  # let the write lock the events and wait for the leases

    registry = Registry()

    @registry.on("payment_succeeded", name="ship")
    def ship(event: Event) -> None:
        runs[event.event_id] += 1
        assert paused.wait(PATIENCE)  # finish while a renewal is half done

    sa.event.listen(engine, "before_cursor_execute", hook)
    try:
        retry = RetryPolicy(max_attempts=3, base_seconds=0, max_seconds=0)
        store = Store(engine, retry=retry)
        worker = Worker(store, registry, WorkerConfig(lease_seconds=lease), name="renewing")
        body = encode(build_event("payment_succeeded", object_id="pay_renewing"))
        event = parse_event(body)
        pk = store.inbox.insert(event, body).pk
        with caplog.at_level(logging.WARNING):
            worker.drain()
    finally:
        sa.event.remove(engine, "before_cursor_execute", hook)
    assert paused.is_set() and writing.is_set()
    assert "DeadlockDetected" not in caplog.text, caplog.text
    assert runs == Counter({event.event_id: 1})
    assert store.queue.status_of(pk) == "done"
