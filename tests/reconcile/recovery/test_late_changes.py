"""Late changes to old objects, their webhooks lost, recovered by the sweep or the events API.

Each test lives through days or months of a real lifecycle (freezegun), runs the reconciler
as the schedule would, and checks the transition reached the handlers once, by which path,
and that no report said ``ok`` while the merchant's side was wrong.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from receiver.storage.tables import Source
from reconcile.cli.context import EXIT_OK, exit_code
from reconcile.core.report import render
from reconcile.recovery.sweep import CAPTURED_REACH, SweepPolicy
from reconcile.runtime.runner import ReconcileOptions
from tests.conftest import AppFactory
from tests.reconcile.world import CARD_ASYNC, World, world

pytestmark = pytest.mark.storage

DAY = timedelta(days=1)


def _sweep(report: object, name: str) -> dict[str, int]:
    return dict(report.sweep[name].recovered)  # type: ignore[attr-defined]


def _daily(w: World, days: int) -> list[object]:
    """The schedule, day by day: an incremental run after each day (the nightly one)."""
    reports = []
    for _ in range(days):
        w.advance(DAY)
        reports.append(w.run())
    return reports


def _recovering(w: World, days: int = 2) -> object:
    """Run the schedule day by day until a run recovers something (the sweep checks an old
    object about daily); return that run's report. Every run must be honest: ok."""
    for report in _daily(w, days):
        assert report.status == "ok", report.as_dict()  # type: ignore[attr-defined]
        if report.recovered:  # type: ignore[attr-defined]
            return report
    raise AssertionError(f"nothing recovered within {days} days")


def _lost_without_request(w: World, payment_id: str) -> dict[str, Any]:
    """A payment whose ``payment_succeeded`` webhook is lost and whose request the events
    API has not recorded (the processor was stopped mid-delivery); returns that event."""
    w.drop_next("payment_succeeded")
    w.pay(payment_id)
    w.settle()
    lost = next(e for e in w.sandbox.events() if e["event_type"] == "payment_succeeded")
    w.sandbox.webhooks.unrecord_request(lost["event_id"])
    return lost


def test_an_authorisation_expiring_on_day_7_is_recovered_by_the_sweep(
    make_app: AppFactory,
) -> None:
    with world(make_app) as w:
        w.pay("pay_hold", manual=True)
        w.settle()
        assert w.run().status == "ok"
        assert w.projected("payment", "pay_hold") == "requires_capture"
        w.drop_next("payment_expired")
        reports = _daily(w, 8)
        # Nothing was wrong until the expiry; the run after it recovered it through the sweep.
        recovered = [r for r in reports if r.recovered]  # type: ignore[attr-defined]
        assert len(recovered) == 1
        assert _sweep(recovered[0], "payments") == {"payment_expired": 1}
        assert recovered[0].kinds["payments"].recovered == Counter()  # type: ignore[attr-defined]
        assert all(r.status == "ok" for r in reports)  # type: ignore[attr-defined]
        assert w.projected("payment", "pay_hold") == "expired"
        assert w.handled == Counter(
            {("payment", "pay_hold", "requires_capture"): 1, ("payment", "pay_hold", "expired"): 1}
        )
        # The recovered event is dated when the sweep saw the object change (its modified_at).
        assert recovered[0].sweep["payments"].dated_by == {"modified": 1}  # type: ignore[attr-defined]


def test_a_dispute_decided_a_month_later_and_reopened_is_recovered(
    make_app: AppFactory,
) -> None:
    with world(make_app) as w:
        w.pay("pay_disputed")
        w.settle()
        dispute = w.sandbox.open_dispute("pay_disputed")
        dispute_id = dispute["dispute_id"]
        w.sandbox.dispute_action(dispute_id, "challenge")
        w.settle()
        w.run()
        # Day 30: won, webhook lost. Day 45: taken to pre-arbitration (the processor sends
        # no webhook: dispute_opened was sent for this dispute). Day 90: lost, webhook lost.
        _daily(w, 30)
        w.drop_next("dispute_won")
        w.sandbox.dispute_action(dispute_id, "win")
        w.settle()
        won = _recovering(w)
        assert _sweep(won, "disputes") == {"dispute_won": 1}
        assert won.sweep["disputes"].dated_by == {"observed": 1}  # type: ignore[attr-defined]
        _daily(w, 15)
        w.sandbox.dispute_action(dispute_id, "pre_arbitration")
        w.settle()
        reopened = _recovering(w)
        assert _sweep(reopened, "disputes") == {"dispute_opened": 1}
        _daily(w, 45)
        w.drop_next("dispute_lost")
        w.sandbox.dispute_action(dispute_id, "lose")
        w.settle()
        lost = _recovering(w)
        assert _sweep(lost, "disputes") == {"dispute_lost": 1}
        assert w.projected("dispute", dispute_id) == "pre_arbitration/dispute_lost"
        assert [key for key in w.order if key[0] == "dispute"] == [
            ("dispute", dispute_id, "dispute/dispute_opened"),
            ("dispute", dispute_id, "dispute/dispute_challenged"),
            ("dispute", dispute_id, "dispute/dispute_won"),
            ("dispute", dispute_id, "pre_arbitration/dispute_opened"),
            ("dispute", dispute_id, "pre_arbitration/dispute_lost"),
        ]
        assert max(w.handled.values()) == 1


