"""Several processor accounts: part of the dispatch bench (issue 19, items 6 and 10).

* **1,000 accounts**: the same backlog of distinct payments drained by one worker, once with
  every payment in the default account and once dealt to 1,000 accounts, in alternating
  rounds on one PostgreSQL database; the row is the ratio of the two medians (target: the
  1,000-account drain within 10 % of the single account's). A claim takes turns between up
  to 16 accounts with due events (:data:`receiver.storage.queue.ACCOUNTS_PER_CLAIM`), so
  with 1,000 accounts it reads 16 accounts' heads instead of one index range.
* **Fairness under a flood**: a fresh database, 100,000 pending deliveries of one account
  (``flood``) inserted in bulk, one ``hookledger worker`` started; while it drains them,
  another account (``quiet``) receives a few events a second through the package's own
  ``Store.insert``. Reported: the quiet account's receipt-to-done p50 / p99, and how many
  of the flood's events were still open when the last quiet event was done (the flood was
  still draining throughout, or the figure would prove nothing). Target: p99 under 1 s.
  Without taking turns, a quiet event waited behind every earlier flood event: 100,000
  events at the worker's rate, minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from bench.bodies import Template, new_event_id
from bench.common import Backend, Row, Section, database, fmt, log, median, migrate, percentile
from bench.inbox_fill import chain_events, fill_inbox

LABEL = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}
#: The 1,000-account drain may be this much slower than the single account's (issue 19).
ACCOUNTS_TOLERANCE = 0.10
#: The quiet account's receipt-to-done p99 during the flood must stay under this.
FAIR_P99_MS = 1000.0


@dataclass(frozen=True, kw_only=True)
class FairnessConfig:
    backends: tuple[Backend, ...] = ("postgresql", "sqlite")
    flood: int = 100_000
    quiet_rate: float = 5.0  # events/s stored in the quiet account while the flood drains
    quiet_seconds: float = 20.0
    timeout: float = 300.0


@dataclass
class Fairness:
    p50_ms: float
    p99_ms: float
    worst_ms: float
    quiet: int
    flood_open_at_end: int
    flood_done: int
    seconds: float


def account_ids(n: int) -> list[str]:
    return [f"seller{i:04d}" for i in range(n)]


def dispatch_rows(
    section: Section,
    drain: Callable[[int, list[str] | None], float],
    *,
    events: int,
    accounts: int,
    rounds: int,
) -> None:
    """The several-accounts row of the dispatch ``section`` (PostgreSQL, 1 worker):
    ``drain(events, accounts)`` drains ``events`` distinct payments (dealt to ``accounts``,
    or all in the default account for ``None``) and answers the rate."""
    sellers = account_ids(accounts)
    one: list[float] = []
    many: list[float] = []
    for r in range(rounds):
        one.append(drain(events, None))
        many.append(drain(events, sellers))
        log(
            f"  dispatch accounts, round {r + 1}: 1 account {one[-1]:.0f}/s, "
            f"{accounts:,} accounts {many[-1]:.0f}/s"
        )
    a, b = median(many), median(one)
    section.rows.append(
        Row(
            bench="dispatch",
            case=f"PostgreSQL, distinct payments, 1 worker, {accounts:,} accounts vs 1",
            metric="events/s",
            hookledger=a,
            yardstick=b,
            ratio=a / b,
            target=f">= {1 - ACCOUNTS_TOLERANCE:.2f}x of one account",
            met=a >= (1 - ACCOUNTS_TOLERANCE) * b,
            samples_a=many,
            samples_b=one,
        )
    )
    section.details.append(
        f"- {accounts:,} accounts (the yardstick column is the same drain in one "
        f"account): {events} distinct payments dealt to {accounts:,} accounts in turn, "
        f"{rounds} alternating rounds, 1 worker: "
        + ", ".join(f"{fmt(x)}/s" for x in many)
        + "; one account: "
        + ", ".join(f"{fmt(x)}/s" for x in one)
    )


def fairness(cfg: FairnessConfig, backend: Backend, workdir: Path) -> Fairness:
    from bench.drain import _no_statistics, _worker
    from receiver.core.events import parse_event
    from receiver.storage.sql.tables import EVENT
    from receiver.store import Store

    template = Template()
    with database(backend, workdir, name="fair") as db:
        migrate(db)
        engine = db.engine()
        try:
            _no_statistics(engine)
            fill_inbox(engine, chain_events(cfg.flood, 1), accounts=["flood"], analyze=False)
            store = Store(engine)
            quiet: list[int] = []
            worker = _worker(db)
            t0 = time.monotonic()
            try:
                total = int(cfg.quiet_rate * cfg.quiet_seconds)
                for i in range(total):
                    wait = t0 + i / cfg.quiet_rate - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                    body = template.body(new_event_id(), f"pay_q{i:019d}")
                    quiet.append(store.inbox.insert(parse_event(body), body, account="quiet").pk)
                deadline = time.monotonic() + cfg.timeout
                while True:
                    with engine.connect() as conn:
                        left = conn.execute(
                            sa.select(sa.func.count())
                            .select_from(EVENT)
                            .where(EVENT.c.account == "quiet", EVENT.c.status != "done")
                        ).scalar_one()
                    if not left:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{left} quiet events still open")
                    time.sleep(0.05)
                seconds = time.monotonic() - t0
                with engine.connect() as conn:
                    flood: dict[str, int] = dict(
                        conn.execute(
                            sa.select(EVENT.c.status, sa.func.count())
                            .where(EVENT.c.account == "flood")
                            .group_by(EVENT.c.status)
                        ).all()
                    )
                    times = conn.execute(
                        sa.select(EVENT.c.received_at, EVENT.c.processed_at).where(
                            EVENT.c.account == "quiet"
                        )
                    ).all()
            finally:
                worker.stop()
        finally:
            engine.dispose()

    def epoch(value: datetime) -> float:
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()

    latencies = sorted((epoch(p) - epoch(r)) * 1000 for r, p in times)
    return Fairness(
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        worst_ms=latencies[-1],
        quiet=len(latencies),
        flood_open_at_end=sum(n for s, n in flood.items() if s != "done"),
        flood_done=int(flood.get("done", 0)),
        seconds=seconds,
    )


def fairness_rows(cfg: FairnessConfig, section: Section, workdir: Path) -> None:
    for backend in cfg.backends:
        log(f"  dispatch: fairness, {cfg.flood:,} flood events, {LABEL[backend]}")
        fair = fairness(cfg, backend, workdir)
        log(
            f"  dispatch fairness {LABEL[backend]}: quiet p50 {fair.p50_ms:.0f} ms, p99 "
            f"{fair.p99_ms:.0f} ms; flood {fair.flood_done:,} done, "
            f"{fair.flood_open_at_end:,} still open"
        )
        section.rows.append(
            Row(
                bench="dispatch",
                case=f"{LABEL[backend]}, quiet account during a {cfg.flood // 1000}k flood of "
                "another, 1 worker, receipt-to-done p99",
                metric="receipt to done p99 (ms)",
                hookledger=fair.p99_ms,
                yardstick=None,
                ratio=None,
                target=f"< {FAIR_P99_MS:.0f} ms, flood still open",
                met=fair.p99_ms < FAIR_P99_MS and fair.flood_open_at_end > 0,
                unit="ms",
            )
        )
        section.details.append(
            f"- fairness, {LABEL[backend]}: {cfg.flood:,} pending events of account `flood` "
            f"(bulk, fresh database), 1 worker; {fair.quiet} events of account `quiet` stored "
            f"at {cfg.quiet_rate:g}/s meanwhile: receipt to done p50 {fair.p50_ms:.0f} ms, "
            f"p99 {fair.p99_ms:.0f} ms, worst {fair.worst_ms:.0f} ms; in those "
            f"{fair.seconds:.0f} s the flood went down by {fair.flood_done:,} events and "
            f"{fair.flood_open_at_end:,} were still open"
        )


__all__ = ["Fairness", "FairnessConfig", "account_ids", "dispatch_rows", "fairness_rows"]
