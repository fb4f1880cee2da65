"""One reconcile run: page through the processor's lists, diff, feed missed transitions.

The diff is pure (:mod:`reconcile.diff`); this module is the adapter that pages through the
API client, reads the projection, inserts synthesised events through the receiver's inbox
(source ``reconcile``), keeps the watermarks and writes the report.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from receiver.clock import Clock, as_utc, utcnow
from receiver.events import parse_event
from receiver.models import EventStatus
from receiver.store import Store
from receiver.worker import worker_name
from reconcile import diff
from reconcile.client import ProcessorClient
from reconcile.errors import ProcessorError
from reconcile.paging import Pager
from reconcile.prefetch import Prefetch
from reconcile.store import ReconcileStore

log = logging.getLogger("reconcile.runner")

#: Public names of the kinds (CLI, report) -> object kind.
KIND_NAMES: Final[Mapping[str, str]] = {
    "payments": "payment",
    "refunds": "refund",
    "payouts": "payout",
    "disputes": "dispute",
}
DEFAULT_KINDS: Final = ("payments", "refunds", "payouts", "disputes")

Mode = Literal["incremental", "wide", "window"]
Progress = Callable[[str, int], None]

#: Remote objects diffed and marked seen together: one database round trip per chunk.
CHUNK: Final = 500
#: When the listing fails, the objects gathered so far are diffed in whole units of this
#: many (a run has always left the last partial hundred of a failed listing undiffed).
CHUNK_UNIT: Final = 100
#: Chunks listed ahead of the one being written (bounded: memory stays constant).
PREFETCH_DEPTH: Final = 2
#: When a run fails while listing ahead, how long it waits for the request in flight.
PREFETCH_STOP_TIMEOUT: Final = 10.0
#: Missed transitions gathered (over chunks) before they are inserted in one transaction.
#: Their chunks' seen marks are already committed; if the run dies in between, it is
#: "failed" and the next run finds the same transitions missing and recovers them.
RECOVER_BATCH: Final = 100


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcileOptions:
    """What to reconcile and how.

    ``incremental``: from each kind's watermark minus ``overlap`` (or ``lookback`` on the
    first run) to now; ``wide``: the last ``wide_window``; ``window``: ``since`` to ``until``.
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
    merchant_id: str | None = None
    lock_wait: float = 0.0

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in KIND_NAMES]
        if unknown:
            raise ValueError(f"unknown kind(s) {unknown}; choose from {sorted(KIND_NAMES)}")
        if self.mode == "window" and (self.since is None or self.until is None):
            raise ValueError("mode 'window' needs since and until")


@dataclass(kw_only=True, slots=True)
class KindReport:
    window: tuple[datetime, datetime]
    checked: int = 0
    in_sync: int = 0
    recovered: Counter[str] = field(default_factory=Counter)
    already_queued: int = 0
    no_event: int = 0
    unknown_status: int = 0
    local_ahead: int = 0
    local_ahead_sample: list[str] = field(default_factory=list)
    mismatched: int = 0
    mismatched_sample: list[str] = field(default_factory=list)
    local_only: int = 0
    local_only_sample: list[str] = field(default_factory=list)
    remote_errors: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    pages: int = 0
    requests: int = 0

    @property
    def unresolved(self) -> int:
        return (
            self.local_ahead
            + self.mismatched
            + self.local_only
            + self.unknown_status
            + len(self.remote_errors)
            + len(self.incomplete)
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": [self.window[0].isoformat(), self.window[1].isoformat()],
            "checked": self.checked,
            "in_sync": self.in_sync,
            "recovered": dict(sorted(self.recovered.items())),
            "recovered_total": sum(self.recovered.values()),
            "already_queued": self.already_queued,
            "no_event": self.no_event,
            "unknown_status": self.unknown_status,
            "local_ahead": self.local_ahead,
            "local_ahead_sample": self.local_ahead_sample,
            "mismatched": self.mismatched,
            "mismatched_sample": self.mismatched_sample,
            "local_only": self.local_only,
            "local_only_sample": self.local_only_sample,
            "remote_errors": self.remote_errors,
            "incomplete": self.incomplete,
            "unresolved": self.unresolved,
            "pages": self.pages,
            "requests": self.requests,
        }


