"""Paging every list shape to the end of its data, each object at most once."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reconcile.client.list_endpoints import refunds_pager
from reconcile.client.paging import format_timestamp
from reconcile.client.processor import ProcessorClient
from reconcile.core.errors import PagingError
from tests.reconcile.client._fakeapi import FakeProcessor, Obj, to_us

MakeClient = Callable[..., ProcessorClient]

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
START = T0 - timedelta(hours=1)
END = T0 + timedelta(hours=2)
MS_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _once(rows: list[dict[str, Any]], field: str, expected: list[str]) -> None:
    counts = Counter(row[field] for row in rows)
    duplicates = [key for key, n in counts.items() if n > 1]
    assert duplicates == []
    assert sorted(counts) == sorted(expected)


def _time_params(seen_values: list[str]) -> None:
    assert seen_values and all(MS_ISO.match(value) for value in seen_values)


# -- payments, Hyperswitch's GET /payments/list ---------------------------------------------------


def test_payments_get_pages_backwards_to_the_end(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    expected = fake.add_many("payments", "pay_", 350, T0, timedelta(seconds=1))
    fake.add("payments", "pay_before", START - timedelta(milliseconds=1))
    fake.add("payments", "pay_after", END + timedelta(milliseconds=1))
    expected += [fake.add("payments", "pay_at_start", START).id]
    expected += [fake.add("payments", "pay_at_end", END).id]

    pager = client.iter_payments(START, END)
    rows = list(pager)

    _once(rows, "payment_id", expected)
    created = [row["created"] for row in rows]
    assert created == sorted(created, reverse=True)  # newest first, as served
    assert (pager.pages, pager.requests, pager.incomplete) == (4, 4, [])
    sent = fake.list_requests("/payments/list")
    assert len(sent) == 4
    for request in sent:
        assert set(request.query) == {"created.gte", "created.lte", "limit"}
        assert request.query["limit"] == ["100"]
        _time_params(request.query["created.gte"] + request.query["created.lte"])
    assert sent[0].query["created.gte"] == ["2024-05-01T11:00:00.000Z"]
    assert sent[0].query["created.lte"] == ["2024-05-01T14:00:00.000Z"]


def test_payments_get_loses_nothing_inside_a_boundary_millisecond(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    # Seven payments per millisecond, microseconds apart: the server stores microseconds and
    # prints milliseconds, so page boundaries fall inside a printed millisecond.
    base = to_us(T0)
    expected = []
    for i in range(700):
        obj = fake.add("payments", f"pay_{i:04d}", base + (i // 7) * 1000 + (i % 7) * 100)
        expected.append(obj.id)

    pager = client.iter_payments(START, END, page_size=50)
    _once(list(pager), "payment_id", expected)
    assert pager.incomplete == []


def test_naive_backward_paging_by_printed_time_would_lose_rows(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    """The hazard the pager avoids: ``created.lte=<printed created of the last row>``."""
    base = to_us(T0)
    for i in range(700):
        fake.add("payments", f"pay_{i:04d}", base + (i // 7) * 1000 + (i % 7) * 100)
    seen: set[str] = set()
    upper = format_timestamp(END)
    for _ in range(100):
        page = client.request(
            "GET",
            "/payments/list",
            params={"created.gte": format_timestamp(START), "created.lte": upper, "limit": 50},
        )["data"]
        seen.update(row["payment_id"] for row in page)
        if len(page) < 50:
            break
        upper = page[-1]["created"]
    assert len(seen) < 700


def test_payments_more_at_one_instant_than_a_page_raise(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    fake.add_many("payments", "pay_new_", 30, T0 + timedelta(seconds=10), timedelta(seconds=1))
    for i in range(150):
        fake.add("payments", f"pay_burst_{i:03d}", T0)
    fake.add_many("payments", "pay_old_", 40, T0 - timedelta(minutes=5), timedelta(seconds=1))

    pager = client.iter_payments(START, END)
    yielded: list[dict[str, Any]] = []
    with pytest.raises(PagingError) as caught:
        for row in pager:
            yielded.append(row)
    assert caught.value.start == T0 - timedelta(milliseconds=1)
    assert caught.value.end == T0 + timedelta(milliseconds=1)
    assert "more than 100 payments" in str(caught.value)
    assert len({row["payment_id"] for row in yielded}) == len(yielded)
    assert pager.requests <= 3


def test_payments_stuck_window_can_be_reported_and_skipped(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    newer = fake.add_many(
        "payments", "pay_new_", 30, T0 + timedelta(seconds=10), timedelta(seconds=1)
    )
    burst = [fake.add("payments", f"pay_burst_{i:03d}", T0).id for i in range(150)]
    older = fake.add_many(
        "payments", "pay_old_", 140, T0 - timedelta(minutes=5), timedelta(seconds=1)
    )

    pager = client.iter_payments(START, END, on_stuck="report")
    rows = list(pager)

    got = Counter(row["payment_id"] for row in rows)
    assert max(got.values()) == 1
    assert set(newer) | set(older) <= set(got)
    assert 100 <= len(set(burst) & set(got)) < 150
    assert len(pager.incomplete) == 1
    window = pager.incomplete[0]
    assert (window.start, window.end) == (
        T0 - timedelta(milliseconds=1),
        T0 + timedelta(milliseconds=1),
    )
    assert "more than 100 payments" in window.reason
    assert pager.requests <= 5


# -- payments, the seed's POST /payments/list --------------------------------------------------


def test_payments_seed_dialect_pages_by_offset_until_has_more_is_false(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    expected = fake.add_many("payments", "pay_", 350, T0, timedelta(seconds=1))
    fake.add("payments", "pay_outside", END + timedelta(seconds=1))

    pager = client.iter_payments(START, END, dialect="seed")
    _once(list(pager), "payment_id", expected)

    sent = fake.list_requests("/payments/list")
    assert [r.method for r in sent] == ["POST"] * 4
    assert [r.body["offset"] for r in sent] == [0, 100, 200, 300]
    for request in sent:
        assert set(request.body) == {"limit", "offset", "created_gte", "created_lte"}
        _time_params([request.body["created_gte"], request.body["created_lte"]])
    assert (pager.pages, pager.requests) == (4, 4)


def test_payments_seed_dialect_skips_rows_pushed_down_by_new_payments(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    expected = fake.add_many("payments", "pay_", 250, T0, timedelta(seconds=1))
    created: list[str] = []

    def insert_newest(fake: FakeProcessor, path: str, rows: list[Obj]) -> None:
        if len(created) < 2:
            obj = fake.add("payments", f"pay_new_{len(created)}", T0 + timedelta(minutes=30))
            created.append(obj.id)

    fake.after_list = insert_newest
    rows = list(client.iter_payments(START, END, dialect="seed"))
    counts = Counter(row["payment_id"] for row in rows)
    assert max(counts.values()) == 1
    assert set(expected) <= set(counts)


# -- refunds: POST /refunds/list, ordered by modified_at ----------------------------------------


def _touch_unread(kind: str, per_call: int) -> Callable[[FakeProcessor, str, list[Obj]], None]:
    """After each list answer, modify a few objects not returned so far (they jump ahead)."""
    returned: set[str] = set()

    def hook(fake: FakeProcessor, path: str, rows: list[Obj]) -> None:
        returned.update(obj.id for obj in rows)
        with fake.lock:
            unread = sorted(set(fake.objects[kind]) - returned)
        for obj_id in unread[-per_call:]:
            fake.touch(kind, obj_id)

    return hook


def test_refunds_survive_pages_shifting_mid_run(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    expected = fake.add_many("refunds", "ref_", 250, T0, timedelta(seconds=7))
    fake.add("refunds", "ref_outside", START - timedelta(seconds=1))
    fake.after_list = _touch_unread("refunds", 3)

    pager = client.iter_refunds(START, END)
    _once(list(pager), "refund_id", expected)
    assert pager.incomplete == []
    # Slicing costs a probe per split window: the refunds fill 29 minutes of a 3-hour window.
    assert pager.pages >= 3 and pager.requests - pager.pages <= 3
    for request in fake.list_requests("/refunds/list"):
        assert set(request.body) == {"limit", "offset", "start_time", "end_time"}
        assert request.body["limit"] == 100
        _time_params([request.body["start_time"], request.body["end_time"]])


def test_naive_offset_paging_of_refunds_would_miss_some(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    """The fake really shifts pages: plain offset paging loses the refunds that moved ahead."""
    fake.add_many("refunds", "ref_", 250, T0, timedelta(seconds=7))
    fake.after_list = _touch_unread("refunds", 3)
    seen: set[str] = set()
    offset = 0
    while True:
        body = {
            "limit": 100,
            "offset": offset,
            "start_time": format_timestamp(START),
            "end_time": format_timestamp(END),
        }
        page = client.request("POST", "/refunds/list", json=body)
        seen.update(row["refund_id"] for row in page["data"])
        offset += len(page["data"])
        if offset >= page["total_count"] or not page["data"]:
            break
    assert len(seen) < 250


def test_refunds_in_one_crowded_millisecond_are_offset_paged(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    expected = [fake.add("refunds", f"ref_burst_{i:03d}", T0).id for i in range(130)]
    expected += fake.add_many(
        "refunds", "ref_", 60, T0 + timedelta(seconds=1), timedelta(seconds=1)
    )
    fake.after_list = _touch_unread("refunds", 2)

    pager = client.iter_refunds(START, END)
    _once(list(pager), "refund_id", expected)
    assert pager.incomplete == []


def test_refunds_too_crowded_to_page_are_raised_or_reported(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    burst = [fake.add("refunds", f"ref_burst_{i:03d}", T0).id for i in range(130)]
    others = fake.add_many("refunds", "ref_", 30, T0 + timedelta(seconds=1), timedelta(seconds=1))

    with pytest.raises(PagingError) as caught:
        list(refunds_pager(client.request, START, END, page_size=50, dense_limit=100))
    assert (caught.value.start, caught.value.end) == (
        T0 - timedelta(milliseconds=1),
        T0,
    )

    pager = refunds_pager(
        client.request, START, END, page_size=50, dense_limit=100, on_stuck="report"
    )
    got = Counter(row["refund_id"] for row in pager)
    assert max(got.values()) == 1
    assert set(others) <= set(got) and len(set(burst) & set(got)) == 100
    # The instant T0 is the shared boundary of two one-millisecond slices: reported once.
    assert pager.incomplete == [
        (
            T0 - timedelta(milliseconds=1),
            T0 + timedelta(milliseconds=1),
            "more than 100 refunds in one millisecond",
        )
    ]


@pytest.mark.parametrize(
    ("dialect", "names"),
    [("hyperswitch", ("start_time", "end_time")), ("seed", ("created_gte", "created_lte"))],
)
def test_refunds_dialects_send_their_own_filter_names(
    fake: FakeProcessor, client: ProcessorClient, dialect: Any, names: tuple[str, str]
) -> None:
    expected = fake.add_many("refunds", "ref_", 130, T0, timedelta(seconds=7))
    fake.add("refunds", "ref_outside", END + timedelta(seconds=1))
    pager = client.iter_refunds(START, END, dialect=dialect)
    _once(list(pager), "refund_id", expected)
    sent = fake.list_requests("/refunds/list")
    assert sent and all(set(r.body) == {"limit", "offset", *names} for r in sent)
    assert sent[0].body[names[0]] == "2024-05-01T11:00:00.000Z"
    assert sent[0].body[names[1]] == "2024-05-01T14:00:00.000Z"
    with pytest.raises(ValueError):
        client.iter_refunds(START, END, dialect="graphql")  # type: ignore[arg-type]


# -- payouts ---------------------------------------------------------------------------------------


def test_payouts_get_pages_backwards(fake: FakeProcessor, client: ProcessorClient) -> None:
    expected = fake.add_many("payouts", "po_", 250, T0, timedelta(milliseconds=400))
    pager = client.iter_payouts(START, END)
    _once(list(pager), "payout_id", expected)
    sent = fake.list_requests("/payouts/list")
    assert [r.method for r in sent] == ["GET"] * 3
    for request in sent:
        assert set(request.query) == {"start_time", "end_time", "limit"}
        assert request.query["limit"] == ["100"]


def test_payouts_post_pages_by_offset_twenty_at_a_time(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    expected = fake.add_many("payouts", "po_", 45, T0, timedelta(seconds=1))
    pager = client.iter_payouts(START, END, dialect="post")
    _once(list(pager), "payout_id", expected)
    sent = fake.list_requests("/payouts/list")
    assert [(r.method, r.body["limit"], r.body["offset"]) for r in sent] == [
        ("POST", 20, 0),
        ("POST", 20, 20),
        ("POST", 20, 40),
    ]
    assert set(sent[0].body) == {"limit", "offset", "start_time", "end_time"}
    with pytest.raises(ValueError, match="between 1 and 20"):
        client.iter_payouts(START, END, dialect="post", page_size=21)


def test_payouts_post_ends_by_total_count_on_an_exact_multiple(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    expected = fake.add_many("payouts", "po_", 40, T0, timedelta(seconds=1))
    pager = client.iter_payouts(START, END, dialect="post")
    _once(list(pager), "payout_id", expected)
    assert pager.requests == 2


# -- disputes: GET /disputes/list, a bare array ----------------------------------------------------


def test_disputes_bare_array_with_shifting_pages(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    expected = fake.add_many("disputes", "dp_", 230, T0, timedelta(seconds=3))
    fake.after_list = _touch_unread("disputes", 2)
    pager = client.iter_disputes(START, END)
    _once(list(pager), "dispute_id", expected)
    sent = fake.list_requests("/disputes/list")
    assert sent and all(set(r.query) == {"limit", "offset", "start_time", "end_time"} for r in sent)


def test_disputes_in_one_crowded_millisecond(fake: FakeProcessor, client: ProcessorClient) -> None:
    expected = [fake.add("disputes", f"dp_burst_{i:03d}", T0).id for i in range(120)]
    pager = client.iter_disputes(START, END)
    _once(list(pager), "dispute_id", expected)


# -- arguments and pager objects -------------------------------------------------------------------


@pytest.mark.parametrize(
    "method", ["iter_payments", "iter_refunds", "iter_payouts", "iter_disputes"]
)
def test_naive_datetimes_are_rejected(client: ProcessorClient, method: str) -> None:
    naive = datetime(2024, 5, 1, 12, 0)
    with pytest.raises(ValueError, match="timezone-aware"):
        getattr(client, method)(naive, END)
    with pytest.raises(ValueError, match="timezone-aware"):
        getattr(client, method)(START, naive)
    with pytest.raises(ValueError, match="start must not be after end"):
        getattr(client, method)(END, START)


def test_page_size_and_dialect_are_checked(client: ProcessorClient) -> None:
    with pytest.raises(ValueError, match="between 1 and 100"):
        client.iter_payments(START, END, page_size=101)
    with pytest.raises(ValueError):
        client.iter_payments(START, END, dialect="graphql")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        client.iter_refunds(START, END, page_size=0)
    with pytest.raises(ValueError):
        client.iter_payments(START, END, on_stuck="ignore")  # type: ignore[arg-type]


def test_a_pager_is_single_use_and_reports_its_work(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    fake.add_many("payments", "pay_", 5, T0, timedelta(seconds=1))
    pager = client.iter_payments(START, END)
    assert len(list(pager)) == 5
    assert (pager.pages, pager.requests, pager.incomplete) == (1, 1, [])
    assert "pages=1" in repr(pager)
    with pytest.raises(RuntimeError):
        iter(pager)


def test_non_utc_bounds_are_converted(fake: FakeProcessor, client: ProcessorClient) -> None:
    fake.add("payments", "pay_1", T0)
    tz = timezone_plus_two()
    rows = list(client.iter_payments(T0.astimezone(tz), T0.astimezone(tz)))
    assert [row["payment_id"] for row in rows] == ["pay_1"]
    assert fake.list_requests("/payments/list")[0].query["created.gte"] == [
        "2024-05-01T12:00:00.000Z"
    ]


def test_an_unexpected_envelope_is_a_paging_error(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    from tests.reconcile.client._fakeapi import Scripted

    fake.script(Scripted(200, body={"items": []}))
    with pytest.raises(PagingError, match="unexpected payments list response"):
        list(client.iter_payments(START, END))


def timezone_plus_two() -> Any:
    from datetime import timezone

    return timezone(timedelta(hours=2))
