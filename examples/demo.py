"""The end-to-end demo: ``./run demo`` (or ``python -m examples.demo``).

On SQLite, with nothing to install: starts the sandbox processor, the example shop's web
process (gunicorn, as in the Procfile) and its worker; places a batch of orders that are
paid, declined, refunded and disputed while the sandbox drops, duplicates, delays and
reorders a share of the webhooks; runs one reconciliation (``python -m reconcile run``);
then prints every order beside what the processor says, and the reconcile report.
Exits 0 only when every order agrees with the processor.
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
from pathlib import Path
from typing import Any

import requests

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
        HOOKLEDGER_POLL_INTERVAL="0.1",
        HOOKLEDGER_BACKOFF_BASE="0.5",
        HOOKLEDGER_BACKOFF_MAX="2",
        HOOKLEDGER_API_KEY=api_key,
        PYTHONPATH=str(ROOT),
    )
    print(f"demo: work folder {work}")
    with ExitStack() as stack:
        sandbox_server = stack.enter_context(
            SandboxServer(
                api_key,
                webhook_url=f"{shop_url}/webhooks/",
                webhook_secret=secret,
                retry_schedule=[0.5, 1.0],  # then the sandbox gives up: reconcile must catch it
                seed=args.seed,
            )
        )
        sandbox = sandbox_server.sandbox
        env["HOOKLEDGER_PROCESSOR_URL"] = sandbox_server.base_url
        print(f"demo: sandbox processor at {sandbox_server.base_url}")

        init = subprocess.run(
            [str(BIN / "flask"), "--app", "examples.shop.app:create_app", "init-db"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if init.returncode != 0:
            print(init.stdout + init.stderr, file=sys.stderr)
            return 2
        subprocess.run(
            [sys.executable, "-m", "reconcile", "db", "upgrade"],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        # The sandbox account is new: nothing happened before hookledger, so the reconciler
        # may dispatch whatever it finds (an account with history runs `reconcile adopt`).
        subprocess.run(
            [sys.executable, "-m", "reconcile", "adopt", "--new-account"],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
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
                    dispute = next(
                        d for d in sandbox.list_disputes([]) if d["payment_id"] == payment_id
                    )
                    if s.dispute_end == "win":
                        sandbox.dispute_action(dispute["dispute_id"], "challenge")
                    sandbox.dispute_action(dispute["dispute_id"], s.dispute_end)
        print(f"demo: {len(plan)} orders placed; waiting for webhooks (with faults) to settle")
        sandbox.flush_webhooks(60)
        stats = sandbox.stats()
        _wait_idle(shop_url)

        print("demo: running one reconciliation: python -m reconcile run")
        recon = subprocess.run(
            [sys.executable, "-m", "reconcile", "run", "--json"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        try:
            report = json.loads(recon.stdout)
        except json.JSONDecodeError:
            report = None
        if recon.returncode not in (0, 1) or report is None:
            print(recon.stdout + recon.stderr, file=sys.stderr)
            return 2
        _wait_idle(shop_url)

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

    print()
    header = ("order", "scenario", "processor says", "shop says", "message", "")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))
    print()
    from reconcile.cli import render

    print(render(report))
    print()
    print(
        "webhook faults injected by the sandbox: "
        + ", ".join(f"{k} {v}" for k, v in sorted(_fault_counts(stats).items()))
    )
    verdict = "all agree" if agree == len(rows) else f"{len(rows) - agree} disagree"
    print(
        f"demo: {agree}/{len(rows)} orders match the processor ({verdict}); "
        f"reconcile recovered {report['totals'].get('recovered', 0)} missed event(s)"
    )
    return 0 if agree == len(rows) and report["status"] == "ok" else 1


def _fault_counts(stats: dict[str, Any]) -> dict[str, int]:
    applied = stats.get("faults", {}).get("webhooks", {})
    return {name: len(ids) for name, ids in applied.items()}


def _wait_idle(shop_url: str) -> None:
    def idle() -> bool:
        health = requests.get(f"{shop_url}/webhooks/health", timeout=5).json()
        events = health["events"]
        return not events.get("pending") and not events.get("processing")

    wait_for(idle, 120, "the worker to finish", interval=0.3)


if __name__ == "__main__":
    sys.exit(main())
