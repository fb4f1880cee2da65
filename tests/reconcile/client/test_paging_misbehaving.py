"""Every pager against a server that misbehaves: bounded, each id once, only the window, reported.

Regressions of a fuzz run (35 hangs): refunds split time slices down to 1 ms forever, disputes
grew ``offset`` past 95,000, payments pushed ``created.lte`` past the window, and rows outside
the window were accepted silently. Each test here names the lie, runs the pager through the
real client against the fake processor over HTTP and checks that the pager stops on its own
(well below its budget), never yields an id twice or a row outside the window, and reports
what it could not read.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reconcile.client.paging import DEFAULT_MAX_REQUESTS, Pager
from reconcile.client.processor import ProcessorClient
from reconcile.core.errors import PagingError
from reconcile.errors import RequestBudgetExhausted
from tests.reconcile.client._fakeapi import FakeProcessor, Misbehaviour, iso_ms, to_us

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
START = T0 - timedelta(hours=1)
END = T0 + timedelta(hours=2)


@dataclass(frozen=True)
class Listing:
    """One pager of the client and the fake's kind it lists."""

    kind: str
    id_field: str
    created_field: str
    make: Callable[..., Pager]


LISTINGS = {
    "payments-get": Listing(
        "payments", "payment_id", "created", lambda c, **kw: c.iter_payments(START, END, **kw)
    ),
    "payments-seed": Listing(
        "payments",
        "payment_id",
        "created",
        lambda c, **kw: c.iter_payments(START, END, dialect="seed", **kw),
    ),
    "refunds": Listing(
        "refunds", "refund_id", "created_at", lambda c, **kw: c.iter_refunds(START, END, **kw)
    ),
    "refunds-seed": Listing(
        "refunds",
        "refund_id",
        "created_at",
        lambda c, **kw: c.iter_refunds(START, END, dialect="seed", **kw),
    ),
    "payouts-get": Listing(
        "payouts", "payout_id", "created", lambda c, **kw: c.iter_payouts(START, END, **kw)
    ),
    "payouts-post": Listing(
        "payouts",
        "payout_id",
        "created",
        lambda c, **kw: c.iter_payouts(START, END, dialect="post", **kw),
    ),
    "disputes": Listing(
        "disputes", "dispute_id", "created_at", lambda c, **kw: c.iter_disputes(START, END, **kw)
    ),
}


def _seed(fake: FakeProcessor, listing: Listing) -> list[str]:
    """250 objects in the window, 60 before it and 60 after it (the newest of all)."""
    inside = fake.add_many(listing.kind, "in_", 250, T0, timedelta(seconds=13))
    fake.add_many(listing.kind, "before_", 60, START - timedelta(days=1), timedelta(seconds=1))
    fake.add_many(listing.kind, "after_", 60, END + timedelta(days=1), timedelta(seconds=1))
    return inside


def _run(pager: Pager, listing: Listing) -> list[dict[str, Any]]:
    rows = list(pager)
    counts = Counter(row[listing.id_field] for row in rows)
    assert not [key for key, n in counts.items() if n > 1], "an id was yielded twice"
    low, high = to_us(START) // 1000, to_us(END) // 1000
    for row in rows:
        created = to_us(datetime.fromisoformat(row[listing.created_field])) // 1000
        assert low <= created <= high, "a row outside the window was yielded"
    assert pager.requests <= pager.max_requests
    return rows


def _reported(pager: Pager, *fragments: str) -> str:
    assert pager.incomplete, "the pager did not report what it could not read"
    reasons = " | ".join(window.reason for window in pager.incomplete)
    assert any(fragment in reasons for fragment in fragments), reasons
    for window in pager.incomplete:
        assert START <= window.start <= window.end <= END
    return reasons


# -- a server that ignores every filter: the newest `limit` rows of everything, every time ------


