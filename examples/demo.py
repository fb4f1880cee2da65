"""The end-to-end demo: ``./run demo`` (or ``python -m examples.demo``).

On SQLite, with nothing to install:

1. a shop that already trades: the sandbox processor holds payments its orders were paid
   and shipped with before hookledger existed (their webhooks went elsewhere);
2. going live: ``reconcile adopt`` records that history as already seen (nothing runs);
3. the shop's web process (gunicorn, as in the Procfile) and worker start; orders are
   placed (the checkout confirms server-side and ships from the API response through
   ``hooks.observe``), paid, declined, refunded and disputed, while the sandbox drops,
   duplicates, delays and reorders a share of the webhooks;
4. ``reconcile run`` recovers what the webhooks missed (the events API and the lists);
5. a late change no webhook ever announces (a won dispute taken to pre-arbitration on the
   same dispute) is recovered by the next run's open-object sweep;
6. every order is printed beside what the processor says, with the reports.

Exits 0 only when every order agrees with the processor and no order shipped twice.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
import sqlalchemy as sa

from examples.shop.models import Order, OrderStatus
from receiver import db as hookledger_db
from receiver.core.keyring import generate_key
from receiver.store import Store
from reconcile.sandbox import SandboxServer

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

CARDS = {
    "paid": "4242424242424242",
    "declined (insufficient funds)": "4000000000009995",
    "declined (issuer)": "4000000000000002",
    "processing then paid": "4000000000000077",
    "disputed": "4000000000000259",
}


@dataclass
class Scenario:
    order_id: str
    label: str
    card: str
    refund: int | None = None  # amount to refund after payment
    dispute_end: str | None = None  # action after the dispute opens: win / lose / None


def scenarios(count: int) -> list[Scenario]:
    plan: list[Scenario] = []
    kinds = [
        ("paid", None, None),
        ("paid", 5000, None),  # full refund
        ("paid", 1200, None),  # partial refund
        ("declined (insufficient funds)", None, None),
        ("declined (issuer)", None, None),
        ("processing then paid", None, None),
        ("disputed", None, None),
        ("disputed", None, "lose"),
        ("disputed", None, "win"),
    ]
    for i in range(count):
        label, refund, dispute_end = kinds[i % len(kinds)]
        plan.append(Scenario(f"ord_{i:03d}", label, CARDS[label], refund, dispute_end))
    return plan


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def process(cmd: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    handle = log.open("wb")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        handle.close()


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(interval)


def expected_state(sandbox: Any, payment_id: str, amount: int) -> str:
    """The order state the processor's data implies."""
    payment = sandbox.get_payment(payment_id)
    status = payment["status"]
    if status == "failed":
        return "failed"
    if status != "succeeded":
        return "pending"
    disputes = [d for d in sandbox.list_disputes([]) if d["payment_id"] == payment_id]
    if disputes:
        dispute = disputes[0]["dispute_status"]
        if dispute in ("dispute_lost", "dispute_accepted"):
            return "chargeback"
        if dispute in ("dispute_opened", "dispute_challenged"):
            return "disputed"
    refunds = sandbox.list_refunds({"payment_id": payment_id, "limit": 100})["data"]
    refunded = sum(r["amount"] for r in refunds if r["status"] == "succeeded")
    if refunded >= amount:
        return "refunded"
    if refunded:
        return "partially_refunded"
    return "paid"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=27, help="how many orders (default 27)")
    parser.add_argument("--seed", type=int, default=2026, help="fault injection seed")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="hookledger-demo-"))
    secret = secrets.token_urlsafe(32)
    api_key = "snd_" + secrets.token_hex(16)
    port = _free_port()
    database_url = f"sqlite:///{work / 'shop.sqlite3'}"
    shop_url = f"http://127.0.0.1:{port}"
    try:
        return _run(args, work, secret, api_key, port, database_url, shop_url)
    finally:
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _run(
    args: argparse.Namespace,
    work: Path,
    secret: str,
    api_key: str,
    port: int,
    database_url: str,
    shop_url: str,
) -> int:
    env = dict(
        os.environ,
        HOOKLEDGER_DATABASE_URL=database_url,
        HOOKLEDGER_SECRETS=f"demo:{secret}",
        # Stored bodies, headers and error texts are sealed with this data key (AES-256-GCM).
        HOOKLEDGER_DATA_KEYS=f"demo:{generate_key()}",
        HOOKLEDGER_POLL_INTERVAL="0.1",
        HOOKLEDGER_BACKOFF_BASE="0.5",
        HOOKLEDGER_BACKOFF_MAX="2",
        HOOKLEDGER_API_KEY=api_key,
        PYTHONPATH=str(ROOT),
    )
    print(f"demo: work folder {work}")
    admin_key = "demo_admin_" + secrets.token_hex(8)
    with ExitStack() as stack:
        sandbox_server = stack.enter_context(
            SandboxServer(
                api_key,
                admin_api_key=admin_key,
                webhook_url=None,  # before hookledger: webhooks went to the old system
                webhook_secret=secret,
                retry_schedule=[0.5, 1.0],  # then the sandbox gives up: reconcile must catch it
                seed=args.seed,
            )
        )
        sandbox = sandbox_server.sandbox
        env["HOOKLEDGER_PROCESSOR_URL"] = sandbox_server.base_url
        env["HOOKLEDGER_ADMIN_API_KEY"] = admin_key
        env["HOOKLEDGER_MERCHANT_ID"] = sandbox.merchant_id
        # The demo lives in seconds, not weeks: short overlaps and sweep intervals.
        env["HOOKLEDGER_RECONCILE_OVERLAP_MINUTES"] = "0"
        env["HOOKLEDGER_SWEEP_MIN_INTERVAL_SECONDS"] = "1"
        print(f"demo: sandbox processor at {sandbox_server.base_url}")

        if not _init_db(env):
            return 2
        legacy = _legacy_orders(sandbox, database_url, LEGACY)
        print(
            f"demo: the shop already trades: {len(legacy)} orders paid and shipped before "
            "hookledger"
        )
        # No webhook has reached hookledger yet: adoption is told when the deploy is (now:
        # the processor's webhook URL is pointed at the shop right after it).
        deploy = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
        adopt = _reconcile(env, "adopt", "--deployed-at", deploy, "--json")
        if adopt is None:
            return 2
        recorded = sum(k["recorded_total"] for k in adopt["kinds"].values())
        print(
            f"demo: reconcile adopt: {recorded} object(s) recorded as already seen, nothing "
            f"dispatched; cut-over {adopt['cutover_at']}"
        )
        sandbox.webhook_url = f"{shop_url}/webhooks/"
        stack.enter_context(
            process(
                [
                    str(BIN / "gunicorn"),
                    "--workers",
                    "2",
                    "--bind",
                    f"127.0.0.1:{port}",
                    "examples.shop.app:create_app()",
                ],
                env,
                work / "web.log",
            )
        )
        stack.enter_context(
            process(
                [str(BIN / "hookledger"), "--app", "examples.shop.app:create_app", "worker"],
                env,
                work / "worker.log",
            )
        )

        def web_up() -> bool:
            try:
                return requests.get(f"{shop_url}/webhooks/health", timeout=1).ok
            except requests.RequestException:
                return False

        wait_for(web_up, 30, "the shop's web process")
        print(f"demo: shop web at {shop_url}, worker running")

        # A share of every webhook kind goes wrong on the way.
        sandbox.faults.configure_from_json(
            {
                "seed": args.seed,
                "webhooks": {
                    "drop": 0.25,
                    "duplicate": 0.2,
                    "reorder": 0.2,
                    "delay": 0.1,
                    "delay_seconds": 0.5,
                    "corrupt_signature": 0.05,
                },
            }
        )
        plan = scenarios(args.orders)
        amount = 5000
        with requests.Session() as http:
            for s in plan:
                response = http.post(
                    f"{shop_url}/orders",
                    json={
                        "id": s.order_id,
                        "amount": amount,
                        "currency": "USD",
                        "card": s.card,
                    },
                    timeout=30,
                )
                response.raise_for_status()
            sandbox.tick()  # processing payments settle, disputed cards get their dispute
            for s in plan:
                payment_id = f"pay_{s.order_id}"
                if s.refund:
                    sandbox.create_refund({"payment_id": payment_id, "amount": s.refund})
                if s.dispute_end:
                    dispute = _dispute_of(sandbox, payment_id)
                    if s.dispute_end == "win":
                        sandbox.dispute_action(dispute["dispute_id"], "challenge")
                    sandbox.dispute_action(dispute["dispute_id"], s.dispute_end)
        print(f"demo: {len(plan)} orders placed; waiting for webhooks (with faults) to settle")
        sandbox.flush_webhooks(60)
        stats = sandbox.stats()
        _wait_idle(database_url)

        print("demo: running a reconciliation: python -m reconcile run")
        report = _reconcile(env, "run", "--json")
        if report is None:
            return 2
        _wait_idle(database_url)

        # A late change no webhook announces: the processor sends one webhook per event type
        # and dispute_opened was sent, so a won dispute taken to pre-arbitration on the same
        # dispute is silent. Only the open-object sweep can see it.
        late = next(s for s in plan if s.dispute_end == "win")
        reopened = _dispute_of(sandbox, f"pay_{late.order_id}")
        sandbox.dispute_action(reopened["dispute_id"], "pre_arbitration")
        late.dispute_end = "win, then pre-arbitration"
        print(
            f"demo: late change: {late.order_id}'s won dispute reopened at pre-arbitration "
            "(no webhook); running the next reconciliations until the sweep's next check of it"
        )
        # The sweep checks an open object again after an interval that grows with its age
        # (1 s at least in the demo): on a slow machine the first run after the change may
        # come before that check is due, as a scheduled run would. Run again, as the
        # schedule does, until it is caught (or a minute has passed: then it says nothing).
        deadline = time.monotonic() + 60
        later_recovered = 0
        while True:
            time.sleep(2)
            second = _reconcile(env, "run", "--json")
            if second is None:
                return 2
            _wait_idle(database_url)
            later_recovered += second["totals"].get("recovered", 0)
            swept = second["sweep"]["disputes"]["recovered"]
            if swept or time.monotonic() > deadline:
                break

        orders = {o["id"]: o for o in requests.get(f"{shop_url}/orders", timeout=10).json()}
        rows, agree = [], 0
        for s in plan:
            truth = expected_state(sandbox, f"pay_{s.order_id}", amount)
            shop = orders[s.order_id]
            ok = shop["status"] == truth
            agree += ok
            rows.append(
                (
                    s.order_id,
                    s.label
                    + (f", refund {s.refund}" if s.refund else "")
                    + (f", dispute {s.dispute_end}" if s.dispute_end else ""),
                    truth,
                    shop["status"],
                    shop.get("failure_message") or "",
                    "ok" if ok else "MISMATCH",
                )
            )
        shipped = {o["id"]: o["shipments"] for o in orders.values()}

    print()
    header = ("order", "scenario", "processor says", "shop says", "message", "")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))
    print()
    from reconcile.core.report import render

    print(render(report))
    print()
    print(render(second))
    print()
    print(
        "webhook faults injected by the sandbox: "
        + ", ".join(f"{k} {v}" for k, v in sorted(_fault_counts(stats).items()))
    )
    twice = sorted(order for order, n in shipped.items() if n > 1)
    paid_once = sum(1 for n in shipped.values() if n == 1)
    print(
        f"demo: shipments: {paid_once} orders shipped once (the {len(legacy)} shipped before "
        f"hookledger among them), {len(twice)} twice{': ' + ', '.join(twice) if twice else ''}"
    )
    print(
        f"demo: late change recovered by the sweep: "
        f"{', '.join(f'{n} x {t}' for t, n in swept.items()) or 'nothing'}"
    )
    sealed, clear = _at_rest(database_url)
    print(
        f"demo: at rest: {sealed} stored events sealed with data key 'demo', {clear} in the clear"
    )
    verdict = "all agree" if agree == len(rows) else f"{len(rows) - agree} disagree"
    recovered = report["totals"].get("recovered", 0) + later_recovered
    print(
        f"demo: {agree}/{len(rows)} orders match the processor ({verdict}); "
        f"reconcile recovered {recovered} missed transition(s)"
    )
    healthy = (
        agree == len(rows)
        and not twice
        and report["status"] == second["status"] == "ok"
        and swept == {"dispute_opened": 1}
        and clear == 0
    )
    return 0 if healthy else 1