def test_a_payout_reversed_and_a_refund_failing_days_later_are_recovered(
    make_app: AppFactory,
) -> None:
    with world(make_app) as w:
        payout = w.sandbox.create_payout(
            {"amount": 4000, "currency": "USD", "payout_type": "bank", "auto_fulfill": True}
        )
        w.pay("pay_refunded")
        w.settle()
        refund = w.sandbox.create_refund({"payment_id": "pay_refunded", "amount": 1000})
        w.settle()
        w.run()
        _daily(w, 3)
        w.drop_next("payout_reversed")
        w.sandbox.reverse_payout(payout["payout_id"])
        w.drop_next("refund_failed")
        w.sandbox.fail_refund(refund["refund_id"])
        w.settle()
        report = _recovering(w)
        assert _sweep(report, "payouts") == {"payout_reversed": 1}
        assert _sweep(report, "refunds") == {"refund_failed": 1}
        assert w.projected("payout", payout["payout_id"]) == "reversed"
        assert w.projected("refund", refund["refund_id"]) == "failed"
        assert max(w.handled.values()) == 1


def test_a_void_after_capture_days_later_is_recovered_by_the_sweep(
    make_app: AppFactory,
) -> None:
    """Issue 28, hole 8: a captured payment is voided (``cancelled_post_capture``) days
    after it was created, out of every listed window, its webhook lost. The sweep follows
    captured payments while the processor can still move them, as it follows refunds and
    payouts: the void is recovered, once; a captured payment past that reach costs nothing."""
    with world(make_app) as w:
        w.pay("pay_voided")
        w.pay("pay_partial", manual=True)
        w.settle()
        w.sandbox.capture_payment("pay_partial", {"amount_to_capture": 2000})
        w.settle()
        assert w.projected("payment", "pay_partial") == "partially_captured"
        w.run()
        _daily(w, 4)
        for payment_id in ("pay_voided", "pay_partial"):
            w.drop_next("payment_cancelled_post_capture")
            w.sandbox.cancel_post_capture(payment_id, {"cancellation_reason": "fraudulent"})
        w.settle()
        report = _recovering(w)
        assert _sweep(report, "payments") == {"payment_cancelled_post_capture": 2}
        assert report.kinds["payments"].recovered == Counter()  # type: ignore[attr-defined]
        for payment_id in ("pay_voided", "pay_partial"):
            assert w.projected("payment", payment_id) == "cancelled_post_capture"
            assert w.handled[("payment", payment_id, "cancelled_post_capture")] == 1
        assert max(w.handled.values()) == 1
        # The cost is bounded: a captured payment is followed for CAPTURED_REACH (by its
        # creation), its checks spaced by its age (at most one a day), then no more.
        w.pay("pay_kept")
        w.settle()
        w.run()
        reach = SweepPolicy().horizon("payment", "succeeded")
        assert reach == CAPTURED_REACH < SweepPolicy().horizon("payment")
        checks = 0
        for report in _daily(w, reach.days + 2):
            assert report.status == "ok"  # type: ignore[attr-defined]
            checks += report.sweep["payments"].requests  # type: ignore[attr-defined]
        assert checks <= reach.days + 1
        assert report.sweep["payments"].due == 0  # type: ignore[attr-defined]


def test_a_revoked_mandate_is_recovered_by_the_sweep(make_app: AppFactory) -> None:
    with world(make_app) as w:
        mandate = w.sandbox.create_mandate(card_number="4242424242424242")
        w.settle()
        mandate_id = mandate["mandate_id"]
        assert w.projected("mandate", mandate_id) == "active"
        w.run()
        _daily(w, 60)
        w.drop_next("mandate_revoked")
        w.sandbox.revoke_mandate(mandate_id)
        w.settle()
        reports = _daily(w, 8)  # mandates are checked at least weekly
        assert sum(sum(r.sweep["mandates"].recovered.values()) for r in reports) == 1  # type: ignore[attr-defined]
        assert w.projected("mandate", mandate_id) == "revoked"