@pytest.mark.parametrize("name", LISTINGS)
def test_server_ignoring_all_filters(
    fake: FakeProcessor, client: ProcessorClient, name: str
) -> None:
    listing = LISTINGS[name]
    _seed(fake, listing)
    fake.misbehave = Misbehaviour(ignore_time=True, ignore_offset=True)
    pager = listing.make(client, on_stuck="report")
    rows = _run(pager, listing)
    _reported(pager, "outside the requested")
    assert pager.requests <= 2
    assert all(row[listing.id_field].startswith("in_") for row in rows)


@pytest.mark.parametrize("name", LISTINGS)
def test_server_ignoring_the_time_filter_but_not_the_offset(
    fake: FakeProcessor, client: ProcessorClient, name: str
) -> None:
    listing = LISTINGS[name]
    _seed(fake, listing)
    fake.misbehave = Misbehaviour(ignore_time=True)
    pager = listing.make(client, on_stuck="report")
    _run(pager, listing)
    _reported(pager, "outside the requested")
    assert pager.requests <= 2


@pytest.mark.parametrize("name", LISTINGS)
def test_in_raise_mode_the_same_lie_is_a_paging_error(
    fake: FakeProcessor, client: ProcessorClient, name: str
) -> None:
    listing = LISTINGS[name]
    _seed(fake, listing)
    fake.misbehave = Misbehaviour(ignore_time=True, ignore_offset=True)
    pager = listing.make(client)
    with pytest.raises(PagingError) as caught:
        _run(pager, listing)
    assert "outside the requested" in (caught.value.reason or "")
    assert caught.value.start is not None and caught.value.end is not None


# -- a server that repeats its first answer whatever the bounds or offset ---------------------


@pytest.mark.parametrize("name", LISTINGS)
def test_server_repeating_the_first_page(
    fake: FakeProcessor, client: ProcessorClient, name: str
) -> None:
    listing = LISTINGS[name]
    inside = _seed(fake, listing)
    fake.misbehave = Misbehaviour(repeat_first=True)
    pager = listing.make(client, on_stuck="report")
    rows = _run(pager, listing)
    _reported(pager, "outside the requested", "already read")
    assert pager.requests <= 3
    assert {row[listing.id_field] for row in rows} < set(inside)


