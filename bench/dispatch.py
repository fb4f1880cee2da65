"""Dispatch: events/s through ``hookledger worker`` processes with a trivial handler (PostgreSQL).

Each measurement starts from an empty inbox: N events are inserted (one transaction, then
``ANALYZE``), then K worker processes are started; the clock starts when the first worker
reports it has started and stops at the last ``processed_at`` once no event is open.
Cases: every event of its own payment, and several events per payment (processing ->
authorized -> captured -> succeeded, all dispatched in order). Every event must end ``done``.

Yardstick (the floor of any database queue): the same bodies in a bare table, drained by K
processes running ``SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1`` + parse + no-op handler +
``UPDATE ... SET status='done'`` + ``COMMIT`` in a loop. No per-object order, no ledger.

``python -m bench.dispatch yardstick-worker`` is that loop (a child process).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench import accounts, profiling
from bench.accounts import FairnessConfig
from bench.bodies import ChainEvent
from bench.common import (
    BIN,
    Database,
    Proc,
    Row,
    Section,
    child_env,
    database,
    fmt,
    log,
    median,
    migrate,
    pg_commits,
)
from bench.drain import DrainConfig
from bench.growing import GrowingConfig
from bench.inbox_fill import chain_events, fill_inbox

TARGET = 1000.0
QUEUE_TABLE = "bench_queue"
APP = "bench.yardstick:create_hookledger_app"
INBOX_TABLES = (
    "hookledger_handler_run",
    "hookledger_transition",
    "hookledger_projection",
    "hookledger_object_lease",
    "hookledger_event_conflict",
    "hookledger_event",
)


@dataclass(frozen=True, kw_only=True)
class DispatchConfig:
    run_seconds: float = 5.0  # events per run = calibrated rate x this, within the bounds:
    min_events: int = 500
    max_events: int = 30_000
    per_object: int = 4
    workers: tuple[int, ...] = (1, 2)
    rounds: int = 3
    timeout: float = 180.0
    yardstick: bool = True
    profile: bool | None = None
    profile_seconds: float = 6.0
    #: The history drains and the steady states (:mod:`bench.drain`); ``None``: skipped.
    drain: DrainConfig | None = DrainConfig()
    #: Batches drained on top of a growing done history (:mod:`bench.growing`); ``None``:
    #: skipped.
    growing: GrowingConfig | None = GrowingConfig()
    #: The several-accounts drain (:mod:`bench.accounts`): how many accounts (0: skipped).
    accounts: int = 1000
    #: The fairness run (:mod:`bench.accounts`); ``None``: skipped.
    fairness: FairnessConfig | None = FairnessConfig()


# -- filling ----------------------------------------------------------------------------------


def fill_queue(engine: sa.Engine, events: list[ChainEvent]) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"INSERT INTO {QUEUE_TABLE} (object_key, body) VALUES (:k, :b)"),
            [{"k": f"payment:{e.object_id}", "b": e.body} for e in events],
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"ANALYZE {QUEUE_TABLE}"))


def reset(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {', '.join(INBOX_TABLES)}, {QUEUE_TABLE}"))


def create_queue(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE TABLE IF NOT EXISTS {QUEUE_TABLE} (id BIGSERIAL PRIMARY KEY, "
                "object_key VARCHAR(300) NOT NULL, body BYTEA NOT NULL, "
                "status VARCHAR(16) NOT NULL DEFAULT 'pending', processed_at TIMESTAMPTZ)"
            )
        )
        conn.execute(
            sa.text(
                f"CREATE INDEX IF NOT EXISTS ix_{QUEUE_TABLE}_status ON {QUEUE_TABLE} (status, id)"
            )
        )


# -- the yardstick worker (child process) -----------------------------------------------------


def yardstick_worker(url: str) -> int:
    engine = sa.create_engine(url, pool_size=2)
    take = sa.text(
        f"SELECT id, body FROM {QUEUE_TABLE} WHERE status = 'pending' ORDER BY id "
        "LIMIT 1 FOR UPDATE SKIP LOCKED"
    )
    done = sa.text(
        f"UPDATE {QUEUE_TABLE} SET status = 'done', processed_at = clock_timestamp() WHERE id = :id"
    )

    def handler(event: dict[str, Any]) -> None:
        """The same trivial handler."""

    print("yardstick worker started", file=sys.stderr, flush=True)
    processed = 0
    idle_since: float | None = None
    while True:
        with engine.begin() as conn:
            row = conn.execute(take).first()
            if row is not None:
                handler(json.loads(row.body))
                conn.execute(done, {"id": row.id})
        if row is None:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > 2.0:
                break
            time.sleep(0.05)
            continue
        idle_since = None
        processed += 1
    print(f"yardstick worker stopped after {processed}", file=sys.stderr, flush=True)
    engine.dispose()
    return 0


# -- measuring --------------------------------------------------------------------------------


def _wait_started(procs: list[Proc], timeout: float = 60.0) -> list[float]:
    """``time.time()`` at which each worker reported it had started (polled every 5 ms)."""
    ready: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(ready) < len(procs):
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not start")
        for i, proc in enumerate(procs):
            if i in ready:
                continue
            if "started" in proc.stderr_text():
                ready[i] = time.time()
            elif not proc.alive():
                raise RuntimeError(f"worker exited: {proc.stderr_text()}")
        time.sleep(0.005)
    return [ready[i] for i in range(len(procs))]


@dataclass
class Drained:
    """One drain: throughput while every worker was running."""

    rate: float
    events: int
    seconds: float
    skew: float  # seconds between the first and the last worker's start
    commits: float = 0.0  # PostgreSQL commits per event, all processes of the run
    statements: float | None = None  # statements sent per event (hookledger's workers)


def _drain(
    engine: sa.Engine, table: str, open_sql: str, ready: list[float], timeout: float
) -> Drained:
    """Wait until no event is open; the rate counts the events finished after the *last*
    worker started, over the time from then to the last ``processed_at``."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            left = int(conn.execute(sa.text(open_sql)).scalar_one())
        if left == 0:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{left} events still open after {timeout:g} s")
        time.sleep(0.05)
    start = max(ready)
    since = datetime.fromtimestamp(start, UTC)
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(f"SELECT count(*), max(processed_at) FROM {table} WHERE processed_at > :since"),
            {"since": since},
        ).one()
    count, last = int(row[0]), row[1]
    if last is None or count == 0:
        raise RuntimeError(
            "every event was processed before the last worker started: use more events"
        )
    seconds = (last if last.tzinfo else last.replace(tzinfo=UTC)).timestamp() - start
    return Drained(count / seconds, count, seconds, max(ready) - min(ready))