def test_an_async_capture_is_followed_through_processing(make_app: AppFactory) -> None:
    with world(make_app) as w:
        w.pay("pay_async", card=CARD_ASYNC, manual=True)
        w.settle()
        w.run()
        _daily(w, 2)
        w.drop_next("payment_processing")
        w.drop_next("payment_succeeded")
        w.sandbox.capture_payment("pay_async", {})
        w.settle()
        # The capture settles on the processor's next tick (the next day here), so the
        # sweep finds it settled, or first in flight (processing), then settled.
        found = Counter[str]()
        for report in _daily(w, 3):
            found.update(_sweep(report, "payments"))
        assert found["payment_succeeded"] == 1
        assert w.projected("payment", "pay_async") == "succeeded"
        keys = [k[2] for k in w.order]
        assert keys[0] == "requires_capture" and keys[-1] == "succeeded", keys


def test_a_recovered_payout_success_runs_after_the_initiation_waiting_for_a_retry(
    make_app: AppFactory,
) -> None:
    """Regression (reconciliation issue, item 2): recovered events were dated at the
    object's creation, so a recovered payout_success ran before a payout_initiated waiting
    for its retry, and the order ended in transit instead of paid."""
    with world(make_app, max_attempts=5) as w:
        failing = {"on": True}
        hooks = w.app.extensions["hookledger"].registry

        @hooks.on("payout_initiated", name="world.flaky")
        def flaky(event: object) -> None:
            if failing["on"]:
                raise RuntimeError("bank adapter down")

        payout = w.sandbox.create_payout(
            {"amount": 4055, "currency": "USD", "payout_type": "bank", "auto_fulfill": True}
        )
        w.settle()  # payout_initiated delivered; its handler fails and waits for a retry
        w.drop_next("payout_success")
        w.advance(timedelta(minutes=1))  # the processor's tick: success, webhook lost
        report = w.run(ReconcileOptions(sweep_budget=0))
        assert report.kinds["payouts"].recovered == Counter(payout_success=1)
        assert report.kinds["payouts"].dated_by == Counter(observed=1)
        failing["on"] = False
        w.advance(timedelta(hours=1))
        keys = [k[2] for k in w.order if k[0] == "payout"]
        assert keys == ["initiated", "success"], keys
        assert w.projected("payout", payout["payout_id"]) == "success"


def test_undelivered_webhooks_come_back_through_the_events_api_with_their_own_ids(
    make_app: AppFactory,
) -> None:
    with world(make_app, events_api=True) as w:
        w.drop_next("payment_succeeded")
        w.pay("pay_lost")
        w.settle()
        lost = next(e for e in w.sandbox.events() if e["event_type"] == "payment_succeeded")
        report = w.run(ReconcileOptions(sweep_budget=0))
        assert report.events is not None
        assert report.events.recovered == Counter(payment_succeeded=1)
        # Recovered by the events path under the original id: the lists found it queued.
        assert sum(report.kinds["payments"].recovered.values()) == 0
        row = w.store.operations.get(lost["event_id"])
        assert row is not None and row.source == Source.RECOVERED and row.status == "done"
        assert w.handled[("payment", "pay_lost", "succeeded")] == 1
        # A manual re-send by the processor is an exact duplicate now.
        w.sandbox.retry_event(w.sandbox.merchant_id, lost["event_id"])
        w.drain()
        assert w.handled[("payment", "pay_lost", "succeeded")] == 1
        assert w.run(ReconcileOptions(sweep_budget=0)).events.already_stored == 0  # type: ignore[union-attr]


def test_an_undelivered_webhook_whose_signature_does_not_verify_is_not_stored(
    make_app: AppFactory,
) -> None:
    with world(make_app, events_api=True) as w:
        w.reconciler.events.secrets = w.reconciler.events.secrets[1:]  # type: ignore[union-attr]
        w.drop_next("payment_succeeded")
        w.pay("pay_forged")
        w.settle()
        report = w.run(ReconcileOptions(sweep_budget=0))
        assert report.events is not None and report.events.bad_signature == 1
        assert report.status == "unresolved"
        assert all(
            w.store.operations.get(e["event_id"]) is None
            for e in w.sandbox.events()
            if e["event_type"] == "payment_succeeded"
        )


