"""The open-object sweep: re-fetch by id every object that has not settled yet.

The processor's lists filter on *creation* time, so a late change to an old object (an
authorisation that expires on day 7, a captured payment voided days later, a dispute
decided on day 30, a payout reversed after its success, a refund that fails days later, a
mandate revoked months on) never shows up in a recent creation window. The sweep catches
those: every object whose projection, or whose last remote state, is not settled for its
kind (:meth:`receiver.core.transitions.Lifecycle.is_settled`) is fetched again by id
(``GET /payments/{id}``, ``/refunds/{id}``, ``/disputes/{id}``, ``/payouts/{id}``,
``/mandates/{id}``), until it settles or grows older than its kind's horizon (or its
status's: a captured payment, which only a void after capture still moves, is followed
for ``CAPTURED_REACH``). What it finds goes through the same diff and inbox as the lists.
An object a run found out of step (its recovery inserted, or waiting behind events that
may leave the projection short; a projection reached by a dead-lettered event) is kept,
however settled its remote state, and checked at every run until one finds it in sync
(:meth:`FollowedObjects.keep`).

Checks are spaced out as an object ages: the next one comes after as long as the object has
existed (at least ``min_interval``, at most the kind's ``max_interval``), so a young object
is looked at often and an old one about daily; each run spends at most its request budget,
oldest-due first, and reports what it had to leave overdue. Nothing here is a loop that
can run away: one request per object, a fixed budget per run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    and_,
    delete,
    func,
    literal,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.dialects import postgresql, sqlite

import receiver.core.transitions as transitions
from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.core.clock import Clock, as_utc, utcnow
from receiver.storage.database import deferred_begin
from receiver.storage.tables import Projection
from reconcile.core.diff import Remote
from reconcile.storage.tables import FollowedObject

log = logging.getLogger("reconcile.sweep")

F: Table = FollowedObject.__table__  # type: ignore[attr-defined]

#: Stop following settled objects (PostgreSQL): the ids joined as an array of the key's own
#: type, so each is a probe of the primary key.
_SETTLE_PG = text(
    "DELETE FROM hookledger_recon_object AS f USING unnest(CAST(:ids AS varchar[])) AS k(id)"
    " WHERE f.account = :account AND f.kind = :kind AND f.object_id = k.id"
)
P: Table = Projection.__table__  # type: ignore[attr-defined]

DAY: Final = timedelta(days=1)

#: Per kind, how long after its creation an object is still followed (its lifecycle's
#: reach: a manual-capture authorisation lives 7 days and asynchronous payment methods
#: settle within weeks; refunds and payouts can fail or be reversed days later; disputes are
#: decided months after they open; a mandate can be revoked any time while it is used).
DEFAULT_HORIZONS: Final[Mapping[str, timedelta]] = {
    "payment": 30 * DAY,
    "refund": 30 * DAY,
    "dispute": 180 * DAY,
    "payout": 30 * DAY,
    "mandate": 400 * DAY,
}
#: How long after its creation a captured payment (``succeeded``, ``partially_captured``) is
#: followed for a void after capture (``cancelled_post_capture``). Hyperswitch's API takes
#: ``POST /payments/{id}/cancel_post_capture`` on any captured payment, and the connector
#: accepts it until it settles the capture (days, not weeks): a capture made at the end of
#: a manual-capture authorisation's 7 days, and a week for the connector to settle it.
#: The cost is bounded: every captured payment costs at most about 21 fetches over these
#: 14 days (its checks spaced by its age: 8 in its first day, then one a day), inside each
#: run's sweep budget (oldest due first; what is left is reported overdue); a shorter
#: reach (``HOOKLEDGER_SWEEP_HORIZON_DAYS=payment.succeeded=7``) costs less, and the events
#: API (90 days) recovers a lost void of an older one.
CAPTURED_REACH: Final = 14 * DAY
#: Statuses with a shorter reach than their kind's: a payment nobody has paid yet (no
#: payment method attached, not confirmed) is an abandoned checkout after two days; a
#: captured payment can be voided until the connector settles it (``CAPTURED_REACH``).
DEFAULT_STATUS_HORIZONS: Final[Mapping[tuple[str, str], timedelta]] = {
    ("payment", "requires_payment_method"): 2 * DAY,
    ("payment", "requires_confirmation"): 2 * DAY,
    ("payment", "succeeded"): CAPTURED_REACH,
    ("payment", "partially_captured"): CAPTURED_REACH,
}
DEFAULT_MAX_INTERVALS: Final[Mapping[str, timedelta]] = {
    "payment": DAY,
    "refund": DAY,
    "dispute": DAY,
    "payout": DAY,
    "mandate": 7 * DAY,
}
#: The kinds the sweep follows, in the order a run sweeps them.
SWEPT_KINDS: Final = ("payment", "refund", "dispute", "payout", "mandate")


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepPolicy:
    """How long objects are followed and how often they are checked (pure)."""

    horizons: Mapping[str, timedelta] = field(default_factory=lambda: dict(DEFAULT_HORIZONS))
    status_horizons: Mapping[tuple[str, str], timedelta] = field(
        default_factory=lambda: dict(DEFAULT_STATUS_HORIZONS)
    )
    min_interval: timedelta = timedelta(minutes=10)
    max_intervals: Mapping[str, timedelta] = field(
        default_factory=lambda: dict(DEFAULT_MAX_INTERVALS)
    )

    def __post_init__(self) -> None:
        for name, value in [*self.horizons.items(), *self.max_intervals.items()]:
            if value <= timedelta(0):
                raise ValueError(f"the sweep's {name} setting must be positive")
        if self.min_interval <= timedelta(0):
            raise ValueError("the sweep's minimum interval must be positive")

    def horizon(self, kind: str, status: str | None = None) -> timedelta:
        kind_horizon = self.horizons.get(kind, DEFAULT_HORIZONS.get(kind, 30 * DAY))
        if status is not None and (kind, status) in self.status_horizons:
            return min(kind_horizon, self.status_horizons[(kind, status)])
        return kind_horizon

    def interval(self, kind: str, age: timedelta) -> timedelta:
        """The wait before the next check of an object ``age`` old."""
        ceiling = self.max_intervals.get(kind, DAY)
        return max(self.min_interval, min(ceiling, age))

    def next_check(self, kind: str, born: datetime | None, now: datetime) -> datetime:
        age = now - as_utc(born) if born is not None else timedelta(0)
        return now + self.interval(kind, max(age, timedelta(0)))

    def within_horizon(self, kind: str, status: str, born: datetime | None, now: datetime) -> bool:
        return born is None or as_utc(born) >= now - self.horizon(kind, status)


def unsettled(kind: str, status_column: Any, stage_column: Any) -> Any:
    """A SQL condition: the state in those columns is not settled for ``kind``."""
    model = transitions.lifecycle(kind)
    if model is None:
        return literal(False)
    open_statuses = sorted(model.statuses - model.settled)
    condition = status_column.in_(open_statuses) if open_statuses else literal(False)
    if model.stages:
        reopenable = sorted(
            status
            for status in model.settled
            if not model.is_settled(transitions.State(kind, status, model.stages[0]))
        )
        if reopenable:
            condition = or_(
                condition,
                and_(
                    status_column.in_(reopenable),
                    func.coalesce(stage_column, transitions.DEFAULT_DISPUTE_STAGE)
                    != model.stages[-1],
                ),
            )
    return condition


def remote_state(kind: str, status_column: Any) -> Any:
    """A SQL condition: a follow row's status is a state of ``kind`` the processor showed
    (not ``unknown``: a fetch that failed; nor ``other_profile``: set aside). Such a row is
    followed whatever the projection says: kept until in sync (see
    :meth:`FollowedObjects.keep`), or open at the processor while the projection is
    settled (a ``payment_failed`` projected, the customer's retry ``succeeded``)."""
    model = transitions.lifecycle(kind)
    if model is None:
        return literal(False)
    return status_column.in_(sorted(model.statuses))


@dataclass(slots=True)
class FollowPlan:
    """What one look at some remote objects changes in the sweep's follow list."""

    follow: list[dict[str, Any]] = field(default_factory=list)
    settle: dict[str, list[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.follow or self.settle)


@dataclass(frozen=True, slots=True)
class Due:
    """An object the sweep should fetch now."""

    kind: str
    object_id: str
    due_at: datetime | None


class FollowedObjects:
    """The sweep's storage: which objects to follow and when each is due."""

    def __init__(
        self,
        engine: Engine,
        *,
        policy: SweepPolicy | None = None,
        clock: Clock = utcnow,
        account: str = DEFAULT_ACCOUNT,
    ) -> None:
        self.engine = engine
        #: The processor account whose projections the sweep follows.
        self.account = account
        self.reader = deferred_begin(engine)
        self.policy = policy or SweepPolicy()
        self.clock = clock
        self._pg = engine.dialect.name == "postgresql"

    def __repr__(self) -> str:
        return f"FollowedObjects(dialect={self.engine.dialect.name!r}, account={self.account!r})"

    def now(self) -> datetime:
        return as_utc(self.clock())

    def observed(self, remotes: Iterable[Remote], *, now: datetime | None = None) -> int:
        """Record what the reconciler just saw of ``remotes`` (see :meth:`plan`), in a
        transaction of its own; returns how many are followed."""
        plan = self.plan(remotes, now=now)
        if plan:
            with self.engine.begin() as conn:
                self.write(conn, plan)
        return len(plan.follow)

    def plan(self, remotes: Iterable[Remote], *, now: datetime | None = None) -> FollowPlan:
        """What seeing ``remotes`` changes: an unsettled one is followed (its next check
        spaced by its age), a settled one (or one past its horizon) no longer."""
        now = now or self.now()
        plan = FollowPlan()
        for remote in remotes:
            state = remote.state
            if state is None or transitions.lifecycle(remote.kind) is None:
                continue
            if transitions.is_settled(state):
                plan.settle.setdefault(remote.kind, []).append(remote.object_id)
                continue
            created = remote.created
            if not self.policy.within_horizon(remote.kind, state.status, created, now):
                plan.settle.setdefault(remote.kind, []).append(remote.object_id)
                continue
            plan.follow.append(
                {
                    "kind": remote.kind,
                    "object_id": remote.object_id,
                    "created_at": created,
                    "first_seen_at": now,
                    "status": state.status,
                    "stage": state.stage,
                    "last_checked_at": now,
                    "next_check_at": self.policy.next_check(remote.kind, created, now),
                    "checks": 1,
                }
            )
        return plan

    def keep(self, remotes: Sequence[Remote], *, now: datetime | None = None) -> None:
        """Follow ``remotes`` until a later look finds them in sync, however settled their
        remote state: the run found them out of step (a recovery inserted, or queued behind
        events that may leave the projection short; a projection reached by a dead-lettered
        event). Each is due again at the next run (see :meth:`due`), which judges it afresh:
        in sync, it is no longer followed (unless its remote state is open)."""
        now = now or self.now()
        rows = [
            {
                "account": self.account,
                "kind": remote.kind,
                "object_id": remote.object_id,
                "created_at": remote.created,
                "first_seen_at": now,
                "status": remote.state.status,
                "stage": remote.state.stage,
                "last_checked_at": now,
                "next_check_at": now,
                "checks": 1,
            }
            for remote in remotes
            if remote.state is not None and transitions.lifecycle(remote.kind) is not None
        ]
        if not rows:
            return
        insert = (postgresql.insert if self._pg else sqlite.insert)(F)
        with self.engine.begin() as conn:
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=["account", "kind", "object_id"],
                    set_={
                        "created_at": func.coalesce(insert.excluded.created_at, F.c.created_at),
                        "status": insert.excluded.status,
                        "stage": insert.excluded.stage,
                        "last_checked_at": insert.excluded.last_checked_at,
                        "next_check_at": insert.excluded.next_check_at,
                        "checks": F.c.checks + 1,
                    },
                ),
                rows,
            )

    def write(self, conn: Connection, plan: FollowPlan) -> None:
        """Write ``plan`` on ``conn`` (inside the caller's transaction)."""
        if plan.follow:
            insert = (postgresql.insert if self._pg else sqlite.insert)(F)
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=["account", "kind", "object_id"],
                    set_={
                        "created_at": func.coalesce(insert.excluded.created_at, F.c.created_at),
                        "status": insert.excluded.status,
                        "stage": insert.excluded.stage,
                        "last_checked_at": insert.excluded.last_checked_at,
                        "next_check_at": insert.excluded.next_check_at,
                        "checks": F.c.checks + 1,
                    },
                ),
                [{**row, "account": self.account} for row in plan.follow],
            )
        for kind, ids in plan.settle.items():
            if self._pg:
                # One array parameter: the statement text is the same for every chunk, and
                # a join with it probes the primary key per id (``object_id = ANY(...)``
                # let a plan made while the table had no statistics scan it whole for
                # every chunk: 20 ms a chunk at 20,000 followed objects).
                conn.execute(_SETTLE_PG, {"account": self.account, "kind": kind, "ids": ids})
            else:
                conn.execute(
                    delete(F).where(
                        F.c.account == self.account, F.c.kind == kind, F.c.object_id.in_(ids)
                    )
                )

    def postpone(
        self, kind: str, object_ids: Sequence[str], *, now: datetime | None = None
    ) -> None:
        """Space out the next check of objects whose fetch failed (not found, say), so one
        bad object cannot take the whole budget run after run."""
        self._defer(kind, object_ids, now=now, aside=False)

    def set_aside(
        self, kind: str, object_ids: Sequence[str], *, now: datetime | None = None
    ) -> None:
        """Never fetch again (within their kind's horizon, after which they age out) objects
        a fetch showed to be another business profile's, not this account's (an account's
        projection may hold some, recovered before hookledger told profiles apart)."""
        self._defer(kind, object_ids, now=now, aside=True)

    def _defer(
        self, kind: str, object_ids: Sequence[str], *, now: datetime | None, aside: bool
    ) -> None:
        now = now or self.now()
        if not object_ids:
            return
        born = self.born(kind, object_ids)
        rows = [
            {
                "account": self.account,
                "kind": kind,
                "object_id": object_id,
                "created_at": born.get(object_id),
                "first_seen_at": now,
                "status": "other_profile" if aside else "unknown",
                "stage": None,
                "last_checked_at": now,
                "next_check_at": now + self.policy.horizon(kind)
                if aside
                else self.policy.next_check(kind, born.get(object_id), now),
                "checks": 1,
            }
            for object_id in object_ids
        ]
        insert = (postgresql.insert if self._pg else sqlite.insert)(F)
        with self.engine.begin() as conn:
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=["account", "kind", "object_id"],
                    set_={
                        "status": insert.excluded.status if aside else F.c.status,
                        "last_checked_at": insert.excluded.last_checked_at,
                        "next_check_at": insert.excluded.next_check_at,
                        "checks": F.c.checks + 1,
                    },
                ),
                rows,
            )

    def born(self, kind: str, object_ids: Sequence[str]) -> dict[str, datetime]:
        """Creation times known for ``object_ids`` (projection first, then the follow row)."""
        with self.reader.connect() as conn:
            found = {
                r.object_id: as_utc(r.created)
                for r in conn.execute(
                    select(P.c.object_id, P.c.object_created_at.label("created")).where(
                        P.c.account == self.account,
                        P.c.object_kind == kind,
                        P.c.object_id.in_(list(object_ids)),
                        P.c.object_created_at.is_not(None),
                    )
                )
            }
            for r in conn.execute(
                select(F.c.object_id, F.c.created_at).where(
                    F.c.account == self.account,
                    F.c.kind == kind,
                    F.c.object_id.in_([i for i in object_ids if i not in found]),
                    F.c.created_at.is_not(None),
                )
            ):
                found[r.object_id] = as_utc(r.created_at)
        return found

    def due(
        self,
        kind: str,
        *,
        limit: int,
        now: datetime | None = None,
        checked_before: datetime | None = None,
    ) -> tuple[list[Due], int]:
        """Up to ``limit`` objects of ``kind`` due for a check, oldest-due first, and how
        many are due in all.

        Due: an unsettled projection within the kind's horizon with no follow row or a due
        one, or a follow row (an object listed, fetched or adopted unsettled, or kept until
        it is in sync: see :meth:`keep`) that is due. With ``checked_before`` (the run's
        start), an object already checked since (by this run's lists) is not due again.
        """
        now = now or self.now()
        since = now - self.policy.horizon(kind)
        row_due = F.c.next_check_at <= now
        if checked_before is not None:
            row_due = and_(row_due, F.c.last_checked_at < checked_before)
        from_projection = (
            select(
                P.c.object_id.label("object_id"),
                F.c.next_check_at.label("due_at"),
                P.c.status.label("status"),
                func.coalesce(P.c.object_created_at, F.c.created_at).label("born"),
            )
            .select_from(
                P.outerjoin(
                    F,
                    and_(
                        F.c.account == P.c.account,
                        F.c.kind == P.c.object_kind,
                        F.c.object_id == P.c.object_id,
                    ),
                )
            )
            .where(
                P.c.account == self.account,
                P.c.object_kind == kind,
                or_(
                    unsettled(kind, P.c.status, P.c.stage),
                    # Kept until in sync, or open at the processor, however settled the
                    # projection (see remote_state).
                    remote_state(kind, F.c.status),
                ),
                or_(P.c.object_created_at.is_(None), P.c.object_created_at >= since),
                or_(F.c.next_check_at.is_(None), row_due),
            )
        )
        from_follow = select(
            F.c.object_id.label("object_id"),
            F.c.next_check_at.label("due_at"),
            F.c.status.label("status"),
            F.c.created_at.label("born"),
        ).where(
            F.c.account == self.account,
            F.c.kind == kind,
            row_due,
            func.coalesce(F.c.created_at, F.c.first_seen_at) >= since,
            ~select(P.c.object_id)
            .where(
                P.c.account == self.account, P.c.object_kind == kind, P.c.object_id == F.c.object_id
            )
            .exists(),
        )
        candidates = union_all(from_projection, from_follow).subquery("due")
        young = [
            or_(
                candidates.c.status != status,
                candidates.c.born.is_(None),
                candidates.c.born >= now - self.policy.horizon(kind, status),
            )
            for (of_kind, status) in self.policy.status_horizons
            if of_kind == kind
        ]
        with self.reader.connect() as conn:
            total = int(
                conn.execute(
                    select(func.count()).select_from(candidates).where(*young)
                ).scalar_one()
            )
            rows = conn.execute(
                select(candidates.c.object_id, candidates.c.due_at)
                .where(*young)
                .order_by(candidates.c.due_at.asc().nulls_first(), candidates.c.object_id)
                .limit(limit)
            ).all()
        picked = [
            Due(kind, row.object_id, as_utc(row.due_at) if row.due_at is not None else None)
            for row in rows
        ]
        return picked, total

    def forget_aged(self, kind: str, *, now: datetime | None = None) -> int:
        """Stop following objects past their kind's horizon; returns how many."""
        now = now or self.now()
        since = now - self.policy.horizon(kind)
        with self.engine.begin() as conn:
            result = conn.execute(
                delete(F).where(
                    F.c.account == self.account,
                    F.c.kind == kind,
                    func.coalesce(F.c.created_at, F.c.first_seen_at) < since,
                )
            )
        return int(result.rowcount or 0)


Fetch = Callable[[str, str], dict[str, Any]]
