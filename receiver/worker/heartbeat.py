"""Worker heartbeats and the operational status built on them.

Each ``hookledger worker`` process keeps a row of ``hookledger_worker`` fresh (every
:data:`BEAT_SECONDS`, and whenever it finishes a batch after that), and deletes it when it
stops cleanly. :func:`check` reads them together with the queue: it is what
``hookledger status`` prints and what a readiness probe can serve. A problem is said in a
sentence an on-call engineer can act on: "no worker alive", "oldest open event is 912 s
old (limit 300 s)".
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Table, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite

from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.core.clock import as_utc, utcnow
from receiver.storage.database import deferred_begin
from receiver.storage.intake import path_of, read_figures
from receiver.storage.tables import EventStatus, InboxEvent, WorkerHeartbeat

log = logging.getLogger("receiver.heartbeat")

W: Table = WorkerHeartbeat.__table__  # type: ignore[attr-defined]
E: Table = InboxEvent.__table__  # type: ignore[attr-defined]

#: How often a running worker writes its heartbeat, seconds.
BEAT_SECONDS = 10.0
#: A worker not seen for this long is not counted alive (three missed beats).
DEFAULT_WORKER_TIMEOUT = 3 * BEAT_SECONDS


def record(
    engine: Engine, name: str, *, started_at: datetime, processed: int, now: datetime | None = None
) -> None:
    """Write (or refresh) the heartbeat of worker ``name``."""
    now = as_utc(now or utcnow())
    values = {
        "name": name,
        "host": socket.gethostname()[:255],
        "pid": os.getpid(),
        "started_at": as_utc(started_at),
        "seen_at": now,
        "processed": processed,
    }
    insert = (postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert)(W)
    stmt = insert.values(**values).on_conflict_do_update(
        index_elements=["name"], set_={"seen_at": now, "processed": processed}
    )
    with engine.begin() as conn:
        conn.execute(stmt)


def remove(engine: Engine, name: str) -> None:
    """Delete the heartbeat of worker ``name`` (it stopped cleanly)."""
    with engine.begin() as conn:
        conn.execute(delete(W).where(W.c.name == name))


def forget_older_than(engine: Engine, age: timedelta, *, now: datetime | None = None) -> int:
    """Delete heartbeats not refreshed for ``age`` (workers that died long ago)."""
    cutoff = as_utc(now or utcnow()) - age
    with engine.begin() as conn:
        return int(conn.execute(delete(W).where(W.c.seen_at < cutoff)).rowcount)


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSeen:
    """One worker's last heartbeat."""

    name: str
    host: str
    pid: int
    started_at: datetime
    seen_at: datetime
    processed: int
    age_seconds: float
    alive: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class OpsStatus:
    """What :func:`check` found. ``ok`` is false when ``problems`` is not empty."""

    workers: tuple[WorkerSeen, ...]
    workers_alive: int
    open_events: dict[str, int]
    dead_events: int
    oldest_open_age_seconds: float | None
    problems: tuple[str, ...] = field(default=())
    #: SQLite: webhooks stored in the intake while the database's lock was held for long, not
    #: yet moved into the inbox (:mod:`receiver.storage.intake`); counted in ``open_events``
    #: as pending, and in the oldest open event's age.
    intake: int = 0
    #: The age of the oldest of them (seconds; ``None``: none waits). Event listings, the
    #: order search and an object's story show them only once they are in the inbox
    #: (``hookledger intake list`` shows them, ``intake move`` moves them now).
    intake_oldest_age_seconds: float | None = None
    #: Per processor account with open or dead events: ``open``, ``dead`` and
    #: ``oldest_open_age_seconds`` (see :mod:`receiver.core.accounts`).
    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": list(self.problems),
            "workers_alive": self.workers_alive,
            "workers": [
                {
                    "name": w.name,
                    "host": w.host,
                    "pid": w.pid,
                    "started_at": w.started_at.isoformat(),
                    "seen_at": w.seen_at.isoformat(),
                    "age_seconds": round(w.age_seconds, 1),
                    "processed": w.processed,
                    "alive": w.alive,
                }
                for w in self.workers
            ],
            "open_events": self.open_events,
            "intake": self.intake,
            "intake_oldest_age_seconds": (
                None
                if self.intake_oldest_age_seconds is None
                else round(self.intake_oldest_age_seconds, 1)
            ),
            "dead_events": self.dead_events,
            "accounts": self.accounts,
            "oldest_open_age_seconds": (
                None
                if self.oldest_open_age_seconds is None
                else round(self.oldest_open_age_seconds, 1)
            ),
        }


