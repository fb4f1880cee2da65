"""Every statement a worker runs reads the big tables through indexes, whatever the
planner's statistics: here none at all (a fresh database, autovacuum off, ``pg_statistic``
emptied), the case of a new ledger.

psycopg prepares a statement after a few runs, and PostgreSQL may then switch for good to a
*generic* plan, made without the parameters' values from the tables' size at that moment:
a plan made while the ledger was empty is kept while it grows. So each statement of a claim
and of a dispatched batch is captured as the worker sends it on an empty ledger, prepared
and planned there (``plan_cache_mode = force_generic_plan``); then 20,000 rows of history
are written to each table and the statements of the next batch are run (rolled back) with
that kept plan and with a plan made afresh. No plan may scan ``hookledger_event``,
``hookledger_transition``, ``hookledger_projection`` or ``hookledger_handler_run``
sequentially, or read more than a batch's worth of their rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from receiver.core.events import parse_event
from receiver.core.registry import Registry
from receiver.store import Store
from receiver.testing.factories import build_event, encode
from receiver.worker.runner import Worker, WorkerConfig
from tests.plans import (
    HISTORY_TABLES,
    PLAN_MARKS,
    Planner,
    _nodes,
    capture,
    no_statistics,
    read_in_full,
    sequential_scans,
    whole_index_reads,
)

pytestmark = PLAN_MARKS

#: Tables whose size grows with the history (the lease and cut-over tables stay tiny).
BIG = HISTORY_TABLES | {"hookledger_handler_run"}
TABLES = (*BIG, "hookledger_object_lease")
HISTORY = 20_000  # rows of each history table: many pages, so a sequential scan is costly
PENDING = 96  # due events, more than one batch
DONE_BY_WORKER = 20_000  # events done, their entries left in the open-events index


def _fill_history(engine: sa.Engine, history: int) -> None:
    """A history as a long-running ledger has it: done events, their transitions,
    projections and ledger rows, written without any ANALYZE."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_event (event_id, source, event_type, object_kind,"
                " object_id, object_status, object_key, event_time, received_at, body, headers,"
                " body_sha256, status, attempts, next_attempt_at, processed_at)"
                " SELECT 'evt_old_' || g, 'webhook', 'payment_succeeded', 'payment',"
                " 'pay_old_' || g, 'succeeded', 'payment:pay_old_' || g, now(), now(),"
                " convert_to(repeat('x', 600), 'UTF8'), '{}', md5(g::text), 'done', 1, now(),"
                " now() FROM generate_series(1, :n) AS g"
            ),
            {"n": history},
        )
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_transition (object_kind, object_id, state, event_pk,"
                " created_at) SELECT 'payment', 'pay_old_' || g, 'succeeded', g, now()"
                " FROM generate_series(1, :n) AS g ON CONFLICT DO NOTHING"
            ),
            {"n": history},
        )
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_projection (object_kind, object_id, status, event_time,"
                " event_pk, updated_at) SELECT 'payment', 'pay_old_' || g, 'succeeded', now(),"
                " g, now() FROM generate_series(1, :n) AS g ON CONFLICT DO NOTHING"
            ),
            {"n": history},
        )
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_handler_run (event_pk, handler, status, attempts,"
                " updated_at) SELECT g, 'bench.noop', 'succeeded', 1, now()"
                " FROM generate_series(1, :n) AS g ON CONFLICT DO NOTHING"
            ),
            {"n": history},
        )


def _insert_due(store: Store, n: int, *, prefix: str) -> None:
    """``n`` due events: half of new payments, half of payments with a history (if any)."""
    at = datetime.now(UTC) - timedelta(minutes=5)
    for i in range(n):
        payment = f"pay_{prefix}_{i}" if i % 2 else f"pay_old_{i + 1}"
        body = encode(
            build_event(
                "payment_succeeded",
                object_id=payment,
                event_id=f"evt_{prefix}_{i}",
                timestamp=at,
            )
        )
        store.inbox.insert(parse_event(body), body)


@pytest.fixture
def captured(engine: sa.Engine) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    statements, stop = capture(engine)
    yield statements
    stop()