def test_repeated_pages_alternating_are_caught_too(
    fake: FakeProcessor, client: ProcessorClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A, B, A, B, ...: only ids kept over the whole run can see the third page repeat."""
    listing = LISTINGS["payments-seed"]
    _seed(fake, listing)
    offsets = itertools.cycle([0, 100])
    honest = fake._seed_payments
    monkeypatch.setattr(
        fake, "_seed_payments", lambda body: honest({**body, "offset": next(offsets)})
    )
    fake.misbehave = Misbehaviour(has_more=True)
    pager = listing.make(client, on_stuck="report")
    rows = _run(pager, listing)
    _reported(pager, "already read")
    assert pager.requests == 3 and len(rows) == 200


# -- a server that returns rows outside the requested bounds ------------------------------------


@pytest.mark.parametrize("name", LISTINGS)
def test_server_adding_rows_outside_the_bounds(
    fake: FakeProcessor, client: ProcessorClient, name: str
) -> None:
    listing = LISTINGS[name]
    _seed(fake, listing)
    stray = {
        listing.id_field: "stray_after_the_window",
        listing.created_field: iso_ms(to_us(END + timedelta(days=30))),
    }
    fake.misbehave = Misbehaviour(extra_rows=lambda path, bounds, rows: [dict(stray)])
    pager = listing.make(client, on_stuck="report")
    rows = _run(pager, listing)
    _reported(pager, "outside the requested")
    assert "stray_after_the_window" not in {row[listing.id_field] for row in rows}
    assert pager.requests == 1


@pytest.mark.parametrize("year", [1, 9999])
@pytest.mark.parametrize("name", LISTINGS)
def test_rows_created_at_the_ends_of_time_are_outside_not_a_crash(
    fake: FakeProcessor, client: ProcessorClient, name: str, year: int
) -> None:
    listing = LISTINGS[name]
    _seed(fake, listing)
    when = "0001-01-01T00:00:00.000Z" if year == 1 else "9999-12-31T23:59:59.999Z"
    stray = {listing.id_field: "stray_end_of_time", listing.created_field: when}
    fake.misbehave = Misbehaviour(extra_rows=lambda path, bounds, rows: [dict(stray)])
    pager = listing.make(client, on_stuck="report")
    _run(pager, listing)
    _reported(pager, "outside the requested")


# -- a server whose total_count lies -------------------------------------------------------------


@pytest.mark.parametrize("name", ["payments-seed", "payouts-post"])
def test_offset_pagers_and_a_total_count_promising_more(
    fake: FakeProcessor, client: ProcessorClient, name: str
) -> None:
    listing = LISTINGS[name]
    inside = _seed(fake, listing)
    fake.misbehave = Misbehaviour(total=lambda n: n + 100_000, has_more=True)
    pager = listing.make(client, on_stuck="report")
    rows = _run(pager, listing)
    assert {row[listing.id_field] for row in rows} == set(inside)
    if name == "payments-seed":  # has_more: true on an empty page contradicts itself
        _reported(pager, "an empty page")
        assert pager.requests == 4
    else:
        # No has_more: a short page ends the list. Hyperswitch's payout counts are known to
        # disagree with its lists (issue #11967), so a total above it is not a stuck window.
        assert pager.incomplete == []
        assert pager.requests == 13


def test_has_more_past_every_total_count_is_reported(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    """has_more: true forever with fresh rows past the total the server itself reported."""
    listing = LISTINGS["payments-seed"]
    fake.add_many("payments", "in_", 30, T0, timedelta(seconds=1))
    made = itertools.count()

    def fabricate(path: str, bounds: Any, rows: list[Any]) -> list[Any]:
        return [
            {"payment_id": f"made_{next(made)}", "created": iso_ms(to_us(T0))}
            for _ in range(100 - len(rows))
        ]

    fake.misbehave = Misbehaviour(has_more=True, extra_rows=fabricate)
    pager = listing.make(client, on_stuck="report")
    _run(pager, listing)
    _reported(pager, "past the total_count 30")
    assert pager.requests == 1


@pytest.mark.parametrize("name", ["refunds", "refunds-seed"])
@pytest.mark.parametrize(
    "lie", [lambda n: 0, lambda n: n * 1000, lambda n: 99], ids=["zero", "huge", "99"]
)
def test_time_slices_do_not_trust_an_impossible_total(
    fake: FakeProcessor, client: ProcessorClient, name: str, lie: Callable[[int], int]
) -> None:
    """A total below the rows in hand is ignored; one above only shapes the splits."""
    listing = LISTINGS[name]
    inside = _seed(fake, listing)
    fake.misbehave = Misbehaviour(total=lie)
    pager = listing.make(client, on_stuck="report")
    rows = _run(pager, listing)
    assert {row[listing.id_field] for row in rows} == set(inside)
    assert pager.incomplete == []
    assert pager.requests <= 80


# -- rows with equal timestamps -------------------------------------------------------------------


@pytest.mark.parametrize("name", LISTINGS)
def test_rows_sharing_one_millisecond(
    fake: FakeProcessor, client: ProcessorClient, name: str
) -> None:
    listing = LISTINGS[name]
    burst = [fake.add(listing.kind, f"burst_{i:03d}", T0).id for i in range(150)]
    others = fake.add_many(listing.kind, "in_", 40, T0 + timedelta(seconds=1), timedelta(seconds=1))
    pager = listing.make(client, on_stuck="report")
    got = {row[listing.id_field] for row in _run(pager, listing)}
    assert set(others) <= got
    if name.endswith("-get"):  # no offset: 150 rows in one instant cannot be paged
        _reported(pager, "more than")
        assert len(got & set(burst)) >= pager.page_size
    else:
        assert pager.incomplete == [] and set(burst) <= got


def test_dense_millisecond_against_a_server_ignoring_the_offset(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    """The fuzz run's disputes case: offset paging of a crowded instant grew past 95,000."""
    listing = LISTINGS["disputes"]
    burst = [fake.add("disputes", f"burst_{i:03d}", T0).id for i in range(150)]
    fake.misbehave = Misbehaviour(ignore_offset=True)
    pager = listing.make(client, on_stuck="report")
    got = {row[listing.id_field] for row in _run(pager, listing)}
    _reported(pager, "already read")
    assert len(got & set(burst)) == 100
    # Halving 3 hours down to one millisecond costs ~2 requests a level (no total_count to
    # split by); the crowded millisecond then costs 2 (the repeat is seen on the second).
    assert pager.requests <= 60


# -- the request budget ------------------------------------------------------------------------


def _endless(listing: Listing) -> Callable[[str, Any, list[Any]], list[Any]]:
    """Fresh rows inside the bounds of every request, a millisecond apart: every page full."""
    made = itertools.count()

    def fabricate(path: str, bounds: Any, rows: list[Any]) -> list[Any]:
        low, high = bounds
        low, high = low or to_us(START), high or to_us(END)
        return [
            {
                listing.id_field: f"made_{next(made)}",
                listing.created_field: iso_ms(max(low, high - i * 1000)),
            }
            for i in range(100)
        ]

    return fabricate


@pytest.mark.parametrize("name", LISTINGS)
def test_the_request_budget_ends_an_endless_listing(
    fake: FakeProcessor, client: ProcessorClient, name: str
) -> None:
    listing = LISTINGS[name]
    fake.add(listing.kind, "in_1", T0)
    lies = Misbehaviour(total=lambda n: 10**9, has_more=True, extra_rows=_endless(listing))
    fake.misbehave = lies
    pager = listing.make(client, on_stuck="report", max_requests=7, page_size=20)
    _run(pager, listing)
    assert pager.requests == 7
    reasons = _reported(pager, "the request budget of 7 requests was exhausted")
    assert "were not read" in reasons


def test_the_budget_in_raise_mode_is_a_paging_error(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    listing = LISTINGS["payments-seed"]
    fake.misbehave = Misbehaviour(
        has_more=True, total=lambda n: 10**9, extra_rows=_endless(listing)
    )
    pager = listing.make(client, max_requests=3)
    with pytest.raises(RequestBudgetExhausted) as caught:
        _run(pager, listing)
    error = caught.value
    assert isinstance(error, PagingError)
    assert (error.start, error.end) == (START, END)
    assert (error.kind, error.requests, error.max_requests) == ("payments", 3, 3)
    assert error.cursor == "at offset 300"
    assert error.reason is not None and "request budget of 3 requests was exhausted" in error.reason
    # The message says which list, how many requests, which window and cursor, how to raise it.
    message = str(error)
    assert message.startswith("the payments list stopped after 3 requests")
    assert "2024-05-01T11:00:00.000Z .. 2024-05-01T14:00:00.000Z" in message
    assert "at offset 300" in message
    assert "iter_payments(..., max_requests=N)" in message and "max_list_requests=N" in message
    assert pager.requests == 3


def test_the_default_budget_is_documented_and_checked(client: ProcessorClient) -> None:
    assert client.iter_refunds(START, END).max_requests == DEFAULT_MAX_REQUESTS == 1_000
    with pytest.raises(ValueError, match="at least 1"):
        client.iter_payments(START, END, max_requests=0)
    with pytest.raises(TypeError):
        client.iter_payments(START, END, max_requests=True)


def test_the_client_sets_the_default_budget_of_its_lists(
    make_client: Callable[..., ProcessorClient],
) -> None:
    client = make_client(max_list_requests=40)
    assert client.iter_payments(START, END).max_requests == 40
    assert client.iter_refunds(START, END).max_requests == 40
    assert client.iter_payouts(START, END, dialect="post").max_requests == 40
    assert client.iter_disputes(START, END).max_requests == 40
    # A call's own budget wins.
    assert client.iter_refunds(START, END, max_requests=5).max_requests == 5
    with pytest.raises(ValueError, match="max_list_requests must be at least 1"):
        make_client(max_list_requests=0)
    with pytest.raises(TypeError, match="max_list_requests"):
        make_client(max_list_requests=2.5)
