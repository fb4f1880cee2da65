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
#: Where the open-events index keeps the entries of done events until a vacuum (PostgreSQL),
#: a claim's walk starts at each account's floor, learnt by a full scan at most this long ago
#: and at most :data:`FLOOR_CLAIMS` claims ago (see :meth:`Queue._candidates`).
FLOOR_LIFETIME = timedelta(seconds=1)
FLOOR_CLAIMS = 32
#: A floor is this much below the earliest open event the full scan saw (or its own time):
#: an event written with an earlier time by a transaction that committed after the scan.
FLOOR_MARGIN = timedelta(seconds=1)


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
        #: Each account with open events and where its walk starts, as of the last full
        #: scan (at ``_floors_at``, ``_floor_claims`` claims ago); ``None``: none to use.
        self._floors: dict[str, datetime] | None = None
        self._floors_at = datetime.min
        self._floor_claims = 0
        #: How many of ``_floors``' accounts had open events at that scan (the others had
        #: none: their walks' share is not taken from theirs).
        self._floors_open = 0
        #: Whether the last :meth:`_candidates` came from the floors' walks only.
        self._walked_floors = False

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
            claimed = self._claim_of(conn, candidates, owner, now, expires, limit)
            if not claimed and self._walked_floors:
                # The floors' walks found only events no claim can take now (an object's
                # later event behind its head's retry, others' leases): that is finding
                # nothing, so this claim scans in full (an account's first event, an event
                # below its floor) rather than leave them for the floors' bounds.
                self._floor_claims = FLOOR_CLAIMS  # the floors are spent: scan in full
                candidates = self._candidates(conn, now, scan)
                claimed = self._claim_of(conn, candidates, owner, now, expires, limit)
        return claimed

    def _claim_of(
        self,
        conn: Connection,
        candidates: dict[str, int],
        owner: str,
        now: datetime,
        expires: datetime,
        limit: int,
    ) -> list[Claimed]:
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
        waiting behind it: each batch has room for every account's earliest.

        On PostgreSQL an event that is done leaves its entry in the index over open events
        (a dead row version) until a vacuum, at the index's low end, where every walk in
        due order starts: with autovacuum behind, each claim read the whole done history
        (issue 29, item 6). So a full scan (the accounts' skip scan and their walks from
        the start) also learns each account's floor, where the events a claim can take
        begin (see :meth:`_learn_floors`) less :data:`FLOOR_MARGIN`, and the next claims,
        for up to :data:`FLOOR_LIFETIME` and :data:`FLOOR_CLAIMS`, walk those accounts from
        their floors only (and the accounts an earlier full scan saw, from this one's
        time). A claim that takes nothing that way, or comes after those bounds, scans in
        full: an account that got its first open event, an event committed late with an
        earlier time, or one below the floor that a worker lost or gave back, waits at
        most that long behind the others (order within an object is kept by the heads,
        whatever the walk found). With more accounts with open events than a claim takes turns
        between, every claim scans in full."""
        floors = self._floors_in_use(now)
        self._walked_floors = False
        if floors:
            self._floor_claims += 1
            accounts = list(floors)
            found = self._interleave(
                self._sql.due_of_accounts(
                    conn,
                    self._due(now),
                    now,
                    self._share(scan, self._floors_open),
                    accounts,
                    [floors[a] for a in accounts],
                )
            )
            if found:
                self._walked_floors = True
                return found
        # One account more than a claim takes turns between: whether any is left beyond them
        # (exactly that many take no turns, and their claims may walk from the floors).
        accounts = self._sql.accounts_open(conn, self._after, ACCOUNTS_PER_CLAIM + 1)
        more = len(accounts) > ACCOUNTS_PER_CLAIM
        del accounts[ACCOUNTS_PER_CLAIM:]
        if not more and self._after:  # from the first account again, for the rest of the turns
            room = ACCOUNTS_PER_CLAIM - len(accounts)
            fresh = [a for a in self._sql.accounts_open(conn, "", room + 1) if a not in accounts]
            more = len(fresh) > room
            accounts += fresh[:room]
        self._after = accounts[-1] if more else ""
        share = self._share(scan, len(accounts))
        per_account = self._sql.due_of_accounts(conn, self._due(now), now, share, accounts)
        self._learn_floors(conn, now, accounts, per_account, share, whole=not more)
        return self._interleave(per_account)

    def _floors_in_use(self, now: datetime) -> dict[str, datetime] | None:
        if not self._floors or self._floor_claims >= FLOOR_CLAIMS:
            return None
        if not timedelta(0) <= now - self._floors_at < FLOOR_LIFETIME:
            return None
        return self._floors

    def _learn_floors(
        self,
        conn: Connection,
        now: datetime,
        accounts: list[str],
        walked: list[list[tuple[str, int, datetime | None]]],
        share: int,
        *,
        whole: bool,
    ) -> None:
        """Keep each account's floor from a full scan that saw every account with open
        events (``whole``) where the index keeps done events' entries; else none.

        An account's earliest open event may be one no claim can take for long: in a slow
        handler's hands (leased), or behind its object's head, waiting for a retry (minutes
        or hours). A floor there would have every walk read all done events since. So the
        floor is the first event the walk from the start (``walked``, up to ``share`` each:
        due, not leased) found that is not behind a retry (past every one of them, if the
        walk read its share; the scan's time, if it found fewer). The events below it come
        back only when a worker dies or gives its events back (a lease that expires or is
        released) or when their head is done: then a full scan finds them, within the
        floors' bounds, as an event committed late."""
        seen_before, self._floors = self._floors or {}, None
        if not (whole and accounts and self._sql.open_index_keeps_done):
            return
        waiting = self._behind_retries(conn, now, [w[0] for w in walked if w])
        if waiting:
            waiting |= self._behind_retries(
                conn, now, [c for w in walked if w and w[0][1] in waiting for c in w[1:]]
            )
        floors = {}
        for account, found in zip(accounts, walked, strict=True):
            free = [due_at for _, pk, due_at in found if pk not in waiting]
            past = free[0] if free else found[-1][2] if len(found) >= share else now
            if past is None:
                return
            floors[account] = min(as_utc(past), now) - FLOOR_MARGIN
        # The accounts an earlier scan saw with open events and this one without: their
        # next event is new, due from about its arrival, so their walks start at this scan
        # (an account whose events come one at a time is not left for the floors' bounds,
        # up to a second each, while another account floods the queue).
        self._floors_open = len(floors)
        for account in seen_before:
            if len(floors) >= ACCOUNTS_PER_CLAIM:
                break
            floors.setdefault(account, now - FLOOR_MARGIN)
        floors = dict(sorted(floors.items()))  # in account order, as a full scan takes turns
        self._floors, self._floors_at, self._floor_claims = floors, now, 0

    def _behind_retries(
        self, conn: Connection, now: datetime, found: list[tuple[str, int, datetime | None]]
    ) -> set[int]:
        """Which of the events ``found`` wait behind their object's head, itself waiting for
        a retry (not due before it)."""
        if not found:
            return set()
        heads = self._sql.heads(conn, sorted({key for key, _, _ in found}))
        return {
            pk
            for key, pk, _ in found
            if (head := heads.get(key)) is not None
            and int(head.id) != pk
            and as_utc(head.next_attempt_at) > now
        }

    @staticmethod
    def _share(scan: int, accounts: int) -> int:
        return max(2, -(-scan // max(1, accounts)))

    @staticmethod
    def _interleave(per_account: list[list[tuple[str, int, datetime | None]]]) -> dict[str, int]:
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