class _Dispatch:
    def __init__(self, cfg: DispatchConfig, db: Database, workdir: Path):
        self.cfg = cfg
        self.db = db
        self.workdir = workdir
        self.engine = db.engine()

    def hookledger(
        self,
        events: list[ChainEvent],
        workers: int,
        spy: Path | None = None,
        accounts: list[str] | None = None,
    ) -> Drained:
        reset(self.engine)
        fill_inbox(self.engine, events, accounts=accounts)
        before = pg_commits(self.db)
        procs = []
        args = [str(BIN / "hookledger"), "--app", APP, "worker", "--poll-interval", "0.05"]
        counts = self.workdir / "sql-counts"
        shutil.rmtree(counts, ignore_errors=True)
        counts.mkdir()
        try:
            for _ in range(workers):
                procs.append(Proc(args, env=child_env(self.db, HLBENCH_SQL_COUNT=str(counts))))
            ready = _wait_started(procs)
            attach = (
                profiling.Attach(
                    procs[0].pid, spy, self.cfg.profile_seconds, subprocesses=False, idle=True
                )
                if spy is not None
                else None
            )
            drained = _drain(
                self.engine,
                "hookledger_event",
                "SELECT count(*) FROM hookledger_event WHERE status IN ('pending', 'processing')",
                ready,
                self.cfg.timeout,
            )
            if attach is not None:
                attach.wait()
        finally:
            for proc in procs:
                proc.stop()
        drained.commits = self._commits(before, len(events))
        written = [int(f.read_text()) for f in counts.iterdir()]
        if len(written) == workers:
            drained.statements = sum(written) / len(events)
        shutil.rmtree(counts, ignore_errors=True)
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT status, count(*) FROM hookledger_event GROUP BY status")
            ).all()
        statuses = {str(row[0]): int(row[1]) for row in rows}
        if statuses != {"done": len(events)}:
            raise RuntimeError(f"unexpected final statuses {statuses} (expected all done)")
        return drained

    def yardstick(self, events: list[ChainEvent], workers: int) -> Drained:
        reset(self.engine)
        fill_queue(self.engine, events)
        before = pg_commits(self.db)
        args = [sys.executable, "-m", "bench.dispatch", "yardstick-worker", self.db.child_url]
        procs = []
        try:
            for _ in range(workers):
                procs.append(Proc(args, env=child_env(self.db)))
            ready = _wait_started(procs)
            drained = _drain(
                self.engine,
                QUEUE_TABLE,
                f"SELECT count(*) FROM {QUEUE_TABLE} WHERE status = 'pending'",
                ready,
                self.cfg.timeout,
            )
        finally:
            for proc in procs:
                proc.stop()
        drained.commits = self._commits(before, len(events))
        return drained

    def _commits(self, before: int, events: int) -> float:
        time.sleep(0.5)  # ended sessions report their statistics on exit
        return (pg_commits(self.db) - before) / events


