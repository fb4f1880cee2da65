"""Reconcile: a full window run over N sandbox payments against only fetching the same pages.

A sandbox (:class:`reconcile.sandbox.SandboxServer`, in a child process of its own) holds N
payments created over a week (``seed_payments``, statuses cycling through succeeded, failed,
processing, requires_capture, cancelled). The local projection is pre-filled with one row per
payment (the remote status), so everything is in sync; for the "5% missed" case every 20th
row is left out, so the run recovers those transitions into the inbox.

Each measurement is a child process (``python -m bench.reconcile measure``), so its peak RSS
(``VmHWM``) is that measurement's own:

* hookledger: ``Reconciler.run(ReconcileOptions(kinds=["payments"], mode="window", ...))``;
* yardstick: ``for _ in client.iter_payments(...)`` with the same client, window and page size.

The two alternate (ABAB...). Between rounds the recovered events are deleted so each run
does the same work. An extra run per size ("5% missed") with ``tracemalloc`` gives the Python
heap peak.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench import profiling, reconcile_accounts
from bench.common import (
    ROOT,
    Database,
    Row,
    Section,
    TimedOut,
    child_env,
    database,
    log,
    median,
    migrate,
    pg_commits,
    run_json,
)
from bench.reconcile_accounts import AccountsConfig

API_KEY = "snd_bench_0123456789"
CREATED_FROM = datetime(2026, 1, 1, tzinfo=UTC)
CREATED_TO = datetime(2026, 1, 8, tzinfo=UTC)
SINCE = CREATED_FROM - timedelta(minutes=5)
UNTIL = CREATED_TO + timedelta(minutes=5)
STATUSES = ("succeeded", "failed", "processing", "requires_capture", "cancelled")
MISSED_EVERY = 20  # 5 %
TIME_RATIO_TARGET = 1.5
MEMORY_RATIO_TARGET = 1.2
LINEAR_TOLERANCE = 1.25


@dataclass(frozen=True, kw_only=True)
class ReconcileConfig:
    sizes: tuple[int, ...] = (10_000, 100_000)
    rounds: int = 3
    tracemalloc: bool = True
    profile: bool | None = None  # None: profile the smallest size
    limit_factor: float = 3.0  # stop a reconcile run at this many times the fetch-only time
    min_limit: float = 20.0
    budget: float = 150.0  # seconds per size and case: no new round past it (2 rounds at least)
    #: Many accounts (:mod:`bench.reconcile_accounts`); ``None``: skipped.
    accounts: AccountsConfig | None = AccountsConfig()


# -- child: the sandbox -----------------------------------------------------------------------


def serve(n: int, out: Path) -> int:
    """Serve a sandbox with ``n`` seeded payments; write ``id created status`` lines to ``out``;
    print the base URL as JSON; serve until SIGTERM."""
    from reconcile.sandbox import SandboxServer

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with SandboxServer(API_KEY) as server:
        ids = server.sandbox.seed_payments(n, CREATED_FROM, CREATED_TO, status=list(STATUSES))
        with out.open("w") as f:
            for payment_id in ids:
                payment = server.sandbox.get_payment(payment_id)
                f.write(f"{payment_id} {payment['created']} {payment['status']}\n")
        print(json.dumps({"base_url": server.base_url}), flush=True)
        while not stop.wait(0.5):
            pass
    return 0


class Sandbox:
    def __init__(self, n: int, workdir: Path):
        self.listing = workdir / f"sandbox-{n}.txt"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.reconcile", "serve", str(n), str(self.listing)],
            env=child_env(),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError("the sandbox did not start")
        self.base_url: str = json.loads(line)["base_url"]

    def payments(self) -> list[tuple[str, str, str]]:
        rows = []
        for line in self.listing.read_text().splitlines():
            payment_id, created, status = line.split(" ")
            rows.append((payment_id, created, status))
        return rows

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.listing.unlink(missing_ok=True)


# -- child: one measurement -------------------------------------------------------------------


def _status_kb(field: str) -> int:
    """A ``/proc/self/status`` size: ``VmRSS`` now, ``VmHWM`` the peak of this program.

    (``getrusage().ru_maxrss`` would not do: Linux carries it over ``fork`` and ``exec``, so a
    child started by a big parent reports the parent's size.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def measure(what: str, base_url: str, db_url: str, traced: bool, limit: float | None) -> int:
    """Time one run and print its result as one JSON line. With ``limit``, a watchdog ends the
    process after ``limit`` seconds of run, printing how far it got (``timed_out``)."""
    import receiver.storage.database as db
    from receiver.store import Store
    from reconcile.client.processor import ProcessorClient
    from reconcile.runtime.runner import DEFAULT_MAX_REQUESTS, ReconcileOptions, Reconciler

    engine = db.make_engine(db_url)
    client = ProcessorClient(base_url, API_KEY)
    client.health()  # connect once, outside the clock
    result: dict[str, Any] = {"what": what, "rss_before_kb": _status_kb("VmRSS")}
    state = {"t": 0.0, "checked": 0, "listed_seconds": None}
    done = threading.Lock()

    def progress(_kind: str, checked: int) -> None:
        state.update(t=time.perf_counter() - started, checked=checked)

    def watchdog() -> None:
        if not done.acquire(blocking=False):
            return  # the run has just finished
        stopped = dict(result, timed_out=True, seconds=limit, maxrss_kb=_status_kb("VmHWM"))
        stopped.update(checked=state["checked"], listed_seconds=state["t"])
        print(json.dumps(stopped), flush=True)
        os._exit(0)

    if traced:
        tracemalloc.start()
    timer = threading.Timer(limit, watchdog) if limit else None
    started = time.perf_counter()
    if timer is not None:
        timer.daemon = True
        timer.start()
    if what == "reconcile":
        report = Reconciler(client, Store(engine), progress=progress).run(
            # The lists path, which the yardstick's page fetching is the floor of: no sweep,
            # no events API; the bench database is a fresh account, not adopted.
            ReconcileOptions(
                kinds=["payments"],
                mode="window",
                since=SINCE,
                until=UNTIL,
                sweep_budget=0,
                events=False,
                require_adoption=False,
            )
        )
        kind = report.kinds["payments"]
        result.update(
            checked=kind.checked,
            in_sync=kind.in_sync,
            recovered=sum(kind.recovered.values()),
            unresolved=kind.unresolved,
            pages=kind.pages,
            listed_seconds=state["t"],
        )
    else:
        # The reconciler's own budget per window (a direct call's default, 1,000 list
        # calls, stops short of 100,000 payments at 100 a page).
        pager = client.iter_payments(
            SINCE, UNTIL, page_size=100, on_stuck="report", max_requests=DEFAULT_MAX_REQUESTS
        )
        count = 0
        for _ in pager:
            count += 1
        result.update(checked=count, pages=pager.pages)
    seconds = time.perf_counter() - started
    if not done.acquire(blocking=False):
        time.sleep(60)  # the watchdog is reporting a stop: let it end the process
    if timer is not None:
        timer.cancel()
    result["seconds"] = seconds
    if traced:
        result["traced_peak_kb"] = tracemalloc.get_traced_memory()[1] // 1024
        tracemalloc.stop()
    result["maxrss_kb"] = _status_kb("VmHWM")
    client.close()
    engine.dispose()
    print(json.dumps(result), flush=True)
    return 0


# -- harness ----------------------------------------------------------------------------------


def set_projection(engine: sa.Engine, payments: list[tuple[str, str, str]], *, missed: bool) -> int:
    """One projection row per payment with its remote status (all in sync); with ``missed``
    every 20th row is left out. Returns how many were left out."""
    from receiver.storage.tables import Projection

    table: sa.Table = Projection.__table__  # type: ignore[attr-defined]
    now = datetime.now(UTC)
    rows = []
    left_out = 0
    for i, (payment_id, created, status) in enumerate(payments):
        if missed and i % MISSED_EVERY == MISSED_EVERY - 1:
            left_out += 1
            continue
        at = datetime.fromisoformat(created.replace("Z", "+00:00"))
        rows.append(
            dict(
                object_kind="payment",
                object_id=payment_id,
                status=status,
                event_time=at,
                object_created_at=at,
                event_pk=0,
                updated_at=now,
            )
        )
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM hookledger_projection"))
        for i in range(0, len(rows), 5000):
            conn.execute(table.insert(), rows[i : i + 5000])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE hookledger_projection"))
    return left_out


def _reset(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM hookledger_event WHERE source = 'reconcile'"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE hookledger_event"))


