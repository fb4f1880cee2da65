"""One reconcile run: the three paths that feed missed transitions into the inbox.

1. **Events API** (when an admin key is configured, :mod:`reconcile.recovery.undelivered`): the
   processor's undelivered webhooks of the last 90 days, fetched with their original signed
   bytes, verified and stored under their original ids.
2. **Lists** (this module): each kind's objects created in a window (the processor's lists
   filter on creation time), with a watermark and an overlap, diffed against the
   projection.
3. **Sweep** (:mod:`reconcile.recovery.sweep`): every object not yet settled, re-fetched by id, for
   the late changes no creation window shows.

The diff is pure (:mod:`reconcile.core.diff`); recovering a missed transition is the same step
for the lists and the sweep (:mod:`reconcile.recovery.recover`). A merchant's key reads every
business profile's objects: each path keeps only this account's
(:mod:`reconcile.core.ownership`, the receive path's rule), asking the processor for the
account's one profile where a list takes ``profile_id``. One run at a time across hosts
(a database lock). The report (:mod:`reconcile.core.report`) is stored and returned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal, Protocol, cast

import receiver.core.signals as signals
from receiver.core.accounts import DEFAULT_ACCOUNT, AccountSource
from receiver.core.clock import Clock, as_utc, utcnow
from receiver.core.transitions import is_settled
from receiver.storage.account_table import StoredAccounts
from receiver.store import Store
from receiver.worker.runner import worker_name
from reconcile.client.list_endpoints import RefundsDialect
from reconcile.client.paging import Pager
from reconcile.client.prefetch import Prefetch
from reconcile.client.processor import ObjectKind, ProcessorClient
from reconcile.core.diff import Remote
from reconcile.core.errors import (
    AdoptionInProgress,
    NotAdopted,
    NotFound,
    ProcessorError,
    escape_id,
)
from reconcile.core.ownership import Ownership
from reconcile.core.report import SAMPLE, EventsReport, KindReport, Report, SweepReport
from reconcile.recovery.recover import Recovery, RecoveryOptions
from reconcile.recovery.sweep import Due, FollowedObjects, SweepPolicy
from reconcile.storage.store import ReconcileStore, adoption_state

log = logging.getLogger("reconcile.runner")

#: Public names of the kinds (CLI, report) -> object kind.
KIND_NAMES: Final[Mapping[str, str]] = {
    "payments": "payment",
    "refunds": "refund",
    "payouts": "payout",
    "disputes": "dispute",
    "mandates": "mandate",
}
#: Kinds the processor lists (mandates have no list: only the sweep follows them).
LISTED_KINDS: Final = ("payments", "refunds", "payouts", "disputes")
DEFAULT_KINDS: Final = ("payments", "refunds", "payouts", "disputes", "mandates")

Mode = Literal["incremental", "wide", "window"]
Progress = Callable[[str, int], None]

#: Remote objects diffed and marked seen together: one database round trip per chunk.
CHUNK: Final = 500
#: When the listing fails, the objects gathered so far are diffed in whole units of this
#: many (the last partial hundred of a failed listing is left for the next run).
CHUNK_UNIT: Final = 100
#: Chunks listed ahead of the one being written (bounded: memory stays constant).
PREFETCH_DEPTH: Final = 2
#: When a run fails while listing ahead, how long it waits for the request in flight.
PREFETCH_STOP_TIMEOUT: Final = 10.0
#: The cost of one listed window, at most (the pager reports a window it had to leave).
DEFAULT_MAX_REQUESTS: Final = 2_000


class EventsPath(Protocol):
    """The events-API path (:class:`reconcile.recovery.undelivered.UndeliveredEvents`)."""

    def run(
        self, start: datetime, end: datetime, report: EventsReport, *, dry_run: bool
    ) -> None: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcileOptions:
    """What to reconcile and how.

    ``incremental``: lists from each kind's watermark minus ``overlap`` (or ``lookback`` on
    the first run) to now; ``wide``: the last ``wide_window``; ``window``: ``since`` to
    ``until``. A window never ends in the future. The sweep spends at most
    ``sweep_budget`` requests a run (``0`` turns it off); the events path runs when an
    events client is configured and ``events`` is true.
    """

    mode: Mode = "incremental"
    kinds: Sequence[str] = DEFAULT_KINDS
    since: datetime | None = None
    until: datetime | None = None
    overlap: timedelta = timedelta(hours=1)
    lookback: timedelta = timedelta(hours=48)
    wide_window: timedelta = timedelta(hours=48)
    dry_run: bool = False
    payments_dialect: Literal["hyperswitch", "seed"] = "hyperswitch"
    payouts_dialect: Literal["get", "post"] = "get"
    page_size: int = 100
    max_requests: int = DEFAULT_MAX_REQUESTS
    #: The merchant a recovered event names when neither its object (a refund, a dispute,
    #: a mandate) nor the run's account (its ``merchant_id`` in ``accounts``) names one.
    merchant_id: str | None = None
    lock_wait: float = 0.0
    sweep_budget: int = 500
    sweep_policy: SweepPolicy = field(default_factory=SweepPolicy)
    events: bool = True
    events_window: timedelta = timedelta(days=90)
    #: Refuse to run on a database with neither an adoption record nor a run of its own.
    require_adoption: bool = True

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in KIND_NAMES]
        if unknown:
            raise ValueError(f"unknown kind(s) {unknown}; choose from {sorted(KIND_NAMES)}")
        if self.mode == "window" and (self.since is None or self.until is None):
            raise ValueError("mode 'window' needs since and until")
        if self.since is not None and self.until is not None and self.since > self.until:
            raise ValueError("since must not be after until")
        if self.sweep_budget < 0 or self.max_requests < 1:
            raise ValueError("budgets must not be negative")


def kind_pager(
    client: ProcessorClient,
    name: str,
    start: datetime,
    end: datetime,
    *,
    payments_dialect: Literal["hyperswitch", "seed"] = "hyperswitch",
    payouts_dialect: Literal["get", "post"] = "get",
    page_size: int = 100,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    profile_id: str | None = None,
) -> Pager:
    """The pager over one listed kind's objects created in ``[start, end]``, in report mode
    (a stuck window is reported, never raised), within ``max_requests``. The seed dialect
    of the payments list also picks the seed's refund filters. ``profile_id`` is sent where
    the list takes one (refunds, the payouts' POST list, disputes); the payments list and the
    payouts' GET list take none (their rows are filtered by the caller)."""
    budget: dict[str, Any] = {"on_stuck": "report", "max_requests": max_requests}
    if name == "payments":
        return client.iter_payments(
            start, end, dialect=payments_dialect, page_size=page_size, **budget
        )
    if name == "refunds":
        dialect: RefundsDialect = "seed" if payments_dialect == "seed" else "hyperswitch"
        profile = profile_id if dialect == "hyperswitch" else None
        return client.iter_refunds(
            start, end, dialect=dialect, page_size=page_size, profile_id=profile, **budget
        )
    if name == "payouts":
        size = min(page_size, 20) if payouts_dialect == "post" else page_size
        profile = profile_id if payouts_dialect == "post" else None
        return client.iter_payouts(
            start, end, dialect=payouts_dialect, page_size=size, profile_id=profile, **budget
        )
    if name == "disputes":
        return client.iter_disputes(
            start, end, page_size=page_size, profile_id=profile_id, **budget
        )
    raise ValueError(f"{name} has no list (choose from {', '.join(LISTED_KINDS)})")


def truncate_ms(value: datetime) -> datetime:
    """``value`` in UTC, truncated to the millisecond (what the processor's filters see)."""
    utc = as_utc(value)
    return utc.replace(microsecond=utc.microsecond // 1000 * 1000)


def _chunks(rows: Iterable[dict[str, Any]], size: int, unit: int) -> Iterator[list[dict[str, Any]]]:
    """``rows`` in lists of ``size``. When ``rows`` raises a :class:`ProcessorError`, the
    whole ``unit``s gathered before it are yielded first, then the error is raised."""
    chunk: list[dict[str, Any]] = []
    try:
        for row in rows:
            chunk.append(row)
            if len(chunk) == size:
                yield chunk
                chunk = []
    except ProcessorError:
        whole = len(chunk) // unit * unit
        if whole:
            yield chunk[:whole]
        raise
    if chunk:
        yield chunk


class Reconciler:
    """Runs reconciliation against ``client`` into ``inbox``; one run at a time (locked)."""

    def __init__(
        self,
        client: ProcessorClient,
        inbox: Store,
        *,
        store: ReconcileStore | None = None,
        clock: Clock = utcnow,
        progress: Progress | None = None,
        owner: str | None = None,
        events: EventsPath | None = None,
        account: str = DEFAULT_ACCOUNT,
        accounts: AccountSource | None = None,
    ) -> None:
        """``account``: the processor account ``client`` (and ``events``) speak for; what
        the run reads and writes is that account's alone (``store``, when given, must be
        that account's). ``accounts``: the installation's accounts, which tell which of the
        objects ``client`` reads are ``account``'s (:mod:`reconcile.core.ownership`;
        default: the accounts stored in hookledger's table)."""
        self.client = client
        self.inbox = inbox
        self.store = store or ReconcileStore(inbox.engine, clock=clock, account=account)
        if self.store.account != account:
            raise ValueError(
                f"the store is account {self.store.account!r}'s, the run {account!r}'s"
            )
        events_account = getattr(events, "account", account)
        if events_account != account:
            raise ValueError(
                f"the events-API path is account {events_account!r}'s, the run {account!r}'s"
            )
        self.clock = clock
        self.progress = progress
        self.owner = owner or worker_name()
        self.events = events
        self.accounts: AccountSource = (
            accounts if accounts is not None else StoredAccounts(inbox.accounts)
        )

    def ownership(self) -> Ownership:
        """Which objects are this account's, read afresh (once per run: an account
        added or changed since the last run counts)."""
        return Ownership(self.store.account, self.accounts)

    def __repr__(self) -> str:
        return f"Reconciler(client={self.client!r}, account={self.store.account!r})"

    def _fetch(self, kind: str, object_id: str) -> dict[str, Any]:
        """Re-read one object by id (``GET /payments/{id}``, ``/refunds/{id}``, ...)."""
        return self.client.get_object(cast(ObjectKind, kind), object_id)

    def check_adopted(self) -> None:
        """Raise :class:`NotAdopted` (or :class:`AdoptionInProgress`) unless this database may
        be reconciled: it has an adoption record, or runs of its own from before adoption
        existed. (On an account with history, a first run would otherwise dispatch the
        transitions its earlier system already handled.)"""
        state = adoption_state(self.inbox, self.store)
        if state == "adopting":
            raise AdoptionInProgress()
        if state is None:
            raise NotAdopted()

    def run(self, options: ReconcileOptions | None = None) -> Report:
        """Reconcile the kinds asked; returns (and stores) the report."""
        options = options or ReconcileOptions()
        if options.require_adoption:
            self.check_adopted()
        started = truncate_ms(self.clock())
        timer = time.monotonic()
        lease = None
        run_id = None
        if not options.dry_run:
            lease = self.store.lock(self.owner)
            lease.acquire(wait=options.lock_wait)
        try:
            run_id = self.store.start_run(options.mode, self.owner)
            report = Report(
                run_id=run_id, mode=options.mode, dry_run=options.dry_run, started_at=started
            )
            ownership = self.ownership()
            recovery = Recovery(
                self.inbox,
                self.store,
                FollowedObjects(
                    self.inbox.engine,
                    policy=options.sweep_policy,
                    clock=self.clock,
                    account=self.store.account,
                ),
                options=RecoveryOptions(merchant_id=options.merchant_id, dry_run=options.dry_run),
                fetch=self._fetch,
                clock=self.clock,
                ownership=ownership,
            )
            if self.events is not None and options.events:
                self._events(options, started, report)
            for name in options.kinds:
                if name in LISTED_KINDS:
                    self._list_kind(run_id, name, options, started, report, recovery)
            if options.sweep_budget:
                self._sweep(options, report, recovery)
            # This account's dead letters (a count of the whole inbox by status was every
            # account's, and its cost grew with the inbox, run after run of every account).
            report.dead_letter = self.inbox.operations.dead_count(account=self.store.account)
            report.finished_at = as_utc(self.clock())
            report.duration_seconds = time.monotonic() - timer
            self.store.finish_run(run_id, report.status, report.as_dict())
            signals.send(
                signals.reconcile_finished,
                status=report.status,
                report=report.as_dict(),
                run_id=run_id,
            )
            log.debug(
                "reconcile run finished: %s",
                report.status,
                extra={
                    "action": "reconcile",
                    "run_id": run_id,
                    "recovered": report.recovered,
                    "unresolved": report.unresolved,
                },
            )
            return report
        except BaseException as exc:
            if run_id is not None:
                self.store.finish_run(
                    run_id, "failed", {"error": f"run aborted: {type(exc).__name__}"}
                )
                signals.send(
                    signals.reconcile_finished,
                    status="failed",
                    report={"run_id": run_id, "status": "failed", "error": type(exc).__name__},
                    run_id=run_id,
                )
            raise
        finally:
            if lease is not None:
                lease.release()

    # -- the events API ----------------------------------------------------------------------

    def _events(self, options: ReconcileOptions, now: datetime, report: Report) -> None:
        assert self.events is not None
        end = now
        start = self._start("events", options, end, cap=options.events_window)
        part = EventsReport(window=(start, end))
        report.events = part
        self.events.run(start, end, part, dry_run=options.dry_run)
        if not options.dry_run and not part.failures and self._reads_on("events", options, start):
            # An event waiting for its request is listed again by the next run: the watermark
            # stops at the oldest one (the next window starts an overlap below it).
            mark = end if part.oldest_waiting is None else min(end, part.oldest_waiting)
            self.store.set_watermark("events", mark)

    def _reads_on(self, kind: str, options: ReconcileOptions, start: datetime) -> bool:
        """Whether a finished window starting at ``start`` may move ``kind``'s watermark to
        its end: an incremental one (it starts at the watermark), and a wide one only when it
        starts at or before the watermark. A wide window that starts after it (the last
        incremental run is older than the wide window: a run missed, or no schedule) did
        not read the time in between: the next incremental run must, so the watermark
        stays where it is. A ``window`` run never moves it."""
        if options.mode == "window":
            return False
        if options.mode == "wide":
            mark = self.store.watermark(kind)
            return mark is None or start <= mark
        return True

    # -- lists -------------------------------------------------------------------------------

    def _start(
        self, kind: str, options: ReconcileOptions, end: datetime, *, cap: timedelta | None = None
    ) -> datetime:
        if options.mode == "window":
            assert options.since is not None
            start = truncate_ms(options.since)
        elif options.mode == "wide":
            start = end - options.wide_window
        else:
            mark = self.store.watermark(kind)
            start = mark - options.overlap if mark is not None else end - options.lookback
        if cap is not None:
            start = max(start, end - cap)
        return min(start, end)

    def _window(
        self, kind: str, options: ReconcileOptions, now: datetime
    ) -> tuple[datetime, datetime]:
        # A window never reaches past now: the future has nothing to list, and a watermark
        # moved past now would blind the following incremental runs.
        end = min(truncate_ms(options.until), now) if options.until is not None else now
        return self._start(kind, options, end), end

    def _pager(
        self,
        name: str,
        window: tuple[datetime, datetime],
        o: ReconcileOptions,
        profile_id: str | None,
    ) -> Pager:
        return kind_pager(
            self.client,
            name,
            *window,
            payments_dialect=o.payments_dialect,
            payouts_dialect=o.payouts_dialect,
            page_size=o.page_size,
            max_requests=o.max_requests,
            profile_id=profile_id,
        )

    def _list_kind(
        self,
        run_id: int,
        name: str,
        options: ReconcileOptions,
        now: datetime,
        report: Report,
        recovery: Recovery,
    ) -> None:
        kind = KIND_NAMES[name]
        window = self._window(kind, options, now)
        part = KindReport(window=window)
        report.kinds[name] = part
        profile = recovery.ownership.profile_filter if recovery.ownership is not None else None
        pager = self._pager(name, window, options, profile)
        # The next pages are fetched (in a thread, a bounded read-ahead) while a chunk is
        # diffed and written, so a run costs about the larger of listing and writing.
        chunks = Prefetch(
            _chunks(pager, CHUNK, CHUNK_UNIT),
            depth=PREFETCH_DEPTH,
            name=f"reconcile-{name}",
            stop_timeout=PREFETCH_STOP_TIMEOUT,
        )
        try:
            with chunks:
                for chunk in chunks:
                    others: list[str] = []
                    remotes = recovery.read(kind, chunk, part, others=others)
                    # Seen at the processor, another profile's: not "known only locally"
                    # where an earlier version put it in this account's projection.
                    self.store.mark_seen(run_id, kind, others)
                    recovery.process(kind, _distinct(remotes), part, run_id=run_id)
                    if self.progress is not None:
                        self.progress(name, part.checked)
        except ProcessorError as exc:
            part.remote_errors.append(f"{type(exc).__name__}: {exc}")
            log.error(
                "listing %s failed: %s", name, type(exc).__name__, extra={"action": "reconcile"}
            )
        finally:
            part.pages = pager.pages
            part.requests = pager.requests + recovery.spent[kind]
            part.incomplete = [
                f"{w.start.isoformat()}..{w.end.isoformat()}: {w.reason}" for w in pager.incomplete
            ]
            for problem in getattr(pager, "row_errors", ()):
                part.note_bad_row(
                    f"{problem.kind} {problem.object_id or '(no id)'}: {problem.reason}"
                )
        if not part.remote_errors:
            # The window's last millisecond is left to the next run: the processor stores
            # creation times finer than the milliseconds it prints and filters on, so an
            # object printed in that millisecond may lie past the bound it was listed with.
            start, end = window
            part.local_only, part.local_only_sample = self.store.local_only(
                run_id, kind, start, end - timedelta(milliseconds=1)
            )
        if not options.dry_run and not part.failures and self._reads_on(kind, options, window[0]):
            self.store.set_watermark(kind, window[1])

    # -- sweep -------------------------------------------------------------------------------

    def _sweep(self, options: ReconcileOptions, report: Report, recovery: Recovery) -> None:
        followed = recovery.followed
        kinds = [KIND_NAMES[name] for name in options.kinds]
        now = as_utc(self.clock())
        # An object this run's lists already looked at is not fetched again by its sweep.
        queues = {
            kind: followed.due(
                kind, limit=options.sweep_budget, now=now, checked_before=report.started_at
            )
            for kind in kinds
        }
        shares = _share(options.sweep_budget, {kind: total for kind, (_, total) in queues.items()})
        for kind in kinds:
            due, total = queues[kind]
            name = next(n for n, k in KIND_NAMES.items() if k == kind)
            part = SweepReport(due=total)
            report.sweep[name] = part
            self._sweep_kind(kind, due[: shares[kind]], part, recovery)
            part.overdue = max(0, total - part.requests)
            if not options.dry_run:
                part.aged_out = followed.forget_aged(kind, now=now)

    def _sweep_kind(
        self, kind: str, due: Sequence[Due], part: SweepReport, recovery: Recovery
    ) -> None:
        fetched: list[dict[str, Any]] = []
        missing: list[str] = []
        for item in due:
            part.requests += 1
            try:
                fetched.append(self._fetch(kind, item.object_id))
            except NotFound:
                missing.append(item.object_id)
                part.not_found += 1
                if len(part.not_found_sample) < SAMPLE:
                    part.not_found_sample.append(escape_id(item.object_id))
            except ProcessorError as exc:
                part.remote_errors.append(f"{type(exc).__name__}: {exc}")
                log.error("sweeping %s failed: %s", kind, type(exc).__name__)
                break
        others: list[str] = []
        remotes = _distinct(recovery.read(kind, fetched, part, others=others))
        if others and not recovery.options.dry_run:
            recovery.followed.set_aside(kind, others)
        kept = recovery.process(kind, remotes, part, confirm_ahead=False)
        part.settled = sum(
            1
            for remote in remotes
            if remote.state is not None
            and is_settled(remote.state)
            and remote.object_id not in kept
        )
        if missing and not recovery.options.dry_run:
            recovery.followed.postpone(kind, missing)


def _distinct(remotes: Sequence[Remote]) -> list[Remote]:
    """One entry per object id (the last one read wins)."""
    return list({remote.object_id: remote for remote in remotes}.values())


def _share(budget: int, due: Mapping[str, int]) -> dict[str, int]:
    """Split ``budget`` across kinds: an equal share each, what a kind cannot use given to
    the others."""
    shares = {kind: 0 for kind in due}
    left = budget
    wanting = [kind for kind, n in due.items() if n > 0]
    while left > 0 and wanting:
        each = max(1, left // len(wanting))
        for kind in list(wanting):
            take = min(each, due[kind] - shares[kind], left)
            shares[kind] += take
            left -= take
            if shares[kind] >= due[kind]:
                wanting.remove(kind)
            if left == 0:
                break
    return shares
