"""The durable inbox: insert-or-ignore, leases, the staleness guard, the handler ledger.

Every operation is one short transaction. Correctness never depends on a check followed by
a separate write:

- dedupe is the unique constraint on ``event_id`` with ``INSERT ... ON CONFLICT DO NOTHING``;
- a worker claims an event by taking the lease row of the event's *object* with a conditional
  upsert (``ON CONFLICT DO UPDATE ... WHERE expires_at < now``), so two workers never process
  events of one object at the same time, on any number of hosts; on PostgreSQL candidates are
  read with ``FOR UPDATE SKIP LOCKED`` and each object is first gated with a non-blocking
  ``pg_try_advisory_xact_lock`` so claimers never queue behind each other; on SQLite every
  transaction is ``BEGIN IMMEDIATE`` (one writer at a time), which makes the claim atomic;
- a crashed worker's leases expire and its events are claimed again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import (
    Connection,
    Engine,
    Insert,
    Table,
    and_,
    delete,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session

from receiver import status as statuses
from receiver.clock import Clock, as_utc, utcnow
from receiver.errors import StorageUnavailable
from receiver.events import Event
from receiver.models import (
    EventConflict,
    EventStatus,
    HandlerRun,
    InboxEvent,
    ObjectLease,
    Projection,
    Source,
    Transition,
)

log = logging.getLogger("receiver.store")

E: Table = InboxEvent.__table__  # type: ignore[attr-defined]
C: Table = EventConflict.__table__  # type: ignore[attr-defined]
H: Table = HandlerRun.__table__  # type: ignore[attr-defined]
P: Table = Projection.__table__  # type: ignore[attr-defined]
T: Table = Transition.__table__  # type: ignore[attr-defined]
L: Table = ObjectLease.__table__  # type: ignore[attr-defined]

#: Headers never written to the inbox (they may carry credentials).
REDACTED_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization", "api-key"})

InsertResult = Literal["inserted", "duplicate", "conflict"]
Decision = Literal["dispatch", "stale", "duplicate"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Inserted:
    """What :meth:`Store.insert` did with a delivery."""

    result: InsertResult
    pk: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Claimed:
    """An event leased to one worker."""

    pk: int
    event_id: str
    object_key: str
    object_kind: str | None
    object_id: str | None
    object_status: str | None
    event_type: str | None
    event_time: datetime | None
    object_created_at: datetime | None
    body: bytes = field(repr=False)
    source: str
    replay_of: int | None
    attempts: int
    owner: str
    lease_expires_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What :meth:`Store.dispatch` did: the status written (or ``lease_lost``)."""

    status: str
    ran: tuple[str, ...]
    failures: tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Per-event retry schedule: exponential backoff with jitter, then dead-letter."""

    max_attempts: int = 8
    base_seconds: float = 2.0
    max_seconds: float = 3600.0

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """Delay before attempt ``attempts + 1``: ``base * 2**(attempts-1)``, capped, with
        "equal jitter" (between half and all of it) so retries of many events spread out."""
        ceiling = min(self.max_seconds, self.base_seconds * (2.0 ** max(attempts - 1, 0)))
        jitter: float = (rng or random.Random()).uniform(0.0, ceiling / 2)
        return ceiling / 2 + jitter


@dataclass(frozen=True, kw_only=True, slots=True)
class EventFilter:
    """Selects stored events for the operator commands (requeue, replay, list)."""

    pks: Sequence[int] = ()
    event_ids: Sequence[str] = ()
    event_types: Sequence[str] = ()
    statuses: Sequence[str] = ()
    since: datetime | None = None
    until: datetime | None = None
    limit: int | None = None


def body_sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def clean_headers(headers: Iterable[tuple[str, str]]) -> str:
    kept = {k: v for k, v in headers if k.lower() not in REDACTED_HEADERS}
    return json.dumps(kept, ensure_ascii=False, sort_keys=True)


class Store:
    """The inbox and its ledgers on one SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Clock = utcnow,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.retry = retry or RetryPolicy()
        self._rng = rng or random.Random()
        self._pg = engine.dialect.name == "postgresql"

    def __repr__(self) -> str:
        return f"Store(dialect={self.engine.dialect.name!r})"

    # -- helpers --------------------------------------------------------------------------

    def _insert(self, table: Table) -> Any:
        return (postgresql.insert if self._pg else sqlite.insert)(table)

    def now(self) -> datetime:
        return as_utc(self.clock())

    # -- receive --------------------------------------------------------------------------

    def insert(
        self,
        event: Event,
        body: bytes,
        *,
        headers: Iterable[tuple[str, str]] = (),
        secret_id: str | None = None,
        source: str = Source.WEBHOOK,
        replay_of: int | None = None,
    ) -> Inserted:
        """Store a delivery durably; return after commit.

        A new ``event_id`` is inserted; the same ``event_id`` with the same body is a
        duplicate; with a different body it is kept in the conflicts table and flagged.
        Raises :class:`StorageUnavailable` when the database cannot be reached.
        """
        if source not in Source.ALL:
            raise ValueError(f"unknown source {source!r}")
        now = self.now()
        digest = body_sha256(body)
        header_json = clean_headers(headers)
        ref = event.object_ref
        event_time = as_utc(event.timestamp) if event.timestamp else now
        created = event.object.created_time if event.object is not None else None
        if ref is not None and ref.object_id:
            kind: str | None = ref.kind
            object_id: str | None = ref.object_id
            object_key = f"{ref.kind}:{ref.object_id}"
            object_status = ref.status
        else:
            kind = object_id = object_status = None
            object_key = f"event:{event.event_id}"
        values = dict(
            event_id=event.event_id,
            source=source,
            merchant_id=_clip(event.merchant_id, 255),
            event_type=_clip(event.event_type, 64),
            content_type=_clip(event.content_type, 64),
            object_kind=kind,
            object_id=_clip(object_id, 255),
            object_status=_clip(object_status, 64),
            object_key=object_key[:300],
            event_time=event_time,
            object_created_at=created,
            received_at=now,
            body=body,
            headers=header_json,
            body_sha256=digest,
            secret_id=secret_id,
            replay_of=replay_of,
            status=EventStatus.PENDING,
            attempts=0,
            next_attempt_at=now,
        )
        stmt: Insert = (
            self._insert(E)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["event_id"])
            .returning(E.c.id)
        )
        try:
            with self.engine.begin() as conn:
                pk = conn.execute(stmt).scalar()
                if pk is not None:
                    return Inserted(result="inserted", pk=int(pk))
                row = conn.execute(
                    select(E.c.id, E.c.body_sha256).where(E.c.event_id == event.event_id)
                ).one()
                if row.body_sha256 == digest:
                    return Inserted(result="duplicate", pk=int(row.id))
                conn.execute(
                    self._insert(C)
                    .values(
                        event_id=event.event_id,
                        source=source,
                        body=body,
                        headers=header_json,
                        body_sha256=digest,
                        secret_id=secret_id,
                        received_at=now,
                    )
                    .on_conflict_do_nothing(index_elements=["event_id", "body_sha256"])
                )
                log.warning(
                    "event_id delivered again with a different body",
                    extra={"action": "conflict", "event_id": event.event_id},
                )
                return Inserted(result="conflict", pk=int(row.id))
        except DBAPIError as exc:
            if not _is_unavailable(exc):
                raise
            raise StorageUnavailable() from exc

    # -- claim and lease ------------------------------------------------------------------

    def claim(self, owner: str, lease_seconds: float) -> Claimed | None:
        """Lease the next due event (see :meth:`claim_batch`), or return ``None``."""
        claimed = self.claim_batch(owner, lease_seconds, limit=1)
        return claimed[0] if claimed else None

    def claim_batch(
        self, owner: str, lease_seconds: float, *, limit: int = 8, scan: int = 64
    ) -> list[Claimed]:
        """Lease up to ``limit`` due events of distinct objects that no other worker holds.

        Within an object only its head is leased: the earliest open event (event time, then
        arrival), so events of an object run one at a time and in event-time order. On
        PostgreSQL candidates are locked ``FOR UPDATE SKIP LOCKED`` and only a locked
        candidate that is its object's head is updated, so claimers never wait on each other.
        """
        now = self.now()
        expires = now + timedelta(seconds=lease_seconds)
        due = and_(
            E.c.status.in_(EventStatus.OPEN),
            E.c.next_attempt_at <= now,
            or_(E.c.lease_expires_at.is_(None), E.c.lease_expires_at < now),
        )
        query = (
            select(E.c.id, E.c.object_key)
            .where(due)
            .order_by(E.c.next_attempt_at, E.c.id)
            .limit(scan)
        )
        if self._pg:
            query = query.with_for_update(skip_locked=True)
        claimed: list[Claimed] = []
        with self.engine.begin() as conn:
            seen: set[str] = set()
            for candidate in conn.execute(query).all():
                key = candidate.object_key
                if key in seen:
                    continue
                seen.add(key)
                if (
                    self._pg
                    and not conn.execute(
                        text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _lock_id(key)}
                    ).scalar()
                ):
                    continue
                if not self._take_object_lease(conn, key, owner, now, expires):
                    continue
                one = self._claim_head(conn, int(candidate.id), key, owner, now, expires)
                if one is None:
                    conn.execute(delete(L).where(L.c.object_key == key, L.c.owner == owner))
                    continue
                claimed.append(one)
                if len(claimed) >= limit:
                    break
        return claimed

    def _take_object_lease(
        self, conn: Connection, key: str, owner: str, now: datetime, expires: datetime
    ) -> bool:
        stmt = self._insert(L).values(object_key=key, owner=owner, expires_at=expires)
        stmt = stmt.on_conflict_do_update(
            index_elements=["object_key"],
            set_={"owner": owner, "expires_at": expires},
            where=L.c.expires_at < now,
        ).returning(L.c.object_key)
        return conn.execute(stmt).first() is not None

    def _claim_head(
        self,
        conn: Connection,
        candidate: int,
        key: str,
        owner: str,
        now: datetime,
        expires: datetime,
    ) -> Claimed | None:
        head = conn.execute(
            select(E)
            .where(E.c.object_key == key, E.c.status.in_(EventStatus.OPEN))
            .order_by(E.c.event_time, E.c.id)
            .limit(1)
        ).first()
        if head is None or head.next_attempt_at > now:
            return None  # an earlier event of this object is waiting for its retry
        if int(head.id) != candidate and self._pg:
            # The head is another row (an earlier event that arrived later): lock it without
            # waiting, so claimers never block on each other's rows.
            locked = conn.execute(
                select(E.c.id).where(E.c.id == head.id).with_for_update(skip_locked=True)
            ).first()
            if locked is None:
                return None
        if head.status == EventStatus.PROCESSING and head.attempts >= self.retry.max_attempts:
            # Its worker died holding it max_attempts times: a poison event.
            conn.execute(
                update(E)
                .where(E.c.id == head.id)
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
                extra={"action": "dead_letter", "event_id": head.event_id},
            )
            return None
        conn.execute(
            update(E)
            .where(E.c.id == head.id)
            .values(
                status=EventStatus.PROCESSING,
                lease_owner=owner,
                lease_expires_at=expires,
                attempts=E.c.attempts + 1,
            )
        )
        return Claimed(
            pk=int(head.id),
            event_id=head.event_id,
            object_key=key,
            object_kind=head.object_kind,
            object_id=head.object_id,
            object_status=head.object_status,
            event_type=head.event_type,
            event_time=head.event_time,
            object_created_at=head.object_created_at,
            body=head.body,
            source=head.source,
            replay_of=head.replay_of,
            attempts=int(head.attempts) + 1,
            owner=owner,
            lease_expires_at=expires,
        )

    def renew(self, claimed: Sequence[Claimed], lease_seconds: float) -> int:
        """Extend the leases of ``claimed``; returns how many object leases are still held."""
        if not claimed:
            return 0
        owner = claimed[0].owner
        expires = self.now() + timedelta(seconds=lease_seconds)
        with self.engine.begin() as conn:
            rows = conn.execute(
                update(L)
                .where(L.c.object_key.in_([c.object_key for c in claimed]), L.c.owner == owner)
                .values(expires_at=expires)
            ).rowcount
            conn.execute(
                update(E)
                .where(E.c.id.in_([c.pk for c in claimed]), E.c.lease_owner == owner)
                .values(lease_expires_at=expires)
            )
        return int(rows)

    def release(self, claimed: Claimed) -> None:
        """Give an event back untouched (graceful shutdown before it started)."""
        with self.engine.begin() as conn:
            conn.execute(
                update(E)
                .where(E.c.id == claimed.pk, E.c.lease_owner == claimed.owner)
                .values(
                    status=EventStatus.PENDING,
                    lease_owner=None,
                    lease_expires_at=None,
                    attempts=E.c.attempts - 1,
                )
            )
            conn.execute(
                delete(L).where(L.c.object_key == claimed.object_key, L.c.owner == claimed.owner)
            )

    # -- dispatch: guard, handlers, ledger and outcome in one transaction ------------------

    def dispatch(
        self,
        claimed: Claimed,
        handlers: Sequence[tuple[str, Callable[[Session], None]]],
    ) -> Outcome:
        """Process a claimed event in ONE transaction.

        The staleness guard and the transition-once rule decide first; then each handler that
        has not yet succeeded runs inside a savepoint, and its ledger row is written in the
        same transaction; finally the event's status. A handler that writes through the
        session commits exactly once with its ledger row. If the lease was lost meanwhile
        (another worker took over after expiry), everything is rolled back.
        """
        failures: list[str] = []
        ran: list[str] = []
        with Session(self.engine) as session:
            with session.begin():
                conn = session.connection()
                decision, reason = self._decide(conn, claimed)
                if decision == "dispatch":
                    done = self._succeeded(conn, claimed.pk)
                    for name, call in handlers:
                        if name in done:
                            continue
                        savepoint = session.begin_nested()
                        try:
                            call(session)
                            session.flush()
                        except Exception as exc:  # noqa: BLE001 - a handler may raise anything
                            savepoint.rollback()
                            trace = _describe(exc)
                            conn.execute(self._ledger_upsert(claimed.pk, name, "failed", trace))
                            failures.append(f"{name}: {type(exc).__name__}: {exc}")
                        else:
                            savepoint.commit()
                            conn.execute(self._ledger_upsert(claimed.pk, name, "succeeded", None))
                            ran.append(name)
                    status = "failed" if failures else EventStatus.DONE
                    error: str | None = "\n".join(failures) or None
                else:
                    status, error = decision, reason
                written = self._finish(conn, claimed, status, error)
                if written is None:
                    session.rollback()
                    return Outcome(status="lease_lost", ran=(), failures=tuple(failures))
        return Outcome(status=written, ran=tuple(ran), failures=tuple(failures))

    def _decide(self, conn: Connection, claimed: Claimed) -> tuple[Decision, str | None]:
        kind, object_id, event_type = claimed.object_kind, claimed.object_id, claimed.event_type
        if claimed.replay_of is not None or kind is None or object_id is None:
            return "dispatch", None
        incoming = statuses.normalize_status(kind, claimed.object_status)
        incoming_rank = statuses.rank(kind, incoming)
        now = self.now()
        if event_type:
            owner_pk = conn.execute(
                select(T.c.event_pk).where(
                    T.c.object_kind == kind,
                    T.c.object_id == object_id,
                    T.c.event_type == event_type,
                )
            ).scalar()
            if owner_pk is not None:
                if int(owner_pk) == claimed.pk:
                    return "dispatch", None  # a retry of the event that owns it
                return "duplicate", f"transition {event_type} already dispatched by #{owner_pk}"
        current = conn.execute(
            select(P).where(P.c.object_kind == kind, P.c.object_id == object_id)
        ).first()
        if current is not None and incoming_rank is not None and incoming is not None:
            reason = _stale_reason(current, incoming, incoming_rank, claimed.event_time)
            if reason is not None:
                return "stale", reason
        if event_type:
            conn.execute(
                self._insert(T)
                .values(
                    object_kind=kind,
                    object_id=object_id,
                    event_type=event_type,
                    event_pk=claimed.pk,
                    created_at=now,
                )
                .on_conflict_do_nothing()
            )
        if incoming_rank is not None and incoming is not None:
            values = dict(
                status=incoming,
                rank=incoming_rank,
                event_time=claimed.event_time,
                object_created_at=claimed.object_created_at,
                event_pk=claimed.pk,
                updated_at=now,
            )
            conn.execute(
                self._insert(P)
                .values(object_kind=kind, object_id=object_id, **values)
                .on_conflict_do_update(index_elements=["object_kind", "object_id"], set_=values)
            )
        return "dispatch", None

    def _succeeded(self, conn: Connection, event_pk: int) -> set[str]:
        rows = conn.execute(
            select(H.c.handler).where(H.c.event_pk == event_pk, H.c.status == "succeeded")
        )
        return {r.handler for r in rows}

    def _ledger_upsert(self, event_pk: int, handler: str, status: str, error: str | None) -> Any:
        now = self.now()
        stmt = self._insert(H).values(
            event_pk=event_pk,
            handler=handler,
            status=status,
            attempts=1,
            last_error=error,
            updated_at=now,
        )
        return stmt.on_conflict_do_update(
            index_elements=["event_pk", "handler"],
            set_={
                "status": status,
                "attempts": H.c.attempts + 1,
                "last_error": error,
                "updated_at": now,
            },
        )

    def _finish(
        self, conn: Connection, claimed: Claimed, status: str, error: str | None
    ) -> str | None:
        """Write the event's outcome; ``None`` when the lease was lost (nothing written)."""
        now = self.now()
        values: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}
        if status == "failed":
            if claimed.attempts >= self.retry.max_attempts:
                status = EventStatus.DEAD
                log.error(
                    "event dead-lettered after %d attempts",
                    claimed.attempts,
                    extra={"action": "dead_letter", "event_id": claimed.event_id},
                )
            else:
                status = EventStatus.PENDING
                delay = self.retry.delay(claimed.attempts, self._rng)
                values["next_attempt_at"] = now + timedelta(seconds=delay)
        if status in EventStatus.TERMINAL and status != EventStatus.DEAD:
            values["processed_at"] = now
        values["status"] = status
        values["last_error"] = error
        rows = conn.execute(
            update(E).where(E.c.id == claimed.pk, E.c.lease_owner == claimed.owner).values(**values)
        ).rowcount
        conn.execute(
            delete(L).where(L.c.object_key == claimed.object_key, L.c.owner == claimed.owner)
        )
        if not rows:
            log.warning(
                "lease lost before the event was finished; its work is rolled back",
                extra={"action": "lease_lost", "event_id": claimed.event_id},
            )
            return None
        return status

    def finish(self, claimed: Claimed, *, status: str, error: str | None = None) -> str | None:
        """Close a claimed event outside :meth:`dispatch` (an unparseable body, for example)."""
        with self.engine.begin() as conn:
            return self._finish(conn, claimed, status, error)

    # -- operator -------------------------------------------------------------------------

    def select_events(self, flt: EventFilter) -> list[InboxEvent]:
        query = select(InboxEvent).order_by(InboxEvent.id)  # type: ignore[arg-type]
        query = query.where(*_filter_clauses(flt))
        if flt.limit:
            query = query.limit(flt.limit)
        with Session(self.engine) as session:
            return list(session.scalars(query))

    def requeue(self, flt: EventFilter, *, dry_run: bool = False) -> list[InboxEvent]:
        """Put dead (or, when asked, pending) events back in the queue with fresh attempts.

        Handlers that already succeeded for an event are not run again (the ledger is kept).
        """
        requeueable = (EventStatus.DEAD, EventStatus.PENDING)
        wanted = tuple(flt.statuses) or (EventStatus.DEAD,)
        if not set(wanted) <= set(requeueable):
            raise ValueError("only dead or pending events can be requeued")
        chosen = self.select_events(
            EventFilter(
                pks=flt.pks,
                event_ids=flt.event_ids,
                event_types=flt.event_types,
                statuses=wanted,
                since=flt.since,
                until=flt.until,
                limit=flt.limit,
            )
        )
        if dry_run or not chosen:
            return chosen
        now = self.now()
        with self.engine.begin() as conn:
            conn.execute(
                update(E)
                .where(E.c.id.in_([e.id for e in chosen]), E.c.status.in_(wanted))
                .values(
                    status=EventStatus.PENDING,
                    attempts=0,
                    next_attempt_at=now,
                    lease_owner=None,
                    lease_expires_at=None,
                )
            )
        return chosen

    def replay(
        self, flt: EventFilter, *, dry_run: bool = False, parse: Callable[[bytes], Event]
    ) -> list[tuple[InboxEvent, str]]:
        """Store a copy of each chosen event with source ``replay``: every handler runs again
        for it, bypassing the staleness guard and the transition-once rule (the operator asked).
        Returns (original, new event id) pairs."""
        chosen = self.select_events(flt)
        out: list[tuple[InboxEvent, str]] = []
        for original in chosen:
            assert original.id is not None
            with self.engine.connect() as conn:
                n = conn.execute(
                    select(func.count()).select_from(E).where(E.c.replay_of == original.id)
                ).scalar_one()
            new_id = f"{original.event_id}~replay{int(n) + 1}"
            out.append((original, new_id))
            if dry_run:
                continue
            event = parse(original.body)
            copy = _with_event_id(event, new_id)
            self.insert(
                copy,
                original.body,
                headers=json.loads(original.headers).items(),
                secret_id=original.secret_id,
                source=Source.REPLAY,
                replay_of=original.id,
            )
        return out

    def prune(
        self, older_than: timedelta, *, include_dead: bool = False, dry_run: bool = False
    ) -> dict[str, int]:
        """Delete finished events (done, stale, duplicate; dead only when asked) received
        before ``now - older_than``, with their ledger rows, and old conflict records.

        Open events are never pruned. The projection and the transition table are kept, so
        the staleness guard and the transition-once rule still hold for pruned history.
        """
        cutoff = self.now() - older_than
        finished = [EventStatus.DONE, EventStatus.STALE, EventStatus.DUPLICATE]
        if include_dead:
            finished.append(EventStatus.DEAD)
        old = and_(E.c.status.in_(finished), E.c.received_at < cutoff)
        with self.engine.begin() as conn:
            events = int(conn.execute(select(func.count()).select_from(E).where(old)).scalar_one())
            conflicts = int(
                conn.execute(
                    select(func.count()).select_from(C).where(C.c.received_at < cutoff)
                ).scalar_one()
            )
            if not dry_run:
                conn.execute(delete(H).where(H.c.event_pk.in_(select(E.c.id).where(old))))
                conn.execute(delete(E).where(old))
                conn.execute(delete(C).where(C.c.received_at < cutoff))
        return {"events": events, "conflicts": conflicts}

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(E.c.status, func.count()).group_by(E.c.status)).all()
        return {row[0]: int(row[1]) for row in rows}

    def get(self, event_id: str) -> InboxEvent | None:
        with Session(self.engine) as session:
            return session.scalars(
                select(InboxEvent).where(InboxEvent.event_id == event_id)  # type: ignore[arg-type]
            ).first()

    def handler_runs(self, event_pk: int) -> dict[str, HandlerRun]:
        with Session(self.engine) as session:
            rows = session.scalars(
                select(HandlerRun).where(HandlerRun.event_pk == event_pk)  # type: ignore[arg-type]
            )
            return {r.handler: r for r in rows}

    def projection(self, kind: str, object_id: str) -> Projection | None:
        with Session(self.engine) as session:
            return session.get(Projection, (kind, object_id))

    def projections(self, kind: str, object_ids: Sequence[str]) -> Mapping[str, Projection]:
        if not object_ids:
            return {}
        with Session(self.engine) as session:
            rows = session.scalars(
                select(Projection).where(
                    Projection.object_kind == kind,  # type: ignore[arg-type]
                    Projection.object_id.in_(object_ids),  # type: ignore[attr-defined]
                )
            )
            return {p.object_id: p for p in rows}

    def oldest_open_age(self) -> float | None:
        """Seconds since the oldest open event arrived (a health signal), or ``None``."""
        with self.engine.connect() as conn:
            oldest = conn.execute(
                select(func.min(E.c.received_at)).where(E.c.status.in_(EventStatus.OPEN))
            ).scalar()
        if oldest is None:
            return None
        return (self.now() - as_utc(oldest)).total_seconds()


