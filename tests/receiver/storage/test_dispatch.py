"""Dispatch semantics on real databases: ledger, retries, dead-letter, guard, ordering, leases."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from receiver.core.errors import UnknownEventType
from receiver.core.events import Event, parse_event
from receiver.core.registry import Registry
from receiver.core.retry import RetryPolicy
from receiver.extension import WebhookReceiver
from receiver.store import Store
from receiver.testing import WebhookTestClient
from receiver.testing.factories import build_event, encode
from receiver.worker.runner import Worker
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _insert(store: Store, event_type: str, *, at: datetime, **fields: Any) -> Event:
    body = encode(build_event(event_type, timestamp=at, **fields))
    event = parse_event(body)
    store.inbox.insert(event, body)
    return event


def test_failing_handler_is_retried_alone(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()
    calls: Counter[str] = Counter()

    @hooks.on("payment_succeeded")
    def flaky(event: Event) -> None:
        calls["flaky"] += 1
        if calls["flaky"] <= 2:
            raise RuntimeError("downstream unavailable")

    @hooks.on("payment_succeeded")
    def steady(event: Event) -> None:
        calls["steady"] += 1

    @hooks.on_class("payments")
    def by_class(event: Event) -> None:
        calls["class"] += 1

    @hooks.on_any()
    def catch_all(event: Event) -> None:
        calls["any"] += 1

    app, _ = make_app(hooks, max_attempts=5)
    client = WebhookTestClient(app)
    response = client.send("payment_succeeded", event_id="evt_flaky")
    assert response.status_code == 200
    assert client.drain() == 3
    assert calls == Counter(flaky=3, steady=1, **{"class": 1, "any": 1})
    store = WebhookReceiver.state(app).store
    row = store.operations.get("evt_flaky")
    assert row is not None and row.status == "done" and row.attempts == 3
    runs = store.operations.handler_runs(row.id or 0)
    assert runs[f"{__name__}.test_failing_handler_is_retried_alone.<locals>.flaky"].attempts == 3
    assert {r.status for r in runs.values()} == {"succeeded"}


def test_dead_letter_then_requeue_runs_only_the_failed_handler(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()
    calls: Counter[str] = Counter()
    broken = {"yes": True}

    @hooks.on("refund_succeeded", name="notify")
    def notify(event: Event) -> None:
        calls["notify"] += 1
        if broken["yes"]:
            raise ValueError("template missing")

    @hooks.on("refund_succeeded", name="book")
    def book(event: Event) -> None:
        calls["book"] += 1

    app, _ = make_app(hooks, max_attempts=3)
    client = WebhookTestClient(app)
    client.send("refund_succeeded", event_id="evt_dead")
    client.drain()
    store = WebhookReceiver.state(app).store
    row = store.operations.get("evt_dead")
    assert row is not None and row.status == "dead"
    assert "template missing" in (row.last_error or "")
    assert calls == Counter(notify=3, book=1)

    runner = app.test_cli_runner()
    dry = runner.invoke(args=["hookledger", "requeue", "--type", "refund_succeeded", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "1 event(s) would be requeued" in dry.output
    assert store.operations.get("evt_dead").status == "dead"  # type: ignore[union-attr]

    broken["yes"] = False
    result = runner.invoke(args=["hookledger", "requeue", "--event-id", "evt_dead", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["requeued"][0]["event_id"] == "evt_dead"
    client.drain()
    assert store.operations.get("evt_dead").status == "done"  # type: ignore[union-attr]
    assert calls == Counter(notify=4, book=1)


def test_stale_event_does_not_move_the_object_back(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()
    seen: list[str] = []

    @hooks.on_class("payments")
    def record(event: Event) -> None:
        seen.append(event.event_type)

    app, _ = make_app(hooks)
    client = WebhookTestClient(app)
    client.send("payment_succeeded", object_id="pay_s", timestamp=T0)
    client.drain()
    # Arrives later, and even claims a later time: still backwards from succeeded.
    client.send(
        "payment_processing",
        object_id="pay_s",
        event_id="evt_late",
        timestamp=T0 + timedelta(minutes=5),
    )
    client.drain()
    assert seen == ["payment_succeeded"]
    store = WebhookReceiver.state(app).store
    late = store.operations.get("evt_late")
    assert late is not None and late.status == "stale"
    assert "backwards" in (late.last_error or "")
    projection = store.operations.projection("payment", "pay_s")
    assert projection is not None and projection.status == "succeeded"


def test_forward_moves_are_dispatched_in_event_time_order(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()
    seen: list[str] = []

    @hooks.on_class("payments")
    def record(event: Event) -> None:
        seen.append(event.event_type)

    app, _ = make_app(hooks)
    client = WebhookTestClient(app)
    # Delivered newest first; both are waiting when the worker starts.
    client.send("payment_succeeded", object_id="pay_o", timestamp=T0 + timedelta(seconds=2))
    client.send("payment_authorized", object_id="pay_o", timestamp=T0 + timedelta(seconds=1))
    client.send("payment_processing", object_id="pay_o", timestamp=T0)
    client.drain()
    assert seen == ["payment_processing", "payment_authorized", "payment_succeeded"]


def test_equal_rank_terminal_statuses_are_ordered_by_event_time(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()
    seen: list[str] = []

    @hooks.on_class("refunds")
    def record(event: Event) -> None:
        seen.append(event.event_type)

    app, _ = make_app(hooks)
    client = WebhookTestClient(app)
    client.send("refund_failed", object_id="ref_1", timestamp=T0 + timedelta(seconds=5))
    client.drain()
    client.send("refund_succeeded", object_id="ref_1", timestamp=T0)
    client.drain()
    assert seen == ["refund_failed"]


def test_a_transition_is_dispatched_once_however_it_arrives(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()
    seen: list[str] = []

    @hooks.on("payment_succeeded")
    def fulfil(event: Event) -> None:
        seen.append(event.event_id)

    app, _ = make_app(hooks)
    store = WebhookReceiver.state(app).store
    synthesised = build_event("payment_succeeded", object_id="pay_t", event_id="rec_pay_t_1")
    body = encode(synthesised)
    store.inbox.insert(parse_event(body), body, source="reconcile")
    WebhookTestClient(app).send("payment_succeeded", object_id="pay_t", event_id="evt_webhook")
    WebhookTestClient(app).drain()
    assert seen == ["rec_pay_t_1"]
    late = store.operations.get("evt_webhook")
    assert late is not None and late.status == "duplicate"


def test_unknown_event_names_fail_at_registration() -> None:
    registry = Registry()
    with pytest.raises(UnknownEventType, match="payment_succeeded"):
        registry.on("payment_succeded")
    with pytest.raises(UnknownEventType):
        registry.on_class("paymentz")


def test_handler_session_writes_commit_with_the_ledger(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()
    attempts = Counter[str]()

    @hooks.on("payment_succeeded")
    def write(event: Event, session: Session) -> None:
        attempts["write"] += 1
        session.execute(
            sa.text("INSERT INTO side_effect (event_id) VALUES (:e)"), {"e": event.event_id}
        )
        if attempts["write"] == 1:
            raise RuntimeError("fails after writing: the write must roll back")

    app, _ = make_app(hooks)
    engine = WebhookReceiver.state(app).store.engine
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE side_effect (event_id VARCHAR(64))"))
    client = WebhookTestClient(app)
    client.send("payment_succeeded", event_id="evt_tx")
    client.drain()
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT event_id FROM side_effect")).all()
    assert [r[0] for r in rows] == ["evt_tx"]
    assert attempts["write"] == 2


def test_replay_runs_every_handler_again_for_a_copy(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()
    seen: list[str] = []

    @hooks.on("dispute_opened")
    def record(event: Event) -> None:
        seen.append(event.event_id)

    app, _ = make_app(hooks)
    client = WebhookTestClient(app)
    client.send("dispute_opened", event_id="evt_d")
    client.drain()
    runner = app.test_cli_runner()
    dry = runner.invoke(args=["hookledger", "replay", "--event-id", "evt_d", "--dry-run"])
    assert dry.exit_code == 0 and "would be replayed" in dry.output
    client.drain()
    assert seen == ["evt_d"]
    result = runner.invoke(args=["hookledger", "replay", "--event-id", "evt_d"])
    assert result.exit_code == 0, result.output
    client.drain()
    # Handlers see the event exactly as it was stored (same id and body) a second time.
    assert seen == ["evt_d", "evt_d"]
    copy = WebhookReceiver.state(app).store.operations.get("evt_d~replay1")
    assert copy is not None and copy.source == "replay" and copy.status == "done"
    assert runner.invoke(args=["hookledger", "replay"]).exit_code == 2


class _Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def test_object_lease_excludes_other_workers_until_it_expires(engine: sa.Engine) -> None:
    clock = _Clock()
    store = Store(engine, clock=clock, retry=RetryPolicy(max_attempts=3))
    _insert(store, "payment_processing", at=T0, object_id="pay_l")
    _insert(store, "payment_succeeded", at=T0 + timedelta(seconds=1), object_id="pay_l")
    _insert(store, "payment_succeeded", at=T0, object_id="pay_other")

    first = store.queue.claim("worker-a", lease_seconds=30)
    assert first is not None and first.object_id in {"pay_l", "pay_other"}
    second = store.queue.claim("worker-b", lease_seconds=30)
    assert second is not None and second.object_id != first.object_id
    # Everything left belongs to leased objects.
    assert store.queue.claim("worker-c", lease_seconds=30) is None

    clock.now += timedelta(seconds=31)  # worker-a and worker-b "crashed"
    retaken = store.queue.claim("worker-c", lease_seconds=30)
    assert retaken is not None and retaken.pk in {first.pk, second.pk}
    assert retaken.attempts == 2
    # The crashed worker's late finish is ignored: it no longer holds the lease.
    stale_finish = first if retaken.pk == first.pk else second
    store.dispatcher.finish(stale_finish, status="done")
    row = store.operations.get(retaken.event_id)
    assert row is not None and row.status == "processing" and row.lease_owner == "worker-c"


def test_event_whose_worker_dies_every_time_is_dead_lettered(engine: sa.Engine) -> None:
    clock = _Clock()
    store = Store(engine, clock=clock, retry=RetryPolicy(max_attempts=2))
    event = _insert(store, "payout_success", at=T0)
    for _ in range(2):
        assert store.queue.claim("doomed", lease_seconds=5) is not None
        clock.now += timedelta(seconds=6)
    assert store.queue.claim("survivor", lease_seconds=5) is None
    row = store.operations.get(event.event_id)
    assert row is not None and row.status == "dead"
    assert "worker lost" in (row.last_error or "")


def test_backoff_delays_the_retry_and_blocks_later_events_of_the_object(
    engine: sa.Engine,
) -> None:
    clock = _Clock()
    store = Store(engine, clock=clock, retry=RetryPolicy(max_attempts=5, base_seconds=10))
    registry = Registry()
    seen: list[str] = []
    fail = {"on": True}

    @registry.on_class("payments", name="h")
    def handler(event: Event) -> None:
        if fail["on"] and event.event_type == "payment_processing":
            raise RuntimeError("boom")
        seen.append(event.event_type)

    _insert(store, "payment_processing", at=T0, object_id="pay_b")
    _insert(store, "payment_succeeded", at=T0 + timedelta(seconds=1), object_id="pay_b")
    worker = Worker(store, registry, name="w")
    assert worker.drain() == 1  # processing failed; succeeded must wait behind it
    assert seen == []
    clock.now += timedelta(seconds=4)  # equal jitter: at least half of 10 s
    assert worker.drain() == 0
    fail["on"] = False
    clock.now += timedelta(seconds=7)
    assert worker.drain() == 2
    assert seen == ["payment_processing", "payment_succeeded"]


def test_retry_policy_delay_bounds() -> None:
    policy = RetryPolicy(base_seconds=2, max_seconds=60)
    for attempt, ceiling in [(1, 2), (2, 4), (3, 8), (10, 60)]:
        for _ in range(50):
            assert ceiling / 2 <= policy.delay(attempt) <= ceiling


def test_work_of_a_worker_that_lost_its_lease_is_rolled_back(engine: sa.Engine) -> None:
    clock = _Clock()
    store = Store(engine, clock=clock, retry=RetryPolicy(max_attempts=5))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE lost_effect (who VARCHAR(16))"))
    _insert(store, "payment_succeeded", at=T0, object_id="pay_lost")
    slow = store.queue.claim("slow", lease_seconds=10)
    assert slow is not None
    clock.now += timedelta(seconds=11)  # the slow worker stalled past its lease
    fast = store.queue.claim("fast", lease_seconds=10)
    assert fast is not None and fast.pk == slow.pk

    def effect(who: str) -> Any:
        def write(session: Session) -> None:
            session.execute(sa.text("INSERT INTO lost_effect (who) VALUES (:w)"), {"w": who})

        return write

    late = store.dispatcher.dispatch(slow, [("h", effect("slow"), True)])
    assert late.status == "lease_lost"
    assert store.dispatcher.dispatch(fast, [("h", effect("fast"), True)]).status == "done"
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT who FROM lost_effect")).scalars().all()
    assert rows == ["fast"]
    runs = store.operations.handler_runs(fast.pk)
    assert runs["h"].attempts == 1 and runs["h"].status == "succeeded"


def test_prune_keeps_open_and_dead_events_and_the_guard(engine: sa.Engine) -> None:
    clock = _Clock()
    store = Store(engine, clock=clock, retry=RetryPolicy(max_attempts=1))
    registry = Registry()

    @registry.on("payment_failed", name="boom")
    def boom(event: Event) -> None:
        raise RuntimeError("always")

    _insert(store, "payment_succeeded", at=T0, object_id="pay_old", event_id="evt_old")
    _insert(store, "payment_failed", at=T0, object_id="pay_dead", event_id="evt_dead")
    Worker(store, registry, name="w").drain()
    clock.now += timedelta(days=100)
    _insert(store, "refund_succeeded", at=T0, event_id="evt_new")  # open, recent
    assert store.operations.prune(timedelta(days=90), dry_run=True) == {"events": 1, "conflicts": 0}
    assert store.operations.get("evt_old") is not None
    assert store.operations.prune(timedelta(days=90)) == {"events": 1, "conflicts": 0}
    assert store.operations.get("evt_old") is None
    assert (
        store.operations.get("evt_dead") is not None and store.operations.get("evt_new") is not None
    )
    # The transition survives pruning: a late redelivery is still not dispatched twice.
    _insert(store, "payment_succeeded", at=T0, object_id="pay_old", event_id="evt_old_again")
    Worker(store, registry, name="w").drain()
    again = store.operations.get("evt_old_again")
    assert again is not None and again.status in ("duplicate", "stale")
    assert store.operations.prune(timedelta(days=90), include_dead=True)["events"] == 1


def test_a_database_failure_inside_a_handler_aborts_the_batch_not_the_worker(
    engine: sa.Engine,
) -> None:
    """Regression: a connection lost while a handler ran was recorded as the handler's
    failure, and the next statement's PendingRollbackError killed the worker process. An
    invalidated connection aborts the batch (nothing recorded against the handler); since
    issue 20 the worker gives the lease back once the database answers, so ``burst`` runs
    the event again rather than leaving it leased until expiry."""
    store = Store(engine, retry=RetryPolicy(max_attempts=5))
    registry = Registry()
    calls: list[int] = []

    @registry.on_any(name="db_lost")
    def db_lost(event: Event, session: Session) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise sa.exc.OperationalError(
                "SELECT 1",
                {},
                Exception("server closed the connection"),
                connection_invalidated=True,
            )

    event = _insert(store, "payment_succeeded", at=T0, object_id="pay_db_lost")
    worker = Worker(store, registry, name="w")
    worker.config = type(worker.config)(lease_seconds=30, poll_interval=0.01)
    assert worker.run(burst=True) == 1  # survived, gave the lease back, ran it again
    row = store.operations.get(event.event_id)
    assert row is not None and row.status == "done" and row.attempts == 1
    assert {r.status for r in store.operations.handler_runs(row.id or 0).values()} == {"succeeded"}
    assert len(calls) == 2


def test_times_are_right_whatever_the_database_sessions_time_zone(
    database_url: str, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every time written (arrival, retry, lease, processing, projection) is the same instant
    when the database session's time zone is not UTC (libpq takes it from ``PGTZ``)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("a session time zone is PostgreSQL's")
    import receiver.storage.database as db

    monkeypatch.setenv("PGTZ", "America/New_York")
    engine = db.make_engine(database_url)  # the fixture's engine migrated the schema
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "America/New_York"
        clock = _Clock()
        store = Store(engine, clock=clock, retry=RetryPolicy(max_attempts=5, base_seconds=100))
        registry = Registry()

        @registry.on_class("payments", name="h")
        def handler(event: Event) -> None:
            if event.object_ref is not None and event.object_ref.object_id == "pay_fails":
                raise RuntimeError("boom")

        ok = _insert(store, "payment_succeeded", at=T0, object_id="pay_tz")
        bad = _insert(store, "payment_succeeded", at=T0, object_id="pay_fails")
        worker = Worker(store, registry, name="w")
        assert worker.drain() == 2
        done, failed = store.operations.get(ok.event_id), store.operations.get(bad.event_id)
        assert done is not None and failed is not None
        assert (done.status, failed.status) == ("done", "pending")
        assert done.processed_at is not None and done.processed_at == clock.now
        assert done.received_at == clock.now
        assert timedelta(seconds=50) <= failed.next_attempt_at - clock.now <= timedelta(seconds=100)
        projection = store.operations.projection("payment", "pay_tz")
        assert projection is not None and projection.event_time == T0
        runs = store.operations.handler_runs(done.id or 0)
        assert runs["h"].updated_at == clock.now
        # The lease written by the claim expires at the right instant too.
        _insert(store, "payment_succeeded", at=T0, object_id="pay_lease")
        claimed = store.queue.claim("w2", lease_seconds=30)
        assert claimed is not None
        clock.now += timedelta(seconds=29)
        assert store.queue.claim("w3", lease_seconds=30) is None
        clock.now += timedelta(seconds=2)
        assert store.queue.claim("w3", lease_seconds=30) is not None
    finally:
        engine.dispose()


def test_the_bulk_insert_columns_are_the_rows_columns(store: Store) -> None:
    # PostgreSQL inserts synthesised events as one array per column: a column added to the
    # inbox row but not to that list would be silently dropped.
    from receiver.storage.sql.tables import DIGESTS, EVENT_COLUMNS, PATHS

    body = encode(build_event("payment_succeeded"))
    row = store.inbox.row(parse_event(body), body, source="reconcile")
    # (Besides its columns, the row carries its order references: see order_refs.)
    assert list(EVENT_COLUMNS) + [PATHS, DIGESTS] == list(row)
