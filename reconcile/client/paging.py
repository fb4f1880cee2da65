"""Paging through the processor's list endpoints: bounded, self-checking, each object at most once.

Every pager is a single-use iterable of the listed objects (dicts, as the processor sent them)
for one creation-time window ``[start, end]``. What it guarantees, against any server:

* **Bounded.** It makes at most ``max_requests`` list calls (default
  :data:`DEFAULT_MAX_REQUESTS`, 10,000: a million objects at 100 per page; the client's own
  retries of one call are not counted again, see :class:`~reconcile.client.processor.RetryPolicy`).
  When the budget is spent it stops and reports the unread part of the window. The budget is the
  backstop: each lie listed below is caught on its own, usually by the second request.
* **Each object at most once.** Ids already yielded are kept for the pager's life and never
  yielded again, whatever the server repeats (memory grows with the window: about 100 bytes
  an object, 10 MB per 100,000).
* **Only the window.** A row is yielded only if its creation time lies inside the bounds of the
  request that returned it (so inside the window), at the precision of the printed time: a
  time printed in milliseconds stands for that millisecond (Hyperswitch truncates microseconds,
  so a row printed at the window's last millisecond may be up to 999 us past it), a coarser one
  (``...T10:11:12Z``) for its whole second. A row outside the bounds means the server ignored
  the filter: it is skipped, never yielded, and the rest of the window is reported.
* **Defensive rows.** Only what paging needs is checked: a row must be a JSON object with a
  clean string id (1 to 255 printable characters: no NUL, control character, lone surrogate or
  other non-printable) and a readable ``created``/``created_at`` within the years 1 to 9999.
  A row that fails is skipped and recorded as a :class:`RowProblem` in ``pager.row_errors``;
  paging goes on. Everything else in a row (deep ``metadata``, lone surrogates in other
  fields, ...) is yielded as it is: whether it can be stored is the caller's business. No time
  arithmetic can overflow: bounds and every ``± 1 ms`` are clamped to the years 1..9999.
* **Self-checking.** Whatever cannot be read completely is reported, never silently dropped
  (as far as the server's answers can tell: a ``total_count`` that lies low on an endpoint
  without ``has_more`` ends a list early and looks like the truth): with ``on_stuck="raise"``
  (the default) the rows read so far are yielded and then
  :class:`~reconcile.core.errors.PagingError` is raised (with ``start``, ``end``, ``reason``); with
  ``on_stuck="report"`` an :class:`IncompleteWindow` ``(start, end, reason)`` is appended to
  ``pager.incomplete`` (overlapping windows with the same reason are merged) and the pager goes
  on where it can, else stops; it never raises for these. Row problems are never raised.
  Reasons and messages never quote foreign text (ids, times; a server may echo anything, even
  the API key); they are sentences with counts and times, e.g. ``"the request budget of 50
  requests was exhausted; refunds created 2024-05-01T11:00:00.000Z .. 2024-05-01T14:00:00.000Z
  were not read"``. A window reported lies within the pager's window, except the part of the
  caller's window the events API cannot list at all (older than 90 days, see
  :mod:`reconcile.client.events_api`).

What is detected (each a report, never a loop):

* the request budget exhausted (all pagers): the unread part of the window, paging stops;
* rows created outside the requested bounds (all pagers: the server ignores the time filter,
  or repeats the page of other bounds): the rest of the window, paging stops;
* a page of rows all read before while the bounds or the offset moved (the server repeats
  pages or ignores the offset): offset pagers on a full page (or ``has_more``), the backward
  pager on a full page, time slices within one crowded millisecond (that millisecond only);
  checked before the offset is compared with ``total_count``;
* offset pagers: ``has_more: true`` at an offset past every ``total_count`` the server
  reported; an empty page although ``has_more`` or ``total_count`` promised more. A short page
  without ``has_more`` is the end even if ``total_count`` says more (Hyperswitch's payout
  counts are known to disagree with its lists, issue #11967);
* the backward pager: a full page without one usable row (no next bound can be derived from
  it); a next upper bound that would move up or past the window's end;
* time slices: a slice that would leave its parent; a ``total_count`` below the rows in hand is
  ignored (the short-page rule still holds), one above them only shapes the split;
* more objects in one instant than a page (or ``dense_limit``) holds (below).

``pager.pages`` counts list responses whose rows were used, ``pager.requests`` list calls made
(never more than ``max_requests``), ``pager.row_errors`` the first :data:`MAX_ROW_ERRORS`
problems (``pager.row_error_count`` counts them all), ``pager.incomplete`` the windows reported.

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

Time bounds are sent as ISO 8601 UTC with milliseconds and ``Z`` (``2024-05-01T12:00:00.000Z``);
``start`` and ``end`` are truncated to the millisecond.

Stuck windows: when more objects than a page holds share one instant (for the backward pager:
fall within two consecutive milliseconds; for time slices: one millisecond), no time filter can
page through them and Hyperswitch's cursors (``ending_before``) are inclusive by timestamp too.
Time slices first fall back to offset paging of that millisecond (bounded by ``dense_limit``
ids), repeated until the ids found match ``total_count`` (or a pass finds nothing new). If that
fails, or for the backward pager at once, the window is stuck (raised or reported as above);
in report mode paging continues below it (the backward pager from one millisecond below).
"""

