"""Reconcile of many processor accounts (issue 19, item 10): part of the reconcile bench.

One sandbox process serves ``accounts`` merchants (:class:`reconcile.sandbox.MerchantsServer`,
each merchant its own API key and ``objects`` seeded payments over a week). A measurement
(a child process) reconciles every account in turn, as ``reconcile run --all-accounts``
does: one :class:`~reconcile.runtime.runner.Reconciler` per account, the payments list over
the week (``window`` mode, no sweep, no events API: the lists path), into one fresh
database, with nothing missed locally (so every object is compared, and, with an empty
projection, recovered: the first night of a new seller). Beside it, in the same run, the
floor: the same client only paging through each account's payments.

Reported per size: seconds and requests (pages) per account, for hookledger and the floor.
Linear means the time per account at the largest size is within :data:`LINEAR_TOLERANCE`
of the smallest size's, with the same requests per account.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import ROOT, Row, Section, child_env, database, log, median, migrate, run_json

CREATED_FROM = "2026-01-01T00:00:00+00:00"
CREATED_TO = "2026-01-08T00:00:00+00:00"
LINEAR_TOLERANCE = 1.25
MODULE = "bench.reconcile_accounts"


@dataclass(frozen=True, kw_only=True)
class AccountsConfig:
    sizes: tuple[int, ...] = (10, 100, 1000)
    objects: int = 100
    timeout: float = 900.0


def _key(i: int) -> str:
    return f"snd_seller{i:04d}_0123456789"


def serve(accounts: int, objects: int) -> int:
    """Child: serve ``accounts`` merchants with ``objects`` payments each; print the base
    URL as JSON; serve until SIGTERM."""
    from datetime import datetime

    from reconcile.sandbox import MerchantsServer
    from reconcile.sandbox.state import Sandbox

    start, end = datetime.fromisoformat(CREATED_FROM), datetime.fromisoformat(CREATED_TO)
    sandboxes = []
    for i in range(accounts):
        sandbox = Sandbox(
            _key(i), merchant_id=f"mer_seller{i:04d}", profile_id=f"pro_seller{i:04d}", seed=i
        )
        sandbox.seed_payments(objects, start, end, status=["succeeded", "failed", "processing"])
        sandboxes.append(sandbox)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with MerchantsServer(sandboxes) as server:
        print(json.dumps({"base_url": server.base_url}), flush=True)
        while not stop.wait(0.5):
            pass
    return 0


def measure(base_url: str, db_url: str, accounts: int) -> int:
    """Child: reconcile each account in turn, then only page each one's payments; print
    one JSON line."""
    from datetime import datetime, timedelta

    import receiver.storage.database as db
    from receiver.store import Store
    from reconcile.client.processor import ProcessorClient
    from reconcile.runtime.runner import DEFAULT_MAX_REQUESTS, ReconcileOptions, Reconciler

    since = datetime.fromisoformat(CREATED_FROM) - timedelta(minutes=5)
    until = datetime.fromisoformat(CREATED_TO) + timedelta(minutes=5)
    engine = db.make_engine(db_url)
    store = Store(engine)
    clients = [ProcessorClient(base_url, _key(i)) for i in range(accounts)]
    for client in clients[:1]:
        client.health()
    seconds: list[float] = []
    pages: list[int] = []
    checked = recovered = 0
    for i, client in enumerate(clients):
        t0 = time.perf_counter()
        report = Reconciler(client, store, account=f"seller{i:04d}").run(
            ReconcileOptions(
                kinds=["payments"],
                mode="window",
                since=since,
                until=until,
                sweep_budget=0,
                events=False,
                require_adoption=False,
            )
        )
        seconds.append(time.perf_counter() - t0)
        kind = report.kinds["payments"]
        pages.append(kind.pages)
        checked += kind.checked
        recovered += sum(kind.recovered.values())
    floor: list[float] = []
    floor_pages: list[int] = []
    for client in clients:
        t0 = time.perf_counter()
        pager = client.iter_payments(
            since, until, page_size=100, on_stuck="report", max_requests=DEFAULT_MAX_REQUESTS
        )
        for _ in pager:
            pass
        floor.append(time.perf_counter() - t0)
        floor_pages.append(pager.pages)
    for client in clients:
        client.close()
    engine.dispose()
    print(
        json.dumps(
            {
                "accounts": accounts,
                "seconds": seconds,
                "pages": pages,
                "checked": checked,
                "recovered": recovered,
                "floor_seconds": floor,
                "floor_pages": floor_pages,
            }
        ),
        flush=True,
    )
    return 0


def _one(cfg: AccountsConfig, accounts: int, workdir: Path) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, "-m", MODULE, "serve", str(accounts), str(cfg.objects)],
        env=child_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the multi-merchant sandbox did not start")
        base_url = json.loads(line)["base_url"]
        with database("postgresql", workdir, name=f"racc{accounts}") as db:
            migrate(db)
            return run_json(
                [
                    sys.executable,
                    "-m",
                    MODULE,
                    "measure",
                    base_url,
                    db.child_url,
                    str(accounts),
                ],
                env=child_env(db),
                timeout=cfg.timeout,
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(cfg: AccountsConfig, section: Section, workdir: Path) -> None:
    """Add the many-accounts rows to the reconcile ``section``."""
    per_account: dict[int, float] = {}
    for accounts in cfg.sizes:
        log(f"  reconcile: {accounts:,} accounts x {cfg.objects} payments")
        out = _one(cfg, accounts, workdir)
        expected = accounts * cfg.objects
        if out["checked"] != expected or out["recovered"] != expected:
            raise RuntimeError(
                f"{accounts} accounts: checked {out['checked']}, recovered {out['recovered']}, "
                f"expected {expected} of each"
            )
        mean = sum(out["seconds"]) / accounts
        floor = sum(out["floor_seconds"]) / accounts
        per_account[accounts] = mean
        log(
            f"  reconcile {accounts:,} accounts: {sum(out['seconds']):.1f} s, "
            f"{mean * 1000:.0f} ms and {median(out['pages']):.0f} requests per account "
            f"(floor {floor * 1000:.0f} ms)"
        )
        smallest = per_account[cfg.sizes[0]]
        section.rows.append(
            Row(
                bench="reconcile",
                case=f"{accounts:,} accounts x {cfg.objects} payments, every account in turn, "
                "time per account",
                metric="ms per account",
                hookledger=mean * 1000,
                yardstick=floor * 1000,
                ratio=mean / floor,
                target=f"<= {LINEAR_TOLERANCE:g}x the {cfg.sizes[0]}-account figure",
                met=mean <= LINEAR_TOLERANCE * smallest,
                unit="ms",
            )
        )
        section.details.append(
            f"- {accounts:,} accounts x {cfg.objects} payments (one sandbox process serving "
            f"every merchant; PostgreSQL; the lists path, window mode, a new seller's first "
            f"night: every payment recovered): {sum(out['seconds']):.1f} s in all, "
            f"{mean * 1000:.1f} ms per account (max {max(out['seconds']) * 1000:.0f} ms), "
            f"{median(out['pages']):.0f} requests per account (max {max(out['pages'])}); "
            f"the floor (paging only): {floor * 1000:.1f} ms and "
            f"{median(out['floor_pages']):.0f} requests per account"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reconcile_accounts")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("accounts", type=int)
    s.add_argument("objects", type=int)
    m = sub.add_parser("measure")
    m.add_argument("base_url")
    m.add_argument("db_url")
    m.add_argument("accounts", type=int)
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        return serve(args.accounts, args.objects)
    return measure(args.base_url, args.db_url, args.accounts)


if __name__ == "__main__":
    sys.exit(main())