def _measure(
    what: str,
    sandbox: Sandbox,
    db: Database,
    *,
    traced: bool = False,
    limit: float | None = None,
    spy: Path | None = None,
) -> dict[str, Any]:
    """One measurement in a child process; a run past ``limit`` comes back ``timed_out``."""
    args = [sys.executable, "-m", "bench.reconcile", "measure", what, sandbox.base_url]
    args.append(db.child_url)
    if traced:
        args.append("--tracemalloc")
    if limit is not None:
        args += ["--limit", str(limit)]
    if spy is not None:
        args = profiling.wrap(args, spy, idle=True)
    try:
        out = run_json(args, env=child_env(), timeout=(limit or 600) + 120)
    except TimedOut:
        db.terminate_children()
        raise
    if out.get("timed_out"):
        db.terminate_children()  # the stopped run's query would go on in the server
    return out


Key = tuple[int, str]
LABELS = {"in_sync": "all in sync", "missed": "5% missed"}


@dataclass
class _Runs:
    reconcile: list[dict[str, Any]] = field(default_factory=list)
    fetch: list[dict[str, Any]] = field(default_factory=list)
    timed_out: bool = False
    limit: float = 0.0
    traced: dict[str, Any] | None = None

    def of(self, what: str) -> list[dict[str, Any]]:
        return self.reconcile if what == "reconcile" else self.fetch


