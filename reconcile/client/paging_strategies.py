"""The three ways a :class:`~reconcile.client.paging.Pager` walks a list endpoint.

Each is a :class:`~reconcile.client.paging.Pager` with all its guarantees (budget, rows only
once, rows only inside the window, reports): see :mod:`reconcile.client.paging`. Which endpoint
uses which is in :mod:`reconcile.client.list_endpoints`.

Three strategies, chosen per endpoint by what its server really does (``hyperswitch-facts.md``
section 4):

``BackwardTimePager``: ``GET /payments/list`` (Hyperswitch) and ``GET /payouts/list``.
    Newest first, no offset, no ``has_more``, inclusive time bounds. Each next request moves the
    upper bound down to the oldest ``created`` of the page. Hyperswitch stores creation times in
    microseconds but prints them with milliseconds, so a bound equal to the printed time would
    drop the unread rows of that millisecond; the next upper bound is therefore the *following*
    millisecond (``oldest + 1 ms``), and the rows this re-returns are skipped by id. The end is a
    page shorter than ``limit``.

``OffsetPager``: the seed's ``POST /payments/list`` (``has_more``), ``POST /payouts/list``
    (``total_count``, at most 20 per page) and the admin events list (``POST /events/{id}``,
    ``total_count``). Ordered by creation time, which does not change, so offsets are stable
    except for objects created inside the window while paging (they push rows down: the repeats
    are skipped by id). The end is ``has_more: false``, else a short page or ``total_count``.

``TimeSlicePager``: ``POST /refunds/list`` and ``GET /disputes/list``. These are ordered by
    *modification* time, so offset pages shift while objects change: an unread refund that is
    updated jumps to the front, behind the offset already read, and would be missed (overlapping
    pages cannot catch that; they only turn duplicates into skips). Instead the creation-time
    window, which does not move, is split until every slice fits in one response (fewer rows
    than ``limit``, or all of ``total_count``); one response is one consistent snapshot, so
    updates between requests cannot hide a row. Adjacent slices share their boundary
    millisecond; rows seen twice there are skipped by id. Costs one extra request per split.
    Refunds filter by ``start_time``/``end_time`` (Hyperswitch) or by the seed's
    ``created_gte``/``created_lte`` (``refunds_pager(dialect="seed")``).

Stuck windows: when more objects than a page holds share one instant (for the backward pager:
fall within two consecutive milliseconds; for time slices: one millisecond), no time filter can
page through them and Hyperswitch's cursors (``ending_before``) are inclusive by timestamp too.
Time slices first fall back to offset paging of that millisecond (bounded by ``dense_limit``
ids), repeated until the ids found match ``total_count`` (or a pass finds nothing new). If that
fails, or for the backward pager at once, the window is stuck (raised or reported, see
:mod:`reconcile.client.paging`); in report mode paging continues below it (the backward pager
from one millisecond below).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator, Mapping
from datetime import datetime
from typing import Any, Final, Literal

from reconcile.client.paging import (
    Fetch,
    OnStuck,
    Page,
    Pager,
    format_ms,
    int_field,
)

__all__ = [
    "DENSE_LIMIT",
    "BackwardTimePager",
    "OffsetPager",
    "TimeSlicePager",
]

#: Default ``dense_limit``: most ids kept while offset-paging one overcrowded millisecond.
DENSE_LIMIT: Final = 10_000
#: Passes over one overcrowded millisecond before it is declared stuck.
DENSE_PASSES: Final = 3
#: Most slices one window is split into at once (keeps the stack of pending slices small).
MAX_SLICES: Final = 64


class BackwardTimePager(Pager):
    """Newest-first paging by moving an inclusive upper time bound down (no offsets)."""

    def _rows(self) -> Iterator[dict[str, Any]]:
        limit = self.page_size
        start = self._start_ms
        lower = format_ms(start)
        upper = self._end_ms
        while True:
            self._unread = (start, upper)
            self._cursor = f"at the upper bound {format_ms(upper)}"
            params: dict[str, str | int] = {
                self.lower_param: lower,
                self.upper_param: format_ms(upper),
                "limit": limit,
            }
            page = self._page(
                self._rows_of(self._call("GET", self.path, params=params)), start, upper
            )
            self.pages += 1
            fresh = yield from self._emit(page)
            if page.outside:
                self._stuck(start, upper, self._outside(page, start, upper))
                return
            if page.count < limit:
                return
            if not page.rows:
                self._stuck(
                    start,
                    upper,
                    f"a full page of {page.count} {self.kind} held no usable row, so the "
                    "next upper bound cannot be derived",
                )
                return
            oldest = min(earliest for _, _, earliest, _ in page.rows)
            # Every unread row is at most as new as the page's oldest; its printed time may
            # hide up to ``latest - earliest`` ms (microseconds printed as milliseconds too).
            following = min(min(latest for _, _, _, latest in page.rows) + 1, upper)
            if following >= upper:
                # A full page inside [oldest, upper]: lowering the bound cannot make progress.
                self._stuck(
                    oldest - 1,
                    upper,
                    f"more than {limit} {self.kind} created within "
                    f"{format_ms(oldest)} .. {format_ms(upper)}",
                )
                following = oldest - 1
            elif fresh == 0:
                self._stuck(
                    start,
                    upper,
                    f"a full page of {self.kind} up to {format_ms(upper)} held only rows "
                    "already read (the server repeats pages)",
                )
                return
            if following > upper or following > self._end_ms:
                self._stuck(start, upper, "the next upper bound would leave the window")
                return
            if following < start:
                return
            upper = following


class OffsetPager(Pager):
    """Offset paging over a creation-ordered list, up to ``has_more``/``total_count``/short page."""

    def __init__(
        self,
        fetch: Fetch,
        start: datetime,
        end: datetime,
        *,
        method: Literal["GET", "POST"] = "POST",
        extra: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(fetch, start, end, **options)
        self.method = method
        self.extra = dict(extra or {})

    def _rows(self) -> Iterator[dict[str, Any]]:
        limit = self.page_size
        start, end = self._start_ms, self._end_ms
        bounds = {self.lower_param: format_ms(start), self.upper_param: format_ms(end)}
        offset = 0
        most: int | None = None  # the largest total_count reported
        while True:
            self._cursor = f"at offset {offset}"
            query: dict[str, Any] = {**self.extra, "limit": limit, "offset": offset, **bounds}
            if self.method == "GET":
                body = self._call("GET", self.path, params=query)
            else:
                body = self._call("POST", self.path, json=query)
            page = self._page(self._rows_of(body), start, end)
            self.pages += 1
            fresh = yield from self._emit(page)
            at, offset = offset, offset + page.count
            has_more = body.get("has_more") if isinstance(body, dict) else None
            total = int_field(body, "total_count")
            if total is not None:
                most = total if most is None else max(most, total)
            if page.outside:
                self._stuck(start, end, self._outside(page, start, end))
                return
            if page.count == 0:
                if has_more is True or (most is not None and offset < most):
                    self._stuck(
                        start,
                        end,
                        f"an empty page at offset {at} although the server reported more "
                        f"(has_more={has_more!r}, total_count={most!r})",
                    )
                return
            if has_more is False:
                return
            if page.rows and fresh == 0 and (page.count >= limit or has_more is True):
                # Checked before the offset is compared with total_count: a repeated page is
                # no progress, whatever the offset says.
                self._stuck(
                    start,
                    end,
                    f"a page of {self.kind} at offset {at} held only rows already read "
                    "(the server repeats pages or ignores the offset)",
                )
                return
            if has_more is not True and (
                page.count < limit or (total is not None and offset >= total)
            ):
                return
            if most is not None and offset >= most:
                # has_more is True here: it contradicts every total_count reported.
                self._stuck(
                    start,
                    end,
                    f"the offset {offset} is past the total_count {most} the server reported, "
                    "yet it reports has_more",
                )
                return


class TimeSlicePager(Pager):
    """Paging a modification-ordered list by splitting the creation window into one-page slices."""

    def __init__(
        self,
        fetch: Fetch,
        start: datetime,
        end: datetime,
        *,
        kind: str,
        method: Literal["GET", "POST"],
        path: str,
        id_field: str,
        lower_param: str,
        upper_param: str,
        bare: bool,
        page_size: int,
        max_page_size: int,
        on_stuck: OnStuck = "raise",
        dense_limit: int = DENSE_LIMIT,
        max_requests: int | None = None,
        redact: Callable[[str], str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            fetch,
            start,
            end,
            kind=kind,
            path=path,
            id_field=id_field,
            lower_param=lower_param,
            upper_param=upper_param,
            page_size=page_size,
            max_page_size=max_page_size,
            on_stuck=on_stuck,
            max_requests=max_requests,
            rows_key=None if bare else "data",
            redact=redact,
        )
        if dense_limit < page_size:
            raise ValueError("dense_limit must be at least page_size")
        self.method = method
        self.bare = bare
        self.dense_limit = dense_limit
        #: Further filters sent with every request (a business profile's ``profile_id``).
        self.extra = dict(extra or {})

    def _query(self, low: int, high: int, offset: int) -> tuple[Page, int | None]:
        self._cursor = f"at the slice {format_ms(low)} .. {format_ms(high)}" + (
            f", offset {offset}" if offset else ""
        )
        query: dict[str, str | int] = {
            **self.extra,
            "limit": self.page_size,
            "offset": offset,
            self.lower_param: format_ms(low),
            self.upper_param: format_ms(high),
        }
        if self.method == "GET":
            body = self._call("GET", self.path, params=query)
        else:
            body = self._call("POST", self.path, json=query)
        page = self._page(self._rows_of(body), low, high)
        return page, (None if self.bare else int_field(body, "total_count"))

    def _slices(self, low: int, high: int, total: int | None) -> list[tuple[int, int]]:
        # Aim for slices three quarters full, so one uneven slice rarely needs another split.
        wanted = 2 if total is None else math.ceil(total / max(1, self.page_size * 3 // 4))
        parts = max(2, min(wanted, MAX_SLICES, high - low))
        points = [low + (high - low) * i // parts for i in range(parts + 1)]
        return list(zip(points, points[1:], strict=False))

    def _rows(self) -> Iterator[dict[str, Any]]:
        limit = self.page_size
        end = self._end_ms
        pending = [(self._start_ms, end)]  # a stack: the next (lowest) slice is at the end
        while pending:
            low, high = pending.pop()
            self._unread = (low, end)
            page, total = self._query(low, high, 0)
            if page.outside:
                self.pages += 1
                yield from self._emit(page)
                self._stuck(low, end, self._outside(page, low, high))
                return
            # total_count below the rows in hand is a lie; the short-page rule still holds.
            if page.count < limit or total == page.count:
                self.pages += 1
                yield from self._emit(page)
            elif high - low >= 2:
                slices = self._slices(low, high, total)
                if not _partition(slices, low, high):
                    self._stuck(low, end, "a slice would leave its parent window")
                    return
                pending.extend(reversed(slices))
            else:
                go_on = yield from self._dense(low, high)
                if not go_on:
                    return

    def _dense(self, low: int, high: int) -> Generator[dict[str, Any], None, bool]:
        """Offset-page one overcrowded millisecond until its id count is complete.

        Returns whether paging may go on with the next slices.
        """
        limit = self.page_size
        end = self._end_ms
        seen: set[str] = set()  # ids of this millisecond found so far
        for attempt in range(1, DENSE_PASSES + 1):
            offset, fresh, total = 0, 0, None
            this_pass: set[str] = set()
            while True:
                page, total = self._query(low, high, offset)
                self.pages += 1
                if page.outside:
                    yield from self._emit(page)
                    self._stuck(low, end, self._outside(page, low, high))
                    return False
                new = 0
                for row, row_id, _, _ in page.rows:
                    if row_id in this_pass:
                        continue
                    this_pass.add(row_id)
                    new += 1
                    if row_id in seen:
                        continue
                    if len(seen) >= self.dense_limit:
                        self._stuck(
                            low,
                            high,
                            f"more than {self.dense_limit} {self.kind} in one millisecond",
                        )
                        return True
                    seen.add(row_id)
                    fresh += 1
                    if row_id not in self._yielded:
                        self._yielded.add(row_id)
                        yield row
                at, offset = offset, offset + page.count
                if page.rows and new == 0 and page.count >= limit:
                    self._stuck(
                        low,
                        high,
                        f"a page of {self.kind} at offset {at} held only rows already read "
                        "(the server repeats pages or ignores the offset)",
                    )
                    return True
                if page.count < limit or (total is not None and offset >= total):
                    break
            if (len(seen) >= total) if total is not None else (attempt > 1 and fresh == 0):
                return True
        self._stuck(
            low,
            high,
            f"more than {limit} {self.kind} in one millisecond kept changing "
            f"over {DENSE_PASSES} offset passes",
        )
        return True


def _partition(slices: list[tuple[int, int]], low: int, high: int) -> bool:
    """Whether ``slices`` cover ``[low, high]`` in order, each smaller than it."""
    if not slices or slices[0][0] != low or slices[-1][1] != high:
        return False
    previous = low
    for first, last in slices:
        if first != previous or not first < last or last - first >= high - low:
            return False
        previous = last
    return True
