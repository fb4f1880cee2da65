"""Going live on an account with history: adoption, the cut-over, and explicit backfills.

A shop that installs hookledger on an account that has taken payments for months must not
have its handlers run for what its earlier system already handled. ``reconcile adopt``:

1. records a **cut-over** (``hookledger_cutover``) at the moment it starts reading; the
   earlier system's history ends there, or just before the first delivery hookledger was
   sent if that came earlier (the deploy pointed the processor at hookledger first:
   :attr:`receiver.core.guard.CutOver.history_ends`);
2. lists each kind's objects over its history (by default as far back as the open-object
   sweep follows objects of that kind: what is older cannot change any more), newest
   first, in windows, within a request budget, resumable (run it again to go on);
3. records every object hookledger has no history of as already seen: its current state
   becomes the projection and its transition is owned by *adoption* (no inbox event, no
   handler); unsettled ones are followed by the sweep. An object that changed after the
   history ended (its modification time, or, for kinds without one, its creation) is
   dispatched instead, through the recovery path: its webhook may have failed, been in
   flight or been lost. Write-offs (an old delivery retried while adoption runs) are not
   history of hookledger's own;
4. when every kind is done, starts the lists' watermarks (and the events path's) where the
   history ends.

From then on no path dispatches a transition from before the history ended: the guard
records (never dispatches) an event stored after the cut-over that happened before it — a
processor retry of an old delivery, an undelivered event in the events API, a state a
reconcile path finds dated earlier, an API observation of an object hookledger has no
record of (:func:`receiver.core.guard.decide`). Objects with history of their own
(webhooks that reached hookledger before adoption) are left to it: those webhooks are
dispatched as usual.

``reconcile adopt --new-account`` records that the account has nothing before hookledger.
``reconcile backfill`` dispatches, on request, transitions adoption recorded (with a dry
run that counts them first).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from sqlalchemy import Table, delete, select
from sqlalchemy.dialects import postgresql, sqlite

import receiver.core.status as statuses
import receiver.core.transitions as transitions
import reconcile.core.diff as diff
from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.core.clock import Clock, as_utc, utcnow
from receiver.core.guard import ADOPTED, CutOver
from receiver.storage.tables import Projection, Source, Transition
from receiver.store import Store
from receiver.worker.runner import worker_name
from reconcile.client.paging import Pager
from reconcile.client.processor import ProcessorClient
from reconcile.core.diff import Remote
from reconcile.core.errors import ProcessorError
from reconcile.core.report import SAMPLE, KindReport
from reconcile.recovery.recover import Recovery, RecoveryOptions
from reconcile.recovery.sweep import FollowedObjects, SweepPolicy
from reconcile.runtime.runner import KIND_NAMES, LISTED_KINDS, Reconciler, kind_pager, truncate_ms
from reconcile.storage.store import AdoptionState as AdoptionState
from reconcile.storage.store import ReconcileStore
from reconcile.storage.store import adoption_state as adoption_state
from reconcile.storage.tables import Adoption

log = logging.getLogger("reconcile.adoption")

A: Table = Adoption.__table__  # type: ignore[attr-defined]
P: Table = Projection.__table__  # type: ignore[attr-defined]
T: Table = Transition.__table__  # type: ignore[attr-defined]


#: The first (newest) window of an adoption; each older window is twice as long, up to
#: ``MAX_WINDOW``, so recent history, where most objects are, comes in small steps.
FIRST_WINDOW: Final = timedelta(days=1)
MAX_WINDOW: Final = timedelta(days=7)
#: The events path's watermark name.
EVENTS: Final = "events"


@dataclass(frozen=True, kw_only=True, slots=True)
class AdoptOptions:
    kinds: Sequence[str] = LISTED_KINDS
    #: Read history from here (default: as far back as the sweep follows each kind).
    since: datetime | None = None
    #: Requests this run may spend; run ``adopt`` again to go on where it stopped.
    max_requests: int = 5_000
    dry_run: bool = False
    payments_dialect: Literal["hyperswitch", "seed"] = "hyperswitch"
    payouts_dialect: Literal["get", "post"] = "get"
    page_size: int = 100
    sweep_policy: SweepPolicy = field(default_factory=SweepPolicy)
    lock_wait: float = 0.0

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in LISTED_KINDS]
        if unknown:
            raise ValueError(f"adoption lists {sorted(LISTED_KINDS)}, not {unknown}")
        if self.max_requests < 1:
            raise ValueError("the request budget must be positive")


@dataclass(kw_only=True, slots=True)
class KindAdoption:
    """What adoption did for one kind."""

    history: tuple[datetime, datetime]
    reached: datetime | None = None
    finished: bool = False
    listed: int = 0
    recorded: Counter[str] = field(default_factory=Counter)
    own_history: int = 0
    #: Objects whose state changed after the earlier system's history ended (at or after
    #: the deploy, or after the cut-over, before adoption read them): dispatched, by state.
    dispatched: Counter[str] = field(default_factory=Counter)
    followed: int = 0
    unknown_status: int = 0
    bad_rows: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    requests: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "history": [self.history[0].isoformat(), self.history[1].isoformat()],
            "reached": self.reached.isoformat() if self.reached else None,
            "finished": self.finished,
            "listed": self.listed,
            "recorded": dict(sorted(self.recorded.items())),
            "recorded_total": sum(self.recorded.values()),
            "own_history": self.own_history,
            "dispatched": dict(sorted(self.dispatched.items())),
            "followed": self.followed,
            "unknown_status": self.unknown_status,
            "bad_rows": self.bad_rows,
            "incomplete": self.incomplete,
            "requests": self.requests,
        }


@dataclass(kw_only=True, slots=True)
class AdoptionReport:
    mode: str
    dry_run: bool
    cutover_at: datetime | None
    #: Where the earlier system's history ends (the cut-over, or just before the first
    #: delivery hookledger was sent, if earlier): what changed since is dispatched.
    history_ends: datetime | None = None
    kinds: dict[str, KindAdoption] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return all(k.finished for k in self.kinds.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "dry_run": self.dry_run,
            "cutover_at": self.cutover_at.isoformat() if self.cutover_at else None,
            "history_ends": self.history_ends.isoformat() if self.history_ends else None,
            "finished": self.finished,
            "kinds": {name: k.as_dict() for name, k in self.kinds.items()},
        }


def render_adoption(report: dict[str, Any]) -> str:
    """An adoption report as a table for people."""
    head = (
        f"adoption ({report['mode']}{', dry run' if report['dry_run'] else ''}): "
        f"{'finished' if report['finished'] else 'not finished: run `reconcile adopt` again'}"
    )
    if report["cutover_at"]:
        head += f"; cut-over {report['cutover_at']}"
    if report.get("history_ends") and report["history_ends"] != report["cutover_at"]:
        head += f"; history ends {report['history_ends']} (the first delivery)"
    lines = [head]
    for name, k in report["kinds"].items():
        line = (
            f"{name:<9} listed {k['listed']}, recorded {k['recorded_total']}, with history of "
            f"their own {k['own_history']}, followed {k['followed']}, requests {k['requests']}"
        )
        if not k["finished"]:
            line += f", read back to {k['reached'] or 'the cut-over'}"
        lines.append(line)
        for state, n in k["recorded"].items():
            lines.append(f"{'':<9} recorded {n} x {state}")
        for state, n in k.get("dispatched", {}).items():
            lines.append(f"{'':<9} changed since, dispatched {n} x {state}")
        for label in ("incomplete", "bad_rows"):
            for item in k[label]:
                lines.append(f"{'':<9} {label}: {item}")
    return "\n".join(lines)


def _windows(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    """``[start, end]`` as windows, newest first, doubling from a day up to a week."""
    size = FIRST_WINDOW
    upper = end
    while upper > start:
        lower = max(start, upper - size)
        yield lower, upper
        upper = lower - timedelta(milliseconds=1)
        size = min(size * 2, MAX_WINDOW)


class Adopter:
    """Runs ``reconcile adopt`` (see the module docstring)."""

    def __init__(
        self,
        client: ProcessorClient,
        inbox: Store,
        *,
        store: ReconcileStore | None = None,
        clock: Clock = utcnow,
        owner: str | None = None,
        account: str = DEFAULT_ACCOUNT,
    ) -> None:
        """``account``: the processor account ``client`` speaks for (``store``, when given,
        must be that account's)."""
        self.client = client
        self.inbox = inbox
        self.store = store or ReconcileStore(inbox.engine, clock=clock, account=account)
        if self.store.account != account:
            raise ValueError(
                f"the store is account {self.store.account!r}'s, the adoption {account!r}'s"
            )
        self.clock = clock
        self.owner = owner or worker_name()
        self._pg = inbox.engine.dialect.name == "postgresql"

    def __repr__(self) -> str:
        return f"Adopter(client={self.client!r})"

    def declare_new_account(self) -> AdoptionReport:
        """Record that the account has nothing before hookledger (every path dispatches)."""
        if self.inbox.operations.cutover_mode(account=self.store.account) == "adopted":
            raise ValueError(
                "this database has adopted an account with history; it cannot be declared new"
            )
        self.inbox.operations.set_cutover("new_account", None, account=self.store.account)
        return AdoptionReport(mode="new_account", dry_run=False, cutover_at=None)

    def adopt(self, options: AdoptOptions | None = None) -> AdoptionReport:
        """Adopt (or go on adopting) the account's current state; see the module docstring."""
        options = options or AdoptOptions()
        if self.inbox.operations.cutover_mode(account=self.store.account) == "new_account":
            raise ValueError("this database was declared a new account; there is nothing to adopt")
        lease = None if options.dry_run else self.store.lock(self.owner)
        if lease is not None:
            lease.acquire(wait=options.lock_wait)
        try:
            return self._adopt(options)
        finally:
            if lease is not None:
                lease.release()

    def _adopt(self, options: AdoptOptions) -> AdoptionReport:
        progress = self._progress()
        ops = self.inbox.operations
        existing = ops.cutover()
        cutover = existing.at if existing is not None else truncate_ms(self.clock())
        if existing is None:
            # Webhooks stored before this version kept the first delivery bound the deploy too.
            first = ops.first_stored_webhook(account=self.store.account)
            if first is not None and not options.dry_run:
                ops.record_first_delivery(first, account=self.store.account)
            kept = ops.first_delivery(account=self.store.account)
            if first is None or (kept is not None and kept < first):
                first = kept
            if not options.dry_run:
                ops.set_cutover("adopted", cutover, account=self.store.account)
            now = as_utc(self.clock())
            existing = ops.cutover(account=self.store.account) or CutOver(
                at=cutover, recorded_at=now, first_delivery=first
            )
        ends = existing.history_ends
        report = AdoptionReport(
            mode="adopted", dry_run=options.dry_run, cutover_at=cutover, history_ends=ends
        )
        recovery = Recovery(
            self.inbox,
            self.store,
            FollowedObjects(
                self.inbox.engine,
                policy=options.sweep_policy,
                clock=self.clock,
                account=self.store.account,
            ),
            options=RecoveryOptions(dry_run=options.dry_run),
            clock=self.clock,
        )
        budget = options.max_requests
        followed = FollowedObjects(
            self.inbox.engine,
            policy=options.sweep_policy,
            clock=self.clock,
            account=self.store.account,
        )
        for name in options.kinds:
            kind = KIND_NAMES[name]
            row = progress.get(name)
            start = (
                as_utc(row["history_start"])
                if row is not None
                else truncate_ms(options.since)
                if options.since is not None
                else cutover - options.sweep_policy.horizon(kind)
            )
            part = KindAdoption(history=(start, cutover))
            report.kinds[name] = part
            if row is not None and row["finished_at"] is not None:
                part.finished = True
                part.reached = start
                continue
            reached = as_utc(row["reached"]) if row is not None and row["reached"] else None
            if row is None and not options.dry_run:
                self._save(name, cutover, start, None, finished=False, counts={})
            upper = reached - timedelta(milliseconds=1) if reached is not None else cutover
            part.reached = reached
            for low, high in _windows(start, upper):
                if budget <= 0:
                    break
                done, spent = self._window(
                    name, kind, low, high, existing, budget, part, followed, recovery, options
                )
                budget -= spent
                if not done:
                    break
                part.reached = low
                if not options.dry_run:
                    self._save(name, cutover, start, low, finished=False, counts=part.as_dict())
            else:
                part.finished = True
                part.reached = start
                if not options.dry_run:
                    self._save(name, cutover, start, start, finished=True, counts=part.as_dict())
        if report.finished and not options.dry_run:
            for name in options.kinds:
                self.store.set_watermark(KIND_NAMES[name], ends)
            self.store.set_watermark(EVENTS, ends)
            log.info("adoption finished", extra={"action": "adopt", "cutover": str(cutover)})
        return report

    def _window(
        self,
        name: str,
        kind: str,
        low: datetime,
        high: datetime,
        cutover: CutOver,
        budget: int,
        part: KindAdoption,
        followed: FollowedObjects,
        recovery: Recovery,
        options: AdoptOptions,
    ) -> tuple[bool, int]:
        """Adopt the objects of one window; returns (window complete, requests spent)."""
        pager = _pager(self.client, name, low, high, budget, options)
        chunk: list[Remote] = []
        try:
            for row in pager:
                remote = _read(kind, row, part)
                if remote is not None:
                    chunk.append(remote)
                if len(chunk) >= 500:
                    self._record(kind, chunk, cutover, part, followed, recovery, options)
                    chunk = []
            self._record(kind, chunk, cutover, part, followed, recovery, options)
        except ProcessorError as exc:
            part.incomplete.append(f"{low.isoformat()}..{high.isoformat()}: {type(exc).__name__}")
            part.requests += pager.requests
            return False, pager.requests
        for problem in getattr(pager, "row_errors", ()):
            if len(part.bad_rows) < SAMPLE:
                part.bad_rows.append(
                    f"{problem.kind} {problem.object_id or '(no id)'}: {problem.reason}"
                )
        part.requests += pager.requests
        if pager.incomplete:
            part.incomplete += [
                f"{w.start.isoformat()}..{w.end.isoformat()}: {w.reason}" for w in pager.incomplete
            ]
            return False, pager.requests
        return True, pager.requests

    def _record(
        self,
        kind: str,
        remotes: list[Remote],
        cut: CutOver,
        part: KindAdoption,
        followed: FollowedObjects,
        recovery: Recovery,
        options: AdoptOptions,
    ) -> None:
        """Record ``remotes`` hookledger has no history of as already seen (owner: adoption);
        dispatch those that changed after the earlier system's history ended.

        An object whose only history is write-offs (a processor retry of an old delivery,
        stored while adoption ran) has no history of hookledger's own: it is recorded too,
        its projection replacing the write-off's."""
        if not remotes:
            return
        cutover, ends = cut.at, cut.history_ends
        unique = {r.object_id: r for r in remotes}
        own, written_off = self.store.own_history(kind, unique, cut)
        part.own_history += len(own)
        candidates = [r for oid, r in unique.items() if oid not in own and r.state is not None]
        fresh: list[Remote] = []
        changed: list[Remote] = []
        for remote in candidates:
            # A payment or refund shows when it last changed; a dispute, payout or mandate
            # only when it was created (what changed after that cannot be told here).
            when = remote.modified if remote.modified is not None else remote.created
            if when is not None and as_utc(when) >= ends:
                changed.append(remote)
            else:
                fresh.append(remote)
        if changed:
            tally = KindReport(window=(ends, cutover))
            recovery.process(kind, changed, tally, confirm_ahead=False)
            for remote in changed:
                assert remote.state is not None
                part.dispatched[remote.state.key] += 1
        now = as_utc(self.clock())
        projections: list[dict[str, Any]] = []
        owned: list[dict[str, Any]] = []
        for remote in fresh:
            assert remote.state is not None
            part.recorded[remote.state.key] += 1
            when = remote.modified if remote.modified is not None else cutover
            projections.append(
                {
                    "account": self.store.account,
                    "object_kind": kind,
                    "object_id": remote.object_id,
                    "status": remote.state.status,
                    "stage": remote.state.stage,
                    "event_time": min(as_utc(when), cutover),
                    "object_created_at": remote.created,
                    "event_pk": ADOPTED,
                    "updated_at": now,
                }
            )
            owned.append(
                {
                    "account": self.store.account,
                    "object_kind": kind,
                    "object_id": remote.object_id,
                    "state": remote.state.key,
                    "event_pk": ADOPTED,
                    "created_at": now,
                }
            )
        if options.dry_run or not projections:
            return
        insert = postgresql.insert if self._pg else sqlite.insert
        replaced = sorted({pk for pks in written_off.values() for pk in pks})
        project = insert(P)
        if replaced:
            # Over a write-off's projection only (never one a dispatched event set since).
            project = project.on_conflict_do_update(
                index_elements=[P.c.account, P.c.object_kind, P.c.object_id],
                set_={
                    c: project.excluded[c]
                    for c in ("status", "stage", "event_time", "object_created_at", "event_pk")
                }
                | {"updated_at": project.excluded.updated_at},
                where=P.c.event_pk.in_(replaced),
            )
        else:
            project = project.on_conflict_do_nothing()
        with self.inbox.engine.begin() as conn:
            conn.execute(project, projections)
            conn.execute(insert(T).on_conflict_do_nothing(), owned)
        part.followed += followed.observed(fresh, now=now)

    # -- progress ------------------------------------------------------------------------------

    def _progress(self) -> dict[str, dict[str, Any]]:
        with self.store.reader.connect() as conn:
            return {
                row.kind: dict(row._mapping)
                for row in conn.execute(select(A).where(A.c.account == self.store.account))
            }

    def _save(
        self,
        name: str,
        cutover: datetime,
        start: datetime,
        reached: datetime | None,
        *,
        finished: bool,
        counts: Mapping[str, Any],
    ) -> None:
        now = as_utc(self.clock())
        values = {
            "cutover_at": cutover,
            "history_start": start,
            "reached": reached,
            "finished_at": now if finished else None,
            "counts": json.dumps(counts, default=str),
        }
        insert = postgresql.insert if self._pg else sqlite.insert
        with self.inbox.engine.begin() as conn:
            conn.execute(
                insert(A)
                .values(account=self.store.account, kind=name, started_at=now, **values)
                .on_conflict_do_update(index_elements=["account", "kind"], set_=values)
            )


def _pager(
    client: ProcessorClient, name: str, low: datetime, high: datetime, budget: int, o: AdoptOptions
) -> Pager:
    return kind_pager(
        client,
        name,
        low,
        high,
        payments_dialect=o.payments_dialect,
        payouts_dialect=o.payouts_dialect,
        page_size=o.page_size,
        max_requests=budget,
    )


def _read(kind: str, row: object, part: KindAdoption) -> Remote | None:
    part.listed += 1
    read = diff.read_remote(kind, row)
    if isinstance(read, diff.BadRow):
        if len(part.bad_rows) < SAMPLE:
            part.bad_rows.append(str(read))
        return None
    if read.state is None or not _known(read):
        part.unknown_status += 1
        return None
    return read


def _known(remote: Remote) -> bool:
    model = transitions.lifecycle(remote.kind)
    return model is not None and remote.state is not None and model.knows(remote.state.status)


# -- backfill ---------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class BackfillReport:
    dry_run: bool
    window: tuple[datetime, datetime]
    kinds: dict[str, KindReport] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "window": [self.window[0].isoformat(), self.window[1].isoformat()],
            "kinds": {name: k.as_dict() for name, k in self.kinds.items()},
            "total": sum(sum(k.recovered.values()) for k in self.kinds.values()),
        }