def run(cfg: ReconcileConfig, workdir: Path) -> Section:
    section = Section(name="reconcile")
    t0 = time.monotonic()
    section.details.append(
        "PostgreSQL; sandbox in its own process; payments listed with `GET /payments/list` "
        f"(Hyperswitch dialect), pages of 100; window {SINCE:%Y-%m-%d %H:%M} .. "
        f"{UNTIL:%Y-%m-%d %H:%M} UTC; up to {cfg.rounds} rounds alternating fetch-only / "
        f"reconcile (at least 2, more while they fit in {cfg.budget:g} s per size and case), "
        "each measurement in a fresh child process. A reconcile run is stopped at "
        f"{cfg.limit_factor:g}x the first fetch-only time (at least {cfg.min_limit:g} s): the "
        "target is then missed beyond doubt, the time shown is a lower bound and the later "
        "rounds of that case are skipped."
    )
    results: dict[Key, _Runs] = {}
    with database("postgresql", workdir, name="rec") as db:
        migrate(db)
        engine = db.engine()
        try:
            for n in cfg.sizes:
                log(f"reconcile: seeding a sandbox with {n:,} payments")
                sandbox = Sandbox(n, workdir)
                try:
                    payments = sandbox.payments()
                    for scenario in ("in_sync", "missed"):
                        missed = set_projection(engine, payments, missed=scenario == "missed")
                        results[(n, scenario)] = _scenario(
                            cfg, engine, sandbox, db, n, missed, scenario
                        )
                        if (
                            cfg.profile or (cfg.profile is None and n == min(cfg.sizes))
                        ) and scenario == "missed":
                            _profile(cfg, engine, sandbox, db, n, section, workdir)
                finally:
                    sandbox.stop()
        finally:
            engine.dispose()
    _rows(cfg, section, results)
    if cfg.accounts is not None:
        reconcile_accounts.run(cfg.accounts, section, workdir)
    section.seconds = time.monotonic() - t0
    return section


def _scenario(
    cfg: ReconcileConfig,
    engine: sa.Engine,
    sandbox: Sandbox,
    db: Database,
    n: int,
    missed: int,
    scenario: str,
) -> _Runs:
    """Rounds of fetch-only then reconcile. A reconcile run is stopped at ``limit_factor``
    times the first fetch's time (at least ``min_limit``): past that the target is missed
    beyond doubt, the time is a lower bound and the remaining rounds are skipped."""
    runs = _Runs()
    limit = cfg.min_limit
    began = time.monotonic()
    for r in range(cfg.rounds):
        round_began = time.monotonic()
        for what in ("fetch", "reconcile"):
            _reset(engine)
            commits = pg_commits(db)
            out = _measure(what, sandbox, db, limit=limit if what == "reconcile" else None)
            if out.get("timed_out"):
                runs.timed_out = True
                runs.reconcile.append(out)
                log(
                    f"  {n:,} {scenario} round {r + 1} {what:9s} stopped at {limit:.0f} s "
                    f"({out['checked']:,} checked)"
                )
                break
            _check(out, n, missed)
            time.sleep(0.3)  # the child's statistics reach pg_stat_database on exit
            out["commits"] = pg_commits(db) - commits
            runs.of(what).append(out)
            if what == "fetch" and r == 0:
                limit = max(cfg.min_limit, cfg.limit_factor * out["seconds"])
            log(
                f"  {n:,} {scenario} round {r + 1} {what:9s} {out['seconds']:.2f} s, "
                f"peak RSS {out['maxrss_kb'] / 1024:.0f} MB"
            )
        if runs.timed_out:
            break
        spent, last = time.monotonic() - began, time.monotonic() - round_began
        if r + 1 >= min(2, cfg.rounds) and spent + last > cfg.budget and r + 1 < cfg.rounds:
            log(f"  {n:,} {scenario}: {r + 1} rounds fit in the {cfg.budget:g} s budget")
            break
    runs.limit = limit
    if cfg.tracemalloc and scenario == "missed" and not runs.timed_out:
        _reset(engine)
        runs.traced = _measure("reconcile", sandbox, db, traced=True)
    return runs


