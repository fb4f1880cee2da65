"""Helpers for the plans tests (PostgreSQL): statements captured as hookledger sends them,
planned generically (as a connection keeps a prepared statement's plan) and afresh, and
checked for reads of a whole big table."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import backend

#: A plans test's marks: a storage test, on PostgreSQL only.
PLAN_MARKS = [
    pytest.mark.storage,
    pytest.mark.skipif(backend() != "postgresql", reason="PostgreSQL's planner"),
]
#: The inbox tables whose size grows with the history.
HISTORY_TABLES = frozenset({"hookledger_event", "hookledger_transition", "hookledger_projection"})


def no_statistics(engine: sa.Engine, tables: Iterable[str]) -> None:
    """Autovacuum off (it would analyse the tables as they fill), no statistics left."""
    tables = list(tables)
    with engine.begin() as conn:
        for table in tables:
            conn.execute(sa.text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
        conn.execute(
            sa.text(
                "DELETE FROM pg_statistic WHERE starelid = ANY("
                "SELECT c.oid FROM pg_class AS c WHERE c.relname = ANY(:tables)"
                " AND c.relnamespace = to_regnamespace(current_schema()))"
            ),
            {"tables": tables},
        )


def capture(engine: sa.Engine) -> tuple[list[tuple[str, dict[str, Any]]], Any]:
    """Start recording the statements ``engine`` sends; return the list and a stopper."""
    statements: list[tuple[str, dict[str, Any]]] = []

    def hook(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        if re.match(r"\s*(SELECT|WITH|INSERT|UPDATE|DELETE)\b", statement, re.IGNORECASE):
            params = parameters[0] if many else parameters
            statements.append((statement, dict(params or {})))

    sa.event.listen(engine, "before_cursor_execute", hook)
    return statements, lambda: sa.event.remove(engine, "before_cursor_execute", hook)


def _numbered(statement: str) -> tuple[str, list[str]]:
    """``statement`` with ``$n`` placeholders for its ``%(name)s`` ones, and the names."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, statement), names


class Planner:
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
            call = f"{name}({args})" if names else name  # EXECUTE p() is a syntax error
            cur.execute(f"EXPLAIN ({options}) EXECUTE {call}", [params[n] for n in names])
            return cur.fetchone()[0]
        finally:
            cur.execute("ROLLBACK")

    def kept(self, statement: str, params: dict[str, Any]) -> Any:
        """The kept generic plan, as planned (not run)."""
        return self._run(self._cursor(), statement, params, analyze=False)

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


def read_in_full(plan: Any, limit: int, big: Iterable[str]) -> set[str]:
    """The big tables some node of an executed ``plan`` scans sequentially, or reads more
    than ``limit`` rows of (kept or filtered out, over all its loops), directly or through
    one of their indexes (a bitmap index scan names only its index, ``ix_<table>_...`` or
    ``<table>_pkey``)."""
    big = set(big)
    found: set[str] = set()
    for node in _nodes(plan):
        table = node.get("Relation Name") or _table_of_index(node.get("Index Name"), big)
        if table not in big:
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


def sequential_scans(plan: Any, big: Iterable[str]) -> set[str]:
    """The big tables some node of ``plan`` (run or not) scans sequentially."""
    big = set(big)
    return {
        node["Relation Name"]
        for node in _nodes(plan)
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in big
    }


def whole_index_reads(plan: Any, big: Iterable[str]) -> set[str]:
    """The indexes of the big tables some node of ``plan`` reads whole: a bitmap index scan
    with no index condition (it reads every entry, the dead ones of rows that no longer
    match a partial index's predicate included, until a vacuum removes them)."""
    big = set(big)
    return {
        node["Index Name"]
        for node in _nodes(plan)
        if node["Node Type"] == "Bitmap Index Scan"
        and "Index Cond" not in node
        and _table_of_index(node.get("Index Name"), big) is not None
    }


def _table_of_index(index: str | None, tables: set[str]) -> str | None:
    """The table of ``index`` among ``tables``, by hookledger's index names."""
    if index is None:
        return None
    for table in sorted(tables, key=len, reverse=True):
        if index == f"{table}_pkey" or index.startswith((f"ix_{table}_", f"uq_{table}_")):
            return table
        if index.startswith(f"{table}_") and index.endswith("_key"):
            return table
    return None


def _nodes(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            yield from _nodes(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from _nodes(value)