class Backfill:
    """Dispatch, on request, transitions adoption recorded as already seen.

    For the objects created in ``[since, until]`` whose projection adoption recorded, the
    current state is read again from the processor and dispatched to the handlers (inbox
    source ``backfill``, exempt from the cut-over). A dry run counts them and changes
    nothing.
    """

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler

    def __repr__(self) -> str:
        return "Backfill()"

    def run(
        self,
        since: datetime,
        until: datetime,
        *,
        kinds: Sequence[str] = LISTED_KINDS,
        dry_run: bool = True,
        options: AdoptOptions | None = None,
    ) -> BackfillReport:
        r = self.reconciler
        options = options or AdoptOptions()
        window = (truncate_ms(since), min(truncate_ms(until), truncate_ms(r.clock())))
        report = BackfillReport(dry_run=dry_run, window=window)
        followed = FollowedObjects(
            r.inbox.engine, policy=options.sweep_policy, clock=r.clock, account=r.store.account
        )
        recovery = Recovery(
            r.inbox,
            r.store,
            followed,
            options=RecoveryOptions(dry_run=dry_run, source=Source.BACKFILL),
            clock=r.clock,
        )
        for name in kinds:
            kind = KIND_NAMES[name]
            part = KindReport(window=window)
            report.kinds[name] = part
            pager = _pager(r.client, name, *window, options.max_requests, options)
            try:
                rows = list(pager)
            except ProcessorError as exc:
                part.remote_errors.append(f"{type(exc).__name__}: {exc}")
                continue
            remotes = recovery.read(kind, rows, part)
            adopted = _adopted(r.inbox, r.store.account, kind, [x.object_id for x in remotes])
            chosen = [x for x in remotes if x.object_id in adopted]
            part.pages, part.requests = pager.pages, pager.requests
            if dry_run:
                # What adoption recorded is, to the diff, in sync: count what a backfill would
                # dispatch (each object's current state, where the processor sends an event).
                for remote in chosen:
                    part.checked += 1
                    event_type = (
                        statuses.event_type_for_status(kind, remote.state.status)
                        if remote.state is not None
                        else None
                    )
                    if event_type is None:
                        part.no_event += 1
                    else:
                        part.recovered[event_type] += 1
                continue
            _forget(r.inbox, r.store.account, kind, [x.object_id for x in chosen])
            recovery.process(kind, chosen, part, confirm_ahead=False)
        return report


