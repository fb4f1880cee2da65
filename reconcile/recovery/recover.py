"""From remote objects to recovered events: the step the lists and the sweep share.

Given remote objects of one kind (listed, or fetched by id), compare each with the local
projection (:func:`reconcile.core.diff.compare`), follow the ones that have not settled (for the
sweep), and feed every missed transition into the receiver's inbox as a synthesised event
(source ``reconcile``), unless the object already has an event waiting in the inbox: then
nothing is inserted (the waiting events run first), and the object is ``queued`` when one of
them brings it to the processor's state, ``behind`` (unresolved) when none does. Every
object found out of step (recovered, queued, behind, or projected by a dead-lettered event)
stays followed by the sweep, however settled its remote state, until a later look finds it
in sync. A remote row that cannot be stored is reported and skipped, never an error of the
run. A row of another business profile (not this account's by
:class:`~reconcile.core.ownership.Ownership`) is skipped before anything else: counted as
``other_profiles``, never diffed, followed or recovered.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import reconcile.core.diff as diff
from receiver.core.accounts import object_key
from receiver.core.clock import Clock, as_utc, utcnow
from receiver.core.events import parse_event
from receiver.storage.tables import EventStatus, Source
from receiver.store import Store
from reconcile.core.diff import KINDS, BadRow, Finding, Remote
from reconcile.core.errors import ProcessorError, escape_id
from reconcile.core.ownership import Ownership
from reconcile.core.report import Tally
from reconcile.recovery.sweep import FollowedObjects
from reconcile.storage.store import ReconcileStore

log = logging.getLogger("reconcile.recovery")

#: Fetch one object by kind and id (the API client's ``get_object``).
Fetch = Callable[[str, str], dict[str, Any]]


@dataclass(frozen=True, kw_only=True, slots=True)
class RecoveryOptions:
    #: The merchant a recovered event names when its object names none (a refund, a
    #: dispute, a mandate) and the account names none either (see :class:`Recovery`).
    merchant_id: str | None = None
    dry_run: bool = False
    #: The inbox source of synthesised events (``backfill`` for an explicit backfill).
    source: str = Source.RECONCILE
    #: Most objects re-fetched in a run to confirm a projection that looks ahead of a
    #: listing (the rest are reported ``local_ahead`` unconfirmed).
    confirm_budget: int = 100


class Recovery:
    """Diffs remote objects against the projection and recovers what the inbox missed."""

    def __init__(
        self,
        inbox: Store,
        store: ReconcileStore,
        followed: FollowedObjects,
        *,
        options: RecoveryOptions | None = None,
        fetch: Fetch | None = None,
        clock: Clock = utcnow,
        ownership: Ownership | None = None,
    ) -> None:
        """``ownership``: which objects are this account's (``None``: every object read)."""
        self.inbox = inbox
        self.store = store
        self.followed = followed
        self.options = options or RecoveryOptions()
        self.fetch = fetch
        self.clock = clock
        self.ownership = ownership
        #: The merchant a recovered event names when its object names none: the account's
        #: own (a seller's, never the platform's), else the options'. An object that names
        #: its merchant (a payment, a payout) is always sent under it.
        self.merchant_id = (
            ownership.merchant_id if ownership is not None else None
        ) or self.options.merchant_id
        #: Requests spent confirming, per kind (they count toward the run's budget).
        self.spent: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"Recovery(dry_run={self.options.dry_run})"

    def read(
        self,
        kind: str,
        rows: Sequence[object],
        tally: Tally,
        *,
        others: list[str] | None = None,
    ) -> list[Remote]:
        """Read raw rows into :class:`Remote` objects; bad rows are reported in ``tally``,
        rows of other profiles counted there (``other_profiles``) and skipped, their ids
        added to ``others`` when it is given."""
        remotes: list[Remote] = []
        for row in rows:
            if self.skip_other(row, tally.other_profiles):
                assert isinstance(row, Mapping)
                if others is not None and isinstance(row.get(KINDS[kind].id_field), str):
                    others.append(row[KINDS[kind].id_field])
                continue
            read = diff.read_remote(kind, row)
            if isinstance(read, BadRow):
                tally.checked += 1
                tally.note_bad_row(str(read))
                log.warning("bad remote row skipped: %s", read, extra={"action": "bad_row"})
            else:
                remotes.append(read)
        return remotes

    def skip_other(self, row: object, counts: Counter[str]) -> bool:
        """Whether ``row`` is an object of another business profile, not this account's
        (counted in ``counts`` by profile, then skipped by the caller)."""
        ownership = self.ownership
        if ownership is None or not isinstance(row, Mapping) or ownership.owns_object(row):
            return False
        counts[ownership.profile_of(row)] += 1
        return True

    def process(
        self,
        kind: str,
        remotes: Sequence[Remote],
        tally: Tally,
        *,
        run_id: int | None = None,
        confirm_ahead: bool = True,
    ) -> set[str]:
        """Diff ``remotes`` (distinct objects of ``kind``) and recover what is missed;
        returns the ids of the objects kept followed until they are in sync.

        ``run_id``: mark them seen by that run (the lists' local-only check needs it).
        ``confirm_ahead``: a projection ahead of a *listed* object may only mean the page
        was read before a webhook arrived; fetch the object again before calling it drift.
        """
        if not remotes:
            return set()
        now = as_utc(self.clock())
        plan = None if self.options.dry_run else self.followed.plan(remotes, now=now)
        differing = self.store.observe(
            run_id,
            kind,
            [(r.object_id, r.state) for r in remotes],
            also=(lambda conn: self.followed.write(conn, plan)) if plan else None,
        )
        missed: list[Finding] = []
        ahead: list[Finding] = []
        for remote in remotes:
            tally.checked += 1
            if remote.state is not None and remote.object_id not in differing:
                tally.in_sync += 1
                continue
            finding = diff.compare(remote, differing.get(remote.object_id))
            if finding.verdict == "local_ahead" and confirm_ahead and self.fetch is not None:
                ahead.append(finding)
            else:
                self._count(finding, tally, missed)
        for finding in self._confirm(kind, ahead):
            self._count(finding, tally, missed)
        # Out of step: recovered (its handlers may yet fail), queued or behind (what waits
        # may leave it short), or projected by a dead-lettered event. A later run judges
        # each again, whatever the lists' windows and the remote state's settledness say.
        kept = {f.object_id: f.remote for f in self._recover(kind, missed, tally, now)}
        kept.update(
            (remote.object_id, remote)
            for remote in remotes
            if (local := differing.get(remote.object_id)) is not None
            and local.dead
            and remote.state is not None
            and remote.state.key == local.state.key
        )
        if kept and not self.options.dry_run:
            self.followed.keep(list(kept.values()), now=now)
        return set(kept)

    @staticmethod
    def _count(finding: Finding, tally: Tally, missed: list[Finding]) -> None:
        if finding.verdict == "in_sync":
            tally.in_sync += 1
        elif finding.verdict == "dead_letter":
            tally.note_dead_lettered(
                f"{escape_id(finding.object_id)}: {finding.remote.state}, reached by a "
                f"dead-lettered event (#{finding.local.event_pk if finding.local else '?'})"
            )
        elif finding.verdict == "no_event":
            tally.no_event += 1
        elif finding.verdict == "unknown_status":
            state = finding.remote.state
            tally.note_unknown(
                f"{escape_id(finding.object_id)}: status {state.status if state else None}"
            )
        elif finding.verdict == "local_ahead":
            tally.note_local_ahead(finding.describe())
        else:
            missed.append(finding)

    def _confirm(self, kind: str, ahead: list[Finding]) -> list[Finding]:
        """Fetch objects whose listing looked older than the projection; judge them fresh."""
        if not ahead:
            return []
        assert self.fetch is not None
        fresh: list[Finding] = []
        for finding in ahead:
            if sum(self.spent.values()) >= self.options.confirm_budget:
                fresh.append(finding)
                continue
            self.spent[kind] += 1
            try:
                row = self.fetch(kind, finding.object_id)
            except ProcessorError as exc:
                log.warning("could not confirm %s: %s", kind, type(exc).__name__)
                fresh.append(finding)
                continue
            read = diff.read_remote(kind, row)
            if isinstance(read, BadRow) or read.object_id != finding.object_id:
                fresh.append(finding)
                continue
            local = self.store.local_states(kind, [read.object_id]).get(read.object_id)
            fresh.append(diff.compare(read, local))
        return fresh

    def _recover(
        self, kind: str, missed: list[Finding], tally: Tally, now: datetime
    ) -> list[Finding]:
        """Insert the missed transitions; returns those recovered or waiting (queued or
        behind), which a later run must look at again."""
        if not missed:
            return []
        bodies: list[tuple[Finding, bytes, str, diff.DatedBy]] = []
        for finding in missed:
            assert finding.event_type is not None
            try:
                body, event_id, dated_by = diff.synthesise(
                    finding, merchant_id=self.merchant_id, observed=now
                )
            except ValueError as exc:
                tally.note_bad_row(f"{kind} {escape_id(finding.object_id)}: {exc}")
                continue
            bodies.append((finding, body, event_id, dated_by))
        if not bodies:
            return []
        if self.options.dry_run:
            waiting = self.inbox.inbox.waiting(
                object_key(self.store.account, kind, f.object_id) for f, _, _, _ in bodies
            )
            queued: list[Finding] = []
            for finding, _body, _event_id, _dated_by in bodies:
                assert finding.event_type is not None
                if object_key(self.store.account, kind, finding.object_id) in waiting:
                    queued.append(finding)
                else:
                    tally.recovered[finding.event_type] += 1
            self._queued(kind, queued, tally)
            return [finding for finding, _, _, _ in bodies]
        # One transaction: objects with an event already waiting in the inbox are skipped
        # (queued: what the worker does next may settle them), the others inserted.
        results = self.inbox.inbox.insert_synthesised(
            [(parse_event(body), body) for _, body, _, _ in bodies],
            source=self.options.source,
            unless_queued=True,
            account=self.store.account,
        )
        recheck: list[tuple[Finding, str]] = []
        behind_others: list[Finding] = []
        for finding, _body, event_id, dated_by in bodies:
            assert finding.event_type is not None
            state = results[event_id]
            if state == "inserted":
                tally.recovered[finding.event_type] += 1
                tally.dated_by[dated_by] += 1
            elif state in EventStatus.OPEN:
                tally.queued += 1  # this very recovery, waiting for the worker
            elif state == "queued":
                behind_others.append(finding)
            else:
                recheck.append((finding, state))
        self._queued(kind, behind_others, tally)
        self._recheck(kind, recheck, tally)
        # A recovery event found finished with the projection short was refused or
        # dead-lettered: reported for a person (mismatched), not looked at run after run.
        refused = {finding.object_id for finding, _ in recheck}
        return [finding for finding, _, _, _ in bodies if finding.object_id not in refused]

    def _queued(self, kind: str, findings: list[Finding], tally: Tally) -> None:
        """Objects whose recovery was not inserted because events of theirs wait in the
        inbox: ``queued`` when one of those brings the projection to the processor's state,
        ``behind`` (unresolved, and followed until in sync) when none does."""
        if not findings:
            return
        waiting = self.store.waiting_states(kind, [f.object_id for f in findings])
        for finding in findings:
            remote = finding.remote.state
            assert remote is not None
            states = waiting.get(finding.object_id, [])
            if diff.reaches(remote, states):
                tally.queued += 1
            else:
                shown = ", ".join(sorted({str(state) for state in states})) or "nothing"
                tally.note_behind(f"{finding.describe()}, waiting in the inbox: {shown}")

    def _recheck(self, kind: str, found: list[tuple[Finding, str]], tally: Tally) -> None:
        """Recovery events that were already there and are finished: if the projection has
        caught up meanwhile (the worker was busy with them), it is in sync; otherwise the
        guard refused or dead-lettered them, and a person should look."""
        if not found:
            return
        now_local = self.store.local_states(kind, [f.object_id for f, _ in found])
        for finding, state in found:
            local = now_local.get(finding.object_id)
            remote = finding.remote.state
            if local is not None and remote is not None and local.state.key == remote.key:
                tally.in_sync += 1
            else:
                tally.note_mismatch(f"{finding.describe()}, recovery event {state}")