def _is_unavailable(exc: DBAPIError) -> bool:
    """Connection-level failures (server down, network cut, disk locked, schema missing)."""
    return isinstance(exc, (OperationalError, InterfaceError)) or exc.connection_invalidated


def _filter_clauses(flt: EventFilter) -> list[Any]:
    clauses: list[Any] = []
    if flt.pks:
        clauses.append(E.c.id.in_(list(flt.pks)))
    if flt.event_ids:
        clauses.append(E.c.event_id.in_(list(flt.event_ids)))
    if flt.event_types:
        clauses.append(E.c.event_type.in_(list(flt.event_types)))
    if flt.statuses:
        clauses.append(E.c.status.in_(list(flt.statuses)))
    if flt.since is not None:
        clauses.append(E.c.received_at >= as_utc(flt.since))
    if flt.until is not None:
        clauses.append(E.c.received_at <= as_utc(flt.until))
    return clauses


def _stale_reason(
    current: Any, incoming: str, incoming_rank: int, event_time: datetime | None
) -> str | None:
    if incoming_rank < current.rank:
        return f"{incoming} would move {current.status} backwards"
    if incoming_rank == current.rank:
        if incoming == current.status:
            return f"already {current.status}"
        if event_time is not None and current.event_time is not None:
            if as_utc(event_time) <= as_utc(current.event_time):
                return f"{incoming} is older than {current.status}"
    return None


def _with_event_id(event: Event, event_id: str) -> Event:
    from dataclasses import replace

    return replace(event, event_id=event_id)


def _lock_id(key: str) -> int:
    # A stable signed 64-bit id for pg advisory locks, namespaced to hookledger.
    digest = hashlib.blake2b(b"hookledger:" + key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _clip(value: str | None, size: int) -> str | None:
    return value[:size] if isinstance(value, str) else None


def _describe(exc: BaseException, limit: int = 4000) -> str:
    import traceback

    text_ = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text_[-limit:]


__all__ = [
    "Claimed",
    "Outcome",
    "EventFilter",
    "Inserted",
    "RetryPolicy",
    "Store",
    "body_sha256",
    "clean_headers",
]
