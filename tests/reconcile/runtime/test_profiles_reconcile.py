"""Two business profiles of one merchant, kept as two accounts, never recover each other's
objects (issue 28, hole 6).

A merchant's API key reads every profile's objects; each account must take its own profile's
only, on every path (the lists, the open-object sweep, the events API, adoption, a backfill),
by the rule the receive path routes a delivery to the shared URL by. Each test's webhooks
are lost; the handlers must then see each object once, under its own account, and each
account's projection must hold exactly its own profile's objects.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from receiver.core.events import parse_event
from receiver.testing.factories import build_event, encode
from reconcile.core.diff import Remote, read_remote
from reconcile.core.report import Report
from reconcile.recovery.sweep import FollowedObjects
from reconcile.runtime.adoption import Adopter, AdoptOptions
from reconcile.runtime.backfill import Backfill
from reconcile.runtime.runner import ReconcileOptions
from reconcile.sandbox.faults import WebhookFaultConfig
from tests.conftest import AppFactory
from tests.reconcile.brands import BRANDS, MERCHANT, Brands, brands

pytestmark = pytest.mark.storage

OTHER = {"brand_eu": "brand_us", "brand_us": "brand_eu"}
DECLINED = "4000000000000002"
LOSE_EVERYTHING = WebhookFaultConfig(drop=1.0)


def _objects(b: Brands, account: str, tag: str) -> None:
    """Payments (one refunded, one disputed) and a payout of ``account``'s brand."""
    for i in range(3):
        b.pay(account, f"pay_{tag}_{account}_{i}")
    b.sandbox.create_refund({"payment_id": f"pay_{tag}_{account}_0", "amount": 1000})
    b.sandbox.open_dispute(f"pay_{tag}_{account}_1")
    b.payout(account, f"po_{tag}_{account}")


def _skipped(report: Report) -> Counter[str]:
    """Objects of other profiles each path of ``report`` skipped, by profile."""
    total: Counter[str] = Counter()
    for part in [*report.kinds.values(), *report.sweep.values()]:
        total.update(part.other_profiles)
    if report.events is not None:
        total.update(report.events.other_profiles)
    return total


def _each_once_under_its_own_account(b: Brands) -> None:
    assert b.handled, "nothing was handled"
    assert all(n == 1 for n in b.handled.values()), [k for k, n in b.handled.items() if n > 1]
    for account, kind, object_id, _ in b.handled:
        assert (kind, object_id) in b.truth(account), (account, kind, object_id)


@pytest.mark.parametrize(
    ("layout", "source"),
    [
        ("named", "configured"),
        ("named", "stored"),
        ("catch_all", "configured"),
        ("catch_all", "stored"),
        # brand_eu names no merchant: a refund or dispute (which shows no merchant_id) of
        # brand_us's profile is still brand_us's, as its payments are.
        ("legacy", "configured"),
    ],
)
def test_the_lists_recover_each_profiles_objects_into_its_own_account(
    make_app: AppFactory, layout: Any, source: Any
) -> None:
    with brands(make_app, layout=layout, source=source, faults=LOSE_EVERYTHING) as b:
        for account in BRANDS:
            _objects(b, account, "a")
        b.advance(timedelta(minutes=1))
        assert not b.handled  # every webhook was lost
        reports = {account: b.run(account) for account in BRANDS}
        for account in BRANDS:
            assert b.projections(account) == b.truth(account)
        _each_once_under_its_own_account(b)
        assert len(b.handled) == sum(len(b.truth(a)) for a in BRANDS)
        for account, report in reports.items():
            assert report.status == "ok", (account, report.as_dict())
            other_profile = BRANDS[OTHER[account]][0]
            skipped = _skipped(report)
            # The payments list takes no profile filter: the other brand's payments are read
            # and skipped (not recovered, not drift).
            assert skipped[other_profile] >= 3, skipped
            named = layout == "named" or account == "brand_us"
            if named:
                # The refunds and disputes lists were asked for this profile only.
                for kind in ("refunds", "disputes"):
                    assert not report.kinds[kind].other_profiles, report.kinds[kind].as_dict()
        # A second run of each finds every object in step, and recovers nothing.
        b.advance(timedelta(hours=1))
        for account in BRANDS:
            again = b.run(account)
            assert again.status == "ok" and again.recovered == 0, again.as_dict()
        assert all(n == 1 for n in b.handled.values())


