"""Property: every list iterator of the public clients ends within its request budget.

Issue 18: fuzzed direct calls against a server whose pages always look like progress (one or
two fresh rows a page, inside the requested bounds, ``has_more`` and a huge ``total_count``)
paged without end in 3 of 600 calls (``iter_refunds``; ``iter_payouts(dialect="post")``: 351
requests in 20 s): the only bound was a default budget of 10,000 requests. Now every iterator
(``ProcessorClient.iter_payments/iter_refunds/iter_payouts/iter_disputes`` in each dialect,
``EventsClient.iter_events``) has a budget by default (1,000), settable on the client
(``max_list_requests``) and per call (``max_requests``), and ends with
:class:`~reconcile.errors.RequestBudgetExhausted` (or a reported window) when it is spent.

The fake server is called in-process (the client's ``request`` is replaced), so hundreds of
cases take seconds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconcile.client import ProcessorClient
from reconcile.client.events_api import EventsClient
from reconcile.client.paging import DEFAULT_MAX_REQUESTS, Pager
from reconcile.errors import PagingError, RequestBudgetExhausted

NOW = datetime(2024, 5, 1, 14, 0, 0, tzinfo=UTC)
START, END = NOW - timedelta(hours=3), NOW
API_KEY = "snd_budget_test_key"
ADMIN_KEY = "budget_admin_key"
MERCHANT = "merchant_budget"

_LOWER = ("created.gte", "created_gte", "start_time", "created_after")
_UPPER = ("created.lte", "created_lte", "end_time", "created_before")
_ID_FIELDS = {
    "payments": "payment_id",
    "refunds": "refund_id",
    "payouts": "payout_id",
    "disputes": "dispute_id",
    "events": "event_id",
}


def _ms(text: str) -> int:
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int((when - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(milliseconds=1))


def _iso(ms: int) -> str:
    when = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


class ProgressServer:
    """Answers every list call with one or two fresh rows inside the requested bounds (mostly
    just below the upper bound, so a moving bound crawls), ``has_more: true`` and a huge
    ``total_count``: every page looks like progress, and the list never ends."""

    def __init__(self, seed: int, *, strict: bool = False) -> None:
        #: ``strict``: every row 2 or 3 ms below the upper bound, so no pager sees a lie it
        #: can catch (a crowded millisecond): only the budget can end the list.
        self.strict = strict
        self.rng = random.Random(seed)
        self.calls = 0
        self.serial = 0

    def __call__(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Mapping[str, Any] | None = None,
        **_: Any,
    ) -> Any:
        self.calls += 1
        query = dict(params or json or {})
        low = next(_ms(query[name]) for name in _LOWER if name in query)
        high = next(_ms(query[name]) for name in _UPPER if name in query)
        kind = path.strip("/").split("/")[0]
        id_field = _ID_FIELDS[kind]
        limit = int(query.get("limit", 100))
        rows = []
        for _ in range(min(limit, self.rng.randint(1, 2))):
            self.serial += 1
            if self.strict:
                created = max(low, high - self.rng.randint(2, 3))
            elif self.rng.random() < 0.8:
                created = max(low, high - self.rng.randint(0, 3))
            else:
                created = self.rng.randint(low, high)
            rows.append({id_field: f"{kind}_{self.serial}", "created": _iso(created)})
        if kind == "disputes":
            return rows
        key = "events" if kind == "events" else "data"
        return {key: rows, "has_more": True, "total_count": 10**9, "count": len(rows)}


Make = Callable[..., Pager]

ITERATORS: dict[str, Callable[[ProcessorClient, EventsClient], Make]] = {
    "iter_payments": lambda c, e: c.iter_payments,
    "iter_payments-seed": lambda c, e: lambda *a, **kw: c.iter_payments(*a, dialect="seed", **kw),
    "iter_refunds": lambda c, e: c.iter_refunds,
    "iter_refunds-seed": lambda c, e: lambda *a, **kw: c.iter_refunds(*a, dialect="seed", **kw),
    "iter_payouts-get": lambda c, e: c.iter_payouts,
    "iter_payouts-post": lambda c, e: lambda *a, **kw: c.iter_payouts(*a, dialect="post", **kw),
    "iter_disputes": lambda c, e: c.iter_disputes,
    "iter_events": lambda c, e: lambda *a, **kw: e.iter_events(MERCHANT, *a, **kw),
}


def _clients(server: ProgressServer, max_list_requests: int | None) -> tuple[Any, Any]:
    client = ProcessorClient("http://127.0.0.1:9", API_KEY, max_list_requests=max_list_requests)
    events = EventsClient(
        "http://127.0.0.1:9",
        ADMIN_KEY,
        environment="sandbox",
        clock=NOW.timestamp,
        max_list_requests=max_list_requests,
    )
    for one in (client, events):
        one.request = server  # in-process: the pager's list calls reach the fake directly
    return client, events


def _drain(pager: Pager) -> tuple[int, BaseException | None]:
    rows = 0
    try:
        for _ in pager:
            rows += 1
    except PagingError as exc:
        return rows, exc
    return rows, None


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    name=st.sampled_from(sorted(ITERATORS)),
    seed=st.integers(0, 2**32 - 1),
    page_size=st.sampled_from([1, 2]),
    budget=st.integers(1, 60),
    where=st.sampled_from(["client", "call"]),
    on_stuck=st.sampled_from(["raise", "report"]),
)
def test_no_iterator_pages_past_its_budget(
    name: str, seed: int, page_size: int, budget: int, where: str, on_stuck: str
) -> None:
    server = ProgressServer(seed)
    client, events = _clients(server, budget if where == "client" else None)
    make = ITERATORS[name](client, events)
    options: dict[str, Any] = {"page_size": page_size, "on_stuck": on_stuck}
    if where == "call":
        options["max_requests"] = budget
    pager = make(START, END, **options)
    assert pager.max_requests == budget
    rows, error = _drain(pager)
    # Never more requests than the budget, counted by the pager and by the server.
    assert server.calls == pager.requests <= budget
    assert rows <= 2 * server.calls
    if error is not None:
        # The iterator ended with a clear, typed error (the budget, or a lie it caught first).
        assert on_stuck == "raise"
        if isinstance(error, RequestBudgetExhausted):
            assert pager.requests == budget == error.requests == error.max_requests
            assert error.kind is not None and f"the {error.kind} list stopped" in str(error)
            assert "max_requests=N" in str(error) and "max_list_requests=N" in str(error)
            assert error.start is not None and START <= error.start <= END
    if any("request budget" in w.reason for w in pager.incomplete):
        # Budget spent in report mode: the unread window is reported, nothing raised.
        assert on_stuck == "report" and pager.requests == budget


@pytest.mark.parametrize("name", sorted(ITERATORS))
def test_the_default_budget_ends_an_endless_list_with_a_clear_error(name: str) -> None:
    """The measured bug, per iterator: with no budget given, the list still ends."""
    server = ProgressServer(18, strict=True)
    client, events = _clients(server, None)
    pager = ITERATORS[name](client, events)(START, END, page_size=1)
    rows, error = _drain(pager)
    assert isinstance(error, RequestBudgetExhausted), error
    assert server.calls == pager.requests == error.requests == DEFAULT_MAX_REQUESTS == 1_000
    assert rows > 0  # the rows read before the budget ran out were yielded
    assert "were not read" in str(error) and "raise the budget" in str(error)