def check(
    engine: Engine,
    *,
    worker_timeout: float = DEFAULT_WORKER_TIMEOUT,
    max_open_age: float | None = 300.0,
    require_worker: bool = True,
    now: datetime | None = None,
) -> OpsStatus:
    """Read the workers' heartbeats and the queue; say what is wrong.

    Problems: no worker alive (when ``require_worker``), and an open event older than
    ``max_open_age`` seconds (``None``: not checked). Dead letters are counted, never a
    problem here: they wait for an operator, not for a worker. Reads only (on SQLite without
    the write lock).
    """
    now = as_utc(now or utcnow())
    with deferred_begin(engine).connect() as conn:
        rows = conn.execute(select(W).order_by(W.c.seen_at.desc())).all()
        open_counts = {
            str(status): int(n)
            for status, n in conn.execute(
                select(E.c.status, func.count())
                .where(E.c.status.in_(EventStatus.OPEN))
                .group_by(E.c.status)
            )
        }
        per_account: dict[str, dict[str, Any]] = {}
        for account, n, first in conn.execute(
            select(E.c.account, func.count(), func.min(E.c.received_at))
            .where(E.c.status.in_(EventStatus.OPEN))
            .group_by(E.c.account)
        ):
            age_of = max(0.0, (now - as_utc(first)).total_seconds())
            per_account[account] = {"open": int(n), "dead": 0, "oldest_open_age_seconds": age_of}
        for account, n in conn.execute(
            select(E.c.account, func.count())
            .where(E.c.status == EventStatus.DEAD)
            .group_by(E.c.account)
        ):
            per_account.setdefault(
                account, {"open": 0, "dead": 0, "oldest_open_age_seconds": None}
            )["dead"] = int(n)
    # Webhooks still in the intake (SQLite) are open events too: pending, as old as they are.
    waiting, unreadable = read_figures(engine)
    for account, found in waiting.items():
        figures = per_account.setdefault(
            account, {"open": 0, "dead": 0, "oldest_open_age_seconds": None}
        )
        figures["open"] += found.count
        age_of = max(0.0, (now - found.oldest).total_seconds())
        figures["oldest_open_age_seconds"] = max(figures["oldest_open_age_seconds"] or 0.0, age_of)
    in_intake = sum(found.count for found in waiting.values())
    intake_age = (
        max(0.0, (now - min(found.oldest for found in waiting.values())).total_seconds())
        if waiting
        else None
    )
    if in_intake:
        open_counts[EventStatus.PENDING] = open_counts.get(EventStatus.PENDING, 0) + in_intake
    ages = [a["oldest_open_age_seconds"] for a in per_account.values()]
    known = [a for a in ages if a is not None]
    dead = sum(a["dead"] for a in per_account.values())
    workers = []
    for r in rows:
        seen_age = (now - as_utc(r.seen_at)).total_seconds()
        workers.append(
            WorkerSeen(
                name=r.name,
                host=r.host,
                pid=int(r.pid),
                started_at=as_utc(r.started_at),
                seen_at=as_utc(r.seen_at),
                processed=int(r.processed),
                age_seconds=seen_age,
                alive=seen_age <= worker_timeout,
            )
        )
    alive = sum(1 for w in workers if w.alive)
    age = max(known) if known else None
    problems: list[str] = []
    if unreadable is not None:
        problems.append(
            f"the intake {path_of(engine)} cannot be read ({unreadable}): webhooks are refused "
            "(503) and what waits in it is not dispatched"
        )
    if require_worker and alive == 0:
        last = f"; last seen {workers[0].age_seconds:.0f} s ago" if workers else ""
        problems.append(f"no worker alive (none seen in the last {worker_timeout:g} s{last})")
    if max_open_age is not None:
        late = sorted(
            (figures["oldest_open_age_seconds"], account)
            for account, figures in per_account.items()
            if (figures["oldest_open_age_seconds"] or 0.0) > max_open_age
        )
        for late_age, account in reversed(late[-10:]):
            whose = "" if per_account.keys() == {DEFAULT_ACCOUNT} else f" of account {account}"
            problems.append(
                f"oldest open event{whose} is {late_age:.0f} s old (limit {max_open_age:g} s)"
            )
        if len(late) > 10:
            problems.append(f"{len(late) - 10} more account(s) with open events that old")
    return OpsStatus(
        workers=tuple(workers),
        workers_alive=alive,
        open_events={s: open_counts.get(s, 0) for s in EventStatus.OPEN},
        dead_events=dead,
        oldest_open_age_seconds=age,
        problems=tuple(problems),
        intake=in_intake,
        intake_oldest_age_seconds=intake_age,
        accounts={
            account: {
                **figures,
                "oldest_open_age_seconds": None
                if figures["oldest_open_age_seconds"] is None
                else round(figures["oldest_open_age_seconds"], 1),
            }
            for account, figures in sorted(per_account.items())
        },
    )


class Beater:
    """Writes one worker's heartbeat at most every :data:`BEAT_SECONDS` (see
    :class:`receiver.worker.runner.Worker`). A failed write is logged and retried at the next
    beat: a database outage must not end the worker."""

    def __init__(self, engine: Engine, name: str, *, interval: float = BEAT_SECONDS) -> None:
        self.engine = engine
        self.name = name
        self.interval = interval
        self.started_at = utcnow()
        self._last: float | None = None

    def beat(self, processed: int, *, monotonic: float, force: bool = False) -> None:
        if not force and self._last is not None and monotonic - self._last < self.interval:
            return
        self._last = monotonic
        try:
            record(self.engine, self.name, started_at=self.started_at, processed=processed)
        except Exception as exc:  # noqa: BLE001 - a heartbeat never ends the worker
            log.warning(
                "could not write the worker heartbeat: %s",
                type(getattr(exc, "orig", None) or exc).__name__,
                extra={"action": "heartbeat_failed", "worker": self.name},
            )

    def stop(self) -> None:
        try:
            remove(self.engine, self.name)
        except Exception as exc:  # noqa: BLE001 - the row then just ages out
            log.warning(
                "could not remove the worker heartbeat: %s",
                type(getattr(exc, "orig", None) or exc).__name__,
                extra={"action": "heartbeat_failed", "worker": self.name},
            )
