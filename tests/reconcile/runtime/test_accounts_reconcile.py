"""Reconciliation per account: two processor accounts (two sandboxes, one merchant each) with
the same payment id, their webhooks lost; each account's run recovers its own, and one
account's processor failing leaves the other's run and data untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
from flask import Flask
from freezegun import freeze_time

import receiver.storage.database as db
from receiver import Event, WebhookReceiver
from reconcile.client.processor import ProcessorClient
from reconcile.runtime.runner import ReconcileOptions, Reconciler
from reconcile.sandbox.app import create_app as sandbox_app
from reconcile.sandbox.state import Sandbox
from reconcile.sandbox.transport import mount_wsgi, wsgi_sender
from reconcile.storage.store import RECONCILE_MIGRATIONS, ReconcileStore
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage

START = datetime(2026, 2, 2, 9, 0, tzinfo=UTC)
ACCOUNTS = {
    "eu": {"merchant_id": "merchant_eu", "secrets": "k1:whsec_eu_0123456789"},
    "us": {"merchant_id": "merchant_us", "secrets": "k1:whsec_us_0123456789"},
}


@dataclass
class Account:
    sandbox: Sandbox
    client: ProcessorClient
    reconciler: Reconciler


def _pay(sandbox: Sandbox, payment_id: str) -> None:
    sandbox.create_payment(
        {
            "amount": 5000,
            "currency": "EUR",
            "payment_id": payment_id,
            "confirm": True,
            "capture_method": "automatic",
            "payment_method": "card",
            "payment_method_type": "credit",
            "payment_method_data": {
                "card": {
                    "card_number": "4242424242424242",
                    "card_exp_month": "12",
                    "card_exp_year": "2035",
                    "card_cvc": "123",
                }
            },
        }
    )


@pytest.fixture
def platform(make_app: AppFactory) -> Iterator[tuple[Flask, dict[str, Account], list[Any]]]:
    seen: list[tuple[str, str, str]] = []
    hooks = WebhookReceiver()

    @hooks.on_any()
    def record(event: Event) -> None:
        ref = event.object_ref
        assert ref is not None
        seen.append((event.account, ref.object_id, event.event_type))

    with freeze_time(START):
        app, _ = make_app(hooks, secrets="", accounts=json.dumps(ACCOUNTS))
        store = WebhookReceiver.state(app).store
        db.upgrade(store.engine, tree=RECONCILE_MIGRATIONS)
        made: dict[str, Account] = {}
        for name, settings in ACCOUNTS.items():
            store.operations.set_cutover("new_account", None, account=name)
            sandbox = Sandbox(
                f"snd_{name}_key_0123",
                merchant_id=settings["merchant_id"],
                webhook_url=f"http://merchant.test/webhooks/{name}/",
                webhook_secret=settings["secrets"].split(":", 1)[1],
                send=wsgi_sender(app.wsgi_app),
            )
            session = requests.Session()
            url = f"http://{name}.processor.test"
            mount_wsgi(session, url, sandbox_app(sandbox))
            client = ProcessorClient(url, f"snd_{name}_key_0123", session=session)
            made[name] = Account(sandbox, client, Reconciler(client, store, account=name))
        yield app, made, seen


def test_each_account_recovers_its_own_missed_events(
    platform: tuple[Flask, dict[str, Account], list[Any]],
) -> None:
    app, accounts, seen = platform
    with freeze_time(START):
        for account in accounts.values():
            account.sandbox.faults.once("drop", count=5)
            _pay(account.sandbox, "pay_same")
            account.sandbox.deliver_due()
        worker = WebhookReceiver.state(app).worker(name="t")
        assert worker.drain() == 0  # every webhook was lost
        for name, account in accounts.items():
            report = account.reconciler.run(ReconcileOptions())
            assert report.status == "ok", (name, report.as_dict())
        worker.drain()
    assert sorted(seen) == [
        ("eu", "pay_same", "payment_succeeded"),
        ("us", "pay_same", "payment_succeeded"),
    ]
    store = WebhookReceiver.state(app).store
    for name in accounts:
        row = store.operations.projection("payment", "pay_same", account=name)
        assert row is not None and row.status == "succeeded"
        assert ReconcileStore(store.engine, account=name).runs(5)[0].status == "ok"
    assert store.operations.projection("payment", "pay_same") is None  # nobody's default
    assert ReconcileStore(store.engine).runs(5) == []


def test_one_accounts_processor_failing_does_not_touch_another(
    platform: tuple[Flask, dict[str, Account], list[Any]],
) -> None:
    app, accounts, seen = platform
    with freeze_time(START):
        eu, us = accounts["eu"], accounts["us"]
        eu.sandbox.faults.once("drop", count=5)
        _pay(eu.sandbox, "pay_eu")
        eu.sandbox.deliver_due()
        # us's processor refuses its key (revoked): its run fails, alone.
        session = requests.Session()
        mount_wsgi(session, "http://us.processor.test", sandbox_app(us.sandbox))
        broken = ProcessorClient("http://us.processor.test", "snd_revoked_key_0", session=session)
        store = WebhookReceiver.state(app).store
        failing = Reconciler(broken, store, account="us")
        failed = failing.run(ReconcileOptions())
        assert failed.status != "ok"
        report = eu.reconciler.run(ReconcileOptions())
        assert report.status == "ok", report.as_dict()
        WebhookReceiver.state(app).worker(name="t").drain()
    assert seen == [("eu", "pay_eu", "payment_succeeded")]
    assert ReconcileStore(store.engine, account="eu").runs(1)[0].status == "ok"
    assert ReconcileStore(store.engine, account="us").runs(1)[0].status != "ok"


def test_a_store_or_events_path_of_another_account_is_refused(
    platform: tuple[Flask, dict[str, Account], list[Any]],
) -> None:
    app, accounts, _ = platform
    store = WebhookReceiver.state(app).store
    with pytest.raises(ValueError, match="account"):
        Reconciler(
            accounts["eu"].client,
            store,
            store=ReconcileStore(store.engine, account="us"),
            account="eu",
        )


def test_a_runs_dead_letter_count_is_its_own_accounts(
    platform: tuple[Flask, dict[str, Account], list[Any]],
) -> None:
    """Regression: the report's ``dead_letter`` counted every account's dead letters, with a
    count of the whole inbox by status that every account's run repeated (its cost grew
    with the inbox: the 1,000-account reconcile bench was not linear)."""
    from receiver.core.events import parse_event
    from receiver.testing.factories import build_event, encode

    app, accounts, _ = platform
    store = WebhookReceiver.state(app).store
    with freeze_time(START):
        for i in range(3):
            body = encode(build_event("payment_succeeded", object_id=f"pay_dead{i}"))
            pk = store.inbox.insert(parse_event(body), body, account="us").pk
            with store.engine.begin() as conn:
                conn.exec_driver_sql(
                    f"UPDATE hookledger_event SET status = 'dead' WHERE id = {int(pk)}"
                )
        reports = {name: a.reconciler.run(ReconcileOptions()) for name, a in accounts.items()}
    assert reports["eu"].dead_letter == 0
    assert reports["us"].dead_letter == 3
    assert store.operations.dead_count() == 3
