"""Two brands of one merchant, kept apart: a multi-account :mod:`tests.reconcile.world`.

One processor merchant (one API key) has two business profiles, ``pro_brand_eu`` (its
default) and ``pro_brand_us``, each with its own webhook URL and signing key; the
installation keeps them as two accounts, ``brand_eu`` and ``brand_us``, each at its own URL
(``/webhooks/<account>/``) with its own secret. Everything lives in one process under one
frozen clock (freezegun): the sandbox (its API served in-process, its webhooks delivered by
its clock into the receiver app), the receiver app on the test database, one reconciler
(with its events path) per account. Every handler call is recorded with the account it ran
under, so tests can check that each transition reached one account's handlers, once.

``layout``: ``"named"`` (each account names its profile), ``"catch_all"`` (``brand_eu`` names
none: it takes the merchant's profiles no other account names, ``brand_us`` names its own),
``"legacy"`` (as ``catch_all``, and ``brand_eu`` names no merchant either: an installation's
first account, configured before its second brand came).
``source``: ``"configured"`` (``HOOKLEDGER_ACCOUNTS``; the reconcilers are given the
receiver's account source) or ``"stored"`` (hookledger's account table, which the
reconcilers read by default).
"""

from __future__ import annotations

import base64
import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import requests
from flask import Flask
from freezegun import freeze_time
from sqlalchemy import select

from receiver import Event, WebhookReceiver
from receiver.core.accounts import Account
from receiver.core.signature import parse_secrets
from receiver.storage.tables import Projection
from receiver.store import Store
from reconcile.client.events_api import EventsClient
from reconcile.client.processor import ProcessorClient
from reconcile.core.report import Report
from reconcile.recovery.undelivered import UndeliveredEvents
from reconcile.runtime.runner import ReconcileOptions, Reconciler
from reconcile.sandbox.app import create_app as sandbox_app
from reconcile.sandbox.faults import WebhookFaultConfig
from reconcile.sandbox.state import Sandbox
from reconcile.sandbox.transport import mount_wsgi, wsgi_sender
from tests.conftest import AppFactory
from tests.reconcile.world import CARD_OK, state_key
from tests.support import reconcile_ready

API_KEY = "snd_brands_0123456789"
ADMIN_KEY = "brands_admin_key"
MERCHANT = "merchant_brands"
SANDBOX_URL = "http://sandbox.test"
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
DATA_KEY = base64.b64encode(b"b" * 32).decode()
#: Account -> its profile, its webhook signing key (the profile's payment_response_hash_key).
BRANDS = {
    "brand_eu": ("pro_brand_eu", "whsec_brand_eu_0123456789abcdef"),
    "brand_us": ("pro_brand_us", "whsec_brand_us_0123456789abcdef"),
}
PROFILES = {profile: account for account, (profile, _) in BRANDS.items()}

Layout = Literal["named", "catch_all", "legacy"]
Source = Literal["configured", "stored"]

__all__ = ["BRANDS", "PROFILES", "Brands", "brands"]


def accounts_of(layout: Layout) -> list[Account]:
    made = []
    for name, (profile, secret) in BRANDS.items():
        named = layout == "named" or name != "brand_eu"
        made.append(
            Account(
                id=name,
                merchant_id=None if layout == "legacy" and name == "brand_eu" else MERCHANT,
                profile_ids=(profile,) if named else (),
                secrets=parse_secrets(f"k1:{secret}"),
                api_key=API_KEY,
                admin_key=ADMIN_KEY,
            )
        )
    return made


@dataclass
class Brands:
    app: Flask
    sandbox: Sandbox
    client: ProcessorClient
    reconcilers: dict[str, Reconciler]
    frozen: Any
    #: Every handler call: (account, kind, object id, state key) -> how many times.
    handled: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)

    @property
    def store(self) -> Store:
        return WebhookReceiver.state(self.app).store

    def now(self) -> datetime:
        return datetime.now(UTC)

    def advance(self, delta: timedelta) -> None:
        """Move time on, delivering the webhooks that fall due on the way and letting the
        worker run after each step (as :meth:`tests.reconcile.world.World.advance`)."""
        end = self.now() + delta
        while True:
            due = self.sandbox.next_delivery_due()
            if due is None or due > end:
                break
            if due > self.now():
                self.frozen.move_to(due)
            self.sandbox.deliver_due()
            self.drain()
        self.frozen.move_to(end)
        self.sandbox.tick()
        self.sandbox.deliver_due()
        self.drain()

    def drain(self) -> int:
        return WebhookReceiver.state(self.app).worker(name="brands").drain()

    def run(self, account: str, options: ReconcileOptions | None = None) -> Report:
        report = self.reconcilers[account].run(options or ReconcileOptions())
        self.drain()
        return report

    def pay(
        self, account: str, payment_id: str, *, card: str = CARD_OK, manual: bool = False
    ) -> dict[str, Any]:
        """A card payment of ``account``'s brand (its profile)."""
        return self.sandbox.create_payment(
            {
                "amount": 5000,
                "currency": "USD",
                "payment_id": payment_id,
                "confirm": True,
                "capture_method": "manual" if manual else "automatic",
                "payment_method": "card",
                "payment_method_type": "credit",
                "payment_method_data": {
                    "card": {
                        "card_number": card,
                        "card_exp_month": "12",
                        "card_exp_year": "2035",
                        "card_cvc": "123",
                    }
                },
                "profile_id": BRANDS[account][0],
            }
        )

    def payout(self, account: str, payout_id: str, amount: int = 1000) -> dict[str, Any]:
        return self.sandbox.create_payout(
            {
                "payout_id": payout_id,
                "amount": amount,
                "currency": "USD",
                "payout_type": "bank",
                "auto_fulfill": True,
                "confirm": True,
                "profile_id": BRANDS[account][0],
            }
        )

    def projections(self, account: str) -> dict[tuple[str, str], str]:
        """``account``'s projected objects: (kind, id) -> state key."""
        table = Projection.__table__  # type: ignore[attr-defined]
        with self.store.engine.connect() as conn:
            rows = conn.execute(
                select(table.c.object_kind, table.c.object_id, table.c.status, table.c.stage).where(
                    table.c.account == account
                )
            ).all()
        return {(r[0], r[1]): f"{r[3]}/{r[2]}" if r[3] else r[2] for r in rows}

    def truth(self, account: str) -> dict[tuple[str, str], str]:
        """What the processor holds of ``account``'s profile, as projections read it (the
        sandbox's records, read directly: the test's view of the truth)."""
        profile = BRANDS[account][0]
        sandbox = self.sandbox
        found: dict[tuple[str, str], str] = {}
        with sandbox.lock:
            for p in sandbox._payments.values():
                if p.profile_id == profile:
                    found[("payment", p.payment_id)] = p.status
            for r in sandbox._refunds.values():
                if r.profile_id == profile:
                    found[("refund", r.refund_id)] = r.status
            for d in sandbox._disputes.values():
                if d.profile_id == profile:
                    found[("dispute", d.dispute_id)] = f"{d.stage}/{d.status}"
            for o in sandbox._payouts.values():
                if o.profile_id == profile:
                    found[("payout", o.payout_id)] = o.status
        return found


