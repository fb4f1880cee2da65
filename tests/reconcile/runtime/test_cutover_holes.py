"""Issue 28, holes 2 and 3: the cut-over an adoption records is the adopted account's own,
stays where it was recorded, and no later delivery moves the end of history back before it;
on the platform's default account and on a seller's (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.testing import WebhookTestClient
from tests.conftest import AppFactory
from tests.reconcile.platform import Platform, platform

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
