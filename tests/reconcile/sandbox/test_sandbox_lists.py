"""Sandbox processor: list endpoints in the seed's and in Hyperswitch's dialects."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from receiver.core.wire import format_timestamp as iso
from reconcile.sandbox import FrozenClock, SandboxServer
from tests.reconcile.sandbox.sandbox_support import Api

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
def frozen(start_sandbox: Callable[..., SandboxServer], clock: FrozenClock) -> SandboxServer:
    return start_sandbox(now=clock)


@pytest.fixture
def fapi(frozen: SandboxServer, session: requests.Session) -> Api:
    return Api(session, frozen.base_url)


def error_code(response: requests.Response) -> str:
    assert response.status_code >= 400, response.text
    code: str = response.json()["error"]["code"]
    return code


# -- payments: the seed's POST /payments/list -----------------------------------------------


def test_seed_list_pages_through_many_payments_at_one_timestamp(
    frozen: SandboxServer, fapi: Api
) -> None:
    ids = set(frozen.sandbox.seed_payments(250, T0))
    seen: list[str] = []
    offset = 0
    while True:
        page = fapi.ok("POST", "/payments/list", {"limit": 100, "offset": offset})
        assert page["total_count"] == 250
        seen += [p["payment_id"] for p in page["data"]]
        offset += len(page["data"])
        if not page["has_more"]:
            break
    assert len(seen) == len(set(seen)) == 250 and set(seen) == ids
    assert offset == 250


def test_seed_list_filters_and_limits(frozen: SandboxServer, fapi: Api, clock: FrozenClock) -> None:
    frozen.sandbox.seed_payments(6, T0, T0 + timedelta(seconds=5), status=["succeeded", "failed"])
    everything = fapi.ok("POST", "/payments/list", {})
    assert len(everything["data"]) == 6 and everything["has_more"] is False
    created = [p["created"] for p in everything["data"]]
    assert created == sorted(created, reverse=True)
    failed = fapi.ok("POST", "/payments/list", {"status": "failed"})
    assert failed["total_count"] == 3 and {p["unified_code"] for p in failed["data"]} == {"UE_1007"}
    window = {
        "created_gte": iso(T0 + timedelta(seconds=1)),
        "created_lte": iso(T0 + timedelta(seconds=3)),
    }
    assert fapi.ok("POST", "/payments/list", window)["total_count"] == 3
    naive = {"created_gte": "2026-03-01T12:00:04"}
    assert fapi.ok("POST", "/payments/list", naive)["total_count"] == 2
    assert fapi.ok("POST", "/payments/list", {"limit": 2})["has_more"] is True
    assert error_code(fapi.post("/payments/list", {"limit": 101})) == "IR_04"
    assert error_code(fapi.post("/payments/list", {"limit": 0})) == "IR_04"
    assert error_code(fapi.post("/payments/list", {"offset": -1})) == "IR_04"


# -- payments: Hyperswitch's GET /payments/list ---------------------------------------------


def get_list(api: Api, **params: Any) -> requests.Response:
    return api.get("/payments/list", params=params)


def page_backwards(api: Api, limit: int) -> list[str]:
    """Page newest to oldest with the inclusive ``ending_before`` cursor, dropping overlap."""
    seen: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        page = api.ok("GET", "/payments/list", params=params)
        assert set(page) == {"size", "data"} and page["size"] == len(page["data"])
        new = [p["payment_id"] for p in page["data"] if p["payment_id"] not in seen]
        seen += new
        if page["size"] < limit or not new:
            return seen
        params = {"limit": limit, "ending_before": page["data"][-1]["payment_id"]}


def test_hyperswitch_list_pages_to_the_end_with_shared_timestamps(
    frozen: SandboxServer, fapi: Api, clock: FrozenClock
) -> None:
    # 57 payments: groups of up to 5 share one created timestamp.
    ids: list[str] = []
    for group in range(12):
        clock.set(T0 + timedelta(seconds=group))
        for _ in range(5 if group < 11 else 2):
            ids.append(
                fapi.ok("POST", "/payments", {"amount": 10, "currency": "USD"})["payment_id"]
            )
    seen = page_backwards(fapi, limit=10)
    assert len(seen) == 57 and set(seen) == set(ids)
    newest_first = fapi.ok("GET", "/payments/list", params={"limit": 100})["data"]
    assert [p["payment_id"] for p in newest_first] == list(reversed(ids))


def test_hyperswitch_cursor_is_inclusive_and_stalls_on_more_ties_than_limit(
    frozen: SandboxServer, fapi: Api
) -> None:
    frozen.sandbox.seed_payments(15, T0)
    first = fapi.ok("GET", "/payments/list", params={"limit": 10})["data"]
    again = fapi.ok(
        "GET", "/payments/list", params={"limit": 10, "ending_before": first[-1]["payment_id"]}
    )["data"]
    # As on the real server: the cursor means created <= cursor's created, so 15 rows sharing
    # one timestamp cannot be paged with limit 10; the seed dialect (offset) can.
    assert [p["payment_id"] for p in again] == [p["payment_id"] for p in first]
    assert len(page_backwards(fapi, limit=100)) == 15


def test_hyperswitch_time_filters(frozen: SandboxServer, fapi: Api) -> None:
    ids = frozen.sandbox.seed_payments(10, T0, T0 + timedelta(seconds=9))
    at = {i: iso(T0 + timedelta(seconds=i)) for i in range(10)}

    def listed(**params: Any) -> list[str]:
        data = fapi.ok("GET", "/payments/list", params={"limit": 100, **params})["data"]
        return [p["payment_id"] for p in data]

    assert listed(**{"created.gte": at[7]}) == ids[7:][::-1]
    assert listed(**{"created.gt": at[7]}) == ids[7:][::-1]  # .gt is inclusive, as real
    assert listed(**{"created.lte": at[2]}) == ids[:3][::-1]
    assert listed(**{"created.lt": at[2]}) == ids[:3][::-1]  # .lt is inclusive, as real
    assert listed(created=at[4]) == [ids[4]]
    assert listed(starting_after=ids[8]) == ids[8:][::-1]
    # A time filter takes precedence over the cursor on the same side.
    assert listed(**{"created.lte": at[1], "ending_before": ids[5]}) == ids[:2][::-1]
    assert listed(**{"created.gte": at[1], "ending_before": ids[3]}) == ids[1:4][::-1]


def test_hyperswitch_list_validation(frozen: SandboxServer, fapi: Api) -> None:
    frozen.sandbox.seed_payments(3, T0)
    assert error_code(get_list(fapi, offset=0)) == "IR_04"  # deny_unknown_fields
    assert error_code(get_list(fapi, created_gte=iso(T0))) == "IR_04"  # seed name, wrong here
    for limit in (0, 101):
        response = get_list(fapi, limit=limit)
        assert response.status_code == 400
        assert response.json()["error"]["message"] == "limit should be in between 1 and 100"
    assert error_code(get_list(fapi, limit="ten")) == "IR_04"
    assert error_code(get_list(fapi, **{"created.gte": "2026-03-01T12:00:00"})) == "IR_04"
    assert error_code(get_list(fapi, ending_before="pay_nope")) == "IR_05"
    assert len(fapi.ok("GET", "/payments/list")["data"]) == 3  # default limit 10


# -- refunds --------------------------------------------------------------------------------


def test_refund_list_orders_by_modified_and_pages_shift(
    frozen: SandboxServer, fapi: Api, clock: FrozenClock
) -> None:
    payment = fapi.pay(amount=100_000)
    refunds = []
    for index in range(5):
        clock.set(T0 + timedelta(seconds=index))
        body = {"payment_id": payment["payment_id"], "amount": 10 + index}
        refunds.append(fapi.ok("POST", "/refunds", body)["refund_id"])
    listing = fapi.ok("POST", "/refunds/list", {"limit": 2})
    assert listing["count"] == 2 and listing["total_count"] == 5
    assert [r["refund_id"] for r in listing["data"]] == [refunds[4], refunds[3]]
    clock.set(T0 + timedelta(minutes=1))
    fapi.ok("POST", f"/refunds/{refunds[0]}", {"reason": "customer asked"})
    listing = fapi.ok("POST", "/refunds/list", {"limit": 2})
    assert [r["refund_id"] for r in listing["data"]] == [refunds[0], refunds[4]]
    # Time filters apply to created, not to the modified time.
    created_window = {"start_time": iso(T0), "end_time": iso(T0 + timedelta(seconds=1))}
    windowed = fapi.ok("POST", "/refunds/list", created_window)
    assert {r["refund_id"] for r in windowed["data"]} == set(refunds[:2])
    seed_window = {"created_gte": iso(T0 + timedelta(seconds=3))}
    assert fapi.ok("POST", "/refunds/list", seed_window)["total_count"] == 2


def test_refund_list_status_filters_in_both_enums(fapi: Api) -> None:
    payment = fapi.pay(amount=100_000)
    pid = payment["payment_id"]
    statuses = {
        fapi.ok("POST", "/refunds", {"payment_id": pid, "amount": amount})["refund_id"]: status
        for amount, status in (
            (100, "succeeded"),
            (102, "failed"),
            (177, "pending"),
            (188, "review"),
        )
    }

    def ids(body: dict[str, Any]) -> set[str]:
        return {r["refund_id"] for r in fapi.ok("POST", "/refunds/list", body)["data"]}

    def having(*wanted: str) -> set[str]:
        return {rid for rid, status in statuses.items() if status in wanted}

    assert ids({"refund_status": ["success"]}) == having("succeeded")
    assert ids({"refund_status": ["failure", "manual_review"]}) == having("failed", "review")
    assert ids({"refund_status": ["transaction_failure"]}) == having("failed")
    assert ids({"status": "pending"}) == having("pending")  # seed: the response enum
    assert ids({"payment_id": pid, "limit": 100}) == set(statuses)
    wrong_enum = fapi.post("/refunds/list", {"refund_status": ["succeeded"]})
    assert error_code(wrong_enum) == "IR_04"
    too_big = fapi.post("/refunds/list", {"limit": 101})
    assert too_big.json()["error"]["message"] == "limit should be in between 1 and 100"
    assert fapi.ok("POST", "/refunds/list", {"offset": 0})["total_count"] == 4


# -- payouts --------------------------------------------------------------------------------


def make_payouts(api: Api, clock: FrozenClock, count: int) -> list[str]:
    ids = []
    for index in range(count):
        clock.set(T0 + timedelta(seconds=index))
        body = {"amount": 500 + index * 100, "currency": "USD", "customer_id": "cus_p"}
        ids.append(api.ok("POST", "/payouts/create", body)["payout_id"])
    return ids


def test_payout_get_list(fapi: Api, clock: FrozenClock) -> None:
    ids = make_payouts(fapi, clock, 25)
    page = fapi.ok("GET", "/payouts/list", params={"limit": 100})
    assert set(page) == {"size", "data"}  # no total_count on GET, as real
    assert [p["payout_id"] for p in page["data"]] == ids[::-1]
    seen: list[str] = []
    params: dict[str, Any] = {"limit": 10}
    while True:
        data = fapi.ok("GET", "/payouts/list", params=params)["data"]
        new = [p["payout_id"] for p in data if p["payout_id"] not in seen]
        seen += new
        if len(data) < 10 or not new:
            break
        params = {"limit": 10, "ending_before": data[-1]["payout_id"]}
    assert seen == ids[::-1]
    window = {
        "start_time": iso(T0 + timedelta(seconds=3)),
        "end_time": iso(T0 + timedelta(seconds=5)),
    }
    assert [p["payout_id"] for p in fapi.ok("GET", "/payouts/list", params=window)["data"]] == ids[
        3:6
    ][::-1]
    for limit in (0, 101):
        bad = fapi.get("/payouts/list", params={"limit": limit})
        assert bad.json()["error"]["message"] == "limit should be in between 1 and 100"
    assert error_code(fapi.get("/payouts/list", params={"offset": 1})) == "IR_04"


def test_payout_post_list(fapi: Api, clock: FrozenClock) -> None:
    ids = make_payouts(fapi, clock, 25)
    seen: list[str] = []
    offset = 0
    while True:
        page = fapi.ok("POST", "/payouts/list", {"limit": 20, "offset": offset})
        assert page["total_count"] == 25 and page["size"] == len(page["data"])
        seen += [p["payout_id"] for p in page["data"]]
        offset += page["size"]
        if offset >= page["total_count"]:
            break
    assert seen == ids[::-1]
    bad = fapi.post("/payouts/list", {"limit": 21})
    assert bad.json()["error"]["message"] == "limit should be in between 1 and 20"
    fapi.ok("POST", f"/payouts/{ids[0]}/fulfill", {"payout_id": ids[0]})
    assert fapi.ok("POST", "/payouts/list", {"status": ["success"]})["total_count"] == 1


# -- disputes -------------------------------------------------------------------------------


def test_dispute_list_is_a_bare_array(frozen: SandboxServer, fapi: Api, clock: FrozenClock) -> None:
    dispute_ids = []
    for index in range(3):
        clock.set(T0 + timedelta(seconds=index))
        payment = fapi.pay()
        dispute_ids.append(frozen.sandbox.open_dispute(payment["payment_id"])["dispute_id"])
    frozen.sandbox.dispute_action(dispute_ids[0], "lose")
    everything = fapi.ok("GET", "/disputes/list")
    assert isinstance(everything, list)
    assert [d["dispute_id"] for d in everything] == dispute_ids[::-1]
    page = fapi.ok("GET", "/disputes/list", params={"limit": 1, "offset": 1})
    assert [d["dispute_id"] for d in page] == [dispute_ids[1]]
    window = {"start_time": iso(T0 + timedelta(seconds=1))}
    assert len(fapi.ok("GET", "/disputes/list", params=window)) == 2
    lost = fapi.ok("GET", "/disputes/list", params={"dispute_status": "dispute_lost,dispute_won"})
    assert [d["dispute_id"] for d in lost] == [dispute_ids[0]]


def test_seed_payments_is_fast_and_ordered(start_sandbox: Callable[..., SandboxServer]) -> None:
    sandbox = start_sandbox().sandbox
    ids = sandbox.seed_payments(10_000, T0, T0 + timedelta(hours=1), status=["succeeded", "failed"])
    assert len(set(ids)) == 10_000
    page = sandbox.list_payments_hyperswitch([("limit", "100"), ("created.lte", iso(T0))])
    assert [p["payment_id"] for p in page["data"]] == [ids[0]]
    assert sandbox.events() == []
