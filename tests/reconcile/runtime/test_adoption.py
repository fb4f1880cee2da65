"""Going live on an account with history (issue: meet the shop where it is), on SQLite and
PostgreSQL: adoption, the cut-over on every path, explicit backfill, resumable adoption."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from reconcile.core.errors import NotAdopted
from reconcile.runtime.adoption import Adopter, AdoptOptions, adoption_state
from reconcile.runtime.backfill import Backfill
from reconcile.runtime.runner import ReconcileOptions
from tests.conftest import AppFactory
from tests.reconcile.world import World, world

pytestmark = pytest.mark.storage

DAY = timedelta(days=1)


def _history(w: World) -> dict[str, str]:
    """Months of trading before hookledger: webhooks went to the shop's old system."""
    w.sandbox.webhook_url = None  # recorded by the processor, never delivered to hookledger
    made: dict[str, str] = {}
    for n in range(5):
        w.pay(f"pay_old_{n}")
        w.advance(timedelta(days=3))
    w.pay("pay_held", manual=True)  # authorised, not captured yet: it will expire
    made["dispute"] = w.sandbox.open_dispute("pay_old_0")["dispute_id"]
    w.advance(timedelta(hours=2))
    w.pay("pay_recent")  # half an hour before going live
    w.advance(timedelta(minutes=30))
    made["refund"] = w.sandbox.create_refund({"payment_id": "pay_old_1", "amount": 1077})[
        "refund_id"
    ]  # pending: it succeeds on the processor's next tick
    w.sandbox.webhook_url = "http://merchant.test/webhooks/"
    # The deploy, a second later (no tick: the refund is still pending). A change at the
    # very instant adoption starts counts as after it.
    w.frozen.move_to(w.now() + timedelta(seconds=1))
    return made


def test_a_first_run_on_an_account_with_history_refuses(make_app: AppFactory) -> None:
    with world(make_app, new_account=False) as w:
        _history(w)
        with pytest.raises(NotAdopted, match="reconcile adopt"):
            w.run()
        assert w.handled == Counter()


def test_adoption_records_history_and_no_path_dispatches_it(make_app: AppFactory) -> None:
    with world(make_app, new_account=False, events_api=True) as w:
        made = _history(w)
        before = w.now()
        report = Adopter(w.client, w.store).adopt(AdoptOptions(deployed_at=w.now()))
        assert report.finished and report.cutover_at is not None
        assert report.cutover_at >= before - timedelta(milliseconds=1)
        payments = report.kinds["payments"]
        assert payments.recorded == Counter(succeeded=6, requires_capture=1)
        assert report.kinds["disputes"].recorded == Counter({"dispute/dispute_opened": 1})
        assert report.kinds["refunds"].recorded == Counter(pending=1)
        assert adoption_state(w.store, w.reconciler.store) == "adopted"
        w.drain()
        assert w.handled == Counter()  # adoption dispatched nothing

        # A processor retry of a delivery from before the cut-over reaches hookledger now.
        old = next(e for e in w.sandbox.events() if e["object_id"] == "pay_old_4")
        from receiver.testing import WebhookTestClient

        WebhookTestClient(w.app).post(old["body"].encode())
        w.drain()
        row = w.store.operations.get(old["event_id"])
        assert row is not None and row.status in ("stale", "duplicate")
        assert w.handled == Counter()

        # Every path runs: lists (their window overlaps the cut-over), the sweep (every
        # unsettled adopted object), the events API (undelivered events of the history).
        first = w.run()
        assert first.status == "ok", first.as_dict()
        assert first.recovered == 0
        assert first.events is not None and first.events.before_cutover > 0
        assert w.handled == Counter()

        # What happens after the cut-over is dispatched, on every path: the refund succeeds
        # (webhook lost: the sweep), the authorisation expires (webhook lost: the sweep), the
        # dispute is won (webhook delivered), a new payment (webhook lost: events API).
        w.drop_next("refund_succeeded")
        w.drop_next("payment_expired")
        w.sandbox.dispute_action(made["dispute"], "win")
        w.drop_next("payment_succeeded")
        w.pay("pay_new")
        for _ in range(8):
            w.advance(DAY)
            assert w.run().status == "ok"
        assert w.handled == Counter(
            {
                ("refund", made["refund"], "succeeded"): 1,
                ("payment", "pay_held", "expired"): 1,
                ("dispute", made["dispute"], "dispute/dispute_won"): 1,
                ("payment", "pay_new", "succeeded"): 1,
            }
        )


