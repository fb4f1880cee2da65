"""List faults: endpoints that ignore their filters, and endpoints that repeat their first page."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from receiver.core.wire import format_timestamp as iso
from reconcile.sandbox import ApiFaultConfig, FrozenClock, Sandbox
from tests.reconcile.sandbox.sandbox_support import ADMIN_KEY, Api


@pytest.fixture
def world(sb: Sandbox, inproc: Api, clock: FrozenClock) -> dict[str, list[str]]:
    """Ten of each kind, one per second from T0 (ids oldest first)."""
    start = clock()
    ids: dict[str, list[str]] = {"payments": [], "refunds": [], "payouts": [], "disputes": []}
    big = inproc.pay(amount=1_000_000)
    for index in range(10):
        clock.set(start + timedelta(seconds=index + 1))
        ids["payments"].append(inproc.pay(amount=1000)["payment_id"])
        refund = inproc.ok("POST", "/refunds", {"payment_id": big["payment_id"], "amount": 100})
        ids["refunds"].append(refund["refund_id"])
        payout = inproc.ok("POST", "/payouts/create", {"amount": 100, "currency": "USD"})
        ids["payouts"].append(payout["payout_id"])
        ids["disputes"].append(sb.open_dispute(big["payment_id"], amount=1)["dispute_id"])
    return ids


def at(clock: FrozenClock, second: int) -> str:
    return iso(clock() - timedelta(seconds=10 - second))


def rows(data: Any, key: str) -> list[str]:
    items = data if isinstance(data, list) else data.get("data", data.get("events"))
    return [row[key] for row in items]


def test_ignore_filters_answers_the_newest_rows_of_everything(
    sb: Sandbox, inproc: Api, clock: FrozenClock, world: dict[str, list[str]]
) -> None:
    sb.faults.configure(api=ApiFaultConfig(ignore_filters=("all",)))
    window = {"created.gte": at(clock, 2), "created.lte": at(clock, 4), "limit": "3"}
    newest_payments = [*world["payments"][::-1]]
    got = inproc.ok("GET", "/payments/list", params=window)
    assert rows(got, "payment_id") == newest_payments[:3]
    got = inproc.ok("POST", "/payments/list", {"limit": 3, "offset": 5, "status": "failed"})
    assert rows(got, "payment_id") == newest_payments[:3] and got["total_count"] == 11
    got = inproc.ok(
        "POST", "/refunds/list", {"limit": 3, "offset": 4, "refund_status": ["failure"]}
    )
    assert rows(got, "refund_id") == world["refunds"][::-1][:3] and got["total_count"] == 10
    got = inproc.ok(
        "GET", "/payouts/list", params={"limit": "3", "ending_before": world["payouts"][2]}
    )
    assert rows(got, "payout_id") == world["payouts"][::-1][:3]
    got = inproc.ok("POST", "/payouts/list", {"limit": 3, "offset": 3, "status": ["success"]})
    assert rows(got, "payout_id") == world["payouts"][::-1][:3]
    got = inproc.ok(
        "GET",
        "/disputes/list",
        params={"limit": "3", "offset": "3", "dispute_status": "dispute_won"},
    )
    assert rows(got, "dispute_id") == world["disputes"][::-1][:3]
    events = inproc.post(
        f"/events/{sb.merchant_id}",
        {"limit": 2, "offset": 5, "event_types": ["refund_failed"]},
        headers={"api-key": ADMIN_KEY},
    ).json()
    assert len(events["events"]) == 2 and events["total_count"] == len(sb.webhooks.events())
    assert sb.stats()["faults"]["api"]["ignore_filters"] == 7


def test_repeat_pages_answers_the_first_page_whatever_the_offset_or_cursor(
    sb: Sandbox, inproc: Api, clock: FrozenClock, world: dict[str, list[str]]
) -> None:
    newest = world["payments"][::-1]
    first = inproc.ok("GET", "/payments/list", params={"limit": "3"})
    assert rows(first, "payment_id") == newest[:3]
    sb.faults.configure(api=ApiFaultConfig(repeat_pages=("payments", "refunds", "disputes")))
    cursor = {"limit": "3", "ending_before": newest[2]}
    assert rows(inproc.ok("GET", "/payments/list", params=cursor), "payment_id") == newest[:3]
    moved = {"limit": "3", "created.lte": at(clock, 3)}
    assert rows(inproc.ok("GET", "/payments/list", params=moved), "payment_id") == newest[:3]
    # The lower bound and other filters still apply.
    lower = {"limit": "20", "created.gte": at(clock, 8)}
    assert rows(inproc.ok("GET", "/payments/list", params=lower), "payment_id") == newest[:3]
    page = inproc.ok("POST", "/payments/list", {"limit": 3, "offset": 6})
    assert rows(page, "payment_id") == newest[:3]
    refunds = inproc.ok("POST", "/refunds/list", {"limit": 3, "offset": 3})
    assert rows(refunds, "refund_id") == world["refunds"][::-1][:3]
    disputes = inproc.ok("GET", "/disputes/list", params={"limit": "3", "offset": "3"})
    assert rows(disputes, "dispute_id") == world["disputes"][::-1][:3]
    # Payouts are not named: they page normally.
    payouts = inproc.ok("POST", "/payouts/list", {"limit": 3, "offset": 3})
    assert rows(payouts, "payout_id") == world["payouts"][::-1][3:6]


def test_list_faults_over_http_and_as_once_rules(
    sb: Sandbox, inproc: Api, world: dict[str, list[str]]
) -> None:
    admin = inproc.base_url + "/__sandbox/faults"
    session = inproc.session
    answer = session.post(admin, json={"api": {"repeat_pages": ["refunds"]}}, timeout=5).json()
    assert answer["api"]["repeat_pages"] == ["refunds"]
    page = inproc.ok("POST", "/refunds/list", {"limit": 2, "offset": 4})
    assert rows(page, "refund_id") == world["refunds"][::-1][:2]
    bad = session.post(admin, json={"api": {"ignore_filters": ["charges"]}}, timeout=5)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "IR_04"
    session.delete(admin, timeout=5)
    once = {"once": [{"fault": "ignore_filters", "path": "/payouts/list", "count": 1}]}
    session.post(admin, json=once, timeout=5)
    ignored = inproc.ok("POST", "/payouts/list", {"limit": 2, "offset": 4})
    assert rows(ignored, "payout_id") == world["payouts"][::-1][:2]
    normal = inproc.ok("POST", "/payouts/list", {"limit": 2, "offset": 4})
    assert rows(normal, "payout_id") == world["payouts"][::-1][4:6]
    # Other routes never get list faults; the usual faults still work beside them.
    sb.faults.configure(api=ApiFaultConfig(ignore_filters=("all",), error_rate=1.0, paths=("/x",)))
    assert inproc.get(f"/payments/{world['payments'][0]}").status_code == 200
