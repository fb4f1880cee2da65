"""Going live on an account with history: adoption and the cut-over it records.

A shop that installs hookledger on an account that has taken payments for months must not
have its handlers run for what its earlier system already handled. ``reconcile adopt``:

1. records the adopted account's own **cut-over** (``hookledger_cutover``) at the moment its
   first run starts reading (a run that resumes it keeps it: never moved, never another
   account's); the earlier system's history ends there, or at the deploy the operator
   states (``--deployed-at``, recorded with it), or just before the first delivery
   hookledger was sent, whichever is earliest (the deploy pointed the processor at
   hookledger first: :attr:`receiver.core.guard.CutOver.history_ends`). A first run that
   can tell neither (no webhook ever reached hookledger for the account, no
   ``--deployed-at``) refuses (:class:`DeployUnknown`) rather than write off every change
   since the deploy whose deliveries were lost;
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
Like every path, adoption takes only this account's objects of the merchant
(:mod:`reconcile.core.ownership`): another profile's are left to their own account.
Its report is in :mod:`reconcile.runtime.adoption_report`; ``reconcile backfill``, which
dispatches on request transitions adoption recorded, in :mod:`reconcile.runtime.backfill`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from sqlalchemy import Table, literal_column, select
from sqlalchemy.dialects import postgresql, sqlite

import receiver.core.transitions as transitions
import reconcile.core.diff as diff
from receiver.core.accounts import DEFAULT_ACCOUNT, AccountSource
from receiver.core.clock import Clock, as_utc, utcnow
from receiver.core.guard import ADOPTED, CutOver
from receiver.storage.account_table import StoredAccounts
from receiver.storage.tables import Projection, Transition
from receiver.store import Store
from receiver.worker.runner import worker_name
from reconcile.client.paging import Pager
from reconcile.client.processor import ProcessorClient
from reconcile.core.diff import Remote
from reconcile.core.errors import ProcessorError
from reconcile.core.ownership import Ownership
from reconcile.core.report import SAMPLE, KindReport
from reconcile.recovery.recover import Recovery, RecoveryOptions
from reconcile.recovery.sweep import FollowedObjects, SweepPolicy
from reconcile.runtime.adoption_report import AdoptionReport, KindAdoption
from reconcile.runtime.runner import KIND_NAMES, LISTED_KINDS, kind_pager, truncate_ms
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
    #: When the deploy pointed the processor's webhooks at hookledger (``--deployed-at``):
    #: the earlier system's history ends there (recorded by the first run, never moved).
    #: Required by a first run when no webhook delivery ever reached hookledger for the
    #: account (:class:`DeployUnknown`).
    deployed_at: datetime | None = None

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in LISTED_KINDS]
        if unknown:
            raise ValueError(f"adoption lists {sorted(LISTED_KINDS)}, not {unknown}")
        if self.max_requests < 1:
            raise ValueError("the request budget must be positive")


class DeployUnknown(ValueError):
    """Adoption cannot tell when the deploy pointed the processor at hookledger: no webhook
    delivery ever reached hookledger for the account, and ``--deployed-at`` was not given.
    Taking the cut-over for the end of history would write off as the earlier system's
    every change made since the deploy whose deliveries were lost."""


class DeployTooEarly(ValueError):
    """``--deployed-at`` is earlier than the history adoption reads, and no webhook reached
    hookledger near it: every object adoption reads would be taken for a change since the
    deploy and dispatched (a mistyped year or month would dispatch the whole history)."""


#: A delivery this close after a stated deploy shows the deploy was then.
DEPLOY_EVIDENCE = timedelta(days=1)


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
        accounts: AccountSource | None = None,
    ) -> None:
        """``account``: the processor account ``client`` speaks for (``store``, when given,
        must be that account's); ``accounts``: the installation's, which tell which objects
        are its (default: the accounts stored in hookledger's table)."""
        self.client = client
        self.inbox = inbox
        self.store = store or ReconcileStore(inbox.engine, clock=clock, account=account)
        if self.store.account != account:
            raise ValueError(
                f"the store is account {self.store.account!r}'s, the adoption {account!r}'s"
            )
        self.clock = clock
        self.owner = owner or worker_name()
        self.accounts: AccountSource = (
            accounts if accounts is not None else StoredAccounts(inbox.accounts)
        )
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
        # Nothing before now: the first run reads on from here, however long after it comes
        # (its 48-hour lookback would miss what was created between now and then). A
        # watermark already there (declared before, runs since) is left where it is.
        now = as_utc(self.clock())
        for kind in [*KIND_NAMES.values(), EVENTS]:
            if self.store.watermark(kind) is None:
                self.store.set_watermark(kind, now)
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
        # This account's own cut-over: recorded by its first adoption run and kept by every
        # run that resumes it (never another account's, never moved).
        existing = ops.cutover(account=self.store.account)
        cutover = existing.at if existing is not None else truncate_ms(self.clock())
        deployed = as_utc(options.deployed_at) if options.deployed_at is not None else None
        if existing is not None:
            if deployed is not None and deployed != existing.deployed_at:
                raise ValueError(
                    f"account {self.store.account!r}'s adoption began at {cutover.isoformat()} "
                    "and recorded where its history ends; a resumed run never moves it: run "
                    "`reconcile adopt` again without --deployed-at"
                    + (
                        f" (or with the recorded {existing.deployed_at.isoformat()})"
                        if existing.deployed_at is not None
                        else ""
                    )
                )
        else:
            if deployed is not None and deployed > as_utc(self.clock()):
                raise ValueError(
                    f"--deployed-at {deployed.isoformat()} is in the future: give the time "
                    "the deploy pointed the processor's webhooks at hookledger"
                )
            # Webhooks stored before this version kept the first delivery bound the deploy too.
            first = ops.first_stored_webhook(account=self.store.account)
            if first is not None and not options.dry_run:
                ops.record_first_delivery(first, account=self.store.account)
            kept = ops.first_delivery(account=self.store.account)
            if first is None or (kept is not None and kept < first):
                first = kept
            if deployed is not None:
                self._check_deploy(deployed, first, cutover, options)
            if first is None and deployed is None:
                raise DeployUnknown(
                    f"no webhook has reached hookledger for account {self.store.account!r}, "
                    "so adoption cannot tell when the deploy pointed the processor's webhooks "
                    "at it: every change since the deploy whose deliveries were lost would be "
                    "recorded as the earlier system's and never dispatched. Run `reconcile "
                    "adopt --deployed-at TIME` (UTC, when the webhook URL was switched; "
                    "everything from then on is dispatched once)"
                )
            if not options.dry_run:
                if deployed is not None:
                    ops.record_deployed(deployed, account=self.store.account)
                ops.set_cutover("adopted", cutover, account=self.store.account)
            now = as_utc(self.clock())
            existing = ops.cutover(account=self.store.account) or CutOver(
                at=cutover, recorded_at=now, first_delivery=first, deployed_at=deployed
            )
        ends = existing.history_ends
        report = AdoptionReport(
            mode="adopted",
            dry_run=options.dry_run,
            cutover_at=cutover,
            history_ends=ends,
            deployed_at=existing.deployed_at,
            first_delivery=existing.first_delivery,
        )
        ownership = Ownership(self.store.account, self.accounts)
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
            ownership=ownership,
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
            if row is not None and as_utc(row["cutover_at"]) != cutover:
                # Progress toward another cut-over (an earlier version read the default
                # account's for every account, and moved a seller's when resumed): this
                # kind's history is read again up to this account's own.
                row = None
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

    def _check_deploy(
        self,
        deployed: datetime,
        first: datetime | None,
        cutover: datetime,
        options: AdoptOptions,
    ) -> None:
        """Refuse a deploy earlier than the history adoption reads (of any kind asked), unless
        a webhook reached hookledger within :data:`DEPLOY_EVIDENCE` after it: adoption
        could then tell nothing from the earlier system's, and would dispatch all of it."""
        if first is not None and as_utc(first) <= deployed + DEPLOY_EVIDENCE:
            return
        starts = [
            truncate_ms(options.since)
            if options.since is not None
            else cutover - options.sweep_policy.horizon(KIND_NAMES[name])
            for name in options.kinds
        ]
        latest = max(starts, default=cutover)
        if deployed >= latest:
            return
        raise DeployTooEarly(
            f"--deployed-at {deployed.isoformat()} is before the history adoption reads "
            f"(from {latest.isoformat()}), and no webhook reached hookledger for account "
            f"{self.store.account!r} within a day of it: every object adoption reads would be "
            "taken for a change since the deploy and dispatched again. Check the date (UTC); "
            "if the deploy really was then, pass --since at or before it"
        )

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
        ownership = recovery.ownership
        profile = ownership.profile_filter if ownership is not None else None
        pager = adoption_pager(self.client, name, low, high, budget, options, profile)
        chunk: list[Remote] = []
        try:
            for row in pager:
                if recovery.skip_other(row, part.other_profiles):
                    continue
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
                # Inline integers (the inbox's own keys): an expanding IN parameter cannot go
                # with the executemany of several projections.
                where=P.c.event_pk.in_([literal_column(str(int(pk))) for pk in replaced]),
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


def adoption_pager(
    client: ProcessorClient,
    name: str,
    low: datetime,
    high: datetime,
    budget: int,
    o: AdoptOptions,
    profile_id: str | None = None,
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
        profile_id=profile_id,
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


__all__ = [
    "AdoptOptions",
    "Adopter",
    "adoption_state",
]
