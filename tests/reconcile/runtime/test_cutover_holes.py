"""Issue 28, holes 2 to 5: the cut-over an adoption records is the adopted account's own,
stays where it was recorded, no later delivery moves the end of history back before it,
every path (the events API too) dispatches what happened after history ended, and what a
seller's account recovers names the seller's merchant; on the platform's default account
and on a seller's (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import pytest

from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.testing import WebhookTestClient
from reconcile.runtime.adoption import Adopter, AdoptOptions
from reconcile.runtime.runner import ReconcileOptions
from tests.conftest import AppFactory
from tests.reconcile.platform import START, Platform, platform
from tests.reconcile.world import world

pytestmark = pytest.mark.storage

DAY = timedelta(days=1)


def _retry(p: Platform, account: str, payment_id: str) -> None:
    """The processor's retry of ``payment_id``'s ``payment_succeeded`` delivery (the same
    signed bytes as its first attempt), at the account's URL."""
    side = p.sides[account]
    sent = next(
        e
        for e in side.sandbox.events()
        if e["object_id"] == payment_id and e["event_type"] == "payment_succeeded"
    )
    url_account = None if account == DEFAULT_ACCOUNT else account
    client = WebhookTestClient(p.app, account=url_account, secret=side.sandbox.webhook_secret)
    assert client.post(sent["body"].encode()).status_code == 200


@pytest.mark.parametrize("account", [DEFAULT_ACCOUNT, "seller_a"])
def test_a_retry_just_after_adoption_of_a_payment_adoption_recorded_is_not_dispatched(
    make_app: AppFactory, account: str
) -> None:
    """Hole 3: a payment succeeded two minutes before ``reconcile adopt``; its webhook went
    to the earlier system (which handled it) and failed; adoption records it as seen. The
    processor's retry of that delivery reaches hookledger a minute after adoption: it is the
    first delivery hookledger ever gets, yet history still ends at the cut-over."""
    with platform(make_app, adopted=True) as p:
        p.silence(account)
        p.pay(account, "pay_old")
        p.advance(3 * DAY)
        p.pay(account, "pay_last")  # handled by the earlier system, minutes before go-live
        p.frozen.move_to(p.now() + timedelta(minutes=2))
        p.silence(account, False)
        report = p.adopt(account)
        assert report.finished
        assert report.kinds["payments"].recorded == Counter(succeeded=2)
        assert p.projected(account, "payment", "pay_last") == "succeeded"
        p.frozen.move_to(p.now() + timedelta(minutes=1))
        _retry(p, account, "pay_last")
        p.drain()
        assert p.handled == Counter()
        cut = p.store.operations.cutover(account=account)
        assert cut is not None and cut.first_delivery is not None
        assert cut.history_ends == cut.at
        # Nothing later dispatches it either.
        for _ in range(2):
            p.advance(DAY)
            assert p.run(account).status == "ok"
        assert p.handled == Counter()


def test_a_seller_adopted_after_the_default_account_gets_its_own_cutover(
    make_app: AppFactory,
) -> None:
    """Hole 2 (a): the platform's own account is adopted; a month later a seller with a
    month of history of its own is onboarded. Its adoption records the seller's cut-over
    (not the platform's month-old one), its whole history is recorded as seen, and its
    first runs dispatch none of it."""
    with platform(make_app, adopted=True) as p:
        p.silence(DEFAULT_ACCOUNT)
        p.pay(DEFAULT_ACCOUNT, "pay_platform_old")
        p.advance(DAY)
        p.silence(DEFAULT_ACCOUNT, False)
        assert p.adopt(DEFAULT_ACCOUNT).finished
        platform_cut = p.store.operations.cutover()
        assert platform_cut is not None
        p.silence("seller_a")  # the seller's earlier system, for a month
        for n in range(10):
            p.advance(3 * DAY)
            p.pay("seller_a", f"pay_seller_{n}")
        p.advance(timedelta(hours=1))
        p.silence("seller_a", False)
        onboarded = p.now()
        report = p.adopt("seller_a")
        assert report.finished, report.as_dict()
        assert report.cutover_at is not None and report.cutover_at >= onboarded - timedelta(
            milliseconds=1
        )
        assert report.kinds["payments"].recorded == Counter(succeeded=10)
        seller_cut = p.store.operations.cutover(account="seller_a")
        assert seller_cut is not None and seller_cut.at == report.cutover_at
        assert p.store.operations.cutover() == platform_cut  # the platform's is untouched
        for _ in range(2):
            p.advance(DAY)
            for account in p.sides:
                assert p.run(account).status == "ok"
        assert p.handled == Counter()


