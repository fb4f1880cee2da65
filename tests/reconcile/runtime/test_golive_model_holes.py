"""Two holes the world model (tests/model) found in going live, on SQLite and PostgreSQL:

- an ``observe()`` of a mandate hookledger never saw, on an adopted account: a mandate
  carries no time at all, so nothing shows it is not the earlier system's; it is recorded
  as adoption records what it reads (never dispatched by the observation alone), and its
  webhook, dated after the history's end, still dispatches it;
- ``reconcile adopt`` when no webhook reached hookledger since the deploy: history ends at
  the deploy hookledger recorded, not at the cut-over.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from receiver import WebhookReceiver
from receiver.core.accounts import DEFAULT_ACCOUNT
from reconcile.cli.commands import cli as reconcile_cli
from reconcile.runtime.adoption import Adopter, AdoptOptions, DeployTooEarly, DeployUnknown
from reconcile.runtime.runner import ReconcileOptions
from tests.conftest import AppFactory
from tests.reconcile.platform import Platform, platform
from tests.reconcile.world import World, world

pytestmark = pytest.mark.storage

DAY = timedelta(days=1)
MERCHANT_URL = "http://merchant.test/webhooks/"


def _observe(w: World, mandate_id: str) -> tuple[str | None, str]:
    seen = WebhookReceiver().observe(w.sandbox.get_mandate(mandate_id), dispatch=True, app=w.app)
    assert seen.stored == "inserted"
    row = w.store.operations.get(seen.event_id or "")
    assert row is not None
    return seen.status, row.last_error or ""


def test_observing_a_mandate_the_earlier_system_handled_does_not_dispatch_it(
    make_app: AppFactory,
) -> None:
    with world(make_app, new_account=False) as w:
        w.sandbox.webhook_url = None  # the earlier system's time: it handled mandate_active
        old = w.sandbox.create_mandate()["mandate_id"]
        w.advance(DAY)
        w.sandbox.webhook_url = MERCHANT_URL
        w.frozen.move_to(w.now() + timedelta(seconds=1))
        assert Adopter(w.client, w.store).adopt(AdoptOptions(deployed_at=w.now())).finished
        w.frozen.move_to(w.now() + timedelta(hours=1))
        status, reason = _observe(w, old)  # the shop looks it up (a renewal, say)
        assert status == "stale"
        assert "carries no time" in reason
        assert w.handled == Counter()
        assert w.projected("mandate", old) == "active"
        # Its revocation, after go-live, is dispatched (once) when its webhook comes.
        w.sandbox.revoke_mandate(old)
        w.settle()
        assert w.handled == Counter({("mandate", old, "revoked"): 1})


def test_a_mandate_created_after_go_live_observed_before_its_webhook_is_dispatched_once(
    make_app: AppFactory,
) -> None:
    with world(make_app, new_account=False) as w:
        w.sandbox.webhook_url = None
        w.pay("pay_old")
        w.advance(DAY)
        w.sandbox.webhook_url = MERCHANT_URL
        w.frozen.move_to(w.now() + timedelta(seconds=1))
        assert Adopter(w.client, w.store).adopt(AdoptOptions(deployed_at=w.now())).finished
        w.frozen.move_to(w.now() + timedelta(minutes=10))
        w.sandbox.faults.once("delay", event_type="mandate_active", seconds=600)
        new = w.sandbox.create_mandate()["mandate_id"]
        w.settle()
        status, _ = _observe(w, new)  # before its webhook: it cannot tell it is new
        assert status == "stale"
        assert w.handled == Counter()
        w.advance(timedelta(hours=1))  # the webhook lands, dated after the cut-over
        assert w.handled == Counter({("mandate", new, "active"): 1})
        # Observed again, and after its webhook: a duplicate.
        again = WebhookReceiver().observe(w.sandbox.get_mandate(new), dispatch=True, app=w.app)
        assert again.stored == "duplicate"
        for _ in range(2):
            w.advance(DAY)
            assert w.run().status == "ok"
        assert w.handled == Counter({("mandate", new, "active"): 1})


def test_a_payout_observed_before_its_reversals_webhook_is_dispatched_by_that_webhook(
    make_app: AppFactory,
) -> None:
    """A payout from before the cut-over, older than adoption's reach, reversed after go-live:
    the shop observes it (dated only by its creation) before the reversal's webhook lands.
    The observation is recorded, not dispatched; the webhook, dated after the cut-over, is
    not a duplicate of it."""
    with world(make_app, new_account=False) as w:
        w.sandbox.webhook_url = None
        payout = w.sandbox.create_payout(
            {"amount": 1200, "currency": "USD", "payout_type": "bank", "auto_fulfill": True}
        )["payout_id"]
        w.advance(5 * DAY)
        w.sandbox.webhook_url = MERCHANT_URL
        w.frozen.move_to(w.now() + timedelta(seconds=1))
        options = AdoptOptions(
            deployed_at=w.now(), since=w.now() - DAY
        )  # the payout is older than this reach
        assert Adopter(w.client, w.store).adopt(options).finished
        w.frozen.move_to(w.now() + timedelta(minutes=10))
        w.sandbox.faults.once("delay", event_type="payout_reversed", seconds=600)
        w.sandbox.reverse_payout(payout)
        w.settle()
        seen = WebhookReceiver().observe(w.sandbox.get_payout(payout), dispatch=True, app=w.app)
        assert seen.status == "stale"
        assert w.handled == Counter()
        w.advance(timedelta(hours=1))  # the reversal's webhook lands
        assert w.handled == Counter({("payout", payout, "reversed"): 1})


# -- adoption when no webhook reached hookledger since the deploy ---------------------------


def _adopter(p: Platform, account: str) -> Adopter:
    side = p.sides[account]
    accounts = WebhookReceiver.state(p.app).accounts
    return Adopter(side.client, p.store, account=account, accounts=accounts)


@pytest.mark.parametrize("account", [DEFAULT_ACCOUNT, "seller_a"])
def test_adoption_before_any_delivery_refuses_to_guess_where_history_ends(
    make_app: AppFactory, account: str
) -> None:
    """No webhook reached hookledger since the deploy: adoption cannot tell the deploy from
    the cut-over, so it refuses (it used to take the cut-over and write off the payment
    paid after the deploy). Told the deploy, it dispatches that payment, once."""
    with platform(make_app, adopted=True) as p:
        deployed = _deploy_then_lose_a_payment(p, account)
        with pytest.raises(DeployUnknown, match="--deployed-at"):
            _adopter(p, account).adopt()
        with pytest.raises(DeployUnknown):
            _adopter(p, account).adopt(AdoptOptions(dry_run=True))
        assert p.store.operations.cutover(account=account) is None  # nothing recorded
        report = _adopter(p, account).adopt(AdoptOptions(deployed_at=deployed))
        assert report.finished and report.history_ends == deployed
        assert report.kinds["payments"].recorded == Counter(succeeded=1)  # pay_old
        p.drain()
        assert p.handled == Counter({(account, "payment", "pay_after_deploy", "succeeded"): 1})
        cut = p.store.operations.cutover(account=account)
        assert cut is not None and cut.deployed_at == deployed and cut.history_ends == deployed
        for _ in range(2):  # the processor's retry lands: a duplicate
            p.advance(DAY)
            assert p.run(account).status == "ok"
        assert p.handled == Counter({(account, "payment", "pay_after_deploy", "succeeded"): 1})


def _deploy_then_lose_a_payment(p: Platform, account: str) -> datetime:
    """Days of the earlier system; the deploy; ten minutes later a payment whose webhook's
    first attempt is lost on the way (the processor retries it later). Returns the
    deploy's time."""
    p.silence(account)
    p.pay(account, "pay_old")
    p.advance(3 * DAY)
    p.silence(account, False)  # the deploy
    deployed = p.now()
    p.frozen.move_to(p.now() + timedelta(minutes=10))
    p.sides[account].sandbox.faults.once("drop", event_type="payment_succeeded")
    p.pay(account, "pay_after_deploy")
    p.settle()
    p.frozen.move_to(p.now() + timedelta(seconds=30))  # before the processor's retry
    return deployed