from __future__ import annotations

import logging
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NamedTuple, Protocol
from urllib.parse import quote

from reconcile.core.errors import MAX_ID_LENGTH, PagingError, escape_id, id_defect, json_type

__all__ = [
    "DEFAULT_MAX_REQUESTS",
    "MAX_ID_LENGTH",
    "MAX_ROW_ERRORS",
    "BackwardTimePager",
    "Fetch",
    "IncompleteWindow",
    "OffsetPager",
    "OnStuck",
    "Pager",
    "PaymentsDialect",
    "PayoutsDialect",
    "RefundsDialect",
    "RowProblem",
    "RowProblemKind",
    "TimeSlicePager",
    "disputes_pager",
    "events_pager",
    "format_timestamp",
    "payments_pager",
    "payouts_pager",
    "refunds_pager",
]

logger = logging.getLogger("reconcile.paging")

OnStuck = Literal["raise", "report"]
PaymentsDialect = Literal["hyperswitch", "seed"]
RefundsDialect = Literal["hyperswitch", "seed"]
PayoutsDialect = Literal["get", "post"]
RowProblemKind = Literal["not_an_object", "missing_id", "bad_id", "bad_created"]

#: Default ``max_requests``: list calls one pager may make (a million objects at 100 a page).
DEFAULT_MAX_REQUESTS: Final = 10_000
#: Default ``dense_limit``: most ids kept while offset-paging one overcrowded millisecond.
DENSE_LIMIT: Final = 10_000
#: Passes over one overcrowded millisecond before it is declared stuck.
DENSE_PASSES: Final = 3
#: Most slices one window is split into at once (keeps the stack of pending slices small).
MAX_SLICES: Final = 64
#: Row problems kept on ``pager.row_errors`` (``pager.row_error_count`` counts them all).
MAX_ROW_ERRORS: Final = 1_000

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
#: The representable range (``datetime.min`` .. ``datetime.max`` in UTC), in ms since the epoch.
_MIN_MS: Final = (datetime.min.replace(tzinfo=UTC) - _EPOCH) // _MS
_MAX_MS: Final = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // _MS
_TIME_FIELDS: Final = ("created", "created_at")
#: Longer than any ISO 8601 time; longer texts are not handed to ``fromisoformat``.
_MAX_TIME_TEXT: Final = 64


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


@dataclass(frozen=True, slots=True)
class RowProblem:
    """A list row that was skipped because paging could not use it.

    ``kind``: ``"not_an_object"`` (the row is not a JSON object), ``"missing_id"`` (no id, or
    ``null``/empty), ``"bad_id"`` (an id that is not a clean string: not a string, NUL, control
    characters, lone surrogates, other non-printables, over :data:`MAX_ID_LENGTH` characters),
    ``"bad_created"`` (no readable creation time, or one outside the years 1..9999).
    ``object_id`` is the row's id rendered by :func:`~reconcile.core.errors.escape_id` (printable,
    at most 80 characters), or ``None`` when there is none. ``reason`` says what is wrong,
    without raw foreign text.
    """

    kind: RowProblemKind
    object_id: str | None
    reason: str


class _BudgetSpent(Exception):
    """Internal: the pager's request budget is spent (caught by :meth:`Pager._run`)."""


# --------------------------------------------------------------------------------------------
# Time helpers (milliseconds since the epoch internally, always within _MIN_MS.._MAX_MS)
# --------------------------------------------------------------------------------------------