def test_the_sweep_sets_aside_another_profiles_object_it_was_following(
    make_app: AppFactory,
) -> None:
    """An object of brand_eu in brand_us's follow list and projection (what an earlier
    version's recovery left): brand_us's sweep fetches it once, sees another profile's,
    recovers nothing and never fetches it again; brand_eu's own run recovers its capture."""
    with brands(make_app, source="stored", faults=LOSE_EVERYTHING) as b:
        payment = b.pay("brand_eu", "pay_eu_manual", manual=True)
        assert payment["status"] == "requires_capture"
        store = b.store
        # brand_us holds it, as a run of an earlier version left it.
        body = encode(
            build_event(
                "payment_authorized",
                object_id="pay_eu_manual",
                merchant_id=MERCHANT,
                profile_id="pro_brand_eu",
            )
        )
        store.inbox.insert(parse_event(body), body, account="brand_us")
        remote = read_remote("payment", payment)
        assert isinstance(remote, Remote)
        FollowedObjects(store.engine, account="brand_us").keep([remote])
        b.drain()
        b.handled.clear()
        assert b.projections("brand_us") == {("payment", "pay_eu_manual"): "requires_capture"}
        b.sandbox.capture_payment("pay_eu_manual", {})
        b.advance(timedelta(hours=1))
        sweep_only = ReconcileOptions(kinds=("payments",), events=False, lookback=timedelta(0))
        first = b.run("brand_us", sweep_only)
        assert first.status == "ok", first.as_dict()
        assert first.recovered == 0
        assert first.sweep["payments"].other_profiles == {"pro_brand_eu": 1}
        assert b.projections("brand_us") == {("payment", "pay_eu_manual"): "requires_capture"}
        b.advance(timedelta(days=1))
        second = b.run("brand_us", sweep_only)
        assert second.sweep["payments"].requests == 0, second.as_dict()  # never again
        # Listed, it is another profile's: not "known only locally" to brand_us either.
        listed = b.run("brand_us", ReconcileOptions(mode="wide", wide_window=timedelta(days=3)))
        assert listed.status == "ok", listed.as_dict()
        assert listed.kinds["payments"].local_only == 0
        assert listed.kinds["payments"].other_profiles == {"pro_brand_eu": 1}
        eu = b.run("brand_eu")
        assert eu.status == "ok" and eu.recovered == 1, eu.as_dict()
        assert dict(b.handled) == {("brand_eu", "payment", "pay_eu_manual", "succeeded"): 1}


@pytest.mark.parametrize("layout", ["named", "catch_all"])
def test_the_events_api_recovers_each_profiles_events_into_its_own_account(
    make_app: AppFactory, layout: Any
) -> None:
    """The events API lists the merchant's events of every profile, each signed with its
    profile's key: each account recovers its own, with their original bytes; the other
    profile's are neither recovered nor bad signatures of this account."""
    with brands(
        make_app, layout=layout, source="stored", events_api=True, faults=LOSE_EVERYTHING
    ) as b:
        for account in BRANDS:
            _objects(b, account, "e")
        b.advance(timedelta(minutes=1))
        events_only = ReconcileOptions(kinds=("mandates",), sweep_budget=0)
        reports = {account: b.run(account, events_only) for account in BRANDS}
        for account in BRANDS:
            assert b.projections(account) == b.truth(account)
        _each_once_under_its_own_account(b)
        for account, report in reports.items():
            assert report.events is not None
            assert report.status == "ok", (account, report.as_dict())
            assert report.events.bad_signature == 0
            assert sum(report.events.recovered.values()) > 0
            if layout == "named" or account == "brand_us":
                # Asked with the account's profile: the other profile's were never listed.
                assert not report.events.other_profiles
            else:
                assert report.events.other_profiles["pro_brand_us"] > 0


