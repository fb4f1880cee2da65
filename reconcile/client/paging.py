"""Paging through the processor's list endpoints: bounded, self-checking, each object at most once.

Every pager is a single-use iterable of the listed objects (dicts, as the processor sent them)
for one creation-time window ``[start, end]``. What it guarantees, against any server:

* **Bounded.** It makes at most ``max_requests`` list calls (default
  :data:`DEFAULT_MAX_REQUESTS`, 1,000: 100,000 objects at 100 per page; the client's own
  retries of one call are not counted again, see :class:`~reconcile.client.transport.RetryPolicy`).
  When the budget is spent it stops: with ``on_stuck="raise"`` it raises
  :class:`~reconcile.core.errors.RequestBudgetExhausted` (a :class:`PagingError` naming the list,
  the requests made, the unread part of the window, where paging stood and how to raise the
  budget), with ``on_stuck="report"`` it reports the unread part of the window. The budget is
  the backstop: each lie listed below is caught on its own, usually by the second request, but
  a server whose pages always look like progress (fresh rows, ``has_more``, a growing
  ``total_count``) is stopped by the budget alone. Raise it for windows of more objects:
  ``max_requests=`` on the call, ``max_list_requests=`` on the client.
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
* more objects in one instant than a page (or ``dense_limit``) holds (see "Stuck windows" in
  :mod:`reconcile.client.paging_strategies`).

``pager.pages`` counts list responses whose rows were used, ``pager.requests`` list calls made
(never more than ``max_requests``), ``pager.row_errors`` the first :data:`MAX_ROW_ERRORS`
problems (``pager.row_error_count`` counts them all), ``pager.incomplete`` the windows reported.

This module holds what every pager shares: the :class:`Pager` base (the request budget, the
row checks, the reports), the :class:`Fetch` protocol, :class:`IncompleteWindow`,
:class:`RowProblem` and the time helpers. The three strategies (``BackwardTimePager``,
``OffsetPager``, ``TimeSlicePager``) are in :mod:`reconcile.client.paging_strategies`; which
endpoint is paged by which, in :mod:`reconcile.client.list_endpoints`.

Time bounds are sent as ISO 8601 UTC with milliseconds and ``Z`` (``2024-05-01T12:00:00.000Z``);
``start`` and ``end`` are truncated to the millisecond.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NamedTuple, Protocol

from reconcile.core.errors import (
    MAX_ID_LENGTH,
    PagingError,
    RequestBudgetExhausted,
    escape_id,
    id_defect,
    json_type,
)

__all__ = [
    "DEFAULT_MAX_REQUESTS",
    "MAX_ID_LENGTH",
    "MAX_ROW_ERRORS",
    "Fetch",
    "IncompleteWindow",
    "OnStuck",
    "Page",
    "Pager",
    "RowProblem",
    "RowProblemKind",
    "check_budget",
    "format_ms",
    "format_timestamp",
    "int_field",
]

logger = logging.getLogger("reconcile.paging")

OnStuck = Literal["raise", "report"]
RowProblemKind = Literal["not_an_object", "missing_id", "bad_id", "bad_created"]

#: Default ``max_requests``: list calls one pager may make (100,000 objects at 100 a page).
DEFAULT_MAX_REQUESTS: Final = 1_000
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


def check_budget(value: int | None, name: str = "max_requests") -> int | None:
    """``value`` if it is a usable request budget (an int of at least 1) or ``None``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None")
    if value < 1:
        raise ValueError(f"{name} must be at least 1")
    return value


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


def format_ms(ms: int) -> str:
    when = _from_ms(ms)
    return (
        f"{when.year:04d}-{when.month:02d}-{when.day:02d}T{when.hour:02d}:{when.minute:02d}:"
        f"{when.second:02d}.{when.microsecond // 1000:03d}Z"
    )


def format_timestamp(value: datetime) -> str:
    """``value`` as the processor expects it: UTC, milliseconds, ``Z`` (truncated, not rounded)."""
    return format_ms(_to_ms(_require_aware(value, "value")))


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


def int_field(body: Any, name: str) -> int | None:
    """A non-negative integer field of a response (``None`` when absent or unusable)."""
    value = body.get(name) if isinstance(body, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


@dataclass(slots=True)
class Page:
    """One list response, inspected against the bounds of its request."""

    #: Usable rows inside the bounds: (row, id, earliest ms, latest ms of its printed time).
    rows: list[tuple[dict[str, Any], str, int, int]]
    #: How many rows the response held (usable or not).
    count: int
    #: Rows whose creation time lies outside the bounds.
    outside: int


# --------------------------------------------------------------------------------------------
# The Pager base (the strategies are in reconcile.client.paging_strategies)
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
        max_requests = check_budget(max_requests) or DEFAULT_MAX_REQUESTS
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
        #: Where paging stands, in words (for the budget's error): set by each strategy.
        self._cursor = "at the first page"
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
            reason = (
                f"the request budget of {self.max_requests} requests was exhausted; "
                f"{self.kind} created {format_ms(low)} .. {format_ms(high)} were not read"
            )
            if self.on_stuck == "raise":
                self._budget_error(low, high, reason)
            self._stuck(low, high, reason)
        for low, high, reason in self._deferred:
            self._stuck(low, high, reason, clamp=False)

    def _budget_error(self, low: int, high: int, reason: str) -> None:
        """Raise :class:`RequestBudgetExhausted` for the unread ``[low, high]``."""
        low = min(max(low, self._start_ms), self._end_ms)
        high = min(max(high, low), self._end_ms)
        text = (
            f"the {self.kind} list stopped after {self.requests} requests, its request budget "
            f"(max_requests={self.max_requests}), {self._cursor}: {self.kind} created "
            f"{format_ms(low)} .. {format_ms(high)} were not read. The server may be paging "
            f"without end; if the window really holds that many {self.kind}, raise the budget "
            f"(iter_{self.kind}(..., max_requests=N) per call, max_list_requests=N on the "
            "client) or list smaller windows"
        )
        raise RequestBudgetExhausted(
            text,
            kind=self.kind,
            requests=self.requests,
            max_requests=self.max_requests,
            cursor=self._cursor,
            start=_from_ms(low),
            end=_from_ms(high),
            reason=reason,
        ) from None

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

    def _page(self, rows: list[Any], low: int, high: int) -> Page:
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
        return Page(usable, len(rows), outside)

    def _emit(self, page: Page) -> Generator[dict[str, Any], None, int]:
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

    def _outside(self, page: Page, low: int, high: int) -> str:
        return (
            f"the server returned {page.outside} {self.kind} created outside the requested "
            f"{format_ms(low)} .. {format_ms(high)} (it ignores the time filter); "
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
            f"cannot page through {self.kind} created {format_ms(start_ms)} .. "
            f"{format_ms(end_ms)}: {reason}"
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