def _size(rate: float, cfg: DispatchConfig, per_object: int) -> int:
    n = int(min(cfg.max_events, max(cfg.min_events, rate * cfg.run_seconds)))
    return n - n % per_object


def run(cfg: DispatchConfig, workdir: Path) -> Section:
    section = Section(name="dispatch")
    t0 = time.monotonic()
    with database("postgresql", workdir, name="disp") as db:
        migrate(db)
        bench = _Dispatch(cfg, db, workdir)
        create_queue(bench.engine)
        try:
            # Calibrate: size the runs of each path so each takes about run_seconds.
            probe = chain_events(cfg.min_events, 1)
            rate_h = bench.hookledger(probe, 1).rate
            rate_y = bench.yardstick(probe, 1).rate if cfg.yardstick else 0.0
            sizes = {"hookledger": rate_h, "yardstick": rate_y}
            log(f"  dispatch: calibration hookledger {rate_h:.0f}/s, yardstick {rate_y:.0f}/s")
            section.details.append(
                f"PostgreSQL; one no-op `on_any` handler (no session argument); "
                "`hookledger worker --poll-interval 0.05`; the inbox is pre-filled in one "
                "transaction and analysed, then the workers start; the rate counts the events "
                "finished after the last worker started, up to the last `processed_at`. Runs "
                f"are sized for about {cfg.run_seconds:g} s of hookledger from a one-worker "
                "calibration "
                f"(hookledger {rate_h:.0f}/s, yardstick {rate_y:.0f}/s); both paths drain the "
                f"same number of events. {cfg.rounds} rounds alternating hookledger / yardstick."
            )
            cases = [(1, "distinct payments"), (cfg.per_object, f"{cfg.per_object} per payment")]
            for per_object, label in cases:
                for workers in cfg.workers:
                    _case(cfg, bench, section, sizes, per_object, label, workers)
            if cfg.accounts:
                accounts.dispatch_rows(
                    section,
                    lambda n, sellers: (
                        bench.hookledger(chain_events(n, 1), 1, accounts=sellers).rate
                    ),
                    events=_size(rate_h, cfg, 1),
                    accounts=cfg.accounts,
                    rounds=cfg.rounds,
                )
            if cfg.drain is not None:
                from bench import drain

                drain.run(cfg.drain, section, workdir)
            if cfg.growing is not None:
                from bench import growing

                growing.run(cfg.growing, section, workdir)
            if cfg.fairness is not None:
                accounts.fairness_rows(cfg.fairness, section, workdir)
            missed = [row for row in section.rows if not row.met]
            if cfg.profile or (cfg.profile is None and missed):
                _profile(cfg, bench, section, rate_h)
        finally:
            bench.engine.dispose()
    section.seconds = time.monotonic() - t0
    return section