def test_resuming_a_sellers_adoption_keeps_its_cutover(make_app: AppFactory) -> None:
    """Hole 2 (b): a seller's adoption runs out of its request budget; an authorisation is
    captured before it is resumed (the capture's webhook lost). The resumed adoption keeps
    the cut-over its first run recorded, so the capture, which came after it, is
    dispatched, not written off as history."""
    with platform(make_app, adopted=True) as p:
        p.silence("seller_a")
        p.pay("seller_a", "pay_auth_old", manual=True)
        p.advance(3 * DAY)
        p.pay("seller_a", "pay_recent_old")
        p.advance(DAY)
        p.silence("seller_a", False)
        options = AdoptOptions(kinds=["payments"], max_requests=1, since=p.now() - 20 * DAY)
        first = p.adopt("seller_a", options)
        assert not first.finished  # read the newest day only
        cut = p.store.operations.cutover(account="seller_a")
        assert cut is not None and cut.at == first.cutover_at
        p.frozen.move_to(p.now() + timedelta(minutes=1))
        p.sides["seller_a"].sandbox.faults.once("drop", event_type="payment_succeeded")
        p.sides["seller_a"].sandbox.capture_payment("pay_auth_old", {})
        p.settle()
        p.frozen.move_to(p.now() + timedelta(minutes=1))
        runs = 1
        while not (resumed := p.adopt("seller_a", options)).finished:
            assert resumed.cutover_at == first.cutover_at
            runs += 1
            assert runs < 20
        assert resumed.cutover_at == first.cutover_at
        assert p.store.operations.cutover(account="seller_a") == cut
        p.drain()
        for _ in range(3):
            p.advance(DAY)
            assert p.run("seller_a", ReconcileOptions(kinds=["payments"])).status == "ok"
        assert p.handled == Counter({("seller_a", "payment", "pay_auth_old", "succeeded"): 1})


def test_adoption_progress_toward_another_cutover_is_read_again(make_app: AppFactory) -> None:
    """Upgrade: a seller adopted by an earlier version has its progress recorded toward the
    platform's cut-over and no cut-over of its own. Adopting it again records its own and
    reads its history again up to it (what was recorded stays so, nothing is dispatched)."""
    from sqlalchemy import delete, update

    from receiver.storage.tables import CutOver as CutOverRow
    from reconcile.storage.tables import Adoption

    progress = Adoption.__table__  # type: ignore[attr-defined]
    cutovers = CutOverRow.__table__  # type: ignore[attr-defined]
    with platform(make_app, adopted=True) as p:
        p.silence(DEFAULT_ACCOUNT)
        p.silence("seller_a")
        p.pay("seller_a", "pay_seller_old")
        p.advance(DAY)
        assert p.adopt(DEFAULT_ACCOUNT).finished
        platform_cut = p.store.operations.cutover()
        assert platform_cut is not None
        p.advance(DAY)
        p.pay("seller_a", "pay_seller_recent")
        p.advance(timedelta(hours=1))
        assert p.adopt("seller_a", AdoptOptions(kinds=["payments"])).finished
        with p.store.engine.begin() as conn:  # what the earlier version left
            conn.execute(
                update(progress)
                .where(progress.c.account == "seller_a")
                .values(cutover_at=platform_cut.at)
            )
            conn.execute(delete(cutovers).where(cutovers.c.account == "seller_a"))
        p.advance(timedelta(hours=1))
        p.silence("seller_a", False)
        again = p.adopt("seller_a", AdoptOptions(kinds=["payments"]))
        assert again.finished
        assert again.kinds["payments"].listed == 2
        seller_cut = p.store.operations.cutover(account="seller_a")
        assert seller_cut is not None and seller_cut.at == again.cutover_at
        assert seller_cut.at > platform_cut.at
        assert p.projected("seller_a", "payment", "pay_seller_recent") == "succeeded"
        p.advance(DAY)
        assert p.run("seller_a", ReconcileOptions(kinds=["payments"])).status == "ok"
        assert p.handled == Counter()


