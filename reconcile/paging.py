"""Paging through the processor's list endpoints, to the end of the data, in constant memory.

Every pager is a single-use iterable of the listed objects (dicts, as the processor sent them)
for one creation-time window ``[start, end]``. Each object is yielded at most once. After (or
during) iteration a pager exposes ``pages`` (list responses whose rows were used), ``requests``
(list calls made; the client's own retries of one call are not counted again) and
``incomplete`` (windows that could not be read completely, see *Stuck windows*).

Three strategies, chosen per endpoint by what its server really does (``hyperswitch-facts.md``
section 4):

``BackwardTimePager``: ``GET /payments/list`` (Hyperswitch) and ``GET /payouts/list``.
    Newest first, no offset, no ``has_more``, inclusive time bounds. Each next request moves the
    upper bound down to the oldest ``created`` of the page. Hyperswitch stores creation times in
    microseconds but prints them with milliseconds, so a bound equal to the printed time would
    drop the unread rows of that millisecond; the next upper bound is therefore the *following*
    millisecond (``oldest + 1 ms``), and the rows this re-returns are skipped by id. Only the ids
    of those two milliseconds are remembered. The end is a page shorter than ``limit``.

``OffsetPager``: the seed's ``POST /payments/list`` (``has_more``) and ``POST /payouts/list``
    (``total_count``, at most 20 per page). Both are ordered by creation time, which does not
    change, so offsets are stable except for objects created inside the window while paging
    (they push rows down by one: the ids of the previous page are kept to skip those repeats).

``TimeSlicePager``: ``POST /refunds/list`` and ``GET /disputes/list``. These are ordered by
    *modification* time, so offset pages shift while objects change: an unread refund that is
    updated jumps to the front, behind the offset already read, and would be missed (overlapping
    pages cannot catch that; they only turn duplicates into skips). Instead the creation-time
    window, which does not move, is split until every slice fits in one response (fewer rows
    than ``limit``, or all of ``total_count``); one response is one consistent snapshot, so
    updates between requests cannot hide a row. Adjacent slices share their boundary
    millisecond; the ids of the previous slice are kept to skip rows seen twice there. Costs one
    extra request per split; refund and dispute volumes per window are small.

Time bounds are sent as ISO 8601 UTC with milliseconds and ``Z`` (``2024-05-01T12:00:00.000Z``);
``start`` and ``end`` are truncated to the millisecond.

Stuck windows: when more objects than a page holds share one instant (for the backward pager:
fall within two consecutive milliseconds; for time slices: one millisecond), no time filter can
page through them and Hyperswitch's cursors (``ending_before``) are inclusive by timestamp too.
Time slices first fall back to offset paging of that millisecond with an id set (bounded by
``dense_limit``), repeated until the ids found match ``total_count`` (or a pass finds nothing
new). If that fails, or for the backward pager at once: with ``on_stuck="raise"`` (the default)
the rows read so far are yielded and :class:`~reconcile.errors.PagingError` is raised; with
``on_stuck="report"`` the window is appended to ``pager.incomplete`` as
``(start, end, reason)`` and paging continues below it (for the backward pager from one
millisecond below the stuck ones).
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Generator, Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NamedTuple, Protocol

from reconcile.errors import PagingError

__all__ = [
    "BackwardTimePager",
    "Fetch",
    "IncompleteWindow",
    "OffsetPager",
    "OnStuck",
    "Pager",
    "PaymentsDialect",
    "PayoutsDialect",
    "TimeSlicePager",
    "disputes_pager",
    "format_timestamp",
    "payments_pager",
    "payouts_pager",
    "refunds_pager",
]

logger = logging.getLogger("reconcile.paging")

OnStuck = Literal["raise", "report"]
PaymentsDialect = Literal["hyperswitch", "seed"]
PayoutsDialect = Literal["get", "post"]

#: Default ``dense_limit``: most ids kept while offset-paging one overcrowded millisecond.
DENSE_LIMIT: Final = 10_000
#: Passes over one overcrowded millisecond before it is declared stuck.
DENSE_PASSES: Final = 3
#: Most slices one window is split into at once (keeps the stack of pending slices small).
MAX_SLICES: Final = 64

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
_TIME_FIELDS: Final = ("created", "created_at")


class Fetch(Protocol):
    """How a pager calls the processor: the client's JSON request function (with retries)."""

    def __call__(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Mapping[str, Any] | None = None,
    ) -> Any: ...


