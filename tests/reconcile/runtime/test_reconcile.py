"""The reconciler against the sandbox processor, on real databases."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask import Flask

import receiver.storage.database as db
from receiver import Event, WebhookReceiver
from receiver.core.wire import encode
from receiver.testing import WebhookTestClient
from reconcile.client.processor import ProcessorClient
from reconcile.core.errors import ReconcileLocked
from reconcile.runtime.runner import ReconcileOptions, Reconciler
from reconcile.sandbox import SandboxServer
from reconcile.storage.store import RECONCILE_MIGRATIONS, ReconcileStore
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage

API_KEY = "snd_test_reconcile"
CARD_OK = "4242424242424242"
CARD_DECLINED = "4000000000009995"


def _pay(server: SandboxServer, payment_id: str, card: str = CARD_OK) -> dict[str, Any]:
    return server.sandbox.create_payment(
        {
            "amount": 2500,
            "currency": "USD",
            "payment_id": payment_id,
            "confirm": True,
            "payment_method": "card",
            "payment_method_type": "credit",
            "payment_method_data": {
                "card": {
                    "card_number": card,
                    "card_exp_month": "12",
                    "card_exp_year": "2030",
                    "card_cvc": "123",
                }
            },
            "billing": {
                "address": {
                    "line1": "1 St",
                    "city": "SF",
                    "state": "CA",
                    "zip": "94105",
                    "country": "US",
                    "first_name": "A",
                    "last_name": "B",
                },
                "phone": {"number": "5555550100", "country_code": "+1"},
            },
            "metadata": {"order_id": payment_id},
        }
    )


class Recorder:
    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()


def _app(make_app: AppFactory) -> tuple[Flask, Recorder]:
    hooks = WebhookReceiver()
    recorder = Recorder()

    @hooks.on_any(name="record")
    def record(event: Event) -> None:
        ref = event.object_ref
        recorder.calls[(event.event_type, ref.object_id if ref else "")] += 1

    app, _ = make_app(hooks)
    store = WebhookReceiver.state(app).store
    db.upgrade(store.engine, tree=RECONCILE_MIGRATIONS)
    store.operations.set_cutover("new_account", None)  # a fresh sandbox: nothing before hookledger
    return app, recorder


def _reconciler(app: Flask, server: SandboxServer, **kw: Any) -> Reconciler:
    client = ProcessorClient(server.base_url, API_KEY)
    return Reconciler(client, WebhookReceiver.state(app).store, **kw)


def test_dropped_webhooks_are_recovered_and_handled_once(make_app: AppFactory) -> None:
    app, recorder = _app(make_app)
    with SandboxServer(API_KEY, webhook_url=None, webhook_secret="unused") as server:
        _pay(server, "pay_ok_1")
        _pay(server, "pay_ok_2")
        _pay(server, "pay_no_1", CARD_DECLINED)
        server.sandbox.create_refund({"payment_id": "pay_ok_2", "amount": 500})
        reconciler = _reconciler(app, server)
        report = reconciler.run()
        assert report.status == "ok"
        assert report.kinds["payments"].recovered == Counter(payment_succeeded=2, payment_failed=1)
        assert report.kinds["refunds"].recovered == Counter(refund_succeeded=1)
        WebhookTestClient(app).drain()
        assert recorder.calls == Counter(
            {
                ("payment_succeeded", "pay_ok_1"): 1,
                ("payment_succeeded", "pay_ok_2"): 1,
                ("payment_failed", "pay_no_1"): 1,
                ("refund_succeeded", _only_refund(server)): 1,
            }
        )
        again = reconciler.run()
        assert again.recovered == 0
        assert again.kinds["payments"].in_sync == 3
        reconciler.client.close()


def _only_refund(server: SandboxServer) -> str:
    listed = server.sandbox.list_refunds({})
    (refund,) = listed["data"]
    return str(refund["refund_id"])


def test_webhook_after_reconcile_does_not_run_handlers_again(make_app: AppFactory) -> None:
    app, recorder = _app(make_app)
    with SandboxServer(API_KEY, webhook_url=None, webhook_secret="unused") as server:
        payment = _pay(server, "pay_late")
        reconciler = _reconciler(app, server)
        assert reconciler.run().recovered == 1
        client = WebhookTestClient(app)
        client.drain()
        # The processor's own webhook for the same transition finally arrives.
        late = {
            "merchant_id": "merchant_sandbox",
            "event_id": "evt_0190000000007000800000000000abcd",
            "event_type": "payment_succeeded",
            "content": {"type": "payment_details", "object": payment},
            "timestamp": payment["modified_at"],
        }
        assert client.post(encode(late)).status_code == 200
        client.drain()
        assert recorder.calls == Counter({("payment_succeeded", "pay_late"): 1})
        row = WebhookReceiver.state(app).store.operations.get(late["event_id"])
        assert row is not None and row.status == "duplicate"
        reconciler.client.close()


def test_sandbox_webhooks_with_drops_end_in_sync(make_app: AppFactory) -> None:
    from tests.support import serve

    app, recorder = _app(make_app)
    with serve(app) as base:
        with SandboxServer(
            API_KEY,
            webhook_url=base + "/webhooks/",
            webhook_secret="whsec_primary_0123456789",
            retry_schedule=[0.05, 0.05],
            seed=7,
        ) as server:
            server.sandbox.faults.configure_from_json({"webhooks": {"drop": 0.5, "duplicate": 0.3}})
            for i in range(10):
                _pay(server, f"pay_mix_{i}", CARD_OK if i % 3 else CARD_DECLINED)
            assert server.sandbox.flush_webhooks(10)
            WebhookTestClient(app).drain()
            reconciler = _reconciler(app, server)
            report = reconciler.run()
            WebhookTestClient(app).drain()
            assert report.kinds["payments"].checked == 10
            assert report.recovered + report.kinds["payments"].in_sync == 10
            assert sum(recorder.calls.values()) == 10
            assert set(recorder.calls.values()) == {1}
            assert reconciler.run().kinds["payments"].in_sync == 10
            reconciler.client.close()


def test_dry_run_inserts_nothing(make_app: AppFactory) -> None:
    app, _ = _app(make_app)
    with SandboxServer(API_KEY, webhook_url=None, webhook_secret="unused") as server:
        _pay(server, "pay_dry")
        reconciler = _reconciler(app, server)
        report = reconciler.run(ReconcileOptions(dry_run=True))
        assert report.status == "dry_run"
        assert report.kinds["payments"].recovered == Counter(payment_succeeded=1)
        assert WebhookReceiver.state(app).store.operations.counts() == {}
        assert ReconcileStore(WebhookReceiver.state(app).store.engine).watermark("payment") is None
        reconciler.client.close()


def test_watermark_catches_up_after_a_missed_run(make_app: AppFactory) -> None:
    app, _ = _app(make_app)
    now = {"t": datetime(2026, 11, 20, 12, 0, tzinfo=UTC)}

    def clock() -> datetime:
        return now["t"]

    with SandboxServer(API_KEY, webhook_url=None, webhook_secret="unused", now=clock) as server:
        reconciler = _reconciler(app, server, clock=clock)
        options = ReconcileOptions(kinds=["payments"], overlap=timedelta(minutes=5))
        first = reconciler.run(options)
        assert first.kinds["payments"].checked == 0
        store = ReconcileStore(WebhookReceiver.state(app).store.engine)
        assert store.watermark("payment") == now["t"]
        # Payments are made over the next hours; the 10-minute runs of that time never happen.
        for minutes in (20, 75, 75):
            now["t"] += timedelta(minutes=minutes)
            _pay(server, f"pay_gap_{now['t']:%H%M}")
        now["t"] = datetime(2026, 11, 20, 18, 0, tzinfo=UTC)
        caught_up = reconciler.run(options)
        window = caught_up.kinds["payments"].window
        assert window[0] == datetime(2026, 11, 20, 11, 55, tzinfo=UTC)
        assert caught_up.kinds["payments"].recovered == Counter(payment_succeeded=3)
        assert store.watermark("payment") == now["t"]
        # The next incremental run only looks back over the overlap.
        now["t"] += timedelta(minutes=10)
        nxt = reconciler.run(options)
        assert nxt.kinds["payments"].window[0] == datetime(2026, 11, 20, 17, 55, tzinfo=UTC)
        assert nxt.kinds["payments"].checked == 0
        reconciler.client.close()


def test_only_one_run_at_a_time(make_app: AppFactory) -> None:
    app, _ = _app(make_app)
    with SandboxServer(API_KEY, webhook_url=None, webhook_secret="unused") as server:
        first = _reconciler(app, server, owner="first")
        second = _reconciler(app, server, owner="second")
        lease = first.store.lock("first")
        lease.acquire()
        try:
            with pytest.raises(ReconcileLocked, match="in progress"):
                second.run(ReconcileOptions(kinds=["payments"]))
        finally:
            lease.release()
        assert second.run(ReconcileOptions(kinds=["payments"])).status == "ok"
        first.client.close()
        second.client.close()


def test_local_only_objects_are_unresolved(make_app: AppFactory) -> None:
    app, _ = _app(make_app)
    with SandboxServer(API_KEY, webhook_url=None, webhook_secret="unused") as server:
        client = WebhookTestClient(app)
        client.send(
            "payment_succeeded",
            object_id="pay_ghost",
            created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        )
        client.drain()
        reconciler = _reconciler(app, server)
        report = reconciler.run(ReconcileOptions(kinds=["payments"]))
        assert report.kinds["payments"].local_only == 1
        assert report.kinds["payments"].local_only_sample == ["pay_ghost"]
        assert report.status == "unresolved"
        # The sweep follows a captured payment too (a void after capture may still come):
        # it fetches the ghost by id and reports it not found.
        assert report.sweep["payments"].not_found_sample == ["pay_ghost"]
        stored = json.loads(ReconcileStore(reconciler.inbox.engine).runs(1)[0].report)
        assert stored["totals"]["unresolved"] == 2
        reconciler.client.close()


def test_lock_is_per_schema_on_postgresql(make_app: AppFactory, database_url: str) -> None:
    """Regression: the PostgreSQL lock was per database, so installs in different schemas
    (tenants, test runs) blocked each other."""
    if not database_url.startswith("postgresql"):
        pytest.skip("advisory locks are PostgreSQL's; SQLite has one lease row per file")
    import sqlalchemy as sa

    import receiver.storage.database as receiver_db
    from tests.conftest import PG_URL

    app, _ = _app(make_app)
    here = ReconcileStore(WebhookReceiver.state(app).store.engine).lock("here")
    here.acquire()
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text('CREATE SCHEMA IF NOT EXISTS "hl_other_tenant"'))
    other = receiver_db.make_engine(f"{PG_URL}?options=-csearch_path%3Dhl_other_tenant")
    try:
        there = ReconcileStore(other).lock("there")
        there.acquire()  # does not raise ReconcileLocked
        there.release()
    finally:
        here.release()
        other.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text('DROP SCHEMA IF EXISTS "hl_other_tenant" CASCADE'))
        admin.dispose()