def test_webhooks_that_reached_hookledger_before_adoption_are_its_own(
    make_app: AppFactory,
) -> None:
    with world(make_app, new_account=False) as w:
        _history(w)
        w.pay("pay_installed")  # hookledger is mounted: this webhook is stored...
        w.sandbox.deliver_due()  # ... but no worker has run yet
        Adopter(w.client, w.store).adopt(AdoptOptions(deployed_at=w.now()))
        w.drain()  # the worker starts after adoption
        assert w.handled == Counter({("payment", "pay_installed", "succeeded"): 1})


def test_backfill_counts_first_then_dispatches_what_adoption_recorded(
    make_app: AppFactory,
) -> None:
    with world(make_app, new_account=False) as w:
        start = w.now()
        _history(w)
        Adopter(w.client, w.store).adopt(AdoptOptions(deployed_at=w.now()))
        backfill = Backfill(w.reconciler)
        # pay_old_2 .. 4, pay_held and pay_recent (the dispute is not a payment)
        window = (start + timedelta(days=5), w.now())
        dry = backfill.run(*window, kinds=["payments"], dry_run=True)
        assert dry.kinds["payments"].recovered == Counter(payment_succeeded=4, payment_authorized=1)
        w.drain()
        assert w.handled == Counter()
        done = backfill.run(*window, kinds=["payments"], dry_run=False)
        assert done.kinds["payments"].recovered == dry.kinds["payments"].recovered
        w.drain()
        assert sorted(k[1] for k in w.handled) == [
            "pay_held",
            "pay_old_2",
            "pay_old_3",
            "pay_old_4",
            "pay_recent",
        ]
        assert set(w.handled.values()) == {1}
        # Backfilled once: a second backfill finds nothing adopted left there.
        again = backfill.run(*window, kinds=["payments"], dry_run=True)
        assert sum(again.kinds["payments"].recovered.values()) == 0


def test_adoption_is_resumable_within_a_request_budget(make_app: AppFactory) -> None:
    with world(make_app, new_account=False) as w:
        w.sandbox.webhook_url = None
        for n in range(12):
            w.pay(f"pay_many_{n}")
            w.advance(timedelta(days=2))
        adopter = Adopter(w.client, w.store)
        options = AdoptOptions(deployed_at=w.now(), kinds=["payments"], max_requests=3, page_size=2)
        first = adopter.adopt(options)
        assert not first.finished
        assert adoption_state(w.store, w.reconciler.store) == "adopting"
        with pytest.raises(Exception, match="adopt"):
            w.run()
        runs = 1
        while not adopter.adopt(options).finished:
            runs += 1
            assert runs < 20
        with w.store.engine.connect() as conn:
            total = conn.exec_driver_sql(
                "SELECT count(*) FROM hookledger_projection WHERE event_pk = 0"
            ).scalar()
        assert total == 12
        assert adoption_state(w.store, w.reconciler.store) == "adopted"
        assert w.run(ReconcileOptions(kinds=["payments"])).status == "ok"


# -- issue 20, items 4 to 8: the go-live cut-over ------------------------------------------


def _go_live(w: World) -> None:
    """The deploy: hookledger is sent webhooks from now on (a first delivery is stored)."""
    w.pay("pay_deployed")
    w.settle()
    w.frozen.move_to(w.now() + timedelta(minutes=20))  # no tick: nothing else moves


def _settle_days(w: World, days: int = 3, **run: object) -> None:
    for _ in range(days):
        w.advance(DAY)
        assert w.run(ReconcileOptions(**run) if run else None).status == "ok"  # type: ignore[arg-type]


def test_a_change_after_the_deploy_in_flight_when_adoption_began_is_dispatched(
    make_app: AppFactory,
) -> None:
    """Item 4: the capture's webhook is in flight (delayed) when adoption starts."""
    with world(make_app, new_account=False) as w:
        _history(w)
        _go_live(w)
        w.sandbox.faults.once("delay", event_type="payment_succeeded", seconds=3600)
        w.sandbox.capture_payment("pay_held", {})
        w.frozen.move_to(w.now() + timedelta(minutes=1))
        assert Adopter(w.client, w.store).adopt().finished  # bounded by the first delivery
        w.advance(timedelta(hours=2))  # the delivery lands
        _settle_days(w)
        assert w.handled[("payment", "pay_held", "succeeded")] == 1
        assert w.handled[("payment", "pay_deployed", "succeeded")] == 1
        assert all(n == 1 for n in w.handled.values())
        assert not [k for k in w.handled if k[1].startswith("pay_old")]


