"""Recoveries the reconciler could not finish in one run are looked at again, and a report
never says ``ok`` while one of them is unfinished (issue 20, items 9 and 10).

Each test lives through a real lifecycle (freezegun, the sandbox processor), runs the
reconciler as the schedule would, and checks every report against the merchant's side.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from receiver import Defer, Event
from receiver.storage.operator_actions import EventFilter
from receiver.storage.tables import EventStatus, Source
from reconcile.cli.context import EXIT_OK, EXIT_UNRESOLVED, exit_code
from reconcile.core.report import Report
from reconcile.runtime.runner import ReconcileOptions
from tests.conftest import AppFactory
from tests.reconcile.world import CARD_OK, World, world

pytestmark = pytest.mark.storage

DAY = timedelta(days=1)
CARD_DECLINED = "4000000000000002"
LISTS_ONLY = ReconcileOptions(sweep_budget=0)


def _card(number: str) -> dict[str, Any]:
    return {
        "card": {
            "card_number": number,
            "card_exp_month": "12",
            "card_exp_year": "2035",
            "card_cvc": "123",
        }
    }


def _remote(w: World, payment_id: str) -> str:
    return str(w.sandbox.get_payment(payment_id)["status"])


def _honest(w: World, report: Report, payment_id: str) -> None:
    """A report may say ok only when the projection equals the processor's state."""
    projected, remote = w.projected("payment", payment_id), _remote(w, payment_id)
    if projected != remote:
        assert report.status != "ok", (projected, remote, report.as_dict())


def test_a_queued_recovery_is_followed_until_the_projection_equals_the_processor(
    make_app: AppFactory,
) -> None:
    """Regression (issue 20, item 9): the run found the object with an event waiting
    (queued) and stopped following it because the processor's state is settled; the
    waiting ``payment_failed`` left the projection ``failed`` while the processor said
    ``succeeded``, and every later report said ok."""
    with world(make_app) as w:
        order_written = {"yes": False}
        hooks = w.app.extensions["hookledger"].registry

        @hooks.on("payment_failed", name="shop.release_stock")
        def release_stock(event: Event) -> None:
            if not order_written["yes"]:
                raise Defer(3600, "order not written yet")

        # The customer's first attempt is declined: payment_failed arrives and waits (the
        # shop has not written its order yet). The guard has projected it already.
        w.pay("pay_retried", card=CARD_DECLINED)
        w.settle()
        assert w.projected("payment", "pay_retried") == "failed"
        row = w.store.operations.select_events(EventFilter(event_types=("payment_failed",)))[0]
        assert row.status == EventStatus.PENDING
        # Five minutes later the customer retries and pays; that webhook is lost.
        w.advance(timedelta(minutes=5))
        w.drop_next("payment_succeeded")
        w.sandbox.confirm_payment("pay_retried", {"payment_method_data": _card(CARD_OK)})
        w.settle()
        assert _remote(w, "pay_retried") == "succeeded"

        reports: list[Report] = []
        for step in range(16):  # a run every 30 minutes, for 8 hours
            if step == 6:
                order_written["yes"] = True  # the shop catches up: payment_failed runs
            w.advance(timedelta(minutes=30))
            report = w.run()
            reports.append(report)
            _honest(w, report, "pay_retried")
        # While payment_failed waited, the runs said why they were not ok.
        first = reports[0]
        assert first.kinds["payments"].behind == 1, first.as_dict()
        assert first.kinds["payments"].queued == 0
        assert first.status == "unresolved"
        # Once it had run, the sweep (the lists no longer show a payment that old)
        # recovered the transition, and the object ended equal to the processor.
        recovered = [r for r in reports if r.recovered]
        assert len(recovered) == 1
        assert recovered[0].sweep["payments"].recovered == Counter(payment_succeeded=1)
        assert w.projected("payment", "pay_retried") == "succeeded"
        assert reports[-1].status == "ok"
        assert w.run(ReconcileOptions(mode="wide")).status == "ok"
        assert [key for key in w.order if key[1] == "pay_retried"] == [
            ("payment", "pay_retried", "failed"),
            ("payment", "pay_retried", "succeeded"),
        ]
        # Settled and in sync: the sweep no longer follows it.
        due, total = _due(w, "payment")
        assert total == 0, due


def test_a_queued_recovery_behind_the_same_transition_is_still_queued(
    make_app: AppFactory,
) -> None:
    """The other side of item 9: an object whose waiting event does reach the processor's
    state (the webhook arrived and waits for the worker) is queued, and the run is ok."""
    with world(make_app) as w:
        w.pay("pay_waiting")
        w.sandbox.deliver_due()  # stored, not yet dispatched
        report = w.run(LISTS_ONLY, drain=False)
        payments = report.kinds["payments"]
        assert (payments.queued, payments.behind, report.status) == (1, 0, "ok")
        w.drain()
        assert w.run(LISTS_ONLY).kinds["payments"].in_sync == 1