def _require_aware(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (naive datetimes are ambiguous)")
    return value


def _clamp(ms: int) -> int:
    return min(max(ms, _MIN_MS), _MAX_MS)


def _to_ms(value: datetime) -> int:
    """Milliseconds since the epoch, clamped to the representable years 1..9999 (UTC)."""
    return _clamp((value - _EPOCH) // _MS)


def _from_ms(ms: int) -> datetime:
    """The aware UTC datetime of ``ms`` (clamped: never an ``OverflowError``)."""
    return _EPOCH + _clamp(ms) * _MS


def _format_ms(ms: int) -> str:
    when = _from_ms(ms)
    return (
        f"{when.year:04d}-{when.month:02d}-{when.day:02d}T{when.hour:02d}:{when.minute:02d}:"
        f"{when.second:02d}.{when.microsecond // 1000:03d}Z"
    )


def format_timestamp(value: datetime) -> str:
    """``value`` as the processor expects it: UTC, milliseconds, ``Z`` (truncated, not rounded)."""
    return _format_ms(_to_ms(_require_aware(value, "value")))


_TIME_OF_DAY: Final = re.compile(r"[Tt ](\d\d)(?::?(\d\d)(?::?(\d\d)(?:[.,](\d+))?)?)?")


def _width_ms(text: str) -> int:
    """How many ms after the printed time the true time may be (0 for ms or finer precision)."""
    match = _TIME_OF_DAY.search(text)
    if match is None:
        return 86_400_000 - 1  # a date: the whole day
    _, minutes, seconds, fraction = match.groups()
    if minutes is None:
        return 3_600_000 - 1
    if seconds is None:
        return 60_000 - 1
    if fraction is None:
        return 1_000 - 1
    return 0 if len(fraction) >= 3 else 10 ** (3 - len(fraction)) - 1


def _time_span(value: Any) -> tuple[int, int] | str:
    """The ms span a printed creation time stands for, or why it cannot be read."""
    if not isinstance(value, str):
        return f"is {json_type(value)}, not a timestamp"
    text = value.strip()
    try:
        if len(text) > _MAX_TIME_TEXT:
            raise ValueError
        parsed = datetime.fromisoformat(text)
    except ValueError:
        # The value is foreign text (a server may echo anything, even the API key): not quoted.
        return "is not an ISO 8601 timestamp"
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)  # Hyperswitch prints UTC
    ms = (parsed - _EPOCH) // _MS  # aware subtraction: a timedelta, which cannot overflow here
    # Hyperswitch's own form, 2024-05-01T12:00:00.000Z, needs no closer look.
    width = 0 if len(text) == 24 and text[19] == "." and text[23] == "Z" else _width_ms(text)
    if ms < _MIN_MS or ms + width > _MAX_MS:
        return "is outside the years 1..9999 (UTC)"
    return ms, ms + width


# --------------------------------------------------------------------------------------------
# Row helpers
# --------------------------------------------------------------------------------------------


def _int_field(body: Any, name: str) -> int | None:
    """A non-negative integer field of a response (``None`` when absent or unusable)."""
    value = body.get(name) if isinstance(body, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


@dataclass(slots=True)
class _Page:
    """One list response, inspected against the bounds of its request."""

    #: Usable rows inside the bounds: (row, id, earliest ms, latest ms of its printed time).
    rows: list[tuple[dict[str, Any], str, int, int]]
    #: How many rows the response held (usable or not).
    count: int
    #: Rows whose creation time lies outside the bounds.
    outside: int


# --------------------------------------------------------------------------------------------
# Pagers
# --------------------------------------------------------------------------------------------


class Pager(Iterable[dict[str, Any]], ABC):
    """A single-use iterable over the objects of one list endpoint created in ``[start, end]``.

    Attributes after (or during) iteration: ``pages`` (list responses whose rows were used),
    ``requests`` (list calls made, at most ``max_requests``), ``incomplete`` (list of
    :class:`IncompleteWindow`), ``row_errors`` (list of :class:`RowProblem`, the first
    :data:`MAX_ROW_ERRORS`) and ``row_error_count``. See the module docstring for the
    guarantees.
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
        max_requests: int | None = None,
        rows_key: str | None = "data",
        unlistable: Iterable[IncompleteWindow] = (),
        redact: Callable[[str], str] | None = None,
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
        if max_requests is None:
            max_requests = DEFAULT_MAX_REQUESTS
        if isinstance(max_requests, bool) or not isinstance(max_requests, int):
            raise TypeError("max_requests must be an int or None")
        if max_requests < 1:
            raise ValueError("max_requests must be at least 1")
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
        self.max_requests: int = max_requests
        self.rows_key = rows_key
        #: Applied to a foreign id before it is rendered into a RowProblem (the client removes
        #: its API key: a server may echo it anywhere).
        self._redact = redact or (lambda text: text)
        self.pages = 0
        self.requests = 0
        self.incomplete: list[IncompleteWindow] = []
        self.row_errors: list[RowProblem] = []
        self.row_error_count = 0
        self._start_ms = _to_ms(start)
        self._end_ms = _to_ms(end)
        #: The part of the window not read yet (for the budget's report).
        self._unread = (self._start_ms, self._end_ms)
        #: Ids yielded so far: never yielded again.
        self._yielded: set[str] = set()
        #: Windows to raise after the rows in ``on_stuck="raise"`` mode (see ``_unlistable``).
        self._deferred: list[tuple[int, int, str]] = []
        self._started = False
        for window in unlistable:
            self._unlistable(_to_ms(window.start), _to_ms(window.end), window.reason)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._started:
            raise RuntimeError("a pager can be iterated once; ask the client for a new one")
        self._started = True
        return self._run()

    def _run(self) -> Iterator[dict[str, Any]]:
        try:
            yield from self._rows()
        except _BudgetSpent:
            low, high = self._unread
            self._stuck(
                low,
                high,
                f"the request budget of {self.max_requests} requests was exhausted; "
                f"{self.kind} created {_format_ms(low)} .. {_format_ms(high)} were not read",
            )
        for low, high, reason in self._deferred:
            self._stuck(low, high, reason, clamp=False)

    @abstractmethod
    def _rows(self) -> Iterator[dict[str, Any]]:
        """Yield the window's objects, each at most once."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(kind={self.kind!r}, start={self.start.isoformat()!r}, "
            f"end={self.end.isoformat()!r}, pages={self.pages}, requests={self.requests}, "
            f"max_requests={self.max_requests}, incomplete={len(self.incomplete)}, "
            f"row_errors={self.row_error_count})"
        )

    # -- requests --------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Mapping[str, Any] | None = None,
    ) -> Any:
        if self.requests >= self.max_requests:
            raise _BudgetSpent
        self.requests += 1
        return self._fetch(method, path, params=params, json=json)

    def _rows_of(self, body: Any) -> list[Any]:
        """The row array of a list response (its shape is checked, its rows are not)."""
        key = self.rows_key
        items = body if key is None else (body.get(key) if isinstance(body, dict) else None)
        if not isinstance(items, list):
            shape = "a JSON array" if key is None else f"an object with a {key!r} array"
            raise PagingError(
                f"unexpected {self.kind} list response: expected {shape}",
                reason="unexpected response",
            )
        return items

    # -- rows ------------------------------------------------------------------------------

    def _problem(self, kind: RowProblemKind, object_id: str | None, reason: str) -> None:
        self.row_error_count += 1
        if len(self.row_errors) < MAX_ROW_ERRORS:
            self.row_errors.append(RowProblem(kind, object_id, reason))
        log = logger.warning if self.row_error_count == 1 else logger.debug
        log("a %s list row was skipped (%s): %s", self.kind, kind, reason)

    def _inspect(self, row: Any) -> tuple[str, int, int] | None:
        """The id and creation span of a usable row; else record its problem, ``None``."""
        if not isinstance(row, dict):
            self._problem("not_an_object", None, f"the row is {json_type(row)}, not an object")
            return None
        raw_id = row.get(self.id_field)
        if raw_id is None or raw_id == "":
            self._problem("missing_id", None, f"the row has no {self.id_field!r}")
            return None
        clean = (
            type(raw_id) is str
            and len(raw_id) <= MAX_ID_LENGTH
            and raw_id.isprintable()
            and not raw_id.isspace()
        )
        defect = None if clean else id_defect(raw_id)
        if defect is not None:
            self._problem("bad_id", self._render_id(raw_id), f"{self.id_field!r} {defect}")
            return None
        why = None
        for name in _TIME_FIELDS:
            if name in row:
                span = _time_span(row[name])
                if isinstance(span, tuple):
                    return raw_id, span[0], span[1]
                why = why or f"{name!r} {span}"
        self._problem(
            "bad_created",
            self._render_id(raw_id),
            why or f"the row has no {' or '.join(repr(n) for n in _TIME_FIELDS)}",
        )
        return None

    def _render_id(self, raw_id: Any) -> str:
        """A foreign id as a RowProblem shows it: redacted, escaped, bounded."""
        return escape_id(self._redact(raw_id) if isinstance(raw_id, str) else raw_id)

    def _page(self, rows: list[Any], low: int, high: int) -> _Page:
        """Inspect a response's rows against its request's bounds ``[low, high]``."""
        usable: list[tuple[dict[str, Any], str, int, int]] = []
        outside = 0
        for row in rows:
            found = self._inspect(row)
            if found is None:
                continue
            row_id, earliest, latest = found
            if latest < low or earliest > high:
                outside += 1
                continue
            usable.append((row, row_id, earliest, latest))
        return _Page(usable, len(rows), outside)

    def _emit(self, page: _Page) -> Generator[dict[str, Any], None, int]:
        """Yield the page's rows not yielded before; returns how many it yielded."""
        fresh = 0
        for row, row_id, _, _ in page.rows:
            if row_id in self._yielded:
                continue
            self._yielded.add(row_id)
            fresh += 1
            yield row
        return fresh

    # -- reports ---------------------------------------------------------------------------

    def _outside(self, page: _Page, low: int, high: int) -> str:
        return (
            f"the server returned {page.outside} {self.kind} created outside the requested "
            f"{_format_ms(low)} .. {_format_ms(high)} (it ignores the time filter); "
            "the rest of the window was not read"
        )

    def _unlistable(self, start_ms: int, end_ms: int, reason: str) -> None:
        """Report a window the server cannot list at all, known beforehand (it may lie before
        the pager's window: the part of the caller's window the pager was clamped from).

        Recorded at once with ``on_stuck="report"``; raised after the rows otherwise.
        """
        if self.on_stuck == "report":
            self._stuck(start_ms, end_ms, reason, clamp=False)
        else:
            self._deferred.append((start_ms, end_ms, reason))

    def _stuck(self, start_ms: int, end_ms: int, reason: str, *, clamp: bool = True) -> None:
        """Raise or record a window that cannot be paged through (see ``on_stuck``)."""
        if clamp:
            # Never more than the pager's window (a crowded first millisecond reaches below it).
            start_ms = min(max(start_ms, self._start_ms), self._end_ms)
            end_ms = min(max(end_ms, start_ms), self._end_ms)
        window = IncompleteWindow(_from_ms(start_ms), _from_ms(end_ms), reason)
        text = (
            f"cannot page through {self.kind} created {_format_ms(start_ms)} .. "
            f"{_format_ms(end_ms)}: {reason}"
        )
        if self.on_stuck == "raise":
            raise PagingError(text, start=window.start, end=window.end, reason=reason)
        logger.warning("%s; recorded as incomplete", text)
        last = self.incomplete[-1] if self.incomplete else None
        if (
            last is not None
            and last.reason == reason
            and window.start <= last.end
            and last.start <= window.end
        ):
            # Adjacent slices share their boundary instant, so one crowded instant can make two
            # neighbouring windows stuck: report their union once.
            window = IncompleteWindow(
                min(last.start, window.start), max(last.end, window.end), reason
            )
            self.incomplete[-1] = window
        else:
            self.incomplete.append(window)