def _batch(worker: Worker, captured: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The statements (and their parameters) of one claimed and dispatched batch."""
    captured.clear()
    assert worker.run_once() > 0
    return {s: p for s, p in captured if "hookledger_worker" not in s}


def test_worker_statements_stay_on_indexes_as_the_history_grows(
    engine: sa.Engine, store: Store, captured: list[tuple[str, dict[str, Any]]]
) -> None:
    """The plans a worker's connection makes on an empty ledger, kept (generic) or made
    again (custom) once the ledger has a history, never read a big table in full."""
    no_statistics(engine, TABLES)
    registry = Registry()
    registry.on_any(name="bench.noop")(lambda event: None)
    worker = Worker(store, registry, WorkerConfig(batch_size=64))
    _insert_due(store, PENDING, prefix="early")
    early = _batch(worker, captured)
    assert any("hookledger_transition" in s for s in early)  # the guard ran
    planner = Planner(engine)
    try:
        planner.prepare(early)
        _fill_history(engine, HISTORY)
        _insert_due(store, PENDING, prefix="late")
        late = _batch(worker, captured)
        # A batch (64 events) may read a few rows per event; a history read reads 20,000.
        limit = 1000
        problems = []
        for statement, params in late.items():
            plans = {"custom": planner.custom(statement, params)}
            if statement in early:
                plans["generic (made on the empty ledger)"] = planner.generic(statement, params)
            for mode, plan in plans.items():
                if tables := read_in_full(plan, limit, BIG):
                    summary = " ".join(statement.split())[:160]
                    problems.append(f"{mode}: {sorted(tables)} in {summary}")
        assert problems == [], json.dumps(problems, indent=1)
    finally:
        planner.close()
    worker.drain()
    with engine.connect() as conn:
        left = conn.execute(
            sa.text(
                "SELECT count(*) FROM hookledger_event WHERE status IN ('pending', 'processing')"
            )
        ).scalar_one()
    assert left == 0


#: Done events for the claim's plans: the history of a long drain (issue 29, item 6).
DONE_HISTORY = 100_000


def _fill_done_history(engine: sa.Engine, n: int) -> None:
    """``n`` done events left as a worker leaves them when nothing vacuums: each row went
    pending, then processing, then done (its old versions, and their entries in the
    open-events index, stay until a vacuum), with its transition, projection and ledger
    row; and the lease of each object, taken and deleted again (the dead rows stay too)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_event (event_id, source, event_type, object_kind,"
                " object_id, object_status, object_key, event_time, received_at, body, headers,"
                " body_sha256, status, attempts, next_attempt_at)"
                " SELECT 'evt_done_' || g, 'webhook', 'payment_succeeded', 'payment',"
                " 'pay_done_' || g, 'succeeded', 'payment:pay_done_' || g,"
                " now() - interval '1 hour', now() - interval '1 hour',"
                " convert_to(repeat('x', 100), 'UTF8'), '{}', md5(g::text), 'pending', 0,"
                " now() - interval '1 hour' + g * interval '1 millisecond'"
                " FROM generate_series(1, :n) AS g"
            ),
            {"n": n},
        )
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_object_lease (object_key, owner, expires_at)"
                " SELECT 'payment:pay_done_' || g, 'old-worker', now()"
                " FROM generate_series(1, :n) AS g"
            ),
            {"n": n},
        )
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE hookledger_event SET status = 'processing', attempts = 1,"
                " lease_owner = 'old-worker', lease_expires_at = now()"
                " WHERE event_id LIKE 'evt_done_%'"
            )
        )
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE hookledger_event SET status = 'done', lease_owner = NULL,"
                " lease_expires_at = NULL, processed_at = now() WHERE event_id LIKE 'evt_done_%'"
            )
        )
        conn.execute(sa.text("DELETE FROM hookledger_object_lease WHERE owner = 'old-worker'"))
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_transition (object_kind, object_id, state, event_pk,"
                " created_at) SELECT 'payment', 'pay_done_' || g, 'succeeded', g, now()"
                " FROM generate_series(1, :n) AS g ON CONFLICT DO NOTHING"
            ),
            {"n": n},
        )
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_projection (object_kind, object_id, status, event_time,"
                " event_pk, updated_at) SELECT 'payment', 'pay_done_' || g, 'succeeded', now(),"
                " g, now() FROM generate_series(1, :n) AS g ON CONFLICT DO NOTHING"
            ),
            {"n": n},
        )
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_handler_run (event_pk, handler, status, attempts,"
                " updated_at) SELECT g, 'bench.noop', 'succeeded', 1, now()"
                " FROM generate_series(1, :n) AS g ON CONFLICT DO NOTHING"
            ),
            {"n": n},
        )


