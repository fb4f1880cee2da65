"""Property: any server behaviour, every pager terminates within its budget and stays truthful.

For a fake server drawn from a strategy (honest, ignoring the filters, ignoring the time filter
or the offset, repeating its first page, lying in ``total_count``/``has_more``, adding random
garbage rows), every pager (each endpoint and dialect, the events list too):

* makes at most ``max_requests`` list calls and ends;
* yields each id at most once;
* yields only rows created inside the window;
* with an honest server, yields exactly the window's objects and reports nothing (unless more
  objects share an instant than the pager can page through; then it says so);
* with a server that ignores filters or offsets or repeats pages, never loses rows silently:
  whatever it did not yield is covered by a report.

The fake is called in-process (``FakeProcessor.fetch``), so hundreds of runs take seconds.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconcile.client.list_endpoints import (
    disputes_pager,
    events_pager,
    payments_pager,
    payouts_pager,
    refunds_pager,
)
from reconcile.client.paging import Pager
from reconcile.core.errors import PagingError
from tests.reconcile.client._fakeapi import API_KEY, FakeProcessor, Misbehaviour, iso_ms, to_us

W0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
W0_US = to_us(W0)


@dataclass(frozen=True)
class Endpoint:
    kind: str  # the fake's collection ("events": the events list)
    id_field: str
    created_field: str
    max_page: int
    #: "backward" (no offset: crowding in 2 ms stops it), "offset", "slices".
    strategy: str
    make: Callable[..., Pager]


ENDPOINTS = {
    "payments-get": Endpoint(
        "payments",
        "payment_id",
        "created",
        100,
        "backward",
        lambda f, s, e, **kw: payments_pager(f, s, e, **kw),
    ),
    "payments-seed": Endpoint(
        "payments",
        "payment_id",
        "created",
        100,
        "offset",
        lambda f, s, e, **kw: payments_pager(f, s, e, dialect="seed", **kw),
    ),
    "refunds": Endpoint(
        "refunds",
        "refund_id",
        "created_at",
        100,
        "slices",
        lambda f, s, e, **kw: refunds_pager(f, s, e, **kw),
    ),
    "refunds-seed": Endpoint(
        "refunds",
        "refund_id",
        "created_at",
        100,
        "slices",
        lambda f, s, e, **kw: refunds_pager(f, s, e, dialect="seed", **kw),
    ),
    "payouts-get": Endpoint(
        "payouts",
        "payout_id",
        "created",
        100,
        "backward",
        lambda f, s, e, **kw: payouts_pager(f, s, e, **kw),
    ),
    "payouts-post": Endpoint(
        "payouts",
        "payout_id",
        "created",
        20,
        "offset",
        lambda f, s, e, **kw: payouts_pager(f, s, e, dialect="post", **kw),
    ),
    "disputes": Endpoint(
        "disputes",
        "dispute_id",
        "created_at",
        100,
        "slices",
        lambda f, s, e, **kw: disputes_pager(f, s, e, **kw),
    ),
    "events": Endpoint(
        "events",
        "event_id",
        "created",
        100,
        "offset",
        lambda f, s, e, **kw: events_pager(f, "merchant_fake", s, e, is_delivered=None, **kw),
    ),
}

BEHAVIOURS = (
    "honest",
    "ignore_filters",
    "ignore_time",
    "ignore_offset",
    "repeat_first",
    "lying_total",
    "garbage",
)
#: Behaviours after which every row not yielded must be covered by a report.
NEVER_SILENT = ("honest", "ignore_filters", "ignore_time", "ignore_offset", "repeat_first")


def _garbage(seed: int, ids: list[str], endpoint: Endpoint) -> Callable[..., list[Any]]:
    """Random junk appended to answers: unusable rows, rows anywhere in time, reused ids."""
    rng = random.Random(seed)
    made = iter(range(10**9))

    def junk(path: str, bounds: Any, rows: list[Any]) -> list[Any]:
        out: list[Any] = []
        for _ in range(rng.randrange(0, 4)):
            when = iso_ms(W0_US + rng.randrange(-3_000, 6_000) * 1000)
            choice = rng.randrange(9)
            if choice == 0:
                out.append(rng.choice([None, 7, "row", [1, 2], True]))
            elif choice == 1:
                out.append({endpoint.created_field: when})
            elif choice == 2:
                bad = rng.choice(["x\x00", "\ud800", "a" * 300, "\x1b", "", 12, {"k": 1}])
                out.append({endpoint.id_field: bad, endpoint.created_field: when})
            elif choice == 3:
                bad_time = rng.choice([None, "soon", 12, "9999-12-31T23:59:59-05:00", ""])
                out.append(
                    {endpoint.id_field: f"junk_{next(made)}", endpoint.created_field: bad_time}
                )
            elif choice == 4 and ids:
                # A real id with another creation time.
                out.append({endpoint.id_field: rng.choice(ids), endpoint.created_field: when})
            else:
                out.append({endpoint.id_field: f"junk_{next(made)}", endpoint.created_field: when})
        return out

    return junk


def _crowded(times_us: list[int], limit: int, strategy: str, dense_limit: int) -> bool:
    """Whether an honest run may legitimately report a stuck instant."""
    per_ms = Counter(us // 1000 for us in times_us)
    if strategy == "offset":
        return False
    pair = max((per_ms[ms] + per_ms.get(ms + 1, 0) for ms in per_ms), default=0)
    if strategy == "backward":
        return pair >= limit
    return pair > dense_limit


def _covered(ms: int, pager: Pager) -> bool:
    when = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    return any(w.start <= when <= w.end for w in pager.incomplete)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    name=st.sampled_from(sorted(ENDPOINTS)),
    behaviour=st.sampled_from(BEHAVIOURS),
    offsets_ms=st.lists(st.integers(-1_500, 4_500), max_size=60),
    jitter=st.randoms(use_true_random=False),
    span_ms=st.integers(0, 3_000),
    page_size=st.integers(1, 12),
    dense_extra=st.integers(0, 20),
    budget=st.integers(1, 60),
    on_stuck=st.sampled_from(["report", "report", "raise"]),
    seed=st.integers(0, 2**32),
)
def test_every_pager_is_bounded_and_truthful(
    name: str,
    behaviour: str,
    offsets_ms: list[int],
    jitter: random.Random,
    span_ms: int,
    page_size: int,
    dense_extra: int,
    budget: int,
    on_stuck: str,
    seed: int,
) -> None:
    endpoint = ENDPOINTS[name]
    page_size = min(page_size, endpoint.max_page)
    fake = FakeProcessor(API_KEY)
    fake.now = W0 + timedelta(days=1)  # the events list's 90 days are counted from it
    ids: list[str] = []
    times: dict[str, int] = {}
    for i, offset in enumerate(offsets_ms):
        created_us = W0_US + offset * 1000 + jitter.randrange(1000)
        obj_id = f"o_{i:03d}"
        if endpoint.kind == "events":
            fake.add_event(obj_id, created_us)
        else:
            fake.add(endpoint.kind, obj_id, created_us)
        ids.append(obj_id)
        times[obj_id] = created_us
    start, end = W0, W0 + timedelta(milliseconds=span_ms)
    low_us, high_us = to_us(start), to_us(end)
    expected = {i for i, us in times.items() if low_us <= us <= high_us}
    # A row printed at the window's last millisecond may be up to 999 us past it: the pager
    # cannot tell (it sees milliseconds), so such a row may be yielded by a lying server.
    printed_inside = {i for i, us in times.items() if low_us <= us // 1000 * 1000 <= high_us}

    fake.misbehave = {
        "honest": Misbehaviour(),
        "ignore_filters": Misbehaviour(ignore_time=True, ignore_offset=True),
        "ignore_time": Misbehaviour(ignore_time=True),
        "ignore_offset": Misbehaviour(ignore_offset=True),
        "repeat_first": Misbehaviour(repeat_first=True),
        "lying_total": Misbehaviour(
            total=random.Random(seed).choice([lambda n: 0, lambda n: n // 2, lambda n: n * 7 + 3]),
            has_more=random.Random(seed).choice([None, True, False]),
        ),
        "garbage": Misbehaviour(extra_rows=_garbage(seed, ids, endpoint)),
    }[behaviour]

    calls = 0

    def fetch(method: str, path: str, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        assert calls <= max_requests, "a pager called past its budget"
        return fake.fetch(method, path, **kwargs)

    max_requests = 10_000 if behaviour == "honest" else budget
    options: dict[str, Any] = {
        "page_size": page_size,
        "on_stuck": on_stuck,
        "max_requests": max_requests,
    }
    dense_limit = page_size + dense_extra
    if endpoint.strategy == "slices":
        options["dense_limit"] = dense_limit
    pager = endpoint.make(fetch, start, end, **options)

    rows: list[dict[str, Any]] = []
    raised: PagingError | None = None
    try:
        for row in pager:
            rows.append(row)
    except PagingError as exc:
        assert on_stuck == "raise"
        raised = exc

    # Bounded.
    assert pager.requests == calls <= max_requests
    # Each id at most once.
    got = Counter(row[endpoint.id_field] for row in rows)
    assert all(n == 1 for n in got.values())
    # Only the window (by the printed creation time: milliseconds, truncated).
    for row in rows:
        printed = to_us(datetime.fromisoformat(row[endpoint.created_field]))
        assert low_us // 1000 * 1000 <= printed <= high_us
    # Reported windows lie inside the window.
    for window in pager.incomplete:
        assert start <= window.start <= window.end <= end
        assert window.reason and window.reason.isprintable()

    if behaviour == "honest":
        assert pager.row_errors == []
        if not _crowded([times[i] for i in expected], page_size, endpoint.strategy, dense_limit):
            assert raised is None and pager.incomplete == []
            assert set(got) == expected
    if behaviour in NEVER_SILENT and raised is None:
        assert set(got) <= printed_inside
        for missing in expected - set(got):
            assert _covered(times[missing] // 1000, pager), f"{missing} was lost silently"
    if behaviour == "garbage":
        assert set(got) - expected <= {i for i in got if i.startswith(("junk_", "o_"))}
