"""Read-only queries over the reconciler's runs for the ops console and the metrics: the runs
(a page, or one with its report), each account's latest run and latest success, and a stored
report's recoveries and drift by kind and path.

The reconciler's run table is read through a lightweight table clause (the receiver never
imports :mod:`reconcile`); ``tests/receiver/storage/test_recon_run_reads.py`` checks it against
the reconciler's model. Every read is on SQLite without the write lock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Engine,
    Integer,
    String,
    Text,
    column,
    func,
    select,
    table,
)

from receiver.core.clock import as_utc
from receiver.storage.database import deferred_begin
from receiver.storage.operator_reads import Page

#: The reconciler's run table (``reconcile.storage.tables.ReconcileRun``), as far as it is read
#: here.
RECON_RUN = table(
    "hookledger_recon_run",
    column("id", BigInteger().with_variant(Integer(), "sqlite")),
    column("account", String()),
    column("mode", String()),
    column("owner", String()),
    column("started_at", DateTime(timezone=True)),
    column("finished_at", DateTime(timezone=True)),
    column("status", String()),
    column("report", Text()),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRow:
    """A reconcile run and its report (``{}`` while it runs)."""

    id: int
    mode: str
    status: str
    started_at: datetime
    finished_at: datetime | None
    report: dict[str, Any]


def get_run(engine: Engine, run_id: int) -> RunRow | None:
    """One reconcile run (``None`` when there is none, or no reconciler tables)."""
    from sqlalchemy import inspect

    with deferred_begin(engine).connect() as conn:
        if not inspect(conn).has_table("hookledger_recon_run"):
            return None
        row = conn.execute(select(RECON_RUN).where(RECON_RUN.c.id == run_id)).first()
    return _run_row(row) if row is not None else None


def reconcile_runs(engine: Engine, *, limit: int = 50, offset: int = 0) -> Page:
    """Reconcile runs, newest first (an empty page when the reconciler's tables are absent)."""
    from sqlalchemy import inspect

    with deferred_begin(engine).connect() as conn:
        if not inspect(conn).has_table("hookledger_recon_run"):
            return Page(rows=[], offset=offset, limit=limit, has_more=False)
        result = conn.execute(
            select(RECON_RUN).order_by(RECON_RUN.c.id.desc()).offset(offset).limit(limit + 1)
        )
        rows = [_run_row(r) for r in result]
    return Page(rows=rows[:limit], offset=offset, limit=limit, has_more=len(rows) > limit)


@dataclass(frozen=True, kw_only=True, slots=True)
class AccountRuns:
    """One account's latest finished run (a dry run never counts) and when its latest run
    with status ``ok`` finished (``None``: none yet)."""

    account: str
    latest: RunRow
    last_success: datetime | None


def _per_account() -> Any:
    """Each account of the run table (skipping from one to the next), its latest finished
    run's id and its latest ``ok`` run's id: see :func:`runs_by_account`."""
    run = RECON_RUN
    first = select(func.min(run.c.account).label("account")).cte("accounts", recursive=True)
    following = (
        select(func.min(run.c.account))
        .where(run.c.account > first.c.account)
        .correlate(first)
        .scalar_subquery()
    )
    accounts = first.union_all(select(following).where(first.c.account.is_not(None)))

    def newest(*where: Any) -> Any:
        return (
            select(run.c.id)
            .where(run.c.account == accounts.c.account, *where)
            .order_by(run.c.id.desc())
            .limit(1)
            .correlate(accounts)
            .scalar_subquery()
        )

    return select(
        accounts.c.account,
        newest(run.c.finished_at.is_not(None), run.c.status != "dry_run").label("latest"),
        newest(run.c.status == "ok").label("success"),
    ).where(accounts.c.account.is_not(None))


_PER_ACCOUNT = _per_account()


def runs_by_account(engine: Engine) -> list[AccountRuns]:
    """Per account with a finished run: its latest one and its latest success, by account
    (an empty list when the reconciler's tables are absent).

    Read through the run table's index on (account, id), never by scanning the runs: the
    accounts are found by skipping from one to the next (a recursive query, one index seek
    each), then each account's latest finished run and latest ``ok`` run are the first
    matches reading its runs backwards (within an account, runs finish in id order: one at
    a time, under its lock). A scrape costs a few seeks per account, however many runs the
    table has kept."""
    from sqlalchemy import inspect

    run = RECON_RUN
    with deferred_begin(engine).connect() as conn:
        if not inspect(conn).has_table("hookledger_recon_run"):
            return []
        found = [(str(a), latest, ok) for a, latest, ok in conn.execute(_PER_ACCOUNT)]
        ids = {i for _, latest, ok in found for i in (latest, ok) if i is not None}
        rows = (
            {int(r.id): r for r in conn.execute(select(run).where(run.c.id.in_(ids)))}
            if ids
            else {}
        )
    return [
        AccountRuns(
            account=account,
            latest=_run_row(rows[latest]),
            last_success=_finished(rows[ok]) if ok is not None else None,
        )
        for account, latest, ok in sorted(found)
        if latest is not None
    ]


def _finished(r: Any) -> datetime | None:
    return as_utc(r.finished_at) if r.finished_at is not None else None


def _run_row(r: Any) -> RunRow:
    try:
        report = json.loads(r.report or "{}")
    except ValueError:
        report = {}
    return RunRow(
        id=int(r.id),
        mode=r.mode,
        status=r.status,
        started_at=as_utc(r.started_at),
        finished_at=as_utc(r.finished_at) if r.finished_at is not None else None,
        report=report if isinstance(report, dict) else {},
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Figure:
    """Recovered and unresolved transitions of one kind by one path in a run's report."""

    kind: str
    path: str
    recovered: int
    unresolved: int


def recon_figures(report: dict[str, Any]) -> list[Figure]:
    """A stored report's recoveries and drift by kind (``payments``...) and path (``lists``,
    ``sweep``, ``events``). The events path reports event types: they count for their class."""
    from receiver.core.events import EVENT_TYPES

    figures: list[Figure] = []
    for path, key in (("lists", "kinds"), ("sweep", "sweep")):
        for kind, part in (report.get(key) or {}).items():
            if isinstance(part, dict):
                figures.append(
                    Figure(
                        kind=str(kind),
                        path=path,
                        recovered=int(part.get("recovered_total") or 0),
                        unresolved=int(part.get("unresolved") or 0),
                    )
                )
    events = report.get("events")
    if isinstance(events, dict):
        by_kind: dict[str, int] = {}
        for event_type, n in (events.get("recovered") or {}).items():
            kind = EVENT_TYPES.get(str(event_type), "other")
            by_kind[kind] = by_kind.get(kind, 0) + int(n)
        for kind, n in sorted(by_kind.items()):
            figures.append(Figure(kind=kind, path="events", recovered=n, unresolved=0))
        if events.get("unresolved"):
            figures.append(
                Figure(kind="any", path="events", recovered=0, unresolved=int(events["unresolved"]))
            )
    return figures


__all__ = [
    "AccountRuns",
    "Figure",
    "RunRow",
    "get_run",
    "reconcile_runs",
    "recon_figures",
    "runs_by_account",
]