def _profile(
    cfg: ReconcileConfig,
    engine: sa.Engine,
    sandbox: Sandbox,
    db: Database,
    n: int,
    section: Section,
    workdir: Path,
) -> None:
    if profiling.py_spy() is None:
        section.profiles.append("(py-spy not installed: no reconcile profile)")
        return
    out = workdir / "reconcile.txt"
    log(f"  profiling one reconcile run over {n:,} payments, 5% missed (py-spy)")
    _reset(engine)
    _measure("reconcile", sandbox, db, spy=out, limit=cfg.min_limit * 6)
    if out.exists():
        section.profiles.append(
            profiling.summarize(
                out,
                title=f"reconcile, PostgreSQL: one run over {n:,} payments, 5% missed",
                focus=("receiver/", "reconcile/"),
                within="Reconciler.run",
                idle=True,
            )
        )
        out.unlink()


def _check(out: dict[str, Any], n: int, missed: int) -> None:
    if out["checked"] != n:
        raise RuntimeError(f"{out['what']} saw {out['checked']} payments, expected {n}")
    if out["what"] == "reconcile":
        if out["recovered"] != missed or out["unresolved"]:
            raise RuntimeError(f"reconcile: {out}, expected {missed} recovered, none unresolved")


def _rows(cfg: ReconcileConfig, section: Section, results: dict[Key, _Runs]) -> None:
    per_k: dict[Key, float] = {}
    for (n, scenario), runs in sorted(results.items()):
        rec = [x["seconds"] for x in runs.reconcile]
        fet = [x["seconds"] for x in runs.fetch]
        hl, ys = median(rec), median(fet)
        per_k[(n, scenario)] = hl / (n / 1000)
        section.rows.append(
            Row(
                bench="reconcile",
                case=f"{n // 1000}k payments, {LABELS[scenario]}, time",
                metric="seconds",
                hookledger=hl,
                yardstick=ys,
                ratio=hl / ys,
                target=f"<= {TIME_RATIO_TARGET}x",
                met=_verdict(hl / ys, TIME_RATIO_TARGET, lower_bound=runs.timed_out),
                unit="s",
                samples_a=rec,
                samples_b=fet,
                note="lower bound" if runs.timed_out else "",
            )
        )
        section.details.append(_detail(n, scenario, runs, per_k[(n, scenario)], ys))
    sizes = sorted({n for n, _ in results})
    if len(sizes) < 2:
        return
    small, large = sizes[0], sizes[-1]
    for scenario in ("in_sync", "missed"):
        big_runs, small_runs = results.get((large, scenario)), results.get((small, scenario))
        if big_runs is None or small_runs is None or small_runs.timed_out:
            continue
        a, b = per_k[(large, scenario)], per_k[(small, scenario)]
        ratio = a / b
        # A stopped run's time is a lower bound: it proves non-linearity when even the bound
        # exceeds the tolerance; otherwise the verdict is open.
        met = _verdict(ratio, LINEAR_TOLERANCE, lower_bound=big_runs.timed_out)
        section.rows.append(
            Row(
                bench="reconcile",
                case=f"{LABELS[scenario]}, time per 1k: {large // 1000}k vs {small // 1000}k",
                metric="ms per 1k payments",
                hookledger=a * 1000,
                yardstick=b * 1000,
                ratio=ratio,
                target=f"linear (<= {LINEAR_TOLERANCE}x)",
                met=met,
                unit="ms",
                note="lower bound" if big_runs.timed_out else "",
            )
        )
        big = [x["maxrss_kb"] for x in big_runs.reconcile if x.get("maxrss_kb")]
        little = [x["maxrss_kb"] for x in small_runs.reconcile if x.get("maxrss_kb")]
        if big and little:
            mem = median(big) / median(little)
            mem_met = _verdict(mem, MEMORY_RATIO_TARGET, lower_bound=big_runs.timed_out)
            section.rows.append(
                Row(
                    bench="reconcile",
                    case=f"{LABELS[scenario]}, peak RSS: {large // 1000}k vs {small // 1000}k",
                    metric="MB",
                    hookledger=median(big) / 1024,
                    yardstick=median(little) / 1024,
                    ratio=mem,
                    target=f"<= {MEMORY_RATIO_TARGET}x",
                    met=mem_met,
                    unit="MB",
                    note="lower bound" if big_runs.timed_out else "",
                )
            )
        ta = (big_runs.traced or {}).get("traced_peak_kb")
        tb = (small_runs.traced or {}).get("traced_peak_kb")
        if ta and tb:
            section.details.append(
                f"- Python heap peak (tracemalloc), {LABELS[scenario]}: {ta / 1024:.1f} MB at "
                f"{large:,} vs {tb / 1024:.1f} MB at {small:,} ({ta / tb:.2f}x)"
            )
    section.details.append(
        "- A `?` verdict: the larger run was stopped at its time limit and the lower bound "
        "does not decide the target; the phases above show where the time went."
    )