def _case(
    cfg: DispatchConfig,
    bench: _Dispatch,
    section: Section,
    rates: dict[str, float],
    per_object: int,
    label: str,
    workers: int,
) -> None:
    hl: list[Drained] = []
    ys: list[Drained] = []
    # The same backlog for both paths (a queue's speed depends on its length), sized from
    # hookledger's rate; two workers may go up to twice as fast.
    n_h = n_y = _size(rates["hookledger"] * workers, cfg, per_object)
    for r in range(cfg.rounds):
        hl.append(bench.hookledger(chain_events(n_h, per_object), workers))
        line = f"  dispatch {label}, {workers} worker(s), round {r + 1}: "
        line += f"hookledger {hl[-1].rate:.0f}/s"
        if cfg.yardstick:
            ys.append(bench.yardstick(chain_events(n_y, per_object), workers))
            line += f", yardstick {ys[-1].rate:.0f}/s"
        log(line)
    value = median([x.rate for x in hl])
    yard = median([x.rate for x in ys]) if ys else None
    section.rows.append(
        Row(
            bench="dispatch",
            case=f"PostgreSQL, {label}, {workers} worker{'s' if workers > 1 else ''}",
            metric="events/s",
            hookledger=value,
            yardstick=yard,
            ratio=value / yard if yard else None,
            target=f">= {TARGET:,.0f}/s",
            met=value >= TARGET,
            samples_a=[x.rate for x in hl],
            samples_b=[x.rate for x in ys],
        )
    )

    def runs(xs: list[Drained], n: int) -> str:
        return (
            f"{n} events: "
            + ", ".join(
                f"{fmt(x.rate)}/s ({x.events} in {x.seconds:.2f} s"
                + (f", start skew {x.skew:.2f} s)" if workers > 1 else ")")
                for x in xs
            )
            + f"; {median([x.commits for x in xs]):.2f} commits"
            + (
                f" and {median([x.statements for x in xs if x.statements]):.1f} statements"
                if any(x.statements for x in xs)
                else ""
            )
            + " per event"
        )

    section.details.append(
        f"- {label}, {workers} worker(s): hookledger {runs(hl, n_h)}"
        + (f"; yardstick {runs(ys, n_y)}" if ys else "")
    )


def _profile(cfg: DispatchConfig, bench: _Dispatch, section: Section, rate: float) -> None:
    if profiling.py_spy() is None:
        section.profiles.append("(py-spy not installed: no dispatch profile)")
        return
    out = bench.workdir / "dispatch.txt"
    log(f"  profiling one hookledger worker for {cfg.profile_seconds:g} s (py-spy)")
    n = int(max(cfg.min_events, rate * (cfg.profile_seconds + 2)))
    bench.hookledger(chain_events(n, 1), 1, spy=out)
    section.profiles.append(
        profiling.summarize_worker(
            out,
            title="dispatch, PostgreSQL: one `hookledger worker`, distinct payments",
        )
    )
    out.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("yardstick-worker", help="drain the bare queue table")
    worker.add_argument("url")
    args = parser.parse_args(argv)
    if args.command == "yardstick-worker":
        return yardstick_worker(args.url)
    return 2


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["DispatchConfig", "run"]
