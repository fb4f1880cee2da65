"""Dispatch as the history grows, and while receiving: part of the dispatch bench.

* **History drain**: a fresh database (PostgreSQL: a new database, autovacuum off on the
  inbox's tables and no ``ANALYZE``, so the planner never has statistics; SQLite: a new
  file), ``events`` pending webhook deliveries inserted in bulk, one ``hookledger worker``
  started; when no event is open, the events' ``processed_at`` are cut into slices of
  ``slice_events`` and each slice's throughput is compared with the mean of all: the
  target is every slice within +-20 % of the mean (dispatch cost flat as the ledger grows).
* **Steady state while receiving**: a fresh database, one ``hookledger worker`` running, and
  events stored through the package's own ``Store.insert`` at a fixed rate for a fixed time
  (one thread of the bench process, one transaction per event as the web path commits
  them); reported: the dispatch throughput over the window and the receipt-to-done latency
  (``processed_at - received_at``) p50 / p99 of every event.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from bench.bodies import Template, new_event_id
from bench.common import (
    BIN,
    Backend,
    Database,
    Proc,
    Row,
    Section,
    child_env,
    database,
    fmt,
    log,
    migrate,
    percentile,
)
from bench.inbox_fill import chain_events, fill_inbox

APP = "bench.yardstick:create_hookledger_app"
FLAT_TOLERANCE = 0.20
INBOX = (
    "hookledger_event",
    "hookledger_transition",
    "hookledger_projection",
    "hookledger_handler_run",
    "hookledger_object_lease",
)


@dataclass(frozen=True, kw_only=True)
class DrainConfig:
    backends: tuple[Backend, ...] = ("postgresql", "sqlite")
    events: int = 100_000
    slice_events: int = 10_000
    steady_rate: float = 300.0  # events/s stored while the worker runs
    steady_seconds: float = 20.0
    timeout: float = 900.0


@dataclass
class Flatness:
    rates: list[float] = field(default_factory=list)  # events/s of each slice, in order
    seconds: float = 0.0

    @property
    def mean(self) -> float:
        return statistics.fmean(self.rates)

    @property
    def worst(self) -> float:
        """The largest deviation of a slice from the mean, as a fraction of the mean."""
        return max(abs(r - self.mean) for r in self.rates) / self.mean


@dataclass
class Steady:
    offered: float
    rate: float
    p50_ms: float
    p99_ms: float
    events: int


def _worker(db: Database) -> Proc:
    args = [str(BIN / "hookledger"), "--app", APP, "worker"]
    proc = Proc(args, env=child_env(db))
    deadline = time.monotonic() + 60
    while "started" not in proc.stderr_text():
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not start: {proc.stderr_text()}")
        time.sleep(0.005)
    return proc


def _no_statistics(engine: sa.Engine) -> None:
    if engine.dialect.name != "postgresql":
        return
    with engine.begin() as conn:
        for table in INBOX:
            conn.execute(sa.text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))


def _wait_drained(engine: sa.Engine, timeout: float, poll: float = 0.1) -> None:
    """Until no event is open, polled every ``poll`` seconds (each poll reads pages too)."""
    deadline = time.monotonic() + timeout
    query = sa.text(
        "SELECT count(*) FROM hookledger_event WHERE status IN ('pending', 'processing')"
    )
    while True:
        with engine.connect() as conn:
            if int(conn.execute(query).scalar_one()) == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"events still open after {timeout:g} s")
        time.sleep(poll)


def _times(engine: sa.Engine) -> list[tuple[float, float]]:
    """(received_at, processed_at) of every done event, as epoch seconds, by processed_at."""
    from receiver.storage.sql.tables import EVENT

    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(EVENT.c.received_at, EVENT.c.processed_at, EVENT.c.status).order_by(
                EVENT.c.processed_at
            )
        ).all()
    if any(r.status != "done" for r in rows):
        raise RuntimeError("every event must end done")

    def epoch(value: datetime) -> float:
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()

    return [(epoch(r.received_at), epoch(r.processed_at)) for r in rows]


def history_drain(cfg: DrainConfig, backend: Backend, workdir: Path) -> Flatness:
    with database(backend, workdir, name="drain") as db:
        migrate(db)
        engine = db.engine()
        try:
            _no_statistics(engine)
            fill_inbox(engine, chain_events(cfg.events, 1), analyze=False)
            worker = _worker(db)
            started = time.time()
            try:
                _wait_drained(engine, cfg.timeout)
            finally:
                worker.stop()
            done = [p for _, p in _times(engine)]
        finally:
            engine.dispose()
    flat = Flatness(seconds=done[-1] - started)
    edge = started
    for end in range(cfg.slice_events, len(done) + 1, cfg.slice_events):
        flat.rates.append(cfg.slice_events / (done[end - 1] - edge))
        edge = done[end - 1]
    return flat


def steady_state(cfg: DrainConfig, backend: Backend, workdir: Path) -> Steady:
    from receiver.core.events import parse_event
    from receiver.store import Store

    template = Template()
    with database(backend, workdir, name="steady") as db:
        migrate(db)
        engine = db.engine()
        try:
            _no_statistics(engine)
            store = Store(engine)
            worker = _worker(db)
            stored = 0
            try:
                total = int(cfg.steady_rate * cfg.steady_seconds)
                t0 = time.monotonic()
                for i in range(total):
                    due = t0 + i / cfg.steady_rate
                    wait = due - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    body = template.body(new_event_id(), f"pay_{i:020d}")
                    store.inbox.insert(parse_event(body), body)
                    stored += 1
                offered = stored / (time.monotonic() - t0)
                _wait_drained(engine, cfg.timeout)
            finally:
                worker.stop()
            times = _times(engine)
        finally:
            engine.dispose()
    latencies = sorted((p - r) * 1000 for r, p in times)
    first = min(r for r, _ in times)
    last = max(p for _, p in times)
    return Steady(
        offered=offered,
        rate=len(times) / (last - first),
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        events=len(times),
    )


def run(cfg: DrainConfig, section: Section, workdir: Path) -> None:
    """Add the history drains' and the steady states' rows to the dispatch ``section``."""
    label = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}
    for backend in cfg.backends:
        log(f"  dispatch: {cfg.events:,}-event drain from a fresh {label[backend]} database")
        flat = history_drain(cfg, backend, workdir)
        log(
            f"  dispatch drain {label[backend]}: "
            + ", ".join(f"{r:.0f}" for r in flat.rates)
            + f" events/s per {cfg.slice_events:,}; worst {flat.worst:.0%} from the mean"
        )
        section.rows.append(
            Row(
                bench="dispatch",
                case=f"{label[backend]}, {cfg.events:,}-event drain, fresh database, 1 worker, "
                f"worst {cfg.slice_events // 1000}k slice vs mean",
                metric=f"worst {cfg.slice_events // 1000}k slice vs mean",
                hookledger=flat.worst * 100,
                yardstick=None,
                ratio=None,
                target=f"within +-{FLAT_TOLERANCE:.0%}",
                met=flat.worst <= FLAT_TOLERANCE,
                unit="%",
                samples_a=flat.rates,
            )
        )
        section.details.append(
            f"- {cfg.events:,}-event drain, {label[backend]}, fresh database"
            + (", autovacuum off, never analysed" if backend == "postgresql" else "")
            + f", 1 worker: {fmt(cfg.events / flat.seconds)}/s overall in {flat.seconds:.1f} s;"
            f" per {cfg.slice_events:,} events: "
            + ", ".join(fmt(r) for r in flat.rates)
            + f" events/s (mean {fmt(flat.mean)}, min {fmt(min(flat.rates))}, max "
            f"{fmt(max(flat.rates))}; worst slice {flat.worst:.0%} from the mean)"
        )
    for backend in cfg.backends:
        log(f"  dispatch: steady state while receiving, {label[backend]}")
        steady = steady_state(cfg, backend, workdir)
        log(
            f"  dispatch steady {label[backend]}: {steady.rate:.0f}/s dispatched of "
            f"{steady.offered:.0f}/s stored; receipt to done p50 {steady.p50_ms:.1f} ms, "
            f"p99 {steady.p99_ms:.1f} ms"
        )
        section.rows.append(
            Row(
                bench="dispatch",
                case=f"{label[backend]}, steady {cfg.steady_rate:.0f}/s stored, 1 worker, "
                "receipt-to-done p99",
                metric="receipt to done p99 (ms)",
                hookledger=steady.p99_ms,
                yardstick=None,
                ratio=None,
                target="keeps up (dispatched = stored)",
                met=steady.rate >= 0.95 * steady.offered,
                unit="ms",
            )
        )
        section.details.append(
            f"- steady state, {label[backend]}: {steady.events:,} events stored at "
            f"{fmt(steady.offered)}/s (Store.insert, one transaction each) while 1 worker "
            f"runs: dispatched {fmt(steady.rate)}/s; receipt to done p50 "
            f"{steady.p50_ms:.1f} ms, p99 {steady.p99_ms:.1f} ms"
        )


__all__ = ["DrainConfig", "history_drain", "run", "steady_state"]