class BackwardTimePager(Pager):
    """Newest-first paging by moving an inclusive upper time bound down (no offsets)."""

    def _rows(self) -> Iterator[dict[str, Any]]:
        limit = self.page_size
        start = self._start_ms
        lower = _format_ms(start)
        upper = self._end_ms
        while True:
            self._unread = (start, upper)
            params: dict[str, str | int] = {
                self.lower_param: lower,
                self.upper_param: _format_ms(upper),
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
                    f"{_format_ms(oldest)} .. {_format_ms(upper)}",
                )
                following = oldest - 1
            elif fresh == 0:
                self._stuck(
                    start,
                    upper,
                    f"a full page of {self.kind} up to {_format_ms(upper)} held only rows "
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
        bounds = {self.lower_param: _format_ms(start), self.upper_param: _format_ms(end)}
        offset = 0
        most: int | None = None  # the largest total_count reported
        while True:
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
            total = _int_field(body, "total_count")
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

    def _query(self, low: int, high: int, offset: int) -> tuple[_Page, int | None]:
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
        page = self._page(self._rows_of(body), low, high)
        return page, (None if self.bare else _int_field(body, "total_count"))

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
    max_requests: int | None = None,
    redact: Callable[[str], str] | None = None,
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
            max_requests=max_requests,
            redact=redact,
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
            max_requests=max_requests,
            redact=redact,
        )
    raise ValueError("dialect must be 'hyperswitch' or 'seed'")


