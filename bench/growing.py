"""Dispatch on top of a growing done history (PostgreSQL): part of the dispatch bench.

The history drain (:mod:`bench.drain`) fills the inbox first and then drains it, so it never
measures a claim on top of many *done* events. Here one ``hookledger worker`` runs for the
whole measurement while ``batches`` batches of ``events`` webhooks each are posted through
the real receiver (gunicorn serving :func:`bench.yardstick.create_hookledger_app`, ``wrk``
with :file:`bench/post_once.lua`, every body once, each a payment of its own):

1. the worker is paused (``SIGSTOP``) once no event is open (it is idle then, between
   polls), and the batch is posted and stored;
2. the worker is resumed (``SIGCONT``); the batch's rate is its events over the time from
   the resume to its last ``processed_at``.

The database is a fresh one with autovacuum off on the inbox's tables and never analysed, as
on a new ledger or one whose autovacuum is behind: the done events, their dead row versions
and index entries, and the deleted leases all stay. One worker process for the whole run,
so its connection keeps the plans it made while the ledger was empty (a worker restarted per
batch would plan afresh and hide them). Target: the last batch's rate within 0.85x of the
first's (the ratio of the last three to the first three is reported too). Also reported,
per event of each batch: the CPU of the worker process and its database sessions (from
``/proc``; the web processes' sessions are idle meanwhile), and the pages the database's
sessions read (``pg_stat_database``, after the sessions have reported them): the work done,
which the machine's load does not change (on a loaded machine the rates swing by 2x).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from bench.bodies import write_pool
from bench.common import (
    Database,
    Gunicorn,
    GunicornConfig,
    Row,
    Section,
    database,
    log,
    migrate,
)
from bench.drain import _no_statistics, _wait_drained, _worker
from bench.endtoend import HOOKLEDGER_APP, _errors, _post_all

#: Seconds for idle sessions to report their statistics (PostgreSQL: within 10 s).
STATS_FLUSH = 11.0
#: The last batch's rate must be at least this much of the first's.
FLAT_FLOOR = 0.85


@dataclass(frozen=True, kw_only=True)
class GrowingConfig:
    batches: int = 10
    events: int = 10_000  # per batch
    connections: int = 8
    gunicorn: GunicornConfig = GunicornConfig(workers=2, worker_class="gthread", threads=4)
    timeout: float = 600.0


@dataclass
class Growing:
    rates: list[float] = field(default_factory=list)  # events/s of each batch, in order
    #: CPU per event of each batch (ms): the worker process and its database sessions.
    cpu_ms: list[float] = field(default_factory=list)
    #: Pages read per event of each batch by the database's sessions (shared buffers hit or
    #: read): the work done, whatever the machine's load.
    pages: list[float] = field(default_factory=list)
    errors: int = 0  # HTTP errors while posting

    @property
    def last_vs_first(self) -> float:
        return self.rates[-1] / self.rates[0]

    @property
    def last3_vs_first3(self) -> float:
        k = min(3, len(self.rates) // 2) or 1
        return statistics.fmean(self.rates[-k:]) / statistics.fmean(self.rates[:k])


def _count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM hookledger_event")).scalar_one())


def _done_between(engine: sa.Engine, after: float) -> tuple[float, float]:
    """The first and last ``processed_at`` (epoch seconds) of the events done after ``after``."""
    with engine.connect() as conn:
        first, last = conn.execute(
            sa.text(
                "SELECT min(processed_at), max(processed_at) FROM hookledger_event"
                " WHERE processed_at > :after"
            ),
            {"after": datetime.fromtimestamp(after, UTC).replace(tzinfo=None)},
        ).one()
    if not isinstance(first, datetime) or not isinstance(last, datetime):
        raise RuntimeError("no event was processed")
    return tuple(  # type: ignore[return-value]
        (v if v.tzinfo else v.replace(tzinfo=UTC)).timestamp() for v in (first, last)
    )


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_of(engine: sa.Engine, db: Database, worker: int) -> dict[int, float]:
    """CPU seconds of the worker process and of the measured children's database sessions
    (the web processes' are idle while the worker drains), by pid."""
    with engine.connect() as conn:
        sessions = conn.execute(
            sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :a"),
            {"a": db.child_app},
        ).scalars()
        pids = [worker, *(int(p) for p in sessions)]
    return {pid: _cpu(pid) for pid in pids}


def _pages(engine: sa.Engine, db: Database) -> int:
    """Pages the bench database's sessions have read (shared buffers or not), as far as the
    sessions have reported them (a busy session reports at most once a second, an idle one
    within ten)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = :d"),
                {"d": db.pg_name},
            ).scalar_one()
        )


def _wait_idle(engine: sa.Engine, timeout: float) -> None:
    """No event open, and the worker past its last batch (back in its poll wait)."""
    _wait_drained(engine, timeout)
    time.sleep(0.3)


def growing_history(cfg: GrowingConfig, workdir: Path) -> Growing:
    result = Growing()
    with database("postgresql", workdir, name="growing") as db:
        migrate(db)
        engine = db.engine()
        web = Gunicorn(HOOKLEDGER_APP, db=db, config=cfg.gunicorn.balanced(cfg.connections))
        worker = None
        paused = False
        try:
            _no_statistics(engine)
            web.wait_ready()
            worker = _worker(db)
            pool = workdir / "growing-pool.txt"
            for batch in range(cfg.batches):
                write_pool(pool, cfg.events)  # fresh event and payment ids
                _wait_idle(engine, cfg.timeout)
                os.kill(worker.pid, signal.SIGSTOP)
                paused = True
                target = (batch + 1) * cfg.events
                posted = _post_all(
                    web.base + "/webhooks/", pool, cfg.connections, lambda: _count(engine), target
                )
                result.errors += _errors(posted)
                stored = _count(engine)
                if stored != target:
                    raise RuntimeError(f"{stored} events stored, {target} expected")
                time.sleep(STATS_FLUSH)  # the web sessions report their pages
                pages = _pages(engine, db)
                before = _cpu_of(engine, db, worker.pid)
                resumed = time.time()
                os.kill(worker.pid, signal.SIGCONT)
                paused = False
                _wait_drained(engine, cfg.timeout, poll=0.5)
                first, last = _done_between(engine, resumed)
                after = _cpu_of(engine, db, worker.pid)
                time.sleep(1.5)  # the worker, polling, reports its pages
                pages = _pages(engine, db) - pages
                cpu = sum(t - before.get(pid, 0.0) for pid, t in after.items())
                result.rates.append(cfg.events / (last - resumed))
                result.cpu_ms.append(cpu * 1000 / cfg.events)
                result.pages.append(pages / cfg.events)
                log(
                    f"  dispatch growing history: batch {batch + 1}: {result.rates[-1]:.0f}/s,"
                    f" {result.cpu_ms[-1]:.3f} ms CPU and {result.pages[-1]:.0f} pages read per"
                    f" event (first event done {first - resumed:.2f} s after the resume)"
                )
            with engine.connect() as conn:
                not_done = conn.execute(
                    sa.text("SELECT count(*) FROM hookledger_event WHERE status <> 'done'")
                ).scalar_one()
            if not_done:
                raise RuntimeError(f"{not_done} events did not end done")
        finally:
            if worker is not None:
                if paused:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker.pid, signal.SIGCONT)
                worker.stop()
            web.stop()
            engine.dispose()
    return result


def run(cfg: GrowingConfig, section: Section, workdir: Path) -> None:
    """Add the growing-history row to the dispatch ``section``."""
    log(
        f"  dispatch: {cfg.batches} batches of {cfg.events:,} posted, drained on top of the "
        "done ones (PostgreSQL)"
    )
    grown = growing_history(cfg, workdir)
    rates = ", ".join(f"{r:.0f}" for r in grown.rates)
    log(
        f"  dispatch growing history: {rates} events/s; last vs first {grown.last_vs_first:.2f}x,"
        f" last three vs first three {grown.last3_vs_first3:.2f}x; CPU per event last vs first "
        f"{grown.cpu_ms[-1] / grown.cpu_ms[0]:.2f}x; pages per event last vs first "
        f"{grown.pages[-1] / grown.pages[0]:.2f}x"
    )
    k = cfg.events // 1000
    section.rows.append(
        Row(
            bench="dispatch",
            case=f"PostgreSQL, {cfg.batches} x {k}k posted through the receiver, each drained "
            f"on top of the done ones (never analysed), 1 worker: batch {cfg.batches} "
            "(the yardstick column is batch 1)",
            metric=f"batch {cfg.batches} events/s vs batch 1",
            hookledger=grown.rates[-1],
            yardstick=grown.rates[0],
            ratio=grown.last_vs_first,
            target=f">= {FLAT_FLOOR:.2f}x",
            met=grown.last_vs_first >= FLAT_FLOOR and grown.errors == 0,
            samples_a=grown.rates,
        )
    )
    section.details.append(
        f"- growing done history, PostgreSQL (fresh database, autovacuum off on the inbox's "
        f"tables, never analysed), {cfg.batches} batches of {cfg.events:,} webhooks posted "
        f"through gunicorn ({cfg.gunicorn.describe()}) while the one worker was paused, each "
        f"then drained on top of the done ones: {rates} events/s (batch {cfg.batches} vs 1: "
        f"{grown.last_vs_first:.2f}x; last three vs first three: "
        f"{grown.last3_vs_first3:.2f}x; {grown.errors} HTTP errors); CPU per event of the "
        "worker and its database sessions: "
        + ", ".join(f"{c:.3f}" for c in grown.cpu_ms)
        + f" ms (batch {cfg.batches} vs 1: {grown.cpu_ms[-1] / grown.cpu_ms[0]:.2f}x); pages"
        " read per event by the database's sessions (the work, whatever the load): "
        + ", ".join(f"{p:.0f}" for p in grown.pages)
        + f" (batch {cfg.batches} vs 1: {grown.pages[-1] / grown.pages[0]:.2f}x)"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.growing [--batches N] [--events N]``: this row alone, printed."""
    from bench.common import temp_dir

    parser = argparse.ArgumentParser(prog="python -m bench.growing")
    parser.add_argument("--batches", type=int, default=GrowingConfig.batches)
    parser.add_argument("--events", type=int, default=GrowingConfig.events)
    args = parser.parse_args(argv)
    section = Section(name="dispatch")
    with temp_dir() as workdir:
        run(GrowingConfig(batches=args.batches, events=args.events), section, workdir)
    print("\n".join(section.details))
    return 0 if all(row.met for row in section.rows) else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["GrowingConfig", "growing_history", "run"]