@contextmanager
def brands(
    make_app: AppFactory,
    *,
    layout: Layout = "named",
    source: Source = "configured",
    events_api: bool = False,
    faults: WebhookFaultConfig | None = None,
    seed: int = 0,
    start: datetime = START,
    adopted: bool = False,
) -> Iterator[Brands]:
    """``adopted``: the accounts have history (no cut-over yet: ``reconcile adopt`` comes
    next); else each is declared a new account."""
    freezer = freeze_time(start)
    frozen = freezer.start()
    try:
        hooks = WebhookReceiver()
        accounts = accounts_of(layout)
        if source == "configured":
            spec = {
                a.id: {
                    **({"merchant_id": a.merchant_id} if a.merchant_id else {}),
                    "profile_ids": list(a.profile_ids),
                    "secrets": f"k1:{BRANDS[a.id][1]}",
                }
                for a in accounts
            }
            app, _ = make_app(hooks, secrets="", accounts=json.dumps(spec))
        else:
            app, _ = make_app(hooks, secrets="", accounts_in_table="1", data_keys=f"k1:{DATA_KEY}")
            for account in accounts:
                WebhookReceiver.state(app).store.accounts.add(account)
        state = WebhookReceiver.state(app)
        store = state.store
        reconcile_ready(store.engine)
        for account in accounts:
            if not adopted:
                store.operations.set_cutover("new_account", None, account=account.id)
        (eu_profile, eu_key), (us_profile, us_key) = BRANDS["brand_eu"], BRANDS["brand_us"]
        sandbox = Sandbox(
            API_KEY,
            admin_api_key=ADMIN_KEY,
            merchant_id=MERCHANT,
            profile_id=eu_profile,
            webhook_url="http://merchant.test/webhooks/brand_eu/",
            webhook_secret=eu_key,
            send=wsgi_sender(app.wsgi_app),
            seed=seed,
        )
        sandbox.add_profile(
            us_profile, webhook_url="http://merchant.test/webhooks/brand_us/", webhook_secret=us_key
        )
        if faults is not None:
            sandbox.faults.configure(webhooks=faults)
        session = requests.Session()
        mount_wsgi(session, SANDBOX_URL, sandbox_app(sandbox))
        client = ProcessorClient(SANDBOX_URL, API_KEY, session=session)
        # The receiver's own account source (configured), or hookledger's table (the
        # reconciler's default): the same rule the receive path routes by.
        given = {"accounts": state.accounts} if source == "configured" else {}
        reconcilers: dict[str, Reconciler] = {}
        for account in accounts:
            events = None
            if events_api:
                admin = requests.Session()
                mount_wsgi(admin, SANDBOX_URL, sandbox_app(sandbox))
                api = EventsClient(
                    SANDBOX_URL,
                    ADMIN_KEY,
                    environment="sandbox",
                    session=admin,
                    clock=lambda: time.time(),  # looked up at call time: the frozen clock
                )
                events = UndeliveredEvents(
                    api, store, account.secrets, MERCHANT, account=account.id, **given
                )
            reconcilers[account.id] = Reconciler(
                client, store, events=events, account=account.id, **given
            )
        made = Brands(
            app=app, sandbox=sandbox, client=client, reconcilers=reconcilers, frozen=frozen
        )

        @hooks.on_any(name="brands.record")
        def record(event: Event) -> None:
            ref = event.object_ref
            if ref is None:
                return
            made.handled[(event.account, ref.kind, ref.object_id, state_key(event))] += 1

        yield made
        client.close()
    finally:
        freezer.stop()