@dataclass(kw_only=True, slots=True)
class Report:
    run_id: int | None
    mode: str
    dry_run: bool
    started_at: datetime
    finished_at: datetime | None = None
    duration_seconds: float = 0.0
    kinds: dict[str, KindReport] = field(default_factory=dict)
    dead_letter: int = 0

    @property
    def unresolved(self) -> int:
        return sum(k.unresolved for k in self.kinds.values())

    @property
    def recovered(self) -> int:
        return sum(sum(k.recovered.values()) for k in self.kinds.values())

    @property
    def status(self) -> str:
        if self.dry_run:
            return "dry_run"
        return "unresolved" if self.unresolved else "ok"

    def as_dict(self) -> dict[str, Any]:
        totals: Counter[str] = Counter()
        for k in self.kinds.values():
            totals.update(
                checked=k.checked,
                in_sync=k.in_sync,
                recovered=sum(k.recovered.values()),
                already_queued=k.already_queued,
                no_event=k.no_event,
                local_only=k.local_only,
                local_ahead=k.local_ahead,
                mismatched=k.mismatched,
                remote_errors=len(k.remote_errors),
                unresolved=k.unresolved,
            )
        return {
            "run_id": self.run_id,
            "mode": self.mode,
            "dry_run": self.dry_run,
            "status": self.status,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "duration_seconds": round(self.duration_seconds, 3),
            "totals": dict(totals),
            "dead_letter_events": self.dead_letter,
            "kinds": {name: k.as_dict() for name, k in self.kinds.items()},
        }


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
    ) -> None:
        self.client = client
        self.inbox = inbox
        self.store = store or ReconcileStore(inbox.engine, clock=clock)
        self.clock = clock
        self.progress = progress
        self.owner = owner or worker_name()

    def __repr__(self) -> str:
        return f"Reconciler(client={self.client!r})"

    def run(self, options: ReconcileOptions | None = None) -> Report:
        """Reconcile the kinds asked; returns (and stores) the report."""
        options = options or ReconcileOptions()
        started = as_utc(self.clock())
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
            for name in options.kinds:
                kind = KIND_NAMES[name]
                window = self._window(kind, options, started)
                kind_report = KindReport(window=window)
                report.kinds[name] = kind_report
                self._reconcile_kind(run_id, name, kind, window, options, kind_report)
                if (
                    not options.dry_run
                    and not kind_report.remote_errors
                    and not (kind_report.incomplete)
                ):
                    self.store.set_watermark(kind, window[1])
            report.dead_letter = self.inbox.counts().get(EventStatus.DEAD, 0)
            report.finished_at = as_utc(self.clock())
            report.duration_seconds = time.monotonic() - timer
            self.store.finish_run(run_id, report.status, report.as_dict())
            log.info(
                "reconcile run finished",
                extra={
                    "action": "reconcile",
                    "run_id": run_id,
                    "recovered": report.recovered,
                    "unresolved": report.unresolved,
                },
            )
            return report
        except BaseException:
            if run_id is not None:
                self.store.finish_run(run_id, "failed", {"error": "run aborted"})
            raise
        finally:
            if lease is not None:
                lease.release()

    def _window(
        self, kind: str, options: ReconcileOptions, now: datetime
    ) -> tuple[datetime, datetime]:
        if options.mode == "window":
            assert options.since is not None and options.until is not None
            return as_utc(options.since), as_utc(options.until)
        end = as_utc(options.until) if options.until else now
        if options.mode == "wide":
            return end - options.wide_window, end
        mark = self.store.watermark(kind)
        start = mark - options.overlap if mark is not None else end - options.lookback
        return min(start, end), end

    def _pager(self, name: str, window: tuple[datetime, datetime], o: ReconcileOptions) -> Pager:
        start, end = window
        if name == "payments":
            return self.client.iter_payments(
                start, end, dialect=o.payments_dialect, page_size=o.page_size, on_stuck="report"
            )
        if name == "refunds":
            return self.client.iter_refunds(start, end, page_size=o.page_size, on_stuck="report")
        if name == "payouts":
            size = min(o.page_size, 20) if o.payouts_dialect == "post" else o.page_size
            return self.client.iter_payouts(
                start, end, dialect=o.payouts_dialect, page_size=size, on_stuck="report"
            )
        return self.client.iter_disputes(start, end, page_size=o.page_size, on_stuck="report")

    def _reconcile_kind(
        self,
        run_id: int,
        name: str,
        kind: str,
        window: tuple[datetime, datetime],
        options: ReconcileOptions,
        report: KindReport,
    ) -> None:
        pager = self._pager(name, window, options)
        # The next pages are fetched (in a thread, a bounded read-ahead) while a chunk is
        # diffed and written, so a run costs about the larger of listing and writing.
        chunks = Prefetch(
            _chunks(pager, CHUNK, CHUNK_UNIT),
            depth=PREFETCH_DEPTH,
            name=f"reconcile-{name}",
            stop_timeout=PREFETCH_STOP_TIMEOUT,
        )
        missed: list[tuple[diff.Finding, bytes]] = []
        try:
            with chunks:
                for chunk in chunks:
                    missed += self._reconcile_chunk(run_id, kind, chunk, options, report)
                    if len(missed) >= RECOVER_BATCH:
                        self._recover(kind, missed, report)
                        missed = []
                    if self.progress is not None:
                        self.progress(name, report.checked)
        except ProcessorError as exc:
            report.remote_errors.append(f"{type(exc).__name__}: {exc}")
            log.error(
                "listing %s failed: %s", name, type(exc).__name__, extra={"action": "reconcile"}
            )
        finally:
            report.pages, report.requests = pager.pages, pager.requests
            report.incomplete = [
                f"{w.start.isoformat()}..{w.end.isoformat()}: {w.reason}" for w in pager.incomplete
            ]
        # The transitions found before a listing failure are recovered all the same.
        self._recover(kind, missed, report)
        if not report.remote_errors:
            report.local_only, report.local_only_sample = self.store.local_only(
                run_id, kind, *window
            )

    def _reconcile_chunk(
        self,
        run_id: int,
        kind: str,
        chunk: list[dict[str, Any]],
        options: ReconcileOptions,
        report: KindReport,
    ) -> list[tuple[diff.Finding, bytes]]:
        """Diff one chunk (marking its ids seen); returns the missed transitions to recover."""
        remote: dict[str, dict[str, Any]] = {}
        for obj in chunk:
            object_id = diff.object_id_of(kind, obj)
            if object_id is None:
                report.unknown_status += 1
                continue
            remote[object_id] = obj
        statuses = {object_id: diff.status_of(kind, obj) for object_id, obj in remote.items()}
        listed = [(oid, s if isinstance(s, str) else None) for oid, s in statuses.items()]
        # Only the objects whose projected status is not the remote one come back: the others
        # are projected with exactly the status listed.
        differing = self.store.observe(run_id, kind, listed)
        now = as_utc(self.clock())
        missed: list[tuple[diff.Finding, bytes]] = []
        for object_id, remote_status in listed:
            report.checked += 1
            local_status = differing[object_id] if object_id in differing else remote_status
            finding = diff.compare(kind, object_id, statuses[object_id], local_status)
            if finding.verdict == "in_sync":
                report.in_sync += 1
            elif finding.verdict == "no_event":
                report.no_event += 1
            elif finding.verdict == "unknown_status":
                report.unknown_status += 1
            elif finding.verdict == "local_ahead":
                report.local_ahead += 1
                if len(report.local_ahead_sample) < 20:
                    report.local_ahead_sample.append(
                        f"{object_id}: local {finding.local_status}, remote {finding.remote_status}"
                    )
            elif options.dry_run:
                assert finding.event_type is not None
                report.recovered[finding.event_type] += 1
            else:
                body = diff.synthesise(
                    finding, remote[object_id], merchant_id=options.merchant_id, now=now
                )
                missed.append((finding, body))
        return missed

    def _recover(
        self, kind: str, missed: Sequence[tuple[diff.Finding, bytes]], report: KindReport
    ) -> None:
        """Insert the synthesised events of ``missed`` into the inbox (one transaction)."""
        if not missed:
            return
        results = self.inbox.insert_synthesised([(parse_event(b), b) for _, b in missed])
        for finding, _body in missed:
            assert finding.event_type is not None
            event_id = diff.synthetic_event_id(kind, finding.object_id, finding.event_type)
            state = results[event_id]
            if state == "inserted":
                report.recovered[finding.event_type] += 1
            elif state in EventStatus.OPEN:
                report.already_queued += 1  # recovered earlier; the worker has not run yet
            else:
                # Recovered before, yet the projection still disagrees (the event was stale,
                # a duplicate or dead-lettered): a person should look.
                report.mismatched += 1
                if len(report.mismatched_sample) < 20:
                    report.mismatched_sample.append(
                        f"{finding.object_id}: local {finding.local_status}, "
                        f"remote {finding.remote_status}, recovery event {state}"
                    )
