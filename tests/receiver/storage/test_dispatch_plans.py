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
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from receiver.core.events import parse_event
from receiver.core.registry import Registry
from receiver.store import Store
from receiver.testing.factories import build_event, encode
from receiver.worker.runner import Worker, WorkerConfig
from tests.conftest import backend

pytestmark = [
    pytest.mark.storage,
    pytest.mark.skipif(backend() != "postgresql", reason="PostgreSQL's planner"),
]

#: Tables whose size grows with the history (the lease and cut-over tables stay tiny).
BIG = {
    "hookledger_event",
    "hookledger_transition",
    "hookledger_projection",
    "hookledger_handler_run",
}
TABLES = (*BIG, "hookledger_object_lease")
HISTORY = 20_000  # rows of each history table: many pages, so a sequential scan is costly
PENDING = 96  # due events, more than one batch


def _no_statistics(engine: sa.Engine) -> None:
    """Autovacuum off (it would analyse the tables as they fill), no statistics left."""
    with engine.begin() as conn:
        for table in TABLES:
            conn.execute(sa.text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
        conn.execute(
            sa.text(
                "DELETE FROM pg_statistic WHERE starelid = ANY("
                "SELECT c.oid FROM pg_class AS c WHERE c.relname = ANY(:tables)"
                " AND c.relnamespace = to_regnamespace(current_schema()))"
            ),
            {"tables": list(TABLES)},
        )


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
    statements: list[tuple[str, dict[str, Any]]] = []

    def capture(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        if re.match(r"\s*(SELECT|WITH|INSERT|UPDATE|DELETE)\b", statement, re.IGNORECASE):
            params = parameters[0] if many else parameters
            statements.append((statement, dict(params or {})))

    event.listen(engine, "before_cursor_execute", capture)
    yield statements
    event.remove(engine, "before_cursor_execute", capture)


def _numbered(statement: str) -> tuple[str, list[str]]:
    """``statement`` with ``$n`` placeholders for its ``%(name)s`` ones, and the names."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, statement), names


class _Planner:
    """A connection of its own holding the worker's statements prepared, with the generic
    plans PostgreSQL made for them when they first ran (as a worker's connection keeps them)."""

    def __init__(self, engine: sa.Engine) -> None:
        import psycopg

        # Not a pooled connection: psycopg deallocates every statement of a connection it
        # had prepared statements of its own on, when a transaction is rolled back.
        url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.conn: Any = psycopg.connect(url, autocommit=True, prepare_threshold=None)
        self._prepared: dict[str, tuple[str, list[str]]] = {}

    def close(self) -> None:
        self.conn.close()

    def _cursor(self) -> Any:
        import psycopg

        return psycopg.ClientCursor(self.conn)

    def prepare(self, statements: dict[str, dict[str, Any]]) -> None:
        """Prepare each statement and make its generic plan now (with these parameters)."""
        cur = self._cursor()
        cur.execute("SET plan_cache_mode = force_generic_plan")
        for statement, params in statements.items():
            name = f"hl_plan_{len(self._prepared)}"
            numbered, names = _numbered(statement)
            cur.execute(f"PREPARE {name} AS {numbered}")
            self._prepared[statement] = (name, names)
            self._run(cur, statement, params, analyze=False)

    def _run(self, cur: Any, statement: str, params: dict[str, Any], *, analyze: bool) -> Any:
        name, names = self._prepared[statement]
        args = ", ".join(["%s"] * len(names))
        options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
        cur.execute("BEGIN")
        try:
            cur.execute(f"EXPLAIN ({options}) EXECUTE {name}({args})", [params[n] for n in names])
            return cur.fetchone()[0]
        finally:
            cur.execute("ROLLBACK")

    def generic(self, statement: str, params: dict[str, Any]) -> Any:
        """The kept generic plan, run (and rolled back) with ``params``."""
        return self._run(self._cursor(), statement, params, analyze=True)

    def custom(self, statement: str, params: dict[str, Any]) -> Any:
        """The plan made for ``params`` now (the values inlined), run and rolled back."""
        cur = self._cursor()
        cur.execute("BEGIN")
        try:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
            return cur.fetchone()[0]
        finally:
            cur.execute("ROLLBACK")


def _read_in_full(plan: Any, limit: int) -> set[str]:
    """The big tables some node of an executed ``plan`` scans sequentially, or reads more
    than ``limit`` rows of (kept or filtered out, over all its loops)."""
    found: set[str] = set()
    for node in _nodes(plan):
        table = node.get("Relation Name")
        if table not in BIG:
            continue
        loops = node.get("Actual Loops", 1)
        touched = loops * (
            node.get("Actual Rows", 0)
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
        if node["Node Type"] == "Seq Scan" or touched > limit:
            found.add(table)
    return found


def _nodes(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            yield from _nodes(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from _nodes(value)


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
    _no_statistics(engine)
    registry = Registry()
    registry.on_any(name="bench.noop")(lambda event: None)
    worker = Worker(store, registry, WorkerConfig(batch_size=64))
    _insert_due(store, PENDING, prefix="early")
    early = _batch(worker, captured)
    assert any("hookledger_transition" in s for s in early)  # the guard ran
    planner = _Planner(engine)
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
                if tables := _read_in_full(plan, limit):
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


def test_history_has_no_statistics(engine: sa.Engine) -> None:
    """The plans test runs without statistics (none were gathered, none are left)."""
    _no_statistics(engine)
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