def test_an_undelivered_dispute_change_after_the_deploy_is_dispatched_by_the_events_path(
    make_app: AppFactory,
) -> None:
    """Hole 4: the deploy points the processor at hookledger (a first delivery); ten minutes
    later a dispute opened long before is won, its webhook lost; adoption starts ten
    minutes after that and records the dispute, won, as seen (a dispute carries no
    modification time). History ended at the deploy: the events API's undelivered
    ``dispute_won`` is dispatched, not counted ``before_cutover``."""
    with world(make_app, new_account=False, events_api=True) as w:
        w.sandbox.webhook_url = None  # the earlier system's days
        w.pay("pay_disputed")
        dispute = w.sandbox.open_dispute("pay_disputed")["dispute_id"]
        w.advance(2 * DAY)
        w.sandbox.webhook_url = "http://merchant.test/webhooks/"
        w.pay("pay_deployed")  # the deploy: hookledger's first delivery
        w.settle()
        w.frozen.move_to(w.now() + timedelta(minutes=10))
        w.drop_next("dispute_won")
        w.sandbox.dispute_action(dispute, "win")
        w.settle()
        w.frozen.move_to(w.now() + timedelta(minutes=10))
        report = Adopter(w.client, w.store).adopt()
        assert report.finished
        assert report.history_ends is not None and report.cutover_at is not None
        assert report.history_ends < report.cutover_at - timedelta(minutes=20)
        assert report.kinds["disputes"].recorded == Counter({"dispute/dispute_won": 1})
        w.frozen.move_to(w.now() + timedelta(minutes=5))
        first = w.run()
        assert first.status == "ok", first.as_dict()
        assert first.events is not None
        assert first.events.recovered == Counter(dispute_won=1)
        w.drain()
        assert w.handled[("dispute", dispute, "dispute/dispute_won")] == 1
        assert w.handled == Counter(
            {
                ("payment", "pay_deployed", "succeeded"): 1,
                ("dispute", dispute, "dispute/dispute_won"): 1,
            }
        )


def test_a_sellers_recovered_events_name_its_own_merchant(make_app: AppFactory) -> None:
    """Hole 5: whatever merchant id the run is given (the platform's, as the CLI gave every
    account before), a seller's recovered payment names the merchant the payment names, and
    its refund (which names none) the seller account's: the handlers see the seller."""
    from receiver.core.objects import event_body

    with platform(make_app) as p:
        seller = p.sides["seller_a"].sandbox
        seller.faults.once("drop", count=5)
        p.pay("seller_a", "pay_sold")
        refund = seller.create_refund({"payment_id": "pay_sold", "amount": 700})
        p.settle()
        assert p.handled == Counter()
        given = ReconcileOptions(merchant_id="merchant_platform")
        assert p.run("seller_a", given).status == "ok"
        assert p.merchants == {
            ("seller_a", "payment", "pay_sold"): {"merchant_seller_a"},
            ("seller_a", "refund", refund["refund_id"]): {"merchant_seller_a"},
        }
    # The object's own merchant wins over the one given; the one given fills a gap.
    named = event_body(
        "payment",
        {"payment_id": "pay_1", "merchant_id": "m_own", "status": "succeeded"},
        event_id="evt_1",
        event_type="payment_succeeded",
        timestamp=START,
        merchant_id="m_given",
    )
    assert json.loads(named)["merchant_id"] == "m_own"
    unnamed = event_body(
        "refund",
        {"refund_id": "ref_1", "status": "succeeded"},
        event_id="evt_2",
        event_type="refund_succeeded",
        timestamp=START,
        merchant_id="m_given",
    )
    assert json.loads(unnamed)["merchant_id"] == "m_given"