def _claim(store: Store, captured: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The statements (and their parameters) of one claim of 16 events, given back after:
    it leases twice the batch's objects and gives the unused leases back."""
    captured.clear()
    claimed = store.queue.claim_batch("plans-worker", 60, limit=16)
    statements = dict(captured)
    assert len(claimed) == 16
    for event in claimed:
        store.queue.release(event)
    return statements


def test_claim_statements_stay_on_indexes_over_100k_done_events(
    engine: sa.Engine, store: Store, captured: list[tuple[str, dict[str, Any]]]
) -> None:
    """Issue 29, item 6: a worker drained batch after batch on top of its done history, and
    nothing vacuumed or analysed. Two of a claim's statements read what every done event
    left behind, so the claim's cost grew with the history: the heads (the earliest open
    event of each leased object) ANDed a bitmap of the whole open-events index into their
    read, its entries of every event ever claimed included; the claim's unused leases were
    given back by a sequential scan of the lease table, the deleted leases of every object
    ever claimed included (plans made, generically, while both were small, then kept).

    A claim's statements are planned on a new ledger (generic plans, as a worker's connection
    keeps them): none may scan the inbox, its history or the lease table sequentially. Then,
    after 100,000 done events, run with those plans and with plans made afresh, none may scan
    them sequentially, read an index of theirs whole, or read more than a claim's worth of
    rows.
    """
    no_statistics(engine, TABLES)
    _insert_due(store, PENDING, prefix="early")
    early = _claim(store, captured)
    assert any("hookledger_object_lease" in s and s.lstrip().startswith("DELETE") for s in early)
    big = BIG | {"hookledger_object_lease"}
    planner = Planner(engine)
    try:
        planner.prepare(early)
        # A plan made now is kept while the tables grow: none may scan one sequentially.
        kept = {
            " ".join(statement.split())[:160]: sorted(tables)
            for statement, params in early.items()
            if (tables := sequential_scans(planner.kept(statement, params), big))
        }
        assert kept == {}, json.dumps(kept, indent=1)
        _fill_done_history(engine, DONE_HISTORY)
        late = _claim(store, captured)
        problems = []
        for statement, params in late.items():
            plans = {"custom": planner.custom(statement, params)}
            if statement in early:
                plans["generic (made on the new ledger)"] = planner.generic(statement, params)
            summary = " ".join(statement.split())[:160]
            for mode, plan in plans.items():
                if tables := read_in_full(plan, 1000, big):
                    problems.append(f"{mode}: {sorted(tables)} in {summary}")
                if indexes := whole_index_reads(plan, big):
                    problems.append(f"{mode}: whole {sorted(indexes)} in {summary}")
        assert problems == [], json.dumps(problems, indent=1)
    finally:
        planner.close()
    registry = Registry()
    registry.on_any(name="bench.noop")(lambda event: None)
    Worker(store, registry).drain()
    with engine.connect() as conn:
        left = conn.execute(
            sa.text(
                "SELECT count(*) FROM hookledger_event WHERE status IN ('pending', 'processing')"
            )
        ).scalar_one()
        stats = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_statistic AS s JOIN pg_class AS c ON c.oid = s.starelid"
                " WHERE c.relname = ANY(:tables)"
                " AND c.relnamespace = to_regnamespace(current_schema())"
            ),
            {"tables": list(TABLES)},
        ).scalar_one()
    assert left == 0
    assert stats == 0


def test_history_has_no_statistics(engine: sa.Engine) -> None:
    """The plans test runs without statistics (none were gathered, none are left)."""
    no_statistics(engine, TABLES)
    _fill_history(engine, 100)
    with engine.connect() as conn:
        stats = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_statistic AS s JOIN pg_class AS c ON c.oid = s.starelid"
                " WHERE c.relname = 'hookledger_transition'"
                " AND c.relnamespace = to_regnamespace(current_schema())"
            )
        ).scalar_one()
    assert stats == 0


def _pages(engine: sa.Engine, index: str, statement: str, params: dict[str, Any]) -> int:
    """Pages (shared buffers hit or read) ``statement``'s scans of ``index`` read (with the
    rows they fetch) with ``params``, rolled back."""
    with engine.connect() as conn:
        plan = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params
        ).scalar_one()
        conn.rollback()
    return sum(
        int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
        for node in _nodes(plan)
        if node.get("Index Name") == index
    )