def refunds_pager(
    fetch: Fetch,
    start: datetime,
    end: datetime,
    *,
    dialect: RefundsDialect = "hyperswitch",
    page_size: int = 100,
    on_stuck: OnStuck = "raise",
    dense_limit: int = DENSE_LIMIT,
    max_requests: int | None = None,
    redact: Callable[[str], str] | None = None,
) -> Pager:
    """Refunds created in ``[start, end]``: ``POST /refunds/list`` by time slices.

    ``dialect="hyperswitch"`` filters with ``start_time``/``end_time`` (``RefundListRequest``);
    ``dialect="seed"`` with the seed's generic ``created_gte``/``created_lte``
    (``processor-interface.md``, Refunds). Both answer ``{count, total_count, data}``.
    """
    if dialect == "hyperswitch":
        lower, upper = "start_time", "end_time"
    elif dialect == "seed":
        lower, upper = "created_gte", "created_lte"
    else:
        raise ValueError("dialect must be 'hyperswitch' or 'seed'")
    return TimeSlicePager(
        fetch,
        start,
        end,
        kind="refunds",
        method="POST",
        path="/refunds/list",
        id_field="refund_id",
        lower_param=lower,
        upper_param=upper,
        bare=False,
        page_size=page_size,
        max_page_size=100,
        on_stuck=on_stuck,
        dense_limit=dense_limit,
        max_requests=max_requests,
        redact=redact,
    )


