"""The queue: claim due events under leases, renew and release them.

A worker claims an event by taking the lease row of the event's *object* with a conditional
upsert (``ON CONFLICT DO UPDATE ... WHERE expires_at < now``), so two workers never process
events of one object at the same time, on any number of hosts. On PostgreSQL candidates are
read with ``FOR UPDATE SKIP LOCKED`` and each object is first gated with a non-blocking
``pg_try_advisory_xact_lock`` (keyed by the object and this installation's lease table, so
that installations in other schemas of the database are never in the way), so claimers
never queue behind each other; on SQLite every transaction is ``BEGIN IMMEDIATE`` (one
writer at a time), which makes the claim atomic. A crashed worker's leases expire and its
events are claimed again.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, delete, func, or_, select, update

import receiver.core.signals as signals
from receiver.core.clock import as_utc
from receiver.core.retry import RetryPolicy
from receiver.storage.context import Storage
from receiver.storage.sql.tables import EVENT, LEASE, OPEN_SQL
from receiver.storage.tables import EventStatus

log = logging.getLogger("receiver.store")

#: Accounts a claim takes turns between (with more, the next claim serves the next ones).
ACCOUNTS_PER_CLAIM = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class Claimed:
    """An event leased to one worker."""

    pk: int
    account: str
    event_id: str
    object_key: str
    object_kind: str | None
    object_id: str | None
    object_status: str | None
    object_stage: str | None
    event_type: str | None
    event_time: datetime | None
    object_created_at: datetime | None
    body: bytes = field(repr=False)
    source: str
    received_at: datetime
    replay_of: int | None
    attempts: int
    owner: str
    lease_expires_at: datetime


class Queue:
    """Claims, leases, renewals and releases on one :class:`Storage`."""

    def __init__(self, storage: Storage, *, retry: RetryPolicy) -> None:
        self.storage = storage
        self.retry = retry
        self._sql = storage.sql
        #: The last account a claim took turns up to (see :meth:`_candidates`).
        self._after = ""

    def __repr__(self) -> str:
        return f"Queue(dialect={self._sql.name!r})"

    def claim(self, owner: str, lease_seconds: float) -> Claimed | None:
        """Lease the next due event (see :meth:`claim_batch`), or return ``None``."""
        claimed = self.claim_batch(owner, lease_seconds, limit=1)
        return claimed[0] if claimed else None

    def any_due(self) -> bool:
        """Whether some event is due now (a read: on SQLite, without the write lock)."""
        now = self.storage.now()
        with self.storage.deferred.connect() as conn:
            return (
                conn.execute(select(EVENT.c.id).where(self._due(now)).limit(1)).first() is not None
            )

    def _due(self, now: datetime) -> Any:
        return and_(
            OPEN_SQL,
            EVENT.c.next_attempt_at <= now,
            or_(EVENT.c.lease_expires_at.is_(None), EVENT.c.lease_expires_at < now),
        )

    def claim_batch(
        self, owner: str, lease_seconds: float, *, limit: int = 16, scan: int | None = None
    ) -> list[Claimed]:
        """Lease up to ``limit`` due events of distinct objects that no other worker holds.

        Within an object only its head is leased: the earliest open event (event time, then
        arrival), so events of an object run one at a time and in event-time order. The
        whole batch costs a fixed handful of statements, whatever its size:

        1. due candidates (PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so claimers never wait on
           each other's rows), one per object;
        2. the object leases, taken with one conditional upsert (``... WHERE expires_at <
           now``): race-safe on any number of hosts; on PostgreSQL the same statement first
           takes a non-blocking advisory lock per object, so two claimers never queue on the
           same lease row (which could deadlock);
        3. each leased object's head event; a head that is another row than the candidate
           (an earlier event that arrived later) is locked without waiting;
        4. one update marks the heads ``processing``; leases of objects whose head is not
           due (waiting for a retry) are given back.
        """
        # Candidates: twice the batch at least, since several may belong to one object.
        scan = max(scan or 64, 2 * limit)
        now = self.storage.now()
        expires = now + timedelta(seconds=lease_seconds)
        with self.storage.engine.begin() as conn:
            candidates = self._candidates(conn, now, scan)
            keys = list(candidates)[: limit * 2]
            if not keys:
                return []
            leased = self._take_object_leases(conn, keys, owner, now, expires)
            if not leased:
                return []
            heads = self._heads(conn, leased, candidates, now)
            claimed = self._mark_claimed(conn, heads[:limit], owner, expires)
            returned = set(leased) - {c.object_key for c in claimed}
            if returned:
                self._sql.give_back_leases(conn, sorted(returned), owner)
        return claimed

    def _candidates(self, conn: Connection, now: datetime, scan: int) -> dict[str, int]:
        """Due candidates, one per object, taking turns between accounts: the accounts with
        open events (up to :data:`ACCOUNTS_PER_CLAIM`, after those the previous claim
        served: with more accounts, each claim moves on), each with its share of ``scan``
        in due order, interleaved. A flood in one account cannot keep another's events
        waiting behind it: each batch has room for every account's earliest."""
        accounts = self._sql.accounts_open(conn, self._after, ACCOUNTS_PER_CLAIM)
        if len(accounts) < ACCOUNTS_PER_CLAIM and self._after:
            accounts += [
                a
                for a in self._sql.accounts_open(conn, "", ACCOUNTS_PER_CLAIM - len(accounts))
                if a not in accounts
            ]
        self._after = accounts[-1] if len(accounts) == ACCOUNTS_PER_CLAIM else ""
        share = max(2, -(-scan // max(1, len(accounts))))
        per_account = self._sql.due_of_accounts(conn, self._due(now), now, share, accounts)
        candidates: dict[str, int] = {}
        for turn in itertools.zip_longest(*per_account):
            for found in turn:
                if found is not None:
                    candidates.setdefault(found[0], found[1])
        return candidates

    def claim_object(self, owner: str, object_key: str, lease_seconds: float) -> Claimed | None:
        """Lease the head event of one object, if it is due and no other worker holds the
        object (for processing one object inline,
        :meth:`receiver.worker.runner.Worker.process_object`).
        """
        now = self.storage.now()
        expires = now + timedelta(seconds=lease_seconds)
        with self.storage.engine.begin() as conn:
            head = self._sql.heads(conn, [object_key]).get(object_key)
            if head is None or as_utc(head.next_attempt_at) > now:
                return None
            leased = self._take_object_leases(conn, [object_key], owner, now, expires)
            if not leased:
                return None
            claimed = self._mark_claimed(
                conn, self._heads(conn, leased, {object_key: int(head.id)}, now), owner, expires
            )
            if not claimed:
                conn.execute(
                    delete(LEASE).where(LEASE.c.object_key == object_key, LEASE.c.owner == owner)
                )
                return None
            return claimed[0]

    def status_of(self, pk: int) -> str | None:
        """The status of the inbox row ``pk`` (``None`` if there is none)."""
        with self.storage.deferred.connect() as conn:
            return conn.execute(select(EVENT.c.status).where(EVENT.c.id == pk)).scalar()

    def renew(self, claimed: Sequence[Claimed], lease_seconds: float) -> int:
        """Extend the leases of ``claimed``; returns how many object leases are not another
        worker's: still held (and extended), or freed meanwhile (the event was finished: a
        renewal that waited for SQLite's write lock runs after the dispatch committed)."""
        if not claimed:
            return 0
        owner = claimed[0].owner
        keys = [c.object_key for c in claimed]
        expires = self.storage.now() + timedelta(seconds=lease_seconds)
        with self.storage.engine.begin() as conn:
            others = conn.execute(
                select(func.count())
                .select_from(LEASE)
                .where(self._sql.among(LEASE.c.object_key, keys), LEASE.c.owner != owner)
            ).scalar_one()
            conn.execute(
                update(LEASE)
                .where(self._sql.among(LEASE.c.object_key, keys), LEASE.c.owner == owner)
                .values(expires_at=expires)
            )
            conn.execute(
                update(EVENT)
                .where(
                    self._sql.among(EVENT.c.id, [c.pk for c in claimed]),
                    EVENT.c.lease_owner == owner,
                )
                .values(lease_expires_at=expires)
            )
        return len(set(keys)) - int(others)

    def release(self, claimed: Claimed) -> None:
        """Give an event back untouched (graceful shutdown before it started)."""
        with self.storage.engine.begin() as conn:
            conn.execute(
                update(EVENT)
                .where(EVENT.c.id == claimed.pk, EVENT.c.lease_owner == claimed.owner)
                .values(
                    status=EventStatus.PENDING,
                    lease_owner=None,
                    lease_expires_at=None,
                    attempts=EVENT.c.attempts - 1,
                )
            )
            conn.execute(
                delete(LEASE).where(
                    LEASE.c.object_key == claimed.object_key, LEASE.c.owner == claimed.owner
                )
            )

    # -- the steps of a claim -------------------------------------------------------------

    def _take_object_leases(
        self, conn: Connection, keys: list[str], owner: str, now: datetime, expires: datetime
    ) -> list[str]:
        """The objects of ``keys`` now leased to ``owner``, in ``keys`` order."""
        taken = self._sql.take_object_leases(conn, keys, owner, now, expires)
        return [k for k in keys if k in taken]

    def _heads(
        self, conn: Connection, keys: list[str], candidates: dict[str, int], now: datetime
    ) -> list[Any]:
        """The claimable head event of each of ``keys`` (in ``keys`` order)."""
        rows = self._sql.heads(conn, keys)
        # A head that is not a due candidate of ours waits (its retry is not due) or, on
        # PostgreSQL, may be locked by another claimer: lock it without waiting.
        others = [
            int(r.id)
            for k, r in rows.items()
            if int(r.id) != candidates[k] and r.next_attempt_at <= now
        ]
        free = self._sql.lock_free(conn, others)
        heads = []
        for key in keys:
            head = rows.get(key)
            if head is None or head.next_attempt_at > now:
                continue  # an earlier event of this object is waiting for its retry
            if int(head.id) != candidates[key] and int(head.id) not in free:
                continue
            if head.status == EventStatus.PROCESSING and head.attempts >= self.retry.max_attempts:
                self._dead_letter_lost(conn, head)
                continue
            heads.append(head)
        return heads

    def _dead_letter_lost(self, conn: Connection, head: Any) -> None:
        """A head whose worker died holding it on every attempt: a poison event."""
        conn.execute(
            update(EVENT)
            .where(EVENT.c.id == head.id)
            .values(
                status=EventStatus.DEAD,
                lease_owner=None,
                lease_expires_at=None,
                last_error=(head.last_error or "")
                + f"\nlease expired after {head.attempts} attempts (worker lost)",
            )
        )
        log.error(
            "event dead-lettered: its worker was lost on every attempt",
            extra={
                "action": "dead_letter",
                "event_id": head.event_id,
                "event_type": head.event_type,
            },
        )
        signals.send(
            signals.event_dead_lettered,
            event_id=head.event_id,
            event_type=head.event_type,
            account=head.account,
            source=head.source,
            object_key=head.object_key,
            reason="worker lost on every attempt",
            attempts=int(head.attempts),
        )

    def _mark_claimed(
        self, conn: Connection, heads: list[Any], owner: str, expires: datetime
    ) -> list[Claimed]:
        if not heads:
            return []
        conn.execute(
            update(EVENT)
            .where(self._sql.among(EVENT.c.id, [int(h.id) for h in heads]))
            .values(
                status=EventStatus.PROCESSING,
                lease_owner=owner,
                lease_expires_at=expires,
                attempts=EVENT.c.attempts + 1,
            )
        )
        return [
            Claimed(
                pk=int(h.id),
                account=h.account,
                event_id=h.event_id,
                object_key=h.object_key,
                object_kind=h.object_kind,
                object_id=h.object_id,
                object_status=h.object_status,
                object_stage=h.object_stage,
                event_type=h.event_type,
                event_time=h.event_time,
                object_created_at=h.object_created_at,
                body=h.body,
                source=h.source,
                received_at=h.received_at,
                replay_of=h.replay_of,
                attempts=int(h.attempts) + 1,
                owner=owner,
                lease_expires_at=expires,
            )
            for h in heads
        ]