def test_a_resumed_adoption_keeps_the_deploy_its_first_run_was_told(
    make_app: AppFactory,
) -> None:
    """A seller's adoption, told the deploy, runs out of its request budget; resumed (with
    the same deploy, or none), it keeps both the cut-over and the deploy; a different one
    is refused."""
    with platform(make_app, adopted=True) as p:
        deployed = _deploy_then_lose_a_payment(p, "seller_a")
        options = AdoptOptions(
            kinds=["payments"], max_requests=1, since=p.now() - 20 * DAY, deployed_at=deployed
        )
        first = _adopter(p, "seller_a").adopt(options)
        assert not first.finished
        cut = p.store.operations.cutover(account="seller_a")
        assert cut is not None and cut.history_ends == deployed
        p.frozen.move_to(p.now() + timedelta(minutes=1))
        with pytest.raises(ValueError, match="never moves it"):
            _adopter(p, "seller_a").adopt(
                AdoptOptions(kinds=["payments"], deployed_at=deployed + timedelta(minutes=5))
            )
        resumed = _adopter(p, "seller_a").adopt(options)
        runs = 1
        without = AdoptOptions(kinds=["payments"], max_requests=1, since=p.now() - 20 * DAY)
        while not resumed.finished:
            assert resumed.cutover_at == first.cutover_at
            resumed = _adopter(p, "seller_a").adopt(without)
            runs += 1
            assert runs < 20
        assert p.store.operations.cutover(account="seller_a") == cut
        p.drain()
        for _ in range(2):
            p.advance(DAY)
            assert p.run("seller_a", ReconcileOptions(kinds=["payments"])).status == "ok"
        assert p.handled == Counter({("seller_a", "payment", "pay_after_deploy", "succeeded"): 1})