def _due(w: World, kind: str) -> tuple[list[Any], int]:
    from reconcile.recovery.sweep import FollowedObjects

    followed = FollowedObjects(w.store.engine)
    return followed.due(kind, limit=100)


def test_a_recovered_transition_whose_handlers_are_dead_is_unresolved(
    make_app: AppFactory,
) -> None:
    """Regression (issue 20, item 10): the recovered payment_succeeded put the projection
    in step with the processor, its handlers were dead-lettered, and the next run counted
    the payment in sync (ok, exit 0)."""
    with world(make_app, max_attempts=2) as w:
        warehouse_up = {"yes": False}
        hooks = w.app.extensions["hookledger"].registry

        @hooks.on("payment_succeeded", name="shop.fulfil")
        def fulfil(event: Event) -> None:
            if not warehouse_up["yes"]:
                raise RuntimeError("warehouse API down")

        w.drop_next("payment_succeeded")
        w.pay("pay_dead")
        w.settle()
        first = w.run(LISTS_ONLY)  # recovers it; the worker runs it until it is dead
        assert first.kinds["payments"].recovered == Counter(payment_succeeded=1)
        dead = w.store.operations.select_events(EventFilter(statuses=(EventStatus.DEAD,)))
        assert [(e.source, e.event_type) for e in dead] == [(Source.RECONCILE, "payment_succeeded")]
        assert w.projected("payment", "pay_dead") == "succeeded"

        second = w.run(LISTS_ONLY)
        assert second.status == "unresolved", second.as_dict()
        assert exit_code(second) == EXIT_UNRESOLVED
        payments = second.kinds["payments"]
        assert (payments.in_sync, payments.dead_lettered) == (0, 1), second.as_dict()
        assert "pay_dead" in payments.dead_lettered_sample[0]
        assert second.as_dict()["totals"]["dead_lettered"] == 1

        # The operator mends the warehouse and requeues: in sync, ok.
        warehouse_up["yes"] = True
        w.store.operations.requeue(EventFilter(statuses=(EventStatus.DEAD,)))
        w.drain()
        third = w.run(LISTS_ONLY)
        assert (third.kinds["payments"].in_sync, third.status) == (1, "ok")
        assert exit_code(third) == EXIT_OK
        assert w.handled[("payment", "pay_dead", "succeeded")] == 1


def test_a_swept_transition_whose_handlers_die_keeps_the_reports_unresolved(
    make_app: AppFactory,
) -> None:
    """Item 10 through the sweep: a late change to an old object (an authorisation expiring
    on day 7) is recovered, its handlers die; the object is no longer in any listed window,
    so only the sweep can look again, and it must."""
    with world(make_app, max_attempts=2) as w:
        hooks = w.app.extensions["hookledger"].registry
        mended = {"yes": False}

        @hooks.on("payment_expired", name="shop.release_hold")
        def release_hold(event: Event) -> None:
            if not mended["yes"]:
                raise RuntimeError("inventory service down")

        w.pay("pay_hold", manual=True)
        w.settle()
        assert w.run().status == "ok"
        w.drop_next("payment_expired")
        recovered: Report | None = None
        for _ in range(8):
            w.advance(DAY)
            report = w.run()
            if report.recovered:
                recovered = report
                break
            assert report.status == "ok", report.as_dict()
        assert recovered is not None
        assert recovered.sweep["payments"].recovered == Counter(payment_expired=1)
        assert w.projected("payment", "pay_hold") == "expired"
        assert len(w.store.operations.select_events(EventFilter(statuses=(EventStatus.DEAD,)))) == 1

        for _ in range(2):  # every run until someone acts says so
            w.advance(timedelta(minutes=30))
            report = w.run()
            assert exit_code(report) == EXIT_UNRESOLVED, report.as_dict()
            assert report.sweep["payments"].dead_lettered == 1, report.as_dict()

        mended["yes"] = True
        w.store.operations.requeue(EventFilter(statuses=(EventStatus.DEAD,)))
        w.drain()
        w.advance(timedelta(minutes=30))
        after = w.run()
        assert after.status == "ok" and after.sweep["payments"].in_sync == 1, after.as_dict()
        w.advance(timedelta(minutes=30))
        assert _due(w, "payment")[1] == 0  # in sync: no longer followed
        assert w.handled[("payment", "pay_hold", "expired")] == 1
