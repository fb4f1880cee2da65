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
from datetime import timedelta

import pytest

from receiver import WebhookReceiver
from reconcile.runtime.adoption import Adopter
from tests.conftest import AppFactory
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
        assert Adopter(w.client, w.store).adopt().finished
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
        assert Adopter(w.client, w.store).adopt().finished
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
    from reconcile.runtime.adoption import AdoptOptions

    with world(make_app, new_account=False) as w:
        w.sandbox.webhook_url = None
        payout = w.sandbox.create_payout(
            {"amount": 1200, "currency": "USD", "payout_type": "bank", "auto_fulfill": True}
        )["payout_id"]
        w.advance(5 * DAY)
        w.sandbox.webhook_url = MERCHANT_URL
        w.frozen.move_to(w.now() + timedelta(seconds=1))
        options = AdoptOptions(since=w.now() - DAY)  # the payout is older than this reach
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