def test_adoption_and_backfill_take_each_profiles_objects_into_its_own_account(
    make_app: AppFactory,
) -> None:
    with brands(make_app, source="stored", adopted=True) as b:
        b.sandbox.webhook_url = None
        for account in BRANDS:
            b.sandbox.profile(BRANDS[account][0]).webhook_url = None
            _objects(b, account, "h")  # history of the earlier system
        b.advance(timedelta(hours=2))
        reports = {
            a: Adopter(b.client, b.store, account=a).adopt(AdoptOptions(deployed_at=b.now()))
            for a in BRANDS
        }
        for account in BRANDS:
            assert b.projections(account) == b.truth(account)
        assert not b.handled  # history is recorded, not dispatched
        for account, report in reports.items():
            assert report.finished, report.as_dict()
            other_profile = BRANDS[OTHER[account]][0]
            assert report.kinds["payments"].other_profiles == {other_profile: 3}
            assert not report.kinds["refunds"].other_profiles  # asked for its profile
        since = b.now() - timedelta(days=1)
        for reconciler in b.reconcilers.values():
            done = Backfill(reconciler).run(since, b.now(), dry_run=False)
            assert done.as_dict()["total"] > 0
        b.drain()
        _each_once_under_its_own_account(b)
        assert {a for a, *_ in b.handled} == set(BRANDS)


@pytest.mark.parametrize("layout", ["named", "catch_all"])
def test_a_profile_added_later_is_the_catch_all_accounts_or_nobodys(
    make_app: AppFactory, layout: Any
) -> None:
    """A profile no account names: the account that names no profile (the merchant's catch-
    all, as at the shared URL) takes it; with none, nobody does, and every run says so."""
    with brands(make_app, layout=layout, source="stored", faults=LOSE_EVERYTHING) as b:
        b.sandbox.add_profile("pro_brand_uk")
        b.sandbox.create_payment(
            {
                "amount": 700,
                "currency": "GBP",
                "payment_id": "pay_uk",
                "confirm": True,
                "payment_method": "card",
                "payment_method_data": {
                    "card": {
                        "card_number": "4242424242424242",
                        "card_exp_month": "12",
                        "card_exp_year": "2035",
                        "card_cvc": "123",
                    }
                },
                "profile_id": "pro_brand_uk",
            }
        )
        b.advance(timedelta(minutes=1))
        reports = {account: b.run(account) for account in BRANDS}
        taker = {k[0] for k in b.handled if k[2] == "pay_uk"}
        assert taker == ({"brand_eu"} if layout == "catch_all" else set())
        if layout == "catch_all":
            assert reports["brand_us"].kinds["payments"].other_profiles["pro_brand_uk"] == 1
        else:
            for report in reports.values():
                assert report.kinds["payments"].other_profiles["pro_brand_uk"] == 1
                assert report.status == "ok"


def test_weeks_of_two_brands_end_with_each_account_holding_its_own_profile(
    make_app: AppFactory,
) -> None:
    """Six weeks of two brands (webhooks lost, duplicated and reordered; one API outage),
    each account reconciled twice a day: each ends equal to its own profile's objects,
    every transition handled once, under its own account."""
    faults = WebhookFaultConfig(drop=0.3, duplicate=0.2, reorder=0.2)
    with brands(make_app, layout="catch_all", source="stored", events_api=True, faults=faults) as b:
        counter = 0
        for day in range(42):
            for account in BRANDS:
                for _ in range(2):
                    counter += 1
                    pid = f"pay_{counter:04d}"
                    card = DECLINED if counter % 7 == 0 else "4242424242424242"
                    paid = b.pay(account, pid, manual=counter % 5 == 0, card=card)
                    if paid["status"] != "succeeded":
                        continue  # declined, or an authorisation left to expire
                    if counter % 3 == 0:
                        b.sandbox.create_refund({"payment_id": pid, "amount": 500})
                    elif counter % 11 == 0:
                        b.sandbox.open_dispute(pid)
                if day % 7 == 0:
                    b.payout(account, f"po_{account}_{day}")
            if day == 20:
                b.sandbox.faults.once("error", count=40, path="/", status=503)
            for _ in range(2):
                b.advance(timedelta(hours=12))
                for account in BRANDS:
                    b.run(account)
        b.sandbox.faults.configure(webhooks=WebhookFaultConfig())
        b.advance(timedelta(days=2))
        for account in BRANDS:
            final = b.run(account)
            assert final.status == "ok", final.as_dict()
        for account in BRANDS:
            assert b.projections(account) == b.truth(account)
        _each_once_under_its_own_account(b)