def test_a_change_after_the_deploy_whose_first_delivery_got_503_is_dispatched(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 4: the first delivery hookledger is ever sent gets a 503 (its database did not
    answer); the processor's retry lands after adoption began."""
    from receiver.core.errors import StorageUnavailable

    with world(make_app, new_account=False) as w:
        _history(w)
        inbox = w.store.inbox
        real = inbox.insert
        failed: list[str] = []

        def outage(event, body, **kw):  # type: ignore[no-untyped-def]
            if not failed:
                failed.append(event.event_id)
                raise StorageUnavailable("database unreachable")
            return real(event, body, **kw)

        monkeypatch.setattr(inbox, "insert", outage)
        w.sandbox.capture_payment("pay_held", {})
        w.settle()  # its first attempt: 503
        assert failed and w.store.operations.get(failed[0]) is None
        w.frozen.move_to(w.now() + timedelta(seconds=30))
        Adopter(w.client, w.store).adopt()  # before the processor's retry (a minute later)
        w.advance(timedelta(minutes=5))
        _settle_days(w)
        assert w.handled[("payment", "pay_held", "succeeded")] == 1
        assert all(n == 1 for n in w.handled.values())
        assert not [k for k in w.handled if k[1].startswith("pay_old")]


def test_a_change_adoption_reads_just_after_the_cutover_is_dispatched_if_its_webhook_is_lost(
    make_app: AppFactory,
) -> None:
    """Item 5: adoption (in several runs) reads an authorisation captured after the
    cut-over; the capture's webhook is lost."""
    with world(make_app, new_account=False) as w:
        w.sandbox.webhook_url = None
        w.pay("pay_auth_old", manual=True)
        w.advance(timedelta(days=3))
        w.pay("pay_recent_old")
        w.advance(timedelta(days=1))
        w.sandbox.webhook_url = "http://merchant.test/webhooks/"
        adopter = Adopter(w.client, w.store)
        options = AdoptOptions(
            deployed_at=w.now(), kinds=["payments"], max_requests=1, since=w.now() - 20 * DAY
        )
        assert not adopter.adopt(options).finished  # read the newest day only
        w.drop_next("payment_succeeded")
        w.frozen.move_to(w.now() + timedelta(minutes=1))
        w.sandbox.capture_payment("pay_auth_old", {})
        w.settle()
        runs = 1
        while not adopter.adopt(options).finished:
            runs += 1
            assert runs < 20
        w.drain()
        _settle_days(w, kinds=["payments"])
        assert w.handled == Counter({("payment", "pay_auth_old", "succeeded"): 1})


def test_a_late_retry_of_history_during_adoption_does_not_make_adoption_skip_the_object(
    make_app: AppFactory,
) -> None:
    """Item 6: an old delivery (the dispute's opening) retried while a multi-run adoption
    is under way is written off; adoption still records the dispute (won long ago)."""
    with world(make_app, new_account=False) as w:
        w.sandbox.webhook_url = None
        w.pay("pay_disputed")
        dispute = w.sandbox.open_dispute("pay_disputed")["dispute_id"]
        w.advance(timedelta(days=2))
        w.sandbox.dispute_action(dispute, "win")
        w.advance(timedelta(days=8))
        w.sandbox.webhook_url = "http://merchant.test/webhooks/"
        adopter = Adopter(w.client, w.store)
        options = AdoptOptions(
            deployed_at=w.now(), kinds=["disputes"], max_requests=1, since=w.now() - 20 * DAY
        )
        assert not adopter.adopt(options).finished
        opened = next(
            e
            for e in w.sandbox.events()
            if e["object_id"] == dispute and e["event_type"] == "dispute_opened"
        )
        from receiver.testing import WebhookTestClient

        WebhookTestClient(w.app).post(opened["body"].encode())  # the processor's late retry
        w.drain()
        row = w.store.operations.get(opened["event_id"])
        assert row is not None and row.status == "stale"
        runs = 1
        while not adopter.adopt(options).finished:
            runs += 1
            assert runs < 20
        assert w.projected("dispute", dispute) == "dispute/dispute_won"
        _settle_days(w, kinds=["disputes"])
        assert w.handled == Counter()


def test_a_late_retry_written_off_beside_other_objects_of_the_same_page(
    make_app: AppFactory,
) -> None:
    """Found by the world model (deep profile): when adoption recorded a page holding an
    object with a written-off retry beside others, its projections' write (several rows,
    an executemany) carried an expanding IN parameter: SQLAlchemy refused it, and every
    resumed ``reconcile adopt`` failed on that page."""
    from receiver.testing import WebhookTestClient

    with world(make_app, new_account=False) as w:
        w.sandbox.webhook_url = None
        disputes = []
        for payment in ("pay_disputed_1", "pay_disputed_2", "pay_disputed_3"):
            w.pay(payment)
            disputes.append(w.sandbox.open_dispute(payment)["dispute_id"])
        w.advance(timedelta(days=2))
        for dispute in disputes:
            w.sandbox.dispute_action(dispute, "win")
        w.advance(timedelta(days=8))
        w.sandbox.webhook_url = "http://merchant.test/webhooks/"
        opened = next(
            e
            for e in w.sandbox.events()
            if e["object_id"] == disputes[0] and e["event_type"] == "dispute_opened"
        )
        adopter = Adopter(w.client, w.store)
        options = AdoptOptions(
            deployed_at=w.now(), kinds=["disputes"], max_requests=1, since=w.now() - 20 * DAY
        )
        assert not adopter.adopt(options).finished
        WebhookTestClient(w.app).post(opened["body"].encode())  # the processor's late retry
        w.drain()
        runs = 1
        while not adopter.adopt(options).finished:
            runs += 1
            assert runs < 20
        for dispute in disputes:
            assert w.projected("dispute", dispute) == "dispute/dispute_won"
        _settle_days(w, kinds=["disputes"])
        assert w.handled == Counter()


def test_returning_to_the_state_adoption_recorded_does_not_run_its_handlers(
    make_app: AppFactory,
) -> None:
    """Item 7: an adopted authorisation's asynchronous capture fails after go-live; the
    payment returns to ``requires_capture``, which the earlier system handled."""
    from receiver.testing import WebhookTestClient

    with world(make_app, new_account=False) as w:
        _history(w)
        Adopter(w.client, w.store).adopt(AdoptOptions(deployed_at=w.now()))
        assert w.projected("payment", "pay_held") == "requires_capture"
        hooks = WebhookTestClient(w.app)
        w.frozen.move_to(w.now() + timedelta(minutes=5))
        hooks.send("payment_processing", object_id="pay_held", timestamp=w.now())
        w.drain()
        w.frozen.move_to(w.now() + timedelta(minutes=5))
        hooks.send(
            "payment_authorized",
            object_id="pay_held",
            status="requires_capture",
            timestamp=w.now(),
        )
        w.drain()
        assert w.projected("payment", "pay_held") == "requires_capture"
        assert w.handled == Counter({("payment", "pay_held", "processing"): 1})


def test_observing_an_object_older_than_adoptions_reach_does_not_dispatch_its_history(
    make_app: AppFactory,
) -> None:
    """Item 8: a 60-day-old order, looked up while refunding it."""
    from receiver import WebhookReceiver

    with world(make_app, new_account=False) as w:
        w.sandbox.webhook_url = None
        w.pay("pay_ancient")
        w.advance(timedelta(days=60))
        w.sandbox.webhook_url = "http://merchant.test/webhooks/"
        report = Adopter(w.client, w.store).adopt(AdoptOptions(deployed_at=w.now()))
        assert report.kinds["payments"].listed == 0  # older than adoption's reach
        seen = WebhookReceiver().observe(
            w.sandbox.get_payment("pay_ancient"), dispatch=True, app=w.app
        )
        assert seen.stored == "inserted" and seen.status == "stale"
        assert not seen.dispatched_here
        assert w.handled == Counter()
        # What the shop does after go-live is dispatched on observing it.
        w.pay("pay_today", manual=True)
        w.sandbox.webhook_url = None
        w.sandbox.capture_payment("pay_today", {})
        later = WebhookReceiver().observe(
            w.sandbox.get_payment("pay_today"), dispatch=True, app=w.app
        )
        assert later.dispatched_here


def test_a_new_accounts_first_run_reads_from_its_declaration(make_app: AppFactory) -> None:
    """Regression (found by the world model, tests/model): ``adopt --new-account`` started no
    watermark, so a first run days later read only its 48-hour lookback: a payment made
    between the declaration and then, its webhook lost, was never recovered."""
    with world(make_app, new_account=False) as w:
        Adopter(w.client, w.store).declare_new_account()
        w.advance(timedelta(hours=1))
        w.drop_next("payment_succeeded")
        w.pay("pay_early")
        w.settle()
        w.advance(timedelta(days=4))  # the first run comes days later
        report = w.run(ReconcileOptions(sweep_budget=0))
        assert report.kinds["payments"].recovered == Counter(payment_succeeded=1)
        assert w.projected("payment", "pay_early") == "succeeded"
