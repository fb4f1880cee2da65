"""A merchant and its processor, in one process, living through simulated weeks.

:class:`World` puts the sandbox processor (its API served in-process, its webhooks delivered
by its clock into the receiver app) beside a receiver app on the test database, with a
reconciler wired to both, all under one frozen clock (freezegun) that tests move forward.
It records every handler call, so tests can check that each transition reached the
handlers once.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import requests
from flask import Flask
from freezegun import freeze_time

from receiver import Event, WebhookReceiver
from receiver.core.signature import parse_secrets
from receiver.core.transitions import read_event
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
from tests.conftest import SECRETS, AppFactory
from tests.support import reconcile_ready

API_KEY = "snd_world_0123456789"
ADMIN_KEY = "world_admin_key"
SANDBOX_URL = "http://sandbox.test"
MERCHANT_URL = "http://merchant.test/webhooks/"
START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
CARD_OK = "4242424242424242"
CARD_ASYNC = "4000000000000333"

__all__ = ["World", "state_key", "world"]


def state_key(event: Event) -> str:
    """The transition an event stands for (its object's state key)."""
    ref = event.object_ref
    assert ref is not None
    reading = read_event(ref.kind, event.event_type, ref.status, ref.stage)
    assert reading.state is not None
    return reading.state.key


@dataclass
class World:
    app: Flask
    sandbox: Sandbox
    client: ProcessorClient
    reconciler: Reconciler
    frozen: Any
    #: Every handler call: (kind, object id, state key) -> how many times.
    handled: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    order: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def store(self) -> Store:
        return WebhookReceiver.state(self.app).store

    def now(self) -> datetime:
        return datetime.now(UTC)

    def advance(self, delta: timedelta) -> None:
        """Move time on, delivering the webhooks that fall due on the way (as the
        processor's retries would) and letting the worker run after each step."""
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

    def settle(self) -> None:
        """Deliver what is due now and run the worker until it has nothing due."""
        self.sandbox.deliver_due()
        self.drain()

    def drain(self) -> int:
        return WebhookReceiver.state(self.app).worker(name="world").drain()

    def run(self, options: ReconcileOptions | None = None, *, drain: bool = True) -> Report:
        report = self.reconciler.run(options or ReconcileOptions())
        if drain:
            self.drain()
        return report

    def drop_next(self, event_type: str, count: int = 1) -> None:
        """The processor's next ``count`` webhooks of ``event_type`` are lost."""
        self.sandbox.faults.once("drop", count=count, event_type=event_type)

    def pay(self, payment_id: str, *, card: str = CARD_OK, manual: bool = False) -> dict[str, Any]:
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
                "metadata": {"order_id": payment_id},
                "profile_id": "pro_world",
            }
        )

    def projected(self, kind: str, object_id: str) -> str | None:
        row = self.store.operations.projection(kind, object_id)
        if row is None:
            return None
        return f"{row.stage}/{row.status}" if row.stage else row.status


@contextmanager
def world(
    make_app: AppFactory,
    *,
    events_api: bool = False,
    start: datetime = START,
    faults: WebhookFaultConfig | None = None,
    seed: int = 0,
    new_account: bool = True,
    **config: Any,
) -> Iterator[World]:
    freezer = freeze_time(start)
    frozen = freezer.start()
    try:
        hooks = WebhookReceiver()
        app, _ = make_app(hooks, **config)
        engine = WebhookReceiver.state(app).store.engine
        if new_account:
            reconcile_ready(engine)
        else:
            import receiver.storage.database as db
            from reconcile.storage.store import RECONCILE_MIGRATIONS

            db.upgrade(engine, tree=RECONCILE_MIGRATIONS)
        secret = SECRETS["primary"]
        sandbox = Sandbox(
            API_KEY,
            admin_api_key=ADMIN_KEY,
            webhook_url=MERCHANT_URL,
            webhook_secret=secret,
            profile_id="pro_world",
            send=wsgi_sender(app.wsgi_app),
            seed=seed,
        )
        if faults is not None:
            sandbox.faults.configure(webhooks=faults)
        session = requests.Session()
        mount_wsgi(session, SANDBOX_URL, sandbox_app(sandbox))
        client = ProcessorClient(SANDBOX_URL, API_KEY, session=session)
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
                api, WebhookReceiver.state(app).store, parse_secrets(SECRETS), sandbox.merchant_id
            )
        reconciler = Reconciler(client, WebhookReceiver.state(app).store, events=events)
        made = World(app=app, sandbox=sandbox, client=client, reconciler=reconciler, frozen=frozen)

        @hooks.on_any(name="world.record")
        def record(event: Event) -> None:
            ref = event.object_ref
            if ref is None:
                return
            key = (ref.kind, ref.object_id, state_key(event))
            made.handled[key] += 1
            made.order.append(key)

        yield made
        client.close()
    finally:
        freezer.stop()
