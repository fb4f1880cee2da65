"""The reconcile report: what a run checked, recovered (by path), queued, and left unresolved.

A report never says more than is true:

- ``ok``: every path ran to the end and nothing is unresolved;
- ``unresolved``: drift the reconciler could not mend (an object known only locally, a
  projection ahead of the processor, a recovery event the guard refused or dead-lettered,
  a projection in step with the processor but reached by a dead-lettered event, an object
  whose waiting events leave its projection short of the processor, a remote row that
  cannot be stored, an undelivered event whose signature does not verify, a status the
  transition model does not know);
- ``incomplete``: the processor could not be read completely (an error, a stuck or
  over-budget listing, sweep objects left overdue): the run cannot vouch for what it did
  not see;
- ``dry_run`` and ``failed`` (the run itself broke: see the error). A dry run's
  ``outcome`` is one of the first three, as a real run reading the same would report it
  (its exit code follows it).

Objects of the merchant's other business profiles (another account's, or no single
account's: :mod:`reconcile.core.ownership`) are skipped, counted by profile as
``other_profiles``: not checked, not recovered, not drift of this account.

Recovery that is queued (an event already in the inbox, waiting for the worker, brings the
object to the processor's state) is ``queued``, never unresolved. Likewise an undelivered
event the events API lists before its request is recorded (a delivery interrupted mid-way)
is ``waiting``: not yet, never unresolved; a later run fetches it (the events watermark
stays at the oldest one). When what is waiting leaves
the projection short of the processor (a ``payment_failed`` from before the customer's
successful retry), the object is ``behind``: unresolved until it is in sync (the sweep
follows it and recovers the rest once the inbox is done with it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

#: Most entries of each sample list kept in a report.
SAMPLE: Final = 20

STATUS_OK: Final = "ok"
STATUS_UNRESOLVED: Final = "unresolved"
STATUS_INCOMPLETE: Final = "incomplete"
STATUS_DRY_RUN: Final = "dry_run"
STATUS_FAILED: Final = "failed"


def _add(sample: list[str], item: str) -> None:
    if len(sample) < SAMPLE:
        sample.append(item)


@dataclass(kw_only=True, slots=True)
class Tally:
    """What the diff found for the objects one path looked at."""

    checked: int = 0
    in_sync: int = 0
    recovered: Counter[str] = field(default_factory=Counter)
    #: How the recovered events were dated: ``modified`` (the object's modification time)
    #: or ``observed`` (when the run saw the object; its kind carries no modification time).
    dated_by: Counter[str] = field(default_factory=Counter)
    queued: int = 0
    #: Objects with events waiting in the inbox that leave the projection short of the
    #: processor: nothing was inserted (the waiting events run first); followed by the sweep.
    behind: int = 0
    behind_sample: list[str] = field(default_factory=list)
    #: Objects projected as the processor shows them, by an event that is dead-lettered.
    dead_lettered: int = 0
    dead_lettered_sample: list[str] = field(default_factory=list)
    no_event: int = 0
    unknown_status: int = 0
    unknown_status_sample: list[str] = field(default_factory=list)
    local_ahead: int = 0
    local_ahead_sample: list[str] = field(default_factory=list)
    mismatched: int = 0
    mismatched_sample: list[str] = field(default_factory=list)
    bad_rows: int = 0
    bad_rows_sample: list[str] = field(default_factory=list)
    #: Objects of other business profiles (not this account's), skipped, by profile id.
    other_profiles: Counter[str] = field(default_factory=Counter)

    def note_unknown(self, item: str) -> None:
        self.unknown_status += 1
        _add(self.unknown_status_sample, item)

    def note_local_ahead(self, item: str) -> None:
        self.local_ahead += 1
        _add(self.local_ahead_sample, item)

    def note_mismatch(self, item: str) -> None:
        self.mismatched += 1
        _add(self.mismatched_sample, item)

    def note_bad_row(self, item: str) -> None:
        self.bad_rows += 1
        _add(self.bad_rows_sample, item)

    def note_behind(self, item: str) -> None:
        self.behind += 1
        _add(self.behind_sample, item)

    def note_dead_lettered(self, item: str) -> None:
        self.dead_lettered += 1
        _add(self.dead_lettered_sample, item)

    def tally_unresolved(self) -> int:
        return (
            self.unknown_status
            + self.local_ahead
            + self.mismatched
            + self.bad_rows
            + self.behind
            + self.dead_lettered
        )

    @property
    def unresolved(self) -> int:
        return self.tally_unresolved()

    def tally_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "in_sync": self.in_sync,
            "recovered": dict(sorted(self.recovered.items())),
            "recovered_total": sum(self.recovered.values()),
            "dated_by": dict(sorted(self.dated_by.items())),
            "queued": self.queued,
            "behind": self.behind,
            "behind_sample": self.behind_sample,
            "dead_lettered": self.dead_lettered,
            "dead_lettered_sample": self.dead_lettered_sample,
            "no_event": self.no_event,
            "unknown_status": self.unknown_status,
            "unknown_status_sample": self.unknown_status_sample,
            "local_ahead": self.local_ahead,
            "local_ahead_sample": self.local_ahead_sample,
            "mismatched": self.mismatched,
            "mismatched_sample": self.mismatched_sample,
            "bad_rows": self.bad_rows,
            "bad_rows_sample": self.bad_rows_sample,
            "other_profiles": dict(sorted(self.other_profiles.items())),
        }


@dataclass(kw_only=True, slots=True)
class KindReport(Tally):
    """The list path of one kind: objects created in ``window``."""

    window: tuple[datetime, datetime]
    local_only: int = 0
    local_only_sample: list[str] = field(default_factory=list)
    remote_errors: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    pages: int = 0
    requests: int = 0

    @property
    def unresolved(self) -> int:
        return self.tally_unresolved() + self.local_only

    @property
    def failures(self) -> int:
        return len(self.remote_errors) + len(self.incomplete)

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": [self.window[0].isoformat(), self.window[1].isoformat()],
            **self.tally_dict(),
            "local_only": self.local_only,
            "local_only_sample": self.local_only_sample,
            "remote_errors": self.remote_errors,
            "incomplete": self.incomplete,
            "unresolved": self.unresolved,
            "pages": self.pages,
            "requests": self.requests,
        }


@dataclass(kw_only=True, slots=True)
class SweepReport(Tally):
    """The open-object sweep of one kind: objects re-fetched by id."""

    #: Objects due for a check when the sweep began.
    due: int = 0
    #: Due objects left unchecked because the request budget ran out.
    overdue: int = 0
    not_found: int = 0
    not_found_sample: list[str] = field(default_factory=list)
    #: Objects the sweep stops following: settled, or past the kind's horizon.
    settled: int = 0
    aged_out: int = 0
    remote_errors: list[str] = field(default_factory=list)
    requests: int = 0

    @property
    def unresolved(self) -> int:
        return self.tally_unresolved() + self.not_found

    @property
    def failures(self) -> int:
        return len(self.remote_errors) + (1 if self.overdue else 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "due": self.due,
            **self.tally_dict(),
            "overdue": self.overdue,
            "not_found": self.not_found,
            "not_found_sample": self.not_found_sample,
            "settled": self.settled,
            "aged_out": self.aged_out,
            "remote_errors": self.remote_errors,
            "unresolved": self.unresolved,
            "requests": self.requests,
        }


@dataclass(kw_only=True, slots=True)
class EventsReport:
    """The events-API path: undelivered webhooks fetched with their original bytes."""

    window: tuple[datetime, datetime]
    listed: int = 0
    already_stored: int = 0
    recovered: Counter[str] = field(default_factory=Counter)
    #: Undelivered events stored for their original bytes whose transition hookledger
    #: already held (recovered from the lists in an earlier run): not recovered again.
    already_known: int = 0
    before_cutover: int = 0
    resent: int = 0
    bad_signature: int = 0
    bad_signature_sample: list[str] = field(default_factory=list)
    bad_rows: int = 0
    bad_rows_sample: list[str] = field(default_factory=list)
    #: Undelivered events whose request is not recorded yet: not yet, like ``queued``.
    waiting: int = 0
    waiting_sample: list[str] = field(default_factory=list)
    #: The creation time of the oldest waiting event (the events watermark stops there).
    oldest_waiting: datetime | None = None
    remote_errors: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    requests: int = 0
    #: Events of other business profiles (not this account's), skipped, by profile id.
    other_profiles: Counter[str] = field(default_factory=Counter)

    def note_waiting(self, item: str, created: datetime | None) -> None:
        self.waiting += 1
        _add(self.waiting_sample, item)
        if created is not None and (self.oldest_waiting is None or created < self.oldest_waiting):
            self.oldest_waiting = created

    @property
    def unresolved(self) -> int:
        return self.bad_signature + self.bad_rows

    @property
    def failures(self) -> int:
        return len(self.remote_errors) + len(self.incomplete)

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": [self.window[0].isoformat(), self.window[1].isoformat()],
            "listed": self.listed,
            "already_stored": self.already_stored,
            "recovered": dict(sorted(self.recovered.items())),
            "recovered_total": sum(self.recovered.values()),
            "already_known": self.already_known,
            "before_cutover": self.before_cutover,
            "resent": self.resent,
            "bad_signature": self.bad_signature,
            "bad_signature_sample": self.bad_signature_sample,
            "bad_rows": self.bad_rows,
            "bad_rows_sample": self.bad_rows_sample,
            "waiting": self.waiting,
            "waiting_sample": self.waiting_sample,
            "other_profiles": dict(sorted(self.other_profiles.items())),
            "remote_errors": self.remote_errors,
            "incomplete": self.incomplete,
            "unresolved": self.unresolved,
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
    sweep: dict[str, SweepReport] = field(default_factory=dict)
    events: EventsReport | None = None
    dead_letter: int = 0
    #: Set when the run itself broke (the report is then ``failed``).
    error: str | None = None

    def _parts(self) -> list[KindReport | SweepReport | EventsReport]:
        parts: list[KindReport | SweepReport | EventsReport] = [*self.kinds.values()]
        parts += self.sweep.values()
        if self.events is not None:
            parts.append(self.events)
        return parts

    @property
    def unresolved(self) -> int:
        return sum(part.unresolved for part in self._parts())

    @property
    def failures(self) -> int:
        return sum(part.failures for part in self._parts())

    @property
    def recovered(self) -> int:
        return sum(sum(part.recovered.values()) for part in self._parts())

    @property
    def status(self) -> str:
        if self.error is not None:
            return STATUS_FAILED
        if self.dry_run:
            return STATUS_DRY_RUN
        return self.outcome

    @property
    def outcome(self) -> str:
        """What the run found, dry or not: ``failed``, ``incomplete``, ``unresolved`` or
        ``ok``. A dry run's status is ``dry_run``; its outcome (and so its exit code) is
        the one a real run reading the same would have: one that could not read the
        processor is ``incomplete``, never ``ok`` with nothing recovered."""
        if self.error is not None:
            return STATUS_FAILED
        if self.failures:
            return STATUS_INCOMPLETE
        return STATUS_UNRESOLVED if self.unresolved else STATUS_OK

    def as_dict(self) -> dict[str, Any]:
        totals: Counter[str] = Counter()
        for part in self._parts():
            totals.update(
                recovered=sum(part.recovered.values()),
                unresolved=part.unresolved,
                failures=part.failures,
                other_profiles=sum(part.other_profiles.values()),
            )
        for tally in [*self.kinds.values(), *self.sweep.values()]:
            totals.update(
                checked=tally.checked,
                in_sync=tally.in_sync,
                queued=tally.queued,
                behind=tally.behind,
                dead_lettered=tally.dead_lettered,
                no_event=tally.no_event,
                local_ahead=tally.local_ahead,
                mismatched=tally.mismatched,
                bad_rows=tally.bad_rows,
            )
        by_path = {
            "lists": sum(sum(k.recovered.values()) for k in self.kinds.values()),
            "sweep": sum(sum(k.recovered.values()) for k in self.sweep.values()),
            "events": sum(self.events.recovered.values()) if self.events else 0,
        }
        return {
            "run_id": self.run_id,
            "mode": self.mode,
            "dry_run": self.dry_run,
            "status": self.status,
            "outcome": self.outcome,
            "error": self.error,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "duration_seconds": round(self.duration_seconds, 3),
            "totals": {name: totals.get(name, 0) for name in sorted(totals)},
            "recovered_by_path": by_path,
            "dead_letter_events": self.dead_letter,
            "kinds": {name: k.as_dict() for name, k in self.kinds.items()},
            "sweep": {name: k.as_dict() for name, k in self.sweep.items()},
            "events": self.events.as_dict() if self.events is not None else None,
        }


def render(report: dict[str, Any]) -> str:
    """A stored or fresh report (``Report.as_dict()``) as a table for people."""
    status = report["status"]
    outcome = report.get("outcome")
    if report["dry_run"] and outcome and outcome != status:
        status = f"{status}, {outcome}"
    lines = [
        f"reconcile run #{report['run_id']} ({report['mode']}"
        f"{', dry run' if report['dry_run'] else ''}): {status} "
        f"in {report.get('duration_seconds', 0):.2f} s"
    ]
    if report.get("error"):
        lines.append(f"  error: {report['error']}")
    kinds = report.get("kinds") or {}
    if kinds:
        lines.append(
            f"{'lists':<9} {'checked':>7} {'in_sync':>7} {'recovered':>9} {'queued':>6} "
            f"{'no_event':>8} {'local_only':>10} {'unresolved':>10}  window"
        )
    for name, k in kinds.items():
        start, end = (w[:19] for w in k["window"])
        lines.append(
            f"{name:<9} {k['checked']:>7} {k['in_sync']:>7} {k['recovered_total']:>9} "
            f"{k['queued']:>6} {k['no_event']:>8} {k['local_only']:>10} "
            f"{k['unresolved']:>10}  {start}..{end}"
        )
        lines += _details(k)
    sweep = report.get("sweep") or {}
    if sweep:
        lines.append(
            f"{'sweep':<9} {'due':>7} {'checked':>7} {'recovered':>9} {'queued':>6} "
            f"{'overdue':>8} {'settled':>10} {'unresolved':>10}"
        )
    for name, k in sweep.items():
        lines.append(
            f"{name:<9} {k['due']:>7} {k['checked']:>7} {k['recovered_total']:>9} "
            f"{k['queued']:>6} {k['overdue']:>8} {k['settled']:>10} {k['unresolved']:>10}"
        )
        lines += _details(k)
    events = report.get("events")
    if events:
        lines.append(
            f"events    listed {events['listed']}, recovered {events['recovered_total']}, "
            f"already stored {events['already_stored']}, already known "
            f"{events.get('already_known', 0)}, before the cut-over "
            f"{events['before_cutover']}, bad signature {events['bad_signature']}, "
            f"waiting {events.get('waiting', 0)}"
        )
        lines += _details(events)
    totals = report.get("totals", {})
    by_path = report.get("recovered_by_path", {})
    lines.append(
        f"total: checked {totals.get('checked', 0)}, recovered {totals.get('recovered', 0)} "
        f"(lists {by_path.get('lists', 0)}, sweep {by_path.get('sweep', 0)}, events "
        f"{by_path.get('events', 0)}), queued {totals.get('queued', 0)}, unresolved "
        f"{totals.get('unresolved', 0)}, dead-lettered events in the inbox "
        f"{report.get('dead_letter_events', 0)}"
    )
    return "\n".join(lines)


def summary(report: dict[str, Any]) -> str:
    """A stored or fresh report in one line (a scheduled run's log line)."""
    totals = report.get("totals", {})
    by_path = report.get("recovered_by_path", {})
    return (
        f"reconcile run #{report.get('run_id')} ({report.get('mode')}): {report.get('status')} "
        f"in {report.get('duration_seconds', 0):.2f} s; checked {totals.get('checked', 0)}, "
        f"recovered {totals.get('recovered', 0)} (lists {by_path.get('lists', 0)}, sweep "
        f"{by_path.get('sweep', 0)}, events {by_path.get('events', 0)}), queued "
        f"{totals.get('queued', 0)}, unresolved {totals.get('unresolved', 0)}, failures "
        f"{totals.get('failures', 0)}"
    )


def _details(part: dict[str, Any]) -> list[str]:
    lines = []
    others = part.get("other_profiles") or {}
    if others:
        shown = ", ".join(f"{profile} {n}" for profile, n in others.items())
        lines.append(
            f"{'':<9} skipped {sum(others.values())} of other profiles' (not this "
            f"account's): {shown}"
        )
    for event_type, n in part.get("recovered", {}).items():
        lines.append(f"{'':<9} recovered {n} x {event_type}")
    dated = part.get("dated_by") or {}
    if dated:
        how = ", ".join(f"{n} by {by} time" for by, n in sorted(dated.items()))
        lines.append(f"{'':<9} dated: {how}")
    for label in (
        "remote_errors",
        "incomplete",
        "unknown_status_sample",
        "local_ahead_sample",
        "mismatched_sample",
        "behind_sample",
        "dead_lettered_sample",
        "local_only_sample",
        "not_found_sample",
        "bad_rows_sample",
        "bad_signature_sample",
        "waiting_sample",
    ):
        for item in part.get(label, []):
            lines.append(f"{'':<9} {label.replace('_sample', '')}: {item}")
    return lines