def payouts_pager(
    fetch: Fetch,
    start: datetime,
    end: datetime,
    *,
    dialect: PayoutsDialect = "get",
    page_size: int | None = None,
    on_stuck: OnStuck = "raise",
    max_requests: int | None = None,
    redact: Callable[[str], str] | None = None,
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
            max_requests=max_requests,
            redact=redact,
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
            max_requests=max_requests,
            redact=redact,
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
    max_requests: int | None = None,
    redact: Callable[[str], str] | None = None,
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
        max_requests=max_requests,
        redact=redact,
    )


def events_pager(
    fetch: Fetch,
    merchant_id: str,
    start: datetime,
    end: datetime,
    *,
    is_delivered: bool | None = False,
    page_size: int = 100,
    on_stuck: OnStuck = "raise",
    max_requests: int | None = None,
    unlistable: Iterable[IncompleteWindow] = (),
    redact: Callable[[str], str] | None = None,
) -> Pager:
    """Initial delivery attempts (events) created in ``[start, end]``: the admin events list.

    ``POST /events/{merchant_id}`` with ``{created_after, created_before, limit, offset}`` and
    ``is_delivered`` unless ``None`` (``EventListConstraints``; both bounds inclusive, newest
    first, at most 100 per page); answers ``{events, total_count}``. Offset paging: events
    created while paging push rows down, the repeats are skipped by ``event_id``. The 90-day
    limit of the server is the caller's
    (:meth:`reconcile.client.events_api.EventsClient.iter_events`
    clamps the window and passes the clipped part as ``unlistable``).
    """
    if is_delivered is not None and not isinstance(is_delivered, bool):
        raise TypeError("is_delivered must be a bool or None")
    defect = id_defect(merchant_id)
    if defect is not None or merchant_id in (".", ".."):
        raise ValueError(f"merchant_id must be a clean id: it {defect or 'is a dot segment'}")
    return OffsetPager(
        fetch,
        start,
        end,
        method="POST",
        extra={} if is_delivered is None else {"is_delivered": is_delivered},
        kind="events",
        path=f"/events/{quote(merchant_id, safe='')}",
        id_field="event_id",
        lower_param="created_after",
        upper_param="created_before",
        page_size=page_size,
        max_page_size=100,
        on_stuck=on_stuck,
        max_requests=max_requests,
        rows_key="events",
        unlistable=unlistable,
        redact=redact,
    )