def _adopted(inbox: Store, account: str, kind: str, object_ids: Sequence[str]) -> set[str]:
    if not object_ids:
        return set()
    with inbox.deferred.connect() as conn:
        rows = conn.execute(
            select(P.c.object_id).where(
                P.c.account == account,
                P.c.object_kind == kind,
                P.c.object_id.in_(list(object_ids)),
                P.c.event_pk == ADOPTED,
            )
        ).scalars()
        return set(rows)


def _forget(inbox: Store, account: str, kind: str, object_ids: Sequence[str]) -> None:
    """Drop what adoption recorded for ``object_ids`` so their states dispatch again."""
    if not object_ids:
        return
    with inbox.engine.begin() as conn:
        conn.execute(
            delete(T).where(
                T.c.account == account,
                T.c.object_kind == kind,
                T.c.object_id.in_(list(object_ids)),
                T.c.event_pk == ADOPTED,
            )
        )
        conn.execute(
            delete(P).where(
                P.c.account == account,
                P.c.object_kind == kind,
                P.c.object_id.in_(list(object_ids)),
                P.c.event_pk == ADOPTED,
            )
        )


__all__ = [
    "AdoptOptions",
    "Adopter",
    "AdoptionReport",
    "Backfill",
    "BackfillReport",
    "adoption_state",
    "render_adoption",
]
