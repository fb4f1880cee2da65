"""The example shop, driven purely by signed events through the shipped pytest fixture."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask import Flask

from examples.shop.app import create_app
from receiver.extension import WebhookReceiver
from receiver.testing import WebhookTestClient
from tests.conftest import SECRETS_SPEC

pytestmark = pytest.mark.storage

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def app(database_url: str) -> Iterator[Flask]:
    app = create_app(
        {
            "HOOKLEDGER_DATABASE_URL": database_url,
            "HOOKLEDGER_SECRETS": SECRETS_SPEC,
            "HOOKLEDGER_BACKOFF_BASE": 0,
            "HOOKLEDGER_BACKOFF_MAX": 0,
        }
    )
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 0, result.output
    yield app
    from receiver import WebhookReceiver

    WebhookReceiver.state(app).store.engine.dispose()


def _order(app: Flask, order_id: str, amount: int = 5000) -> None:
    response = app.test_client().post("/orders", json={"id": order_id, "amount": amount})
    assert response.status_code == 201


def _status(app: Flask, order_id: str) -> dict[str, Any]:
    data: dict[str, Any] = app.test_client().get(f"/orders/{order_id}").get_json()
    return data


def test_paid_then_refunded(app: Flask, webhook_client: WebhookTestClient) -> None:
    _order(app, "o1")
    pay = {"object_id": "pay_o1", "metadata": {"order_id": "o1"}, "amount": 5000}
    assert webhook_client.send("payment_succeeded", timestamp=T0, **pay).status_code == 200
    webhook_client.drain()
    assert _status(app, "o1")["status"] == "paid"
    webhook_client.send("refund_succeeded", object_id="ref_1", payment_id="pay_o1", amount=2000)
    webhook_client.drain()
    assert _status(app, "o1")["status"] == "partially_refunded"
    webhook_client.send("refund_succeeded", object_id="ref_2", payment_id="pay_o1", amount=3000)
    webhook_client.drain()
    order = _status(app, "o1")
    assert (order["status"], order["refunded_amount"]) == ("refunded", 5000)


def test_declined_shows_the_unified_message(app: Flask, webhook_client: WebhookTestClient) -> None:
    _order(app, "o2")
    webhook_client.send(
        "payment_failed",
        object_id="pay_o2",
        metadata={"order_id": "o2"},
        unified_code="UE_1001",
        unified_message="Insufficient funds",
    )
    webhook_client.drain()
    order = _status(app, "o2")
    assert order["status"] == "failed"
    assert (order["failure_code"], order["failure_message"]) == ("UE_1001", "Insufficient funds")


def test_disputed_and_lost(app: Flask, webhook_client: WebhookTestClient) -> None:
    _order(app, "o3")
    webhook_client.send("payment_succeeded", object_id="pay_o3", metadata={"order_id": "o3"})
    # Drained before the dispute arrives: events of different objects carry no order between
    # them (a dispute whose payment has not run yet is deferred, see the shop's handlers).
    webhook_client.drain()
    webhook_client.send("dispute_opened", object_id="dp_1", payment_id="pay_o3")
    webhook_client.drain()
    assert _status(app, "o3")["status"] == "disputed"
    webhook_client.send("dispute_lost", object_id="dp_1", payment_id="pay_o3")
    webhook_client.drain()
    assert _status(app, "o3")["status"] == "chargeback"


def test_duplicates_and_stale_events_change_nothing(
    app: Flask, webhook_client: WebhookTestClient
) -> None:
    _order(app, "o4")
    paid = {"object_id": "pay_o4", "metadata": {"order_id": "o4"}}
    first = webhook_client.send("payment_succeeded", timestamp=T0, **paid)
    assert first.status_code == 200
    webhook_client.drain()
    refund = {"object_id": "ref_o4", "payment_id": "pay_o4", "amount": 1000}
    body = {"event_id": "evt_refund_o4"}
    for _ in range(3):
        webhook_client.send("refund_succeeded", **refund, **body)
    # A late, backwards event for the payment:
    webhook_client.send("payment_processing", timestamp=T0 - timedelta(minutes=1), **paid)
    webhook_client.drain()
    order = _status(app, "o4")
    assert (order["status"], order["refunded_amount"]) == ("partially_refunded", 1000)


def test_event_before_the_order_exists_waits_until_it_does(
    app: Flask, webhook_client: WebhookTestClient
) -> None:
    webhook_client.send(
        "payment_succeeded", object_id="pay_o5", event_id="evt_o5", metadata={"order_id": "o5"}
    )
    for _ in range(12):  # more rounds than max attempts (8): deferral uses none of them
        webhook_client.drain()
        row = WebhookReceiver.state(app).store.operations.get("evt_o5")
        assert row is not None and (row.status, row.attempts) == ("pending", 0)
        _due_now(app, "evt_o5")
    listed = app.test_cli_runner().invoke(args=["hookledger", "events", "--deferred"])
    assert "no order for payment pay_o5 yet" in listed.output
    _order(app, "o5")
    webhook_client.drain()
    order = _status(app, "o5")
    assert (order["status"], order["shipments"]) == ("paid", 1)


def _due_now(app: Flask, event_id: str) -> None:
    import sqlalchemy as sa

    from receiver.storage.tables import InboxEvent

    table: sa.Table = InboxEvent.__table__  # type: ignore[attr-defined]
    with WebhookReceiver.state(app).store.engine.begin() as conn:
        conn.execute(
            table.update()
            .where(table.c.event_id == event_id)
            .values(next_attempt_at=datetime(2000, 1, 1, tzinfo=UTC))
        )


def test_orders_page_renders(app: Flask) -> None:
    _order(app, "o6", amount=1234)
    page = app.test_client().get("/").get_data(as_text=True)
    assert "o6" in page and "pending" in page