def _wait_behind_a_retry(engine: sa.Engine, store: Store) -> None:
    """An object whose head waits an hour for its retry, and whose next event has been due
    since before the done history: the account's earliest open event, which no claim can
    take until the head has run."""
    at = datetime.now(UTC) - timedelta(hours=3)
    pks = []
    for i in range(2):
        body = encode(
            build_event(
                "payment_processing" if i == 0 else "payment_succeeded",
                object_id="pay_behind_retry",
                event_id=f"evt_behind_retry_{i}",
                timestamp=at + timedelta(seconds=i),
            )
        )
        pks.append(store.inbox.insert(parse_event(body), body).pk)
    with engine.begin() as conn:
        for pk, due in zip(pks, ("1 hour", "-2 hours"), strict=True):
            conn.execute(
                sa.text(
                    "UPDATE hookledger_event SET next_attempt_at = now() + CAST(:due AS interval)"
                    " WHERE id = :pk"
                ),
                {"due": due, "pk": pk},
            )


def _in_flight_since_before(engine: sa.Engine, store: Store) -> None:
    """An event another worker's handler has run since before the done history (a slow
    carrier call; its lease renewed): open, and no claim can take it meanwhile."""
    body = encode(build_event("payment_succeeded", object_id="pay_slow", event_id="evt_slow"))
    pk = store.inbox.insert(parse_event(body), body).pk
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE hookledger_event SET status = 'processing', attempts = 1,"
                " lease_owner = 'slow-worker', lease_expires_at = now() + interval '1 hour',"
                " next_attempt_at = now() - interval '2 hours' WHERE id = :pk"
            ),
            {"pk": pk},
        )


@pytest.mark.parametrize(
    "early", ["", "an-event-behind-a-retry", "an-event-in-flight"], ids=lambda e: e
)
def test_claims_walk_the_open_events_index_from_past_the_done_history(
    engine: sa.Engine,
    store: Store,
    captured: list[tuple[str, dict[str, Any]]],
    early: str,
) -> None:
    """Issue 29, item 6: an event done by the worker leaves its entry in the index over open
    events (a dead row version, until a vacuum), at the low end where every walk in due
    order starts; with autovacuum behind, each claim's skip scan of the accounts and walk of
    their due events read every event the worker had ever finished (at 100,000 done events
    about 1,500 pages a claim, a third of the dispatch rate). A full scan now learns where
    each account's open events begin, and the next claims (for up to a second, up to 32 of
    them) walk from there. ``early``: the account's earliest open event waits behind its
    object's head's retry (a failing payment with a later event, a shop has some), or is in
    a slow handler's hands: the floor starts past it, not there (where the walk read every
    event done since)."""
    no_statistics(engine, TABLES)
    registry = Registry()
    registry.on_any(name="bench.noop")(lambda event: None)
    if early == "an-event-behind-a-retry":
        _wait_behind_a_retry(engine, store)
    elif early == "an-event-in-flight":
        _in_flight_since_before(engine, store)
    _fill_done_history(engine, DONE_BY_WORKER)
    with engine.connect() as conn:
        size = conn.execute(
            sa.text("SELECT pg_relation_size('ix_hookledger_event_open_due') / 8192")
        ).scalar_one()
    _insert_due(store, PENDING, prefix="new")
    captured.clear()
    assert len(store.queue.claim_batch("plans-worker", 60, limit=8)) == 8
    full = dict(captured)
    assert any(s.lstrip().startswith("WITH RECURSIVE") for s in full)
    captured.clear()
    assert len(store.queue.claim_batch("plans-worker", 60, limit=8)) == 8
    fast = dict(captured)
    # The accounts are not scanned again, and the walk starts past the done history.
    assert not any(s.lstrip().startswith("WITH RECURSIVE") for s in fast), list(fast)
    due = next(s for s in fast if "AS a(account, floor, ord)" in s)
    index = "ix_hookledger_event_open_due"
    walked = _pages(engine, index, due, fast[due])
    no_floors = {**fast[due], "floors": [None] * len(fast[due]["floors"])}
    from_start = _pages(engine, index, due, no_floors)
    # The index is about 100 pages of done events' entries; a walk of a batch's candidates
    # from the floor reads a third of that (their rows included), one from the start all.
    assert walked < size / 2 < from_start, (walked, size, from_start)
    Worker(store, registry).drain()