def test_a_deploy_mistyped_before_the_history_adoption_reads_is_refused(
    make_app: AppFactory,
) -> None:
    """Review of issue 28: ``--deployed-at`` a year early (a mistyped year), no webhook near
    it. Every object adoption read was then dated after the history's end and dispatched:
    the earlier system's whole history shipped again. Refused (dry run too), nothing
    recorded; the real deploy works. A deploy before the history adoption reads is taken
    when a webhook reached hookledger within a day of it, or with --since before it."""
    with platform(make_app, adopted=True) as p:
        deployed = _deploy_then_lose_a_payment(p, "seller_a")
        typo = deployed - 365 * DAY
        for dry_run in (True, False):
            with pytest.raises(DeployTooEarly, match="--since"):
                _adopter(p, "seller_a").adopt(AdoptOptions(deployed_at=typo, dry_run=dry_run))
        assert p.store.operations.cutover(account="seller_a") is None
        dry = _adopter(p, "seller_a").adopt(
            AdoptOptions(deployed_at=typo, since=typo - DAY, dry_run=True)
        )
        assert dry.history_ends == typo  # told twice: what it asked for (a dry run here)
        report = _adopter(p, "seller_a").adopt(AdoptOptions(deployed_at=deployed))
        assert report.finished and report.history_ends == deployed
        p.drain()
        assert p.handled == Counter({("seller_a", "payment", "pay_after_deploy", "succeeded"): 1})
    with platform(make_app, adopted=True) as p:
        p.silence("seller_a")
        p.pay("seller_a", "pay_old")
        p.advance(3 * DAY)
        p.silence("seller_a", False)  # the deploy; its webhooks reach hookledger
        deployed = p.now()
        p.pay("seller_a", "pay_new")
        p.settle()
        p.advance(3 * DAY)
        report = _adopter(p, "seller_a").adopt(
            AdoptOptions(deployed_at=deployed, since=p.now() - DAY)
        )
        assert report.finished and report.history_ends == deployed


def test_reconcile_adopt_before_any_delivery_exits_2_naming_deployed_at(
    database_url: str,
) -> None:
    env = {
        "HOOKLEDGER_DATABASE_URL": database_url,
        "HOOKLEDGER_API_KEY": "snd_golive_key_0001",
        "HOOKLEDGER_PROCESSOR_URL": "http://processor.invalid",
    }
    runner = CliRunner()
    assert runner.invoke(reconcile_cli, ["db", "upgrade"], env=env).exit_code == 0
    refused = runner.invoke(reconcile_cli, ["adopt"], env=env)
    assert refused.exit_code == 2, refused.output
    assert "no webhook has reached hookledger" in refused.stderr
    assert "--deployed-at" in refused.stderr
    future = runner.invoke(reconcile_cli, ["adopt", "--deployed-at", "2999-01-01"], env=env)
    assert future.exit_code == 2 and "in the future" in future.stderr


def test_history_ends_at_the_earliest_of_the_cutover_the_deploy_and_the_first_delivery() -> None:
    from receiver.core.guard import DELIVERY_SLACK, CutOver

    at = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    deployed = at - timedelta(hours=2)
    told = CutOver(at=at, recorded_at=at, deployed_at=deployed)
    assert told.history_ends == deployed
    # A delivery after the deploy (a retry, or the first that got through) moves nothing.
    for first in (deployed + timedelta(minutes=1), at + timedelta(minutes=1)):
        assert (
            CutOver(at=at, recorded_at=at, deployed_at=deployed, first_delivery=first).history_ends
            == deployed
        )
    # A deploy stated too late is bounded by the first delivery.
    early = deployed - timedelta(hours=1)
    assert (
        CutOver(at=at, recorded_at=at, deployed_at=deployed, first_delivery=early).history_ends
        == early - DELIVERY_SLACK
    )
    # A deploy "after" the cut-over: the cut-over.
    late = CutOver(at=at, recorded_at=at, deployed_at=at + timedelta(minutes=1))
    assert late.history_ends == at