class IncompleteWindow(NamedTuple):
    """A creation-time window a pager could not read completely (``on_stuck="report"``)."""

    start: datetime
    end: datetime
    reason: str


# --------------------------------------------------------------------------------------------
# Time helpers (milliseconds since the epoch internally)
# --------------------------------------------------------------------------------------------


def _require_aware(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (naive datetimes are ambiguous)")
    return value


def _to_ms(value: datetime) -> int:
    return (value - _EPOCH) // _MS


def _from_ms(ms: int) -> datetime:
    return _EPOCH + ms * _MS


def _format_ms(ms: int) -> str:
    return _from_ms(ms).strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def format_timestamp(value: datetime) -> str:
    """``value`` as the processor expects it: UTC, milliseconds, ``Z`` (truncated, not rounded)."""
    return _format_ms(_to_ms(_require_aware(value, "value")))


def _parse_ms(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)  # Hyperswitch prints UTC
    return _to_ms(parsed)


# --------------------------------------------------------------------------------------------
# Response helpers
# --------------------------------------------------------------------------------------------


def _rows_of(body: Any, *, kind: str, bare: bool = False) -> list[dict[str, Any]]:
    items = body if bare else (body.get("data") if isinstance(body, dict) else None)
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        shape = "a JSON array" if bare else "an object with a 'data' array"
        raise PagingError(
            f"unexpected {kind} list response: expected {shape}", reason="unexpected response"
        )
    return items


def _int_field(body: Any, name: str) -> int | None:
    value = body.get(name) if isinstance(body, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --------------------------------------------------------------------------------------------
# Pagers
# --------------------------------------------------------------------------------------------


class Pager(Iterable[dict[str, Any]], ABC):
    """A single-use iterable over the objects of one list endpoint created in ``[start, end]``.

    Attributes after (or during) iteration: ``pages`` (list responses whose rows were used),
    ``requests`` (list calls made), ``incomplete`` (list of :class:`IncompleteWindow`).
    """

    def __init__(
        self,
        fetch: Fetch,
        start: datetime,
        end: datetime,
        *,
        kind: str,
        path: str,
        id_field: str,
        lower_param: str,
        upper_param: str,
        page_size: int,
        max_page_size: int,
        on_stuck: OnStuck = "raise",
    ) -> None:
        _require_aware(start, "start")
        _require_aware(end, "end")
        if start > end:
            raise ValueError("start must not be after end")
        if isinstance(page_size, bool) or not isinstance(page_size, int):
            raise TypeError("page_size must be an int")
        if not 1 <= page_size <= max_page_size:
            raise ValueError(f"page_size for {kind} must be between 1 and {max_page_size}")
        if on_stuck not in ("raise", "report"):
            raise ValueError("on_stuck must be 'raise' or 'report'")
        self._fetch = fetch
        self.path = path
        self.lower_param = lower_param
        self.upper_param = upper_param
        self.start = start
        self.end = end
        self.kind = kind
        self.id_field = id_field
        self.page_size = page_size
        self.on_stuck: OnStuck = on_stuck
        self.pages = 0
        self.requests = 0
        self.incomplete: list[IncompleteWindow] = []
        self._start_ms = _to_ms(start)
        self._end_ms = _to_ms(end)
        self._started = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._started:
            raise RuntimeError("a pager can be iterated once; ask the client for a new one")
        self._started = True
        return self._rows()

    @abstractmethod
    def _rows(self) -> Iterator[dict[str, Any]]:
        """Yield the window's objects, each at most once."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(kind={self.kind!r}, start={self.start.isoformat()!r}, "
            f"end={self.end.isoformat()!r}, pages={self.pages}, requests={self.requests}, "
            f"incomplete={len(self.incomplete)})"
        )

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Mapping[str, Any] | None = None,
    ) -> Any:
        self.requests += 1
        return self._fetch(method, path, params=params, json=json)

    def _id(self, row: Mapping[str, Any]) -> str:
        value = row.get(self.id_field)
        if not isinstance(value, str) or not value:
            raise PagingError(
                f"a {self.kind} list row has no {self.id_field!r}", reason="row without id"
            )
        return value

    def _created_ms(self, row: Mapping[str, Any]) -> int:
        for name in _TIME_FIELDS:
            if name in row:
                ms = _parse_ms(row[name])
                if ms is not None:
                    return ms
        self._id(row)
        # The row's id is foreign text: it stays out of the message (and so out of logs).
        raise PagingError(
            f"a {self.kind} list row has no readable creation time",
            reason="row without creation time",
        )

    def _stuck(self, start_ms: int, end_ms: int, reason: str) -> None:
        """Raise or record a window that cannot be paged through (see ``on_stuck``)."""
        window = IncompleteWindow(_from_ms(start_ms), _from_ms(end_ms), reason)
        text = (
            f"cannot page through {self.kind} created {_format_ms(start_ms)} .. "
            f"{_format_ms(end_ms)}: {reason}"
        )
        if self.on_stuck == "raise":
            raise PagingError(text, start=window.start, end=window.end, reason=reason)
        logger.warning("%s; recorded as incomplete, continuing", text)
        last = self.incomplete[-1] if self.incomplete else None
        if last is not None and window.start <= last.end and last.start <= window.end:
            # Adjacent slices share their boundary instant, so one crowded instant can make two
            # neighbouring windows stuck: report their union once.
            window = IncompleteWindow(
                min(last.start, window.start), max(last.end, window.end), last.reason
            )
            self.incomplete[-1] = window
        else:
            self.incomplete.append(window)


class BackwardTimePager(Pager):
    """Newest-first paging by moving an inclusive upper time bound down (no offsets)."""

    def _rows(self) -> Iterator[dict[str, Any]]:
        limit = self.page_size
        lower = _format_ms(self._start_ms)
        upper = self._end_ms
        # Ids already yielded whose creation millisecond the next request returns again.
        recent: dict[str, int] = {}
        while True:
            params: dict[str, str | int] = {
                self.lower_param: lower,
                self.upper_param: _format_ms(upper),
                "limit": limit,
            }
            rows = _rows_of(self._call("GET", self.path, params=params), kind=self.kind)
            self.pages += 1
            oldest: int | None = None
            for row in rows:
                row_id, created = self._id(row), self._created_ms(row)
                oldest = created if oldest is None else min(oldest, created)
                if row_id in recent:
                    continue
                recent[row_id] = created
                yield row
            if len(rows) < limit or oldest is None:
                return
            following = min(oldest + 1, upper)
            if following >= upper:
                # A full page inside [oldest, upper]: lowering the bound cannot make progress.
                self._stuck(
                    oldest - 1,
                    upper,
                    f"more than {limit} {self.kind} created within "
                    f"{_format_ms(oldest)} .. {_format_ms(upper)}",
                )
                recent.clear()
                following = oldest - 1
            else:
                recent = {key: ms for key, ms in recent.items() if oldest <= ms <= following}
            if following < self._start_ms:
                return
            upper = following


class OffsetPager(Pager):
    """Offset paging over a creation-ordered list, up to ``has_more``/``total_count``/short page."""

    def _rows(self) -> Iterator[dict[str, Any]]:
        limit = self.page_size
        bounds = {
            self.lower_param: _format_ms(self._start_ms),
            self.upper_param: _format_ms(self._end_ms),
        }
        offset = 0
        previous: set[str] = set()
        while True:
            body = self._call("POST", self.path, json={"limit": limit, "offset": offset, **bounds})
            rows = _rows_of(body, kind=self.kind)
            self.pages += 1
            current: set[str] = set()
            fresh = 0
            for row in rows:
                row_id = self._id(row)
                current.add(row_id)
                if row_id in previous:
                    continue
                fresh += 1
                yield row
            offset += len(rows)
            has_more = body.get("has_more")
            total = _int_field(body, "total_count")
            if not rows or has_more is False:
                return
            if has_more is not True and (
                len(rows) < limit or (total is not None and offset >= total)
            ):
                return
            if fresh == 0:
                self._stuck(
                    self._start_ms,
                    self._end_ms,
                    f"a full page at offset {offset - len(rows)} repeated the previous one",
                )
                return
            previous = current


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
        )
        if dense_limit < page_size:
            raise ValueError("dense_limit must be at least page_size")
        self.method = method
        self.bare = bare
        self.dense_limit = dense_limit

    def _query(self, low: int, high: int, offset: int) -> tuple[list[dict[str, Any]], int | None]:
        query: dict[str, str | int] = {
            "limit": self.page_size,
            "offset": offset,
            self.lower_param: _format_ms(low),
            self.upper_param: _format_ms(high),
        }
        if self.method == "GET":
            body = self._call("GET", self.path, params=query)
        else:
            body = self._call("POST", self.path, json=query)
        rows = _rows_of(body, kind=self.kind, bare=self.bare)
        return rows, (None if self.bare else _int_field(body, "total_count"))

    def _slices(self, low: int, high: int, total: int | None) -> list[tuple[int, int]]:
        # Aim for slices three quarters full, so one uneven slice rarely needs another split.
        wanted = 2 if total is None else math.ceil(total / max(1, self.page_size * 3 // 4))
        parts = max(2, min(wanted, MAX_SLICES, high - low))
        points = [low + (high - low) * i // parts for i in range(parts + 1)]
        return list(zip(points, points[1:], strict=False))

    def _rows(self) -> Iterator[dict[str, Any]]:
        limit = self.page_size
        pending = [(self._start_ms, self._end_ms)]  # a stack: the next slice is at the end
        carry: set[str] = set()  # ids of the previous slice, which shares its last millisecond
        while pending:
            low, high = pending.pop()
            rows, total = self._query(low, high, 0)
            if len(rows) < limit or (total is not None and len(rows) >= total):
                self.pages += 1
                seen = set()
                for row in rows:
                    row_id = self._id(row)
                    seen.add(row_id)
                    if row_id not in carry:
                        yield row
                carry = seen
            elif high - low >= 2:
                pending.extend(reversed(self._slices(low, high, total)))
            else:
                carry = yield from self._dense(low, high, carry)

    def _dense(
        self, low: int, high: int, carry: set[str]
    ) -> Generator[dict[str, Any], None, set[str]]:
        """Offset-page one overcrowded millisecond, keeping its ids, until the count is complete."""
        limit = self.page_size
        seen: set[str] = set()
        for attempt in range(1, DENSE_PASSES + 1):
            offset, fresh, total = 0, 0, None
            while True:
                rows, total = self._query(low, high, offset)
                self.pages += 1
                for row in rows:
                    row_id = self._id(row)
                    if row_id in seen:
                        continue
                    if len(seen) >= self.dense_limit:
                        self._stuck(
                            low,
                            high,
                            f"more than {self.dense_limit} {self.kind} in one millisecond",
                        )
                        return seen
                    seen.add(row_id)
                    fresh += 1
                    if row_id not in carry:
                        yield row
                offset += len(rows)
                if len(rows) < limit or (total is not None and offset >= total):
                    break
            if (len(seen) >= total) if total is not None else (attempt > 1 and fresh == 0):
                return seen
        self._stuck(
            low,
            high,
            f"more than {limit} {self.kind} in one millisecond kept changing "
            f"over {DENSE_PASSES} offset passes",
        )
        return seen


# --------------------------------------------------------------------------------------------
# The endpoints
# --------------------------------------------------------------------------------------------


def payments_pager(
    fetch: Fetch,
    start: datetime,
    end: datetime,
    *,
    dialect: PaymentsDialect = "hyperswitch",
    page_size: int = 100,
    on_stuck: OnStuck = "raise",
) -> Pager:
    """Payments created in ``[start, end]``.

    ``dialect="hyperswitch"``: ``GET /payments/list`` with ``created.gte``/``created.lte``
    (the API-key form of the real server). ``dialect="seed"``: ``POST /payments/list`` with
    ``{limit, offset, created_gte, created_lte}`` and ``has_more``.
    """
    if dialect == "hyperswitch":
        return BackwardTimePager(
            fetch,
            start,
            end,
            kind="payments",
            path="/payments/list",
            id_field="payment_id",
            lower_param="created.gte",
            upper_param="created.lte",
            page_size=page_size,
            max_page_size=100,
            on_stuck=on_stuck,
        )
    if dialect == "seed":
        return OffsetPager(
            fetch,
            start,
            end,
            kind="payments",
            path="/payments/list",
            id_field="payment_id",
            lower_param="created_gte",
            upper_param="created_lte",
            page_size=page_size,
            max_page_size=100,
            on_stuck=on_stuck,
        )
    raise ValueError("dialect must be 'hyperswitch' or 'seed'")


def refunds_pager(
    fetch: Fetch,
    start: datetime,
    end: datetime,
    *,
    page_size: int = 100,
    on_stuck: OnStuck = "raise",
    dense_limit: int = DENSE_LIMIT,
) -> Pager:
    """Refunds created in ``[start, end]``: ``POST /refunds/list`` by time slices."""
    return TimeSlicePager(
        fetch,
        start,
        end,
        kind="refunds",
        method="POST",
        path="/refunds/list",
        id_field="refund_id",
        lower_param="start_time",
        upper_param="end_time",
        bare=False,
        page_size=page_size,
        max_page_size=100,
        on_stuck=on_stuck,
        dense_limit=dense_limit,
    )


def payouts_pager(
    fetch: Fetch,
    start: datetime,
    end: datetime,
    *,
    dialect: PayoutsDialect = "get",
    page_size: int | None = None,
    on_stuck: OnStuck = "raise",
) -> Pager:
    """Payouts created in ``[start, end]``.

    ``dialect="get"``: ``GET /payouts/list`` (``{size, data}``, no ``total_count``, at most 100
    per page, default 100). ``dialect="post"``: ``POST /payouts/list`` (``total_count``, at most
    20 per page, default 20).
    """
    if dialect == "get":
        return BackwardTimePager(
            fetch,
            start,
            end,
            kind="payouts",
            path="/payouts/list",
            id_field="payout_id",
            lower_param="start_time",
            upper_param="end_time",
            page_size=100 if page_size is None else page_size,
            max_page_size=100,
            on_stuck=on_stuck,
        )
    if dialect == "post":
        return OffsetPager(
            fetch,
            start,
            end,
            kind="payouts",
            path="/payouts/list",
            id_field="payout_id",
            lower_param="start_time",
            upper_param="end_time",
            page_size=20 if page_size is None else page_size,
            max_page_size=20,
            on_stuck=on_stuck,
        )
    raise ValueError("dialect must be 'get' or 'post'")


def disputes_pager(
    fetch: Fetch,
    start: datetime,
    end: datetime,
    *,
    page_size: int = 100,
    on_stuck: OnStuck = "raise",
    dense_limit: int = DENSE_LIMIT,
) -> Pager:
    """Disputes created in ``[start, end]``: ``GET /disputes/list`` (bare array) by time slices."""
    return TimeSlicePager(
        fetch,
        start,
        end,
        kind="disputes",
        method="GET",
        path="/disputes/list",
        id_field="dispute_id",
        lower_param="start_time",
        upper_param="end_time",
        bare=True,
        page_size=page_size,
        max_page_size=100,
        on_stuck=on_stuck,
        dense_limit=dense_limit,
    )
