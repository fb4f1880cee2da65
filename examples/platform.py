"""A platform with two sellers: ``python -m examples.platform``.

On SQLite, with nothing to install, hookledger serves two processor accounts at once:

1. two sellers, ``seller_a`` and ``seller_b``, each a merchant account of its own at the
   processor (the multi-merchant sandbox, :class:`reconcile.sandbox.MerchantsServer`: one
   base URL, the ``api-key`` picks the merchant), with its own API key, admin key, webhook
   secret and webhook URL (``/webhooks/seller_a/``, ``/webhooks/seller_b/``), configured in
   ``HOOKLEDGER_ACCOUNTS``;
2. ``reconcile --account <seller> adopt --new-account`` for each; the web app (served in
   this process here; gunicorn in production, as in the Procfile) and the worker
   (``hookledger worker``) start;
3. each seller takes the **same payment ids** (``pay_000``, ``pay_001`` ...), with opposite
   outcomes (a payment succeeds at one seller and is declined at the other), and refunds
   some, while the sandbox drops, duplicates and reorders a share of each seller's webhooks;
4. ``reconcile run --all-accounts`` recovers, per account, what the webhooks missed;
5. per account, every payment and refund at the processor is printed beside hookledger's
   projection of it (``store.operations.projection(kind, id, account=...)``).

Exits 0 only when, in both accounts, every object's projection equals the processor's status.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import requests
from werkzeug.serving import make_server

from examples.demo import process
from receiver import Event, WebhookReceiver
from receiver import db as hookledger_db
from receiver.core.keyring import generate_key
from receiver.store import Store
from reconcile.sandbox import MerchantsServer, Sandbox

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SELLERS = ("seller_a", "seller_b")
CARDS = ("4242424242424242", "4000000000000002")  # paid, declined (issuer)

hooks = WebhookReceiver()


@hooks.on_any()
def note(event: Event) -> None:
    """The platform's handler: here it only says whose event it was (``event.account``)."""
    ref = event.object_ref
    print(f"{event.account}: {event.event_type} {ref.object_id if ref else ''}", flush=True)


def create_app(config: dict[str, Any] | None = None) -> Any:
    """The platform's web app: hookledger's blueprint, one URL per account
    (``/webhooks/<account>/``), configured from ``config`` or the ``HOOKLEDGER_*``
    environment."""
    from flask import Flask

    app = Flask(__name__)
    app.config.update(config or {})
    hooks.init_app(app)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payments", type=int, default=6, help="payments per seller")
    parser.add_argument("--seed", type=int, default=2026, help="fault injection seed")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="hookledger-platform-"))
    try:
        return _run(args, work)
    finally:
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, work: Path) -> int:
    database_url = f"sqlite:///{work / 'platform.sqlite3'}"
    keys = {
        seller: {
            "api_key": "snd_" + secrets.token_hex(16),
            "admin_key": "admin_" + secrets.token_hex(16),
            "secret": secrets.token_urlsafe(32),
        }
        for seller in SELLERS
    }
    sandboxes = {
        seller: Sandbox(
            keys[seller]["api_key"],
            admin_api_key=keys[seller]["admin_key"],
            merchant_id=f"merchant_{seller}",
            profile_id=f"pro_{seller}",
            webhook_secret=keys[seller]["secret"],
            retry_schedule=[0.5, 1.0],  # then the sandbox gives up: reconcile must catch it
        )
        for seller in SELLERS
    }
    print(f"platform: work folder {work}")
    with ExitStack() as stack:
        processor = stack.enter_context(MerchantsServer(sandboxes.values()))
        accounts = {
            seller: {
                "merchant_id": sandboxes[seller].merchant_id,
                "profile_ids": [sandboxes[seller].profile_id],
                "secrets": f"k1:{keys[seller]['secret']}",
                "api_key": keys[seller]["api_key"],
                "admin_key": keys[seller]["admin_key"],
                "base_url": processor.base_url,
            }
            for seller in SELLERS
        }
        settings = {
            "HOOKLEDGER_SECRETS": "",  # no default account: only the sellers'
            "HOOKLEDGER_DATABASE_URL": database_url,
            "HOOKLEDGER_ACCOUNTS": json.dumps(accounts),
            "HOOKLEDGER_DATA_KEYS": f"platform:{generate_key()}",
            "HOOKLEDGER_POLL_INTERVAL": "0.1",
            "HOOKLEDGER_BACKOFF_BASE": "0.5",
            "HOOKLEDGER_BACKOFF_MAX": "2",
            "HOOKLEDGER_RECONCILE_OVERLAP_MINUTES": "0",
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
        env.update(settings, PYTHONPATH=str(ROOT))
        print(f"platform: one processor for both sellers at {processor.base_url}")
        app_ref = "examples.platform:create_app"
        reconcile = [sys.executable, "-m", "reconcile"]
        steps = [[str(BIN / "hookledger"), "--app", app_ref, "db", "upgrade"]]
        steps += [[*reconcile, "db", "upgrade"]]
        steps += [[*reconcile, "--account", s, "adopt", "--new-account"] for s in SELLERS]
        for step in steps:
            done = subprocess.run(step, env=env, cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stdout + done.stderr, file=sys.stderr)
                return 2
        print("platform: databases migrated; each seller adopted as a new account")
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no access log
        server = make_server("127.0.0.1", 0, create_app(settings), threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        web = f"http://127.0.0.1:{server.server_port}"
        for seller, sandbox in sandboxes.items():
            sandbox.webhook_url = f"{web}/webhooks/{seller}/"  # each seller its own URL
        worker = [str(BIN / "hookledger"), "--app", app_ref, "worker"]
        stack.enter_context(process(worker, env, work / "worker.log"))
        _wait(lambda: _up(f"{web}/webhooks/health"), 30, "the web app")
        print(f"platform: web at {web} (/webhooks/seller_a/, /webhooks/seller_b/), worker running")

        for index, sandbox in enumerate(sandboxes.values()):
            faults = {"drop": 0.25, "duplicate": 0.2, "reorder": 0.2}
            sandbox.faults.configure_from_json({"seed": args.seed + index, "webhooks": faults})
            sandbox.faults.once("drop", count=2)  # some are lost whatever the dice say
        with requests.Session() as http:
            for index, seller in enumerate(SELLERS):
                http.headers["api-key"] = keys[seller]["api_key"]  # picks the merchant
                for n in range(args.payments):
                    _pay_and_refund(http, processor.base_url, n, declined=(n + index) % 2 == 1)
        print(
            f"platform: {args.payments} payments per seller, the same ids in both; waiting "
            "for the webhooks (with faults) to settle"
        )
        for sandbox in sandboxes.values():
            sandbox.flush_webhooks(60)
        store = Store(hookledger_db.make_engine(database_url))
        stack.callback(store.engine.dispose)
        _wait_idle(store)
        for seller, sandbox in sandboxes.items():
            rows = _compare(store, processor.base_url, keys[seller]["api_key"], seller)
            applied = sandbox.stats()["faults"]["webhooks"]
            shown = ", ".join(f"{name} {len(ids)}" for name, ids in sorted(applied.items()) if ids)
            behind = sum(1 for row in rows if row[-1] != "ok")
            print(f"platform: {seller}: webhook faults {shown}; {behind} object(s) behind")

        print("platform: running python -m reconcile run --all-accounts --json")
        run_all = [*reconcile, "run", "--all-accounts", "--json"]
        done = subprocess.run(run_all, env=env, cwd=ROOT, capture_output=True, text=True)
        (work / "reconcile.json").write_text(done.stdout + done.stderr)
        try:
            reports: dict[str, Any] = json.loads(done.stdout)
        except json.JSONDecodeError:
            print(done.stdout + done.stderr, file=sys.stderr)
            return 2
        _wait_idle(store)
        after = {s: _compare(store, processor.base_url, keys[s]["api_key"], s) for s in SELLERS}
        shared = store.operations.projection("payment", "pay_000")  # the default account's

    agree = True
    for seller in SELLERS:
        report = reports["accounts"].get(seller, {})
        paths = ", ".join(f"{k} {v}" for k, v in report.get("recovered_by_path", {}).items())
        print(f"\n== {seller}: reconcile {report.get('status')}, recovered by path: {paths}")
        header = ("object", "processor says", "hookledger says", "")
        rows = [header, *after[seller]]
        widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
        for row in rows:
            print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))
        equal = all(row[-1] == "ok" for row in after[seller])
        agree = agree and equal
        print(f"{seller}: {'every object equals the processor' if equal else 'MISMATCH'}")
    print(f"\nplatform: pay_000 in the default account: {'none' if shared is None else 'FOUND'}")
    healthy = agree and done.returncode == 0 and reports.get("not_ok") == [] and shared is None
    print(
        "platform: both accounts equal the processor"
        if healthy
        else f"platform: NOT equal (reconcile exit {done.returncode}, not ok: "
        f"{reports.get('not_ok')})"
    )
    return 0 if healthy else 1


