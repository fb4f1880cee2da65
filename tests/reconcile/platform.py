"""A platform and its sellers: a multi-merchant :mod:`tests.reconcile.world`.

The platform's own processor merchant is the installation's default account (today's
settings: ``HOOKLEDGER_SECRETS``, ``HOOKLEDGER_MERCHANT_ID``, the shared URL); each seller is
a processor merchant of its own, an account of ``HOOKLEDGER_ACCOUNTS`` at
``/webhooks/<seller>/`` with its own secret. Each merchant is a sandbox of its own (its API
served in-process, its webhooks delivered by its clock into the receiver app) with its own
client and reconciler (given the receiver's accounts, as ``reconcile`` reads them), all under
one frozen clock (freezegun) that tests move forward. Every handler call is recorded with the
account it ran under and the merchant its event names.

``adopted``: the accounts have history (no cut-over yet: ``reconcile adopt`` comes next);
else each is declared a new account.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import requests
from flask import Flask
from freezegun import freeze_time

import receiver.storage.database as db
from receiver import Event, WebhookReceiver
from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.store import Store
from reconcile.client.processor import ProcessorClient
from reconcile.core.report import Report
from reconcile.runtime.adoption import Adopter, AdoptOptions
from reconcile.runtime.adoption_report import AdoptionReport
from reconcile.runtime.runner import ReconcileOptions, Reconciler
from reconcile.sandbox.app import create_app as sandbox_app
from reconcile.sandbox.state import Sandbox
from reconcile.sandbox.transport import mount_wsgi, wsgi_sender
from reconcile.storage.store import RECONCILE_MIGRATIONS
from tests.conftest import SECRETS, AppFactory
from tests.reconcile.world import CARD_OK, state_key

START = datetime(2026, 4, 6, 9, 0, tzinfo=UTC)
PLATFORM_MERCHANT = "merchant_platform"
MERCHANT_URL = "http://merchant.test/webhooks/"

__all__ = ["PLATFORM_MERCHANT", "Platform", "Side", "platform"]


def _merchant(account: str) -> str:
    return PLATFORM_MERCHANT if account == DEFAULT_ACCOUNT else f"merchant_{account}"


def _secret(account: str) -> str:
    return SECRETS["primary"] if account == DEFAULT_ACCOUNT else f"whsec_{account}_0123456789"


@dataclass
class Side:
    """One processor merchant of the platform: its sandbox, client and reconciler."""

    account: str
    sandbox: Sandbox
    client: ProcessorClient
    reconciler: Reconciler

    @property
    def url(self) -> str:
        return MERCHANT_URL if self.account == DEFAULT_ACCOUNT else f"{MERCHANT_URL}{self.account}/"


@dataclass
class Platform:
    app: Flask
    sides: dict[str, Side]
    frozen: Any
    #: Every handler call: (account, kind, object id, state key) -> how many times.
    handled: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    #: The merchant each handled event named: (account, kind, object id) -> merchant ids.
    merchants: dict[tuple[str, str, str], set[str | None]] = field(default_factory=dict)

    @property
    def store(self) -> Store:
        return WebhookReceiver.state(self.app).store

    def now(self) -> datetime:
        return datetime.now(UTC)

    def drain(self) -> int:
        return WebhookReceiver.state(self.app).worker(name="platform").drain()

    def advance(self, delta: timedelta) -> None:
        """Move time on, delivering every merchant's webhooks that fall due on the way (as
        the processor's retries would) and letting the worker run after each step."""
        end = self.now() + delta
        while True:
            dues = [
                (due, side)
                for side in self.sides.values()
                if (due := side.sandbox.next_delivery_due()) is not None and due <= end
            ]
            if not dues:
                break
            due, side = min(dues, key=lambda pair: pair[0])
            if due > self.now():
                self.frozen.move_to(due)
            side.sandbox.deliver_due()
            self.drain()
        self.frozen.move_to(end)
        for side in self.sides.values():
            side.sandbox.tick()
            side.sandbox.deliver_due()
        self.drain()

    def settle(self) -> None:
        """Deliver what is due now and run the worker until it has nothing due."""
        for side in self.sides.values():
            side.sandbox.deliver_due()
        self.drain()

    def run(self, account: str, options: ReconcileOptions | None = None) -> Report:
        report = self.sides[account].reconciler.run(options or ReconcileOptions())
        self.drain()
        return report

    def adopt(self, account: str, options: AdoptOptions | None = None) -> AdoptionReport:
        side = self.sides[account]
        accounts = WebhookReceiver.state(self.app).accounts
        if self.store.operations.cutover(account=account) is None:
            # The deploy is now: the account's webhooks were just pointed at hookledger.
            options = replace(options or AdoptOptions(), deployed_at=self.now())
        return Adopter(side.client, self.store, account=account, accounts=accounts).adopt(options)

    def pay(
        self, account: str, payment_id: str, *, manual: bool = False, card: str = CARD_OK
    ) -> dict[str, Any]:
        return self.sides[account].sandbox.create_payment(
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
            }
        )

    def silence(self, account: str, silent: bool = True) -> None:
        """The merchant's webhooks go nowhere (``silent``: the earlier system's days, the
        processor records them only), or to hookledger again."""
        side = self.sides[account]
        side.sandbox.webhook_url = None if silent else side.url

    def projected(self, account: str, kind: str, object_id: str) -> str | None:
        row = self.store.operations.projection(kind, object_id, account=account)
        if row is None:
            return None
        return f"{row.stage}/{row.status}" if row.stage else row.status


@contextmanager
def platform(
    make_app: AppFactory,
    sellers: Sequence[str] = ("seller_a",),
    *,
    adopted: bool = False,
    start: datetime = START,
) -> Iterator[Platform]:
    freezer = freeze_time(start)
    frozen = freezer.start()
    try:
        hooks = WebhookReceiver()
        spec = {
            seller: {"merchant_id": _merchant(seller), "secrets": f"k1:{_secret(seller)}"}
            for seller in sellers
        }
        app, _ = make_app(hooks, merchant_id=PLATFORM_MERCHANT, accounts=json.dumps(spec))
        state = WebhookReceiver.state(app)
        db.upgrade(state.store.engine, tree=RECONCILE_MIGRATIONS)
        sides: dict[str, Side] = {}
        for account in (DEFAULT_ACCOUNT, *sellers):
            if not adopted:
                state.store.operations.set_cutover("new_account", None, account=account)
            key = f"snd_{account.replace('-', '_')}_key_0123"
            sandbox = Sandbox(
                key,
                merchant_id=_merchant(account),
                profile_id=f"pro_{account}",
                webhook_url=MERCHANT_URL if account == DEFAULT_ACCOUNT else None,
                webhook_secret=_secret(account),
                send=wsgi_sender(app.wsgi_app),
            )
            session = requests.Session()
            base = f"http://{account}.processor.test"
            mount_wsgi(session, base, sandbox_app(sandbox))
            client = ProcessorClient(base, key, session=session)
            reconciler = Reconciler(client, state.store, account=account, accounts=state.accounts)
            sides[account] = Side(account, sandbox, client, reconciler)
            sandbox.webhook_url = sides[account].url
        made = Platform(app=app, sides=sides, frozen=frozen)

        @hooks.on_any(name="platform.record")
        def record(event: Event) -> None:
            ref = event.object_ref
            if ref is None:
                return
            made.handled[(event.account, ref.kind, ref.object_id, state_key(event))] += 1
            made.merchants.setdefault((event.account, ref.kind, ref.object_id), set()).add(
                event.merchant_id
            )

        yield made
        for side in sides.values():
            side.client.close()
    finally:
        freezer.stop()