def test_an_undelivered_event_without_its_request_yet_waits_and_a_later_run_recovers_it(
    make_app: AppFactory,
) -> None:
    """Issue 18: the events API lists an undelivered event whose request is not recorded yet
    (the processor was killed mid-delivery). That is "not yet", like ``queued``: counted as
    waiting, never a bad row, the run is ok (exit 0); the events watermark waits for it, so
    a run days later, once the request exists, recovers it with its original id."""
    with world(make_app, events_api=True) as w:
        lost = _lost_without_request(w, "pay_killed")
        events_only = ReconcileOptions(kinds=[], sweep_budget=0)
        for _ in range(2):
            report = w.run(events_only)
            assert report.events is not None
            assert (report.events.waiting, report.events.bad_rows) == (1, 0), report.as_dict()
            assert report.events.unresolved == 0 and not report.events.recovered
            assert report.status == "ok" and exit_code(report) == EXIT_OK
            shown = report.as_dict()["events"]
            assert shown["waiting"] == 1
            assert "no stored request yet" in shown["waiting_sample"][0]
            assert "waiting 1" in render(report.as_dict())
            assert w.store.operations.get(lost["event_id"]) is None
            # Longer than the overlap of the incremental runs: only a held watermark keeps
            # the event in the next window.
            w.advance(DAY)
        w.sandbox.webhooks.record_request(lost["event_id"])
        w.advance(2 * DAY)
        report = w.run(events_only)
        assert report.events is not None and report.events.waiting == 0, report.as_dict()
        assert report.events.recovered == Counter(payment_succeeded=1)
        assert report.status == "ok"
        row = w.store.operations.get(lost["event_id"])
        assert row is not None and row.source == Source.RECOVERED and row.status == "done"
        assert w.handled[("payment", "pay_killed", "succeeded")] == 1
        # Nothing waits any more: the watermark moves on and the next run lists nothing new.
        w.advance(DAY)
        report = w.run(events_only)
        assert report.events is not None and report.events.listed == 0, report.as_dict()
        assert report.status == "ok"


def test_a_transition_the_lists_recovered_is_not_counted_again_when_its_webhook_comes_back(
    make_app: AppFactory,
) -> None:
    """The lists recover a lost ``payment_succeeded`` (synthesised) while the events API has
    no request for it yet; days later the events API returns the original webhook. It is
    stored under its own id (a re-send is then an exact duplicate), but the transition was
    recovered already: ``already_known``, not ``recovered`` a second time, and the handlers
    ran once. Summed over the runs, the reports recovered one transition."""
    with world(make_app, events_api=True) as w:
        lost = _lost_without_request(w, "pay_twice")
        first = w.run(ReconcileOptions(sweep_budget=0))
        assert first.events is not None and first.events.waiting == 1, first.as_dict()
        assert first.kinds["payments"].recovered == Counter(payment_succeeded=1)
        assert w.handled[("payment", "pay_twice", "succeeded")] == 1
        w.sandbox.webhooks.record_request(lost["event_id"])
        w.advance(2 * DAY)
        later = w.run(ReconcileOptions(sweep_budget=0))
        assert later.events is not None, later.as_dict()
        assert (later.events.recovered, later.events.already_known) == (Counter(), 1)
        assert later.recovered == 0 and later.status == "ok", later.as_dict()
        shown = later.as_dict()
        assert shown["events"]["already_known"] == 1
        assert "already known 1" in render(shown)
        row = w.store.operations.get(lost["event_id"])
        assert row is not None and row.source == Source.RECOVERED
        assert w.handled[("payment", "pay_twice", "succeeded")] == 1
        assert first.recovered + later.recovered == 1


def test_a_transition_waiting_in_the_inbox_is_known_to_the_events_api_path(
    make_app: AppFactory,
) -> None:
    """The same while the lists' synthesised event still waits in the inbox (no worker ran
    between the two runs): the original webhook is stored and counted ``already_known``;
    once the worker runs, the transition has reached the handlers once."""
    with world(make_app, events_api=True) as w:
        lost = _lost_without_request(w, "pay_waiting")
        first = w.run(ReconcileOptions(sweep_budget=0), drain=False)
        assert first.kinds["payments"].recovered == Counter(payment_succeeded=1)
        assert w.handled[("payment", "pay_waiting", "succeeded")] == 0
        w.sandbox.webhooks.record_request(lost["event_id"])
        later = w.run(ReconcileOptions(kinds=[], sweep_budget=0), drain=False)
        assert later.events is not None, later.as_dict()
        assert (later.events.recovered, later.events.already_known) == (Counter(), 1)
        w.drain()
        assert w.handled[("payment", "pay_waiting", "succeeded")] == 1
        assert w.projected("payment", "pay_waiting") == "succeeded"
