"""The shop's own API responses through the same gate as webhooks (``hooks.observe``).

Whichever of the API response and the webhook comes first dispatches the transition; the
other is recorded as a duplicate. Checked both ways in turn, then with real concurrency: a
worker thread, webhooks posted from one thread and responses observed from another.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from flask import Flask
from sqlalchemy.orm import Session

from receiver.core.events import Event
from receiver.core.observe import NotAnObject
from receiver.extension import WebhookReceiver
from receiver.testing import WebhookTestClient
from receiver.testing.factories import build_event
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage


class Shop:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fulfilled: Counter[str] = Counter()
        self.hooks = WebhookReceiver()

        @self.hooks.on("payment_succeeded", name="fulfil")
        def fulfil(event: Event) -> None:
            with self.lock:
                self.fulfilled[event.payment.payment_id or ""] += 1


def _api_response(payment_id: str) -> dict[str, Any]:
    """A payment exactly as ``POST /payments/{id}/confirm`` returns it."""
    body = build_event("payment_succeeded", object_id=payment_id)
    return dict(body["content"]["object"])


def _webhook(payment_id: str) -> dict[str, Any]:
    return build_event("payment_succeeded", object_id=payment_id)


def test_the_api_response_first_dispatches_and_the_webhook_is_a_duplicate(
    make_app: AppFactory,
) -> None:
    shop = Shop()
    app, hooks = make_app(shop.hooks)
    with app.app_context():
        seen = hooks.observe(_api_response("pay_api_first"), dispatch=True)
    assert (seen.stored, seen.status, seen.dispatched_here) == ("inserted", "done", True)
    assert seen.event_type == "payment_succeeded" and seen.state == "succeeded"
    client = WebhookTestClient(app)
    client.post(_webhook("pay_api_first"))
    client.drain()
    assert shop.fulfilled == Counter(pay_api_first=1)
    with app.app_context():
        again = hooks.observe(_api_response("pay_api_first"), dispatch=True)
    assert again.stored == "duplicate" and not again.dispatched_here
    assert shop.fulfilled == Counter(pay_api_first=1)


def test_the_webhook_first_dispatches_and_the_api_response_is_a_duplicate(
    make_app: AppFactory,
) -> None:
    shop = Shop()
    app, hooks = make_app(shop.hooks)
    client = WebhookTestClient(app)
    client.post(_webhook("pay_hook_first"))
    client.drain()
    with app.app_context():
        seen = hooks.observe(_api_response("pay_hook_first"), dispatch=True)
    assert (seen.stored, seen.status, seen.dispatched_here) == ("inserted", "duplicate", False)
    assert shop.fulfilled == Counter(pay_hook_first=1)


def test_an_undispatched_webhook_waiting_in_the_inbox_goes_first(make_app: AppFactory) -> None:
    shop = Shop()
    app, hooks = make_app(shop.hooks)
    WebhookTestClient(app).post(_webhook("pay_waiting"))  # stored, no worker yet
    with app.app_context():
        seen = hooks.observe(_api_response("pay_waiting"), dispatch=True)
    # The webhook is the object's earlier event: processed first, inline, and it dispatched.
    assert seen.status == "duplicate"
    assert shop.fulfilled == Counter(pay_waiting=1)


def test_observe_inside_the_shops_transaction(make_app: AppFactory) -> None:
    shop = Shop()
    app, hooks = make_app(shop.hooks)
    engine = WebhookReceiver.state(app).store.engine
    with app.app_context():
        with Session(engine) as session, session.begin():
            seen = hooks.observe(_api_response("pay_tx_rolled_back"), session=session)
            assert seen.stored == "inserted"
            session.rollback()
        assert WebhookReceiver.state(app).store.operations.get(str(seen.event_id)) is None
        with Session(engine) as session, session.begin():
            kept = hooks.observe(_api_response("pay_tx_kept"), session=session)
        assert WebhookReceiver.state(app).store.operations.get(str(kept.event_id)) is not None
        with pytest.raises(ValueError, match="after your commit"):
            with Session(engine) as session:
                hooks.observe(_api_response("pay_x"), session=session, dispatch=True)
    WebhookTestClient(app).drain()
    assert shop.fulfilled == Counter(pay_tx_kept=1)


@pytest.mark.parametrize("takes_session", [False, True], ids=["no session", "session"])
def test_a_handler_that_observes_its_refund_runs_once(
    make_app: AppFactory, takes_session: bool
) -> None:
    """Review of issue 28: a payment handler refunds and feeds the refund's response to
    ``observe(dispatch=True)``, without ``session=``. On SQLite the handler's worker holds
    the only write lock: the observation waited for it until the handler failed
    (StorageBusy), at every attempt, each making the refund again, then the dead-letter.
    Now, called from a handler on SQLite, it is stored in the handler's transaction and a
    worker dispatches it (``status`` None); on PostgreSQL it is dispatched inline."""
    hooks = WebhookReceiver()
    refunds: Counter[str] = Counter()
    seen: list[tuple[str, str | None]] = []

    def refund(event: Event) -> None:
        payment_id = event.payment.payment_id or ""
        refunds[f"made:{payment_id}"] += 1  # the processor's refund API, say
        response = build_event(
            "refund_succeeded", object_id=f"ref_{payment_id}", payment_id=payment_id
        )["content"]["object"]
        observed = hooks.observe(dict(response), dispatch=True, wait=1.0)
        seen.append((observed.stored, observed.status))

    if takes_session:  # stored in the handler's transaction on SQLite

        @hooks.on("payment_succeeded")
        def refund_in_session(event: Event, session: Session) -> None:
            refund(event)

    else:  # stored in the intake on SQLite
        hooks.on("payment_succeeded")(refund)

    @hooks.on("refund_succeeded")
    def refunded(event: Event) -> None:
        refunds[f"handled:{event.refund.refund_id}"] += 1

    app, _ = make_app(hooks, sqlite_busy_timeout=1, max_attempts=2)
    WebhookTestClient(app).post(_webhook("pay_1"))
    with app.app_context():
        hooks.drain(app)
        hooks.drain(app)
    sqlite = WebhookReceiver.state(app).store.engine.dialect.name == "sqlite"
    assert seen == [("inserted", None if sqlite else "done")]
    assert refunds == Counter({"made:pay_1": 1, "handled:ref_pay_1": 1})
    row = WebhookReceiver.state(app).store.operations.get(_event_id_of(app, "payment_succeeded"))
    assert row is not None and (row.status, row.attempts) == ("done", 1)


def _event_id_of(app: Flask, event_type: str) -> str:
    import sqlalchemy as sa

    with WebhookReceiver.state(app).store.engine.connect() as conn:
        return str(
            conn.execute(
                sa.text("SELECT event_id FROM hookledger_event WHERE event_type = :t"),
                {"t": event_type},
            ).scalar_one()
        )


def test_observe_refuses_what_is_not_an_api_object_and_skips_eventless_states(
    make_app: AppFactory,
) -> None:
    shop = Shop()
    app, hooks = make_app(shop.hooks)
    with app.app_context():
        with pytest.raises(NotAnObject):
            hooks.observe({"amount": 10})
        waiting = dict(_api_response("pay_new"), status="requires_payment_method")
        assert hooks.observe(waiting).stored == "no_event"
        refund = {"refund_id": "ref_1", "payment_id": "pay_1", "status": "succeeded"}
        assert hooks.observe(refund).kind == "refund"


def _race(app: Flask, hooks: WebhookReceiver, payment_ids: list[str]) -> Counter[str]:
    """Per payment, a webhook and an observed API response at the same moment, while a
    worker runs; returns how each observation ended (``done`` or ``duplicate``)."""
    ends: Counter[str] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []
    worker = WebhookReceiver.state(app).worker(name="race-worker", poll_interval=0.005)
    running = threading.Thread(target=worker.run, daemon=True)
    running.start()
    try:
        for payment_id in payment_ids:
            gate = threading.Barrier(2)

            def post(pid: str = payment_id, gate: threading.Barrier = gate) -> None:
                try:
                    client = WebhookTestClient(app)
                    gate.wait()
                    assert client.post(_webhook(pid)).status_code == 200
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)

            def observe(pid: str = payment_id, gate: threading.Barrier = gate) -> None:
                try:
                    with app.app_context():
                        gate.wait()
                        seen = hooks.observe(_api_response(pid), dispatch=True, wait=10)
                    with lock:
                        ends[str(seen.status)] += 1
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)

            threads = [threading.Thread(target=post), threading.Thread(target=observe)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
    finally:
        worker.stop()
        running.join(timeout=30)
    assert not errors, errors
    WebhookTestClient(app).drain()
    return ends


def test_webhook_and_api_response_racing_fulfil_once(make_app: AppFactory) -> None:
    shop = Shop()
    app, hooks = make_app(shop.hooks)
    ids = [f"pay_race_{n}" for n in range(25)]
    ends = _race(app, hooks, ids)
    assert shop.fulfilled == Counter({pid: 1 for pid in ids})
    # Every observation ended dispatched or a duplicate (never lost, never twice).
    assert set(ends) <= {"done", "duplicate"} and sum(ends.values()) == len(ids), ends