def _pay_and_refund(http: requests.Session, base: str, n: int, *, declined: bool) -> None:
    """Payment ``pay_<n>``, paid or declined; two paid ones in three are then refunded in
    part, one of those refunds refused by the processor (an amount ending in 02)."""
    payment_id = f"pay_{n:03d}"
    body = {
        "amount": 5000,
        "currency": "EUR",
        "payment_id": payment_id,
        "confirm": True,
        "payment_method": "card",
        "payment_method_type": "credit",
        "payment_method_data": {
            "card": {
                "card_number": CARDS[declined],
                "card_exp_month": "12",
                "card_exp_year": "2030",
                "card_cvc": "123",
            }
        },
    }
    paid = http.post(f"{base}/payments", json=body, timeout=30)
    paid.raise_for_status()
    if paid.json()["status"] == "succeeded" and n % 3 != 2:
        refund = {"payment_id": payment_id, "amount": 1000 if n % 3 == 0 else 1002}
        http.post(f"{base}/refunds", json=refund, timeout=30).raise_for_status()


def _compare(store: Store, base: str, api_key: str, account: str) -> list[tuple[str, ...]]:
    """Every payment and refund the processor holds for the key's merchant, beside the
    account's projection of it."""
    with requests.Session() as http:
        http.headers["api-key"] = api_key
        payments = http.get(f"{base}/payments/list", params={"limit": 100}, timeout=30).json()
        refunds = http.post(f"{base}/refunds/list", json={"limit": 100}, timeout=30).json()
    objects = [("payment", p["payment_id"], p["status"]) for p in payments["data"]]
    objects += [("refund", r["refund_id"], r["status"]) for r in refunds["data"]]
    rows: list[tuple[str, ...]] = []
    for kind, object_id, status in sorted(objects):
        row = store.operations.projection(kind, object_id, account=account)
        mine = row.status if row is not None else "(nothing)"
        rows.append((f"{kind} {object_id}", status, mine, "ok" if mine == status else "BEHIND"))
    return rows


def _up(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).ok
    except requests.RequestException:
        return False


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"platform: timed out waiting for {what}")
        time.sleep(0.2)


def _wait_idle(store: Store) -> None:
    """Until the worker has nothing open, in any account."""

    def idle() -> bool:
        counts = store.operations.counts()
        return not counts.get("pending") and not counts.get("processing")

    _wait(idle, 120, "the worker to finish")


if __name__ == "__main__":
    sys.exit(main())