#: Orders the shop took (and shipped) before it installed hookledger.
LEGACY = 3


def _init_db(env: dict[str, str]) -> bool:
    init = subprocess.run(
        [str(BIN / "flask"), "--app", "examples.shop.app:create_app", "init-db"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if init.returncode != 0:
        print(init.stdout + init.stderr, file=sys.stderr)
        return False
    upgrade = subprocess.run(
        [sys.executable, "-m", "reconcile", "db", "upgrade"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if upgrade.returncode != 0:
        print(upgrade.stdout + upgrade.stderr, file=sys.stderr)
        return False
    return True


def _legacy_orders(sandbox: Any, database_url: str, count: int) -> list[str]:
    """Orders paid (by the sandbox) and shipped (by the shop's old code) before hookledger."""
    from sqlmodel import Session

    engine = hookledger_db.make_engine(database_url)
    made = []
    try:
        with Session(engine) as session:
            for n in range(count):
                order_id = f"old_{n:03d}"
                payment = sandbox.create_payment(
                    {
                        "amount": 4200,
                        "currency": "USD",
                        "payment_id": f"pay_{order_id}",
                        "confirm": True,
                        "payment_method": "card",
                        "payment_method_type": "credit",
                        "payment_method_data": {
                            "card": {
                                "card_number": CARDS["paid"],
                                "card_exp_month": "12",
                                "card_exp_year": "2030",
                                "card_cvc": "123",
                            }
                        },
                        "metadata": {"order_id": order_id},
                    }
                )
                session.add(
                    Order(
                        id=order_id,
                        amount=4200,
                        currency="USD",
                        status=OrderStatus.PAID,
                        payment_id=payment["payment_id"],
                        shipments=1,
                        history="shipped by the shop's old code;",
                    )
                )
                made.append(order_id)
            session.commit()
    finally:
        engine.dispose()
    return made


def _reconcile(env: dict[str, str], *args: str) -> dict[str, Any] | None:
    done = subprocess.run(
        [sys.executable, "-m", "reconcile", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        result: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        result = {}
    if done.returncode != 0 or not result:
        print(f"reconcile {args[0]} exited {done.returncode}", file=sys.stderr)
        print(done.stdout + done.stderr, file=sys.stderr)
        return None
    return result


def _dispute_of(sandbox: Any, payment_id: str) -> dict[str, Any]:
    return next(d for d in sandbox.list_disputes([]) if d["payment_id"] == payment_id)


def _fault_counts(stats: dict[str, Any]) -> dict[str, int]:
    applied = stats.get("faults", {}).get("webhooks", {})
    return {name: len(ids) for name, ids in applied.items()}


def _at_rest(database_url: str) -> tuple[int, int]:
    """Stored events sealed with a data key, and stored in the clear."""
    engine = hookledger_db.make_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT key_id IS NULL, count(*) FROM hookledger_event GROUP BY 1")
            ).all()
    finally:
        engine.dispose()
    counts = {bool(clear): int(n) for clear, n in rows}
    return counts.get(False, 0), counts.get(True, 0)


def _wait_idle(database_url: str) -> None:
    """Until the worker has nothing open (the counts come from the database: health
    endpoints do not show them)."""
    engine = hookledger_db.make_engine(database_url)
    store = Store(engine)
    try:

        def idle() -> bool:
            counts = store.operations.counts()
            return not counts.get("pending") and not counts.get("processing")

        wait_for(idle, 120, "the worker to finish", interval=0.3)
    finally:
        engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
