"""The transition model through the real inbox and worker, on SQLite and PostgreSQL.

Each test replays a real lifecycle whose second step the processor sends no webhook for (it
sends at most one per object and event type) or sends late, and checks that every state is
dispatched once, in order, and that the projection ends at the processor's state.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from receiver import Defer
from receiver.core.events import Event
from receiver.extension import WebhookReceiver
from receiver.testing import WebhookTestClient
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage

T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


class Calls:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str | None]] = []

    def hooks(self) -> WebhookReceiver:
        hooks = WebhookReceiver()

        @hooks.on_any(name="record")
        def record(event: Event) -> None:
            ref = event.object_ref
            self.seen.append(
                (event.event_type, ref.status if ref else None, ref.stage if ref else None)
            )

        return hooks


def _at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _projection(app: object, kind: str, object_id: str) -> tuple[str, str | None]:
    row = WebhookReceiver.state(app).store.operations.projection(kind, object_id)  # type: ignore[arg-type]
    assert row is not None
    return row.status, row.stage


def test_async_capture_through_processing_is_dispatched(make_app: AppFactory) -> None:
    calls = Calls()
    app, _ = make_app(calls.hooks())
    client = WebhookTestClient(app)
    client.send("payment_authorized", object_id="pay_async", timestamp=_at(0))
    client.drain()
    client.send("payment_processing", object_id="pay_async", timestamp=_at(5))
    client.drain()
    client.send("payment_succeeded", object_id="pay_async", timestamp=_at(6))
    client.drain()
    assert [status for _, status, _ in calls.seen] == [
        "requires_capture",
        "processing",
        "succeeded",
    ]
    assert _projection(app, "payment", "pay_async") == ("succeeded", None)


def test_two_statuses_of_one_event_type_are_each_dispatched(make_app: AppFactory) -> None:
    calls = Calls()
    app, _ = make_app(calls.hooks())
    client = WebhookTestClient(app)
    client.send(
        "payment_captured",
        object_id="pay_parts",
        status="partially_captured_and_capturable",
        timestamp=_at(0),
    )
    # The second payment_captured is a new transition (partially_captured); the processor
    # would not send it (one webhook per event type), the reconciler would: same inbox.
    client.send(
        "payment_captured", object_id="pay_parts", status="partially_captured", timestamp=_at(9)
    )
    client.drain()
    assert calls.seen == [
        ("payment_captured", "partially_captured_and_capturable", None),
        ("payment_captured", "partially_captured", None),
    ]
    assert _projection(app, "payment", "pay_parts") == ("partially_captured", None)


def test_a_dispute_reopened_at_pre_arbitration_is_dispatched(make_app: AppFactory) -> None:
    calls = Calls()
    app, _ = make_app(calls.hooks())
    client = WebhookTestClient(app)
    for minutes, event_type, stage in [
        (0, "dispute_opened", "dispute"),
        (60, "dispute_won", "dispute"),
        (60 * 24 * 40, "dispute_opened", "pre_arbitration"),
        (60 * 24 * 70, "dispute_lost", "pre_arbitration"),
    ]:
        client.send(event_type, object_id="dp_1", dispute_stage=stage, timestamp=_at(minutes))
        client.drain()
    assert calls.seen == [
        ("dispute_opened", "dispute_opened", "dispute"),
        ("dispute_won", "dispute_won", "dispute"),
        ("dispute_opened", "dispute_opened", "pre_arbitration"),
        ("dispute_lost", "dispute_lost", "pre_arbitration"),
    ]
    assert _projection(app, "dispute", "dp_1") == ("dispute_lost", "pre_arbitration")
    # A processor retry of the first stage's opening is a duplicate, not a third opening.
    client.send("dispute_opened", object_id="dp_1", dispute_stage="dispute", timestamp=_at(1))
    client.drain()
    assert len(calls.seen) == 4


def test_a_requeued_dead_event_overtaken_meanwhile_is_stale(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()
    calls: Counter[str] = Counter()
    broken = {"yes": True}

    @hooks.on("payment_authorized", name="hold_stock")
    def hold(event: Event) -> None:
        if broken["yes"]:
            raise RuntimeError("stock service down")
        calls["hold"] += 1

    @hooks.on("payment_succeeded", name="ship")
    def ship(event: Event) -> None:
        calls["ship"] += 1

    app, _ = make_app(hooks, max_attempts=1)
    client = WebhookTestClient(app)
    client.send("payment_authorized", object_id="pay_dead", event_id="evt_auth", timestamp=_at(0))
    client.drain()
    store = WebhookReceiver.state(app).store
    assert store.operations.get("evt_auth").status == "dead"  # type: ignore[union-attr]
    client.send("payment_succeeded", object_id="pay_dead", timestamp=_at(30))
    client.drain()
    broken["yes"] = False
    from receiver.storage.operator_actions import EventFilter

    assert len(store.operations.requeue(EventFilter(event_ids=["evt_auth"]))) == 1
    client.drain()
    row = store.operations.get("evt_auth")
    assert row is not None and row.status == "stale"
    assert row.last_error and "overtaken" in row.last_error
    assert calls == Counter(ship=1)  # the order never went back to "authorised"
    assert _projection(app, "payment", "pay_dead") == ("succeeded", None)


def test_a_requeued_dead_event_still_at_the_head_is_dispatched(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()
    calls: Counter[str] = Counter()
    broken = {"yes": True}

    @hooks.on("refund_succeeded", name="notify")
    def notify(event: Event) -> None:
        if broken["yes"]:
            raise RuntimeError("mail down")
        calls["notify"] += 1

    app, _ = make_app(hooks, max_attempts=1)
    client = WebhookTestClient(app)
    client.send("refund_succeeded", object_id="ref_1", event_id="evt_ref", timestamp=_at(0))
    client.drain()
    broken["yes"] = False
    from receiver.storage.operator_actions import EventFilter

    store = WebhookReceiver.state(app).store
    store.operations.requeue(EventFilter(event_ids=["evt_ref"]))
    client.drain()
    assert store.operations.get("evt_ref").status == "done"  # type: ignore[union-attr]
    assert calls == Counter(notify=1)


def test_deferral_waits_without_using_attempts_and_keeps_order(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()
    orders: set[str] = set()
    seen: list[str] = []

    @hooks.on("payment_succeeded", "payment_captured", name="fulfil")
    def fulfil(event: Event) -> None:
        order_id = event.payment.metadata["order_id"]  # type: ignore[index]
        if order_id not in orders:
            raise Defer(0.5, f"order {order_id} not written yet")
        seen.append(event.payment.status or "")

    app, _ = make_app(hooks, max_attempts=2)
    client = WebhookTestClient(app)
    meta = {"order_id": "o-late"}
    client.send(
        "payment_captured",
        object_id="pay_early",
        event_id="evt_first",
        status="partially_captured_and_capturable",
        metadata=meta,
        timestamp=_at(0),
    )
    client.send(
        "payment_succeeded",
        object_id="pay_early",
        event_id="evt_second",
        metadata=meta,
        timestamp=_at(1),
    )
    store = WebhookReceiver.state(app).store
    for _ in range(5):  # more rounds than max_attempts: deferral uses none of them
        client.drain()
        first = store.operations.get("evt_first")
        assert first is not None and first.status == "pending" and first.attempts == 0
        assert first.last_error == "deferred: order o-late not written yet"
        # The later event of the same object waits behind the deferred one.
        assert store.operations.get("evt_second").status == "pending"  # type: ignore[union-attr]
        _make_due(store, "evt_first")
    listed = app.test_cli_runner().invoke(args=["hookledger", "events", "--deferred"])
    assert listed.exit_code == 0, listed.output
    assert "evt_first" in listed.output and "order o-late not written yet" in listed.output
    assert "evt_second" not in listed.output
    orders.add("o-late")
    client.drain()
    _make_due(store, "evt_first")
    client.drain()
    assert seen == ["partially_captured_and_capturable", "succeeded"]


def test_deferral_past_its_limit_is_dead_lettered_with_the_reason(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()

    @hooks.on("payment_succeeded", name="fulfil")
    def fulfil(event: Event) -> None:
        raise Defer(60, "order not written yet")

    app, _ = make_app(hooks, defer_limit=30)
    client = WebhookTestClient(app)
    client.send("payment_succeeded", event_id="evt_never")
    client.drain()
    row = WebhookReceiver.state(app).store.operations.get("evt_never")
    assert row is not None and row.status == "dead"
    assert row.last_error == "deferred past the limit of 30 s: order not written yet"


def _make_due(store: object, event_id: str) -> None:
    import sqlalchemy as sa

    from receiver.storage.tables import InboxEvent

    table: sa.Table = InboxEvent.__table__  # type: ignore[attr-defined]
    with store.engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(
            table.update()
            .where(table.c.event_id == event_id)
            .values(next_attempt_at=datetime(2000, 1, 1, tzinfo=UTC))
        )