def _verdict(ratio: float, limit: float, *, lower_bound: bool) -> bool | None:
    """``ratio <= limit``; when ``ratio`` is only a lower bound (a stopped run), it can only
    prove a miss: otherwise the verdict is open (``None``)."""
    if lower_bound:
        return False if ratio > limit else None
    return ratio <= limit


def _detail(n: int, scenario: str, runs: _Runs, per_k: float, fetch: float) -> str:
    rec = ", ".join(f"{x['seconds']:.2f}" for x in runs.reconcile)
    line = (
        f"- {n:,} payments, {LABELS[scenario]}: reconcile {rec} s; fetch only "
        + ", ".join(f"{x['seconds']:.2f}" for x in runs.fetch)
        + f" s; {per_k * 1000:.0f} ms per 1k payments (fetch only {fetch / (n / 1000) * 1000:.0f}"
        " ms)"
    )
    finished = [x for x in runs.reconcile if not x.get("timed_out")]
    if finished:
        listed = median([x["listed_seconds"] for x in finished])
        total = median([x["seconds"] for x in finished])
        line += (
            f"; phases: listing + diff {listed:.2f} s, end of run (local-only check, report) "
            f"{total - listed:.2f} s"
        )
        line += f"; {median([x['commits'] for x in finished]):.0f} PostgreSQL commits per run"
        rss = median([x["maxrss_kb"] / 1024 for x in finished])
        growth = median([(x["maxrss_kb"] - x["rss_before_kb"]) / 1024 for x in finished])
        line += f"; peak RSS {rss:.0f} MB (+{growth:.0f} MB during the run)"
    for x in runs.reconcile:
        if not x.get("timed_out"):
            continue
        line += f"; stopped at {x['seconds']:.0f} s after checking {x['checked']:,} of {n:,}"
        if x["checked"] >= n:
            line += (
                f" (all listed and diffed after {x['listed_seconds']:.1f} s, then "
                f"{x['seconds'] - x['listed_seconds']:.1f} s in the end of run without finishing)"
            )
        if x.get("maxrss_kb"):
            line += f", peak RSS so far {x['maxrss_kb'] / 1024:.0f} MB"
    if runs.fetch:
        line += (
            f"; fetch only peak RSS {median([x['maxrss_kb'] / 1024 for x in runs.fetch]):.0f} MB"
        )
    if runs.traced:
        line += f"; Python heap peak (tracemalloc) {runs.traced['traced_peak_kb'] / 1024:.1f} MB"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reconcile")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("n", type=int)
    s.add_argument("out", type=Path)
    m = sub.add_parser("measure")
    m.add_argument("what", choices=("reconcile", "fetch"))
    m.add_argument("base_url")
    m.add_argument("db_url")
    m.add_argument("--tracemalloc", action="store_true")
    m.add_argument("--limit", type=float, default=None, help="stop the run after this long")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args.n, args.out)
    return measure(args.what, args.base_url, args.db_url, args.tracemalloc, args.limit)


if __name__ == "__main__":
    sys.exit(main())
