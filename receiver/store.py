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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    and_,
    any_,
    bindparam,
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

from receiver import guard, signals
from receiver.clock import Clock, as_utc, utcnow
from receiver.db import deferred_begin
from receiver.defer import Defer
from receiver.errors import StorageUnavailable
from receiver.events import Event
from receiver.filelock import WritersLock
from receiver.groupcommit import GroupCommit
from receiver.models import (
    CutOver,
    EventConflict,
    EventStatus,
    HandlerRun,
    InboxEvent,
    ObjectLease,
    Projection,
    Source,
    Transition,
)
from receiver.transitions import Reading, make_state, read_event

log = logging.getLogger("receiver.store")

E: Table = InboxEvent.__table__  # type: ignore[attr-defined]
C: Table = EventConflict.__table__  # type: ignore[attr-defined]
H: Table = HandlerRun.__table__  # type: ignore[attr-defined]
P: Table = Projection.__table__  # type: ignore[attr-defined]
T: Table = Transition.__table__  # type: ignore[attr-defined]
L: Table = ObjectLease.__table__  # type: ignore[attr-defined]
K: Table = CutOver.__table__  # type: ignore[attr-defined]

#: The one row of ``hookledger_cutover``.
CUTOVER_NAME = "cutover"

_OPEN_SQL = text("hookledger_event.status IN ('pending', 'processing')")

#: Headers never written to the inbox (they may carry credentials).
REDACTED_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization", "api-key"})

InsertResult = Literal["inserted", "duplicate", "conflict"]
#: How a deferred event's ``last_error`` begins (the handler's reason follows).
DEFERRED_PREFIX = "deferred: "
#: Sources whose event ids hookledger derives from the transition (not the processor's ids).
_DERIVED = frozenset({Source.API, Source.RECONCILE, Source.BACKFILL})

#: Beside a SQLite database file: the lock its web processes take to write (an empty file).
WRITERS_LOCK_SUFFIX = "-hookledger-writers"

# PostgreSQL: the per-batch writes are single statements over parallel arrays (``unnest``).
# Their text is fixed whatever the batch size, so psycopg caches and prepares them; an
# executemany would send one statement per row, a multi-row VALUES one placeholder per value.
_PG_TAKE_LEASES = text(
    "INSERT INTO hookledger_object_lease (object_key, owner, expires_at) "
    "SELECT k, :owner, :expires FROM unnest(CAST(:keys AS text[])) AS k "
    # Objects another claimer is leasing right now are skipped, never waited for.
    "WHERE pg_try_advisory_xact_lock(hashtextextended('hookledger:' || k, 0)) "
    "ON CONFLICT (object_key) DO UPDATE "
    "SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at "
    "WHERE hookledger_object_lease.expires_at < :now "
    "RETURNING object_key"
)
#: One statement writes a dispatched batch's outcomes: transitions, projections, ledger rows,
#: the events' final states, and frees the object leases of the events it closed. It returns
#: how many events it closed: fewer than sent means a lease was lost (the caller rolls back).
_OUTCOME_COLUMNS = {
    "t": ("object_kind", "object_id", "state", "event_pk", "created_at"),
    "p": (
        "object_kind",
        "object_id",
        "status",
        "stage",
        "event_time",
        "object_created_at",
        "event_pk",
        "updated_at",
    ),
    "l": ("event_pk", "handler", "status", "attempts", "last_error", "updated_at"),
    "b": ("b_id", "b_owner", "b_status", "b_error", "b_next", "b_processed", "b_undo"),
}
_PG_WRITE_OUTCOMES = text(
    "WITH t AS ("
    " INSERT INTO hookledger_transition (object_kind, object_id, state, event_pk, created_at)"
    " SELECT * FROM unnest(CAST(:t_object_kind AS text[]), CAST(:t_object_id AS text[]),"
    " CAST(:t_state AS text[]), CAST(:t_event_pk AS bigint[]),"
    " CAST(:t_created_at AS timestamptz[]))"
    " ON CONFLICT DO NOTHING"
    "), p AS ("
    " INSERT INTO hookledger_projection (object_kind, object_id, status, stage, event_time,"
    " object_created_at, event_pk, updated_at)"
    " SELECT * FROM unnest(CAST(:p_object_kind AS text[]), CAST(:p_object_id AS text[]),"
    " CAST(:p_status AS text[]), CAST(:p_stage AS text[]), CAST(:p_event_time AS timestamptz[]),"
    " CAST(:p_object_created_at AS timestamptz[]), CAST(:p_event_pk AS bigint[]),"
    " CAST(:p_updated_at AS timestamptz[]))"
    " ON CONFLICT (object_kind, object_id) DO UPDATE SET status = EXCLUDED.status,"
    " stage = EXCLUDED.stage, event_time = EXCLUDED.event_time,"
    " object_created_at = COALESCE(EXCLUDED.object_created_at,"
    " hookledger_projection.object_created_at), event_pk = EXCLUDED.event_pk,"
    " updated_at = EXCLUDED.updated_at"
    "), l AS ("
    " INSERT INTO hookledger_handler_run (event_pk, handler, status, attempts, last_error,"
    " updated_at)"
    " SELECT * FROM unnest(CAST(:l_event_pk AS bigint[]), CAST(:l_handler AS text[]),"
    " CAST(:l_status AS text[]), CAST(:l_attempts AS integer[]), CAST(:l_last_error AS text[]),"
    " CAST(:l_updated_at AS timestamptz[]))"
    " ON CONFLICT (event_pk, handler) DO UPDATE SET status = EXCLUDED.status,"
    " attempts = hookledger_handler_run.attempts + 1, last_error = EXCLUDED.last_error,"
    " updated_at = EXCLUDED.updated_at"
    "), closed AS ("
    " UPDATE hookledger_event AS e SET status = v.status, last_error = v.error,"
    " attempts = e.attempts - v.undo,"
    " next_attempt_at = v.next, processed_at = v.processed, lease_owner = NULL,"
    " lease_expires_at = NULL"
    " FROM unnest(CAST(:b_id AS bigint[]), CAST(:b_owner AS text[]), CAST(:b_status AS text[]),"
    " CAST(:b_error AS text[]), CAST(:b_next AS timestamptz[]),"
    " CAST(:b_processed AS timestamptz[]), CAST(:b_undo AS integer[]))"
    " AS v(id, owner, status, error, next, processed, undo)"
    " WHERE e.id = v.id AND e.lease_owner = v.owner"
    " RETURNING e.object_key, v.owner"
    "), freed AS ("
    " DELETE FROM hookledger_object_lease AS lease USING closed"
    " WHERE lease.object_key = closed.object_key AND lease.owner = closed.owner"
    ")"
    " SELECT count(*) FROM closed"
)


#: The inbox columns a new event is inserted with (see ``Store._row``), with their array
#: types: the reconciler's synthesised events are inserted as one array per column.
_EVENT_COLUMNS = {
    "event_id": "varchar",
    "source": "varchar",
    "merchant_id": "varchar",
    "event_type": "varchar",
    "content_type": "varchar",
    "object_kind": "varchar",
    "object_id": "varchar",
    "object_status": "varchar",
    "object_stage": "varchar",
    "object_key": "varchar",
    "event_time": "timestamptz",
    "object_created_at": "timestamptz",
    "received_at": "timestamptz",
    "body": "bytea",
    "headers": "text",
    "body_sha256": "varchar",
    "secret_id": "varchar",
    "replay_of": "bigint",
    "status": "varchar",
    "attempts": "integer",
    "next_attempt_at": "timestamptz",
}
_PG_INSERT_EVENTS = text(
    f"INSERT INTO hookledger_event ({', '.join(_EVENT_COLUMNS)}) SELECT * FROM unnest("
    + ", ".join(f"CAST(:{name} AS {kind}[])" for name, kind in _EVENT_COLUMNS.items())
    + ") ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)


def _outcome_arrays(
    transitions: Sequence[dict[str, Any]],
    projections: Sequence[dict[str, Any]],
    ledger: Sequence[dict[str, Any]],
    finals: Sequence[dict[str, Any]],
) -> dict[str, list[Any]]:
    """The parameters of :data:`_PG_WRITE_OUTCOMES`: each part's rows as parallel arrays, one
    per column. Times stay aware (the columns are ``timestamptz``; a naive value would be
    read in the session's time zone)."""
    params: dict[str, list[Any]] = {}
    for part, rows in (("t", transitions), ("p", projections), ("l", ledger), ("b", finals)):
        for column in _OUTCOME_COLUMNS[part]:
            name = column if part == "b" else f"{part}_{column}"
            params[name] = [row[column] for row in rows]
    return params


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


#: A handler as the store runs it: (ledger name, call with the session, needs the session).
HandlerCall = tuple[str, Callable[[Session], None], bool]


class _LeaseLost(Exception):
    """Another worker holds the lease now: roll back."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Work:
    """A claimed event and the handlers to run for it."""

    claimed: Claimed
    handlers: Sequence[HandlerCall]


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
    #: How long after its receipt an event may still be deferred (:class:`receiver.Defer`).
    defer_limit_seconds: float = 86_400.0

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
    #: Only events a handler deferred (waiting, with the reason in ``last_error``).
    deferred: bool = False


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
        write_wait: float = 5.0,
    ) -> None:
        """``write_wait``: on SQLite, how long a delivery waits for this process's other
        threads' inserts before it gives up with :class:`StorageUnavailable` (use the busy
        timeout)."""
        self.engine = engine
        self.clock = clock
        self.retry = retry or RetryPolicy()
        self._rng = rng or random.Random()
        self._pg = engine.dialect.name == "postgresql"
        #: SQLite: one writer at a time for the whole database (the worker yields to others).
        self.single_writer = engine.dialect.name == "sqlite"
        #: Reads, and inserts (their first statement writes): on SQLite a deferred BEGIN, so
        #: reads never queue for the lock and an insert holds it only from its INSERT on.
        self.deferred = deferred_begin(engine)
        #: SQLite: this process's threads write through one queue (group commit), woken as
        #: soon as the writer is free, rather than each in SQLite's busy handler, which polls
        #: with sleeps of up to 100 ms (that sleeping was the receive path's tail latency).
        self._group: GroupCommit[dict[str, Any], Inserted] | None = (
            GroupCommit(self._insert_batch) if self.single_writer else None
        )
        self._write_wait = write_wait
        #: SQLite file: the web processes of this host queue for writing on a file lock,
        #: not in SQLite's sleeping busy handler (see :mod:`receiver.filelock`).
        database = engine.url.database if self.single_writer else None
        self._writers = (
            WritersLock(database + WRITERS_LOCK_SUFFIX)
            if database and database != ":memory:" and not database.startswith("file:")
            else None
        )
        # Built once: building the statement per request cost more than executing it. SQLite
        # reports the new row's id as ``lastrowid`` (no RETURNING round through the cursor).
        insert_event = self._insert(E).on_conflict_do_nothing(index_elements=["event_id"])
        self._insert_event: Any = (
            insert_event if self.single_writer else insert_event.returning(E.c.id)
        )

    def __repr__(self) -> str:
        return f"Store(dialect={self.engine.dialect.name!r})"

    # -- helpers --------------------------------------------------------------------------

    def _insert(self, table: Table) -> Any:
        return (postgresql.insert if self._pg else sqlite.insert)(table)

    def _among(self, column: Any, values: Iterable[Any]) -> Any:
        """``column IN (values)``. On PostgreSQL one array parameter (``= ANY(:values)``): the
        statement is the same whatever the number of values, so it is compiled and prepared
        once instead of re-rendered with one placeholder per value on every call."""
        listed = list(values)
        if self._pg:
            return column == any_(bindparam(None, listed, type_=postgresql.ARRAY(column.type)))
        return column.in_(listed)

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

        On SQLite, deliveries stored by this process's threads at the same moment share one
        transaction and one commit (:mod:`receiver.groupcommit`); each still gets its own
        answer, and only after the commit.
        """
        now = self.now()
        values = self._row(event, body, now, headers, secret_id, source, replay_of)
        if self._group is None:
            return self._insert_together([values])[0]
        try:
            return self._group.submit(values, timeout=self._write_wait)
        except TimeoutError:
            log.error("webhook not stored: the database stayed locked", extra={"action": "busy"})
            raise StorageUnavailable() from None

    def _insert_together(self, rows: list[dict[str, Any]]) -> list[Inserted]:
        """Insert deliveries in one transaction (see :meth:`insert`)."""
        if self._writers is None:
            return self._insert_transaction(rows)
        try:
            with self._writers.hold(self._write_wait):
                return self._insert_transaction(rows)
        except OSError as exc:  # the lock stayed taken, or its file cannot be opened
            raise StorageUnavailable() from exc

    def _insert_transaction(self, rows: list[dict[str, Any]]) -> list[Inserted]:
        try:
            with self.deferred.begin() as conn:
                return [self._insert_one(conn, values) for values in rows]
        except DBAPIError as exc:
            if not _is_unavailable(exc):
                raise
            raise StorageUnavailable() from exc

    def _insert_batch(self, rows: list[dict[str, Any]]) -> list[Inserted | BaseException]:
        """:class:`GroupCommit`'s writer: one transaction for the batch; if it fails for a
        reason other than the database being unavailable, each delivery is tried alone, so
        one bad delivery cannot fail the others."""
        try:
            return list(self._insert_together(rows))
        except StorageUnavailable as exc:
            return [_unavailable(exc.__cause__) for _ in rows]
        except Exception as exc:  # noqa: BLE001 - isolated below, or that delivery's error
            if len(rows) == 1:
                return [exc]
        outcomes: list[Inserted | BaseException] = []
        for values in rows:
            outcomes.extend(self._insert_batch([values]))
        return outcomes

    def insert_on(
        self,
        conn: Connection,
        event: Event,
        body: bytes,
        *,
        source: str,
        headers: Iterable[tuple[str, str]] = (),
        secret_id: str | None = None,
    ) -> Inserted:
        """Store a delivery on ``conn``, inside the caller's transaction (it commits, or rolls
        back, with the caller's own writes). Same dedupe and conflict rules as :meth:`insert`."""
        values = self._row(event, body, self.now(), headers, secret_id, source, None)
        return self._insert_one(conn, values)

    def _insert_one(self, conn: Connection, values: dict[str, Any]) -> Inserted:
        event_id, digest = values["event_id"], values["body_sha256"]
        result = conn.execute(self._insert_event, values)
        if self.single_writer:
            pk = result.lastrowid if result.rowcount == 1 else None
        else:
            pk = result.scalar()
        if pk is not None:
            return Inserted(result="inserted", pk=int(pk))
        row = conn.execute(select(E.c.id, E.c.body_sha256).where(E.c.event_id == event_id)).one()
        if row.body_sha256 == digest or values["source"] in _DERIVED:
            # An observed or synthesised event's id is deterministic per transition while
            # the object's body may have changed since: the same transition, no conflict.
            return Inserted(result="duplicate", pk=int(row.id))
        conn.execute(
            self._insert(C)
            .values(
                event_id=event_id,
                source=values["source"],
                body=values["body"],
                headers=values["headers"],
                body_sha256=digest,
                secret_id=values["secret_id"],
                received_at=values["received_at"],
            )
            .on_conflict_do_nothing(index_elements=["event_id", "body_sha256"])
        )
        log.warning(
            "event_id delivered again with a different body",
            extra={"action": "conflict", "event_id": event_id, "event_type": values["event_type"]},
        )
        return Inserted(result="conflict", pk=int(row.id))

    def _row(
        self,
        event: Event,
        body: bytes,
        now: datetime,
        headers: Iterable[tuple[str, str]],
        secret_id: str | None,
        source: str,
        replay_of: int | None,
    ) -> dict[str, Any]:
        """The inbox row of a delivery."""
        if source not in Source.ALL:
            raise ValueError(f"unknown source {source!r}")
        ref = event.object_ref
        if ref is not None and ref.object_id:
            kind: str | None = ref.kind
            object_id: str | None = ref.object_id
            object_key = f"{ref.kind}:{ref.object_id}"
            object_status = ref.status
            object_stage = ref.stage
        else:
            kind = object_id = object_status = object_stage = None
            object_key = f"event:{event.event_id}"
        return dict(
            event_id=event.event_id,
            source=source,
            merchant_id=_clip(event.merchant_id, 255),
            event_type=_clip(event.event_type, 64),
            content_type=_clip(event.content_type, 64),
            object_kind=kind,
            object_id=_clip(object_id, 255),
            object_status=_clip(object_status, 64),
            object_stage=_clip(object_stage, 64),
            object_key=object_key[:300],
            event_time=as_utc(event.timestamp) if event.timestamp else now,
            object_created_at=event.object.created_time if event.object is not None else None,
            received_at=now,
            body=body,
            headers=clean_headers(headers),
            body_sha256=body_sha256(body),
            secret_id=secret_id,
            replay_of=replay_of,
            status=EventStatus.PENDING,
            attempts=0,
            next_attempt_at=now,
        )

    def insert_synthesised(
        self, events: Sequence[tuple[Event, bytes]], *, source: str = Source.RECONCILE
    ) -> dict[str, str]:
        """Insert the reconciler's synthesised events in one transaction (insert-or-ignore).

        Returns ``{event_id: "inserted" | <status of the row already there>}``. A synthesised
        id is deterministic per transition while the remote object's body may have changed
        since (a later refund, say), so a different body under a known id is no conflict.
        """
        if not events:
            return {}
        now = self.now()
        rows = [self._row(e, b, now, (), None, source, None) for e, b in events]
        if self._pg:
            stmt: Any = _PG_INSERT_EVENTS
            params: Any = {column: [row[column] for row in rows] for column in _EVENT_COLUMNS}
        else:
            stmt = self._insert(E).on_conflict_do_nothing(index_elements=["event_id"])
            stmt, params = stmt.returning(E.c.event_id), rows
        try:
            with self.engine.begin() as conn:
                inserted = {r[0] for r in conn.execute(stmt, params)}
                others = [r["event_id"] for r in rows if r["event_id"] not in inserted]
                found: dict[str, str] = {}
                if others:
                    found = {
                        r[0]: r[1]
                        for r in conn.execute(
                            select(E.c.event_id, E.c.status).where(
                                self._among(E.c.event_id, others)
                            )
                        )
                    }
        except DBAPIError as exc:
            if not _is_unavailable(exc):
                raise
            raise StorageUnavailable() from exc
        return {r["event_id"]: found.get(r["event_id"], "inserted") for r in rows}

    # -- claim and lease ------------------------------------------------------------------

    def claim(self, owner: str, lease_seconds: float) -> Claimed | None:
        """Lease the next due event (see :meth:`claim_batch`), or return ``None``."""
        claimed = self.claim_batch(owner, lease_seconds, limit=1)
        return claimed[0] if claimed else None

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
        now = self.now()
        expires = now + timedelta(seconds=lease_seconds)
        due = and_(
            # Literal, so the planner can always use the partial index over open events.
            _OPEN_SQL,
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
        with self.engine.begin() as conn:
            candidates: dict[str, int] = {}
            for row in conn.execute(query):
                candidates.setdefault(row.object_key, int(row.id))
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
                conn.execute(
                    delete(L).where(self._among(L.c.object_key, returned), L.c.owner == owner)
                )
        return claimed

    def _take_object_leases(
        self, conn: Connection, keys: list[str], owner: str, now: datetime, expires: datetime
    ) -> list[str]:
        if self._pg:
            rows = conn.execute(
                _PG_TAKE_LEASES,
                {
                    "keys": keys,
                    "owner": owner,
                    "expires": expires,
                    "now": now,
                },
            )
            taken = {row[0] for row in rows}
            return [k for k in keys if k in taken]
        stmt = self._insert(L)
        stmt = stmt.on_conflict_do_update(
            index_elements=["object_key"],
            set_={"owner": stmt.excluded.owner, "expires_at": stmt.excluded.expires_at},
            where=L.c.expires_at < now,
        ).returning(L.c.object_key)
        rows = conn.execute(
            stmt, [{"object_key": k, "owner": owner, "expires_at": expires} for k in keys]
        )
        taken = {row[0] for row in rows}
        return [k for k in keys if k in taken]

    def _heads(
        self, conn: Connection, keys: list[str], candidates: dict[str, int], now: datetime
    ) -> list[Any]:
        """The claimable head event of each of ``keys`` (in ``keys`` order)."""
        ranked = (
            select(
                E,
                func.row_number()
                .over(partition_by=E.c.object_key, order_by=(E.c.event_time, E.c.id))
                .label("position"),
            )
            .where(self._among(E.c.object_key, keys), _OPEN_SQL)
            .subquery()
        )
        rows = {
            row.object_key: row
            for row in conn.execute(select(ranked).where(ranked.c.position == 1))
        }
        # A head that is not a due candidate of ours waits (its retry is not due) or, on
        # PostgreSQL, may be locked by another claimer: lock it without waiting.
        others = [
            int(r.id)
            for k, r in rows.items()
            if int(r.id) != candidates[k] and r.next_attempt_at <= now
        ]
        free: set[int] = set(others)
        if self._pg and others:
            free = {
                int(row[0])
                for row in conn.execute(
                    select(E.c.id)
                    .where(self._among(E.c.id, others))
                    .with_for_update(skip_locked=True)
                )
            }
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
            update(E)
            .where(self._among(E.c.id, [int(h.id) for h in heads]))
            .values(
                status=EventStatus.PROCESSING,
                lease_owner=owner,
                lease_expires_at=expires,
                attempts=E.c.attempts + 1,
            )
        )
        return [
            Claimed(
                pk=int(h.id),
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

    def claim_object(self, owner: str, object_key: str, lease_seconds: float) -> Claimed | None:
        """Lease the head event of one object, if it is due and no other worker holds the
        object (for processing one object inline, :meth:`receiver.worker.Worker.process_object`).
        """
        now = self.now()
        expires = now + timedelta(seconds=lease_seconds)
        with self.engine.begin() as conn:
            head = conn.execute(
                select(E.c.id, E.c.next_attempt_at)
                .where(E.c.object_key == object_key, _OPEN_SQL)
                .order_by(E.c.event_time, E.c.id)
                .limit(1)
            ).first()
            if head is None or as_utc(head.next_attempt_at) > now:
                return None
            leased = self._take_object_leases(conn, [object_key], owner, now, expires)
            if not leased:
                return None
            claimed = self._mark_claimed(
                conn, self._heads(conn, leased, {object_key: int(head.id)}, now), owner, expires
            )
            if not claimed:
                conn.execute(delete(L).where(L.c.object_key == object_key, L.c.owner == owner))
                return None
            return claimed[0]

    def status_of(self, pk: int) -> str | None:
        """The status of the inbox row ``pk`` (``None`` if there is none)."""
        with self.deferred.connect() as conn:
            return conn.execute(select(E.c.status).where(E.c.id == pk)).scalar()

    def renew(self, claimed: Sequence[Claimed], lease_seconds: float) -> int:
        """Extend the leases of ``claimed``; returns how many object leases are still held."""
        if not claimed:
            return 0
        owner = claimed[0].owner
        expires = self.now() + timedelta(seconds=lease_seconds)
        with self.engine.begin() as conn:
            rows = conn.execute(
                update(L)
                .where(
                    self._among(L.c.object_key, [c.object_key for c in claimed]), L.c.owner == owner
                )
                .values(expires_at=expires)
            ).rowcount
            conn.execute(
                update(E)
                .where(self._among(E.c.id, [c.pk for c in claimed]), E.c.lease_owner == owner)
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

    # -- dispatch: guard, handlers, ledger and outcomes in one transaction -----------------

    def dispatch(self, claimed: Claimed, handlers: Sequence[HandlerCall]) -> Outcome:
        """Process one claimed event (see :meth:`dispatch_many`)."""
        return self.dispatch_many([Work(claimed=claimed, handlers=handlers)])[0]

    def dispatch_many(self, works: Sequence[Work]) -> list[Outcome]:
        """Process claimed events (of distinct objects) in ONE transaction.

        For each event the guard decides first (:func:`receiver.guard.decide`); then each
        handler that has not yet succeeded runs, a handler that takes the session inside a
        savepoint of its own; the ledger rows, transitions, projections and the events'
        outcomes are written in the same transaction. A handler's writes through the session
        therefore commit exactly once, together with its ledger row. If any lease was lost
        meanwhile (another worker took over after expiry), the transaction is rolled back
        and the events are retried one by one, so only the event whose lease was lost is
        dropped (it belongs to the other worker now).
        """
        if not works:
            return []
        try:
            return self._dispatch_together(works)
        except _LeaseLost:
            if len(works) == 1:
                log.warning(
                    "lease lost before the event was finished; its work is rolled back",
                    extra={
                        "action": "lease_lost",
                        "event_id": works[0].claimed.event_id,
                        "event_type": works[0].claimed.event_type,
                    },
                )
                return [Outcome(status="lease_lost", ran=(), failures=())]
            return [self.dispatch_many([work])[0] for work in works]

    def _dispatch_together(self, works: Sequence[Work]) -> list[Outcome]:
        now = self.now()
        outcomes: list[Outcome] = []
        transitions: list[dict[str, Any]] = []
        projections: list[dict[str, Any]] = []
        ledger: list[dict[str, Any]] = []
        finals: list[dict[str, Any]] = []
        with Session(self.engine) as session:
            with session.begin():
                conn = session.connection()
                owners, currents, done = self._load_guard_state(conn, works)
                cutover = self._cutover(conn)
                for work in works:
                    c = work.claimed
                    reading = _reading(c)
                    key = reading.state.key if reading.state is not None else None
                    verdict = guard.decide(
                        event_pk=c.pk,
                        incoming=reading.state,
                        event_time=c.event_time,
                        replay=c.replay_of is not None,
                        transition_owner=owners.get((c.object_kind, c.object_id, key)),
                        current=currents.get((c.object_kind, c.object_id)),
                        note=reading.note,
                        cutover=cutover,
                        arrival=guard.Arrival(
                            source=c.source,
                            received_at=as_utc(c.received_at),
                            historical=c.source in Source.HISTORICAL,
                        ),
                    )
                    if verdict.claim is not None:
                        transitions.append(
                            {
                                "object_kind": c.object_kind,
                                "object_id": c.object_id,
                                "state": verdict.claim,
                                "event_pk": c.pk,
                                "created_at": now,
                            }
                        )
                    if verdict.projection is not None:
                        projections.append(
                            {
                                "object_kind": c.object_kind,
                                "object_id": c.object_id,
                                "status": verdict.projection.status,
                                "stage": verdict.projection.stage,
                                "event_time": c.event_time,
                                "object_created_at": c.object_created_at,
                                "event_pk": c.pk,
                                "updated_at": now,
                            }
                        )
                    if verdict.decision != "dispatch":
                        finals.append(self._final(c, verdict.decision, verdict.reason, now))
                        outcomes.append(Outcome(status=verdict.decision, ran=(), failures=()))
                        continue
                    ran, failures, deferrals = self._run_handlers(
                        session, c, work.handlers, done.get(c.pk, set()), ledger, now
                    )
                    if failures:
                        final = self._final(c, "failed", "\n".join(failures), now)
                    elif deferrals:
                        final = self._deferred(c, deferrals, now)
                    else:
                        final = self._final(c, EventStatus.DONE, None, now)
                    finals.append(final)
                    label = "deferred" if deferrals and not failures else final["b_status"]
                    if label == "deferred" and final["b_status"] == EventStatus.DEAD:
                        label = EventStatus.DEAD
                    outcomes.append(Outcome(status=label, ran=ran, failures=failures))
                self._write_outcomes(conn, transitions, projections, ledger, finals)
        return outcomes

    @staticmethod
    def _cutover(conn: Connection) -> guard.CutOver | None:
        """The account's cut-over, if it was adopted (read with every batch: one tiny row)."""
        row = conn.execute(
            select(K.c.cutover_at, K.c.recorded_at).where(K.c.name == CUTOVER_NAME)
        ).first()
        if row is None or row.cutover_at is None:
            return None
        return guard.CutOver(at=as_utc(row.cutover_at), recorded_at=as_utc(row.recorded_at))

    def _load_guard_state(
        self, conn: Connection, works: Sequence[Work]
    ) -> tuple[
        dict[tuple[Any, Any, Any], int],
        dict[tuple[Any, Any], guard.Projected],
        dict[int, set[str]],
    ]:
        guarded = [w.claimed for w in works if w.claimed.object_kind and w.claimed.object_id]
        owners: dict[tuple[Any, Any, Any], int] = {}
        currents: dict[tuple[Any, Any], guard.Projected] = {}
        wanted = {
            (c.object_kind, c.object_id, reading.state.key)
            for c in guarded
            if (reading := _reading(c)).state is not None
        }
        # Each column is matched against the set of its values (one array parameter on
        # PostgreSQL, served by the primary key's index); the rows are then narrowed to the
        # exact tuples here.
        if wanted:
            rows = conn.execute(
                select(T.c.object_kind, T.c.object_id, T.c.state, T.c.event_pk).where(
                    self._among(T.c.object_kind, {k for k, _, _ in wanted}),
                    self._among(T.c.object_id, {i for _, i, _ in wanted}),
                    self._among(T.c.state, {t for _, _, t in wanted}),
                )
            )
            owners = {(r[0], r[1], r[2]): int(r[3]) for r in rows if (r[0], r[1], r[2]) in wanted}
        if guarded:
            objects = {(c.object_kind, c.object_id) for c in guarded}
            projected = conn.execute(
                select(
                    P.c.object_kind,
                    P.c.object_id,
                    P.c.status,
                    P.c.stage,
                    P.c.event_time,
                    P.c.event_pk,
                ).where(
                    self._among(P.c.object_kind, {k for k, _ in objects}),
                    self._among(P.c.object_id, {i for _, i in objects}),
                )
            )
            currents = {
                (r[0], r[1]): guard.Projected(
                    state=make_state(r[0], r[2], r[3]),
                    event_time=r[4],
                    event_pk=int(r[5]),
                )
                for r in projected
                if (r[0], r[1]) in objects
            }
        done: dict[int, set[str]] = {}
        retried = [w.claimed.pk for w in works]
        for pk, handler in conn.execute(
            select(H.c.event_pk, H.c.handler).where(
                self._among(H.c.event_pk, retried), H.c.status == "succeeded"
            )
        ):
            done.setdefault(int(pk), set()).add(handler)
        return owners, currents, done

    def _run_handlers(
        self,
        session: Session,
        claimed: Claimed,
        handlers: Sequence[HandlerCall],
        done: set[str],
        ledger: list[dict[str, Any]],
        now: datetime,
    ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Defer, ...]]:
        ran: list[str] = []
        failures: list[str] = []
        deferrals: list[Defer] = []
        for name, call, needs_session in handlers:
            if name in done:
                continue
            # Only a handler that writes through the session needs a savepoint to undo.
            savepoint = session.begin_nested() if needs_session else None
            try:
                call(session)
                if savepoint is not None:
                    session.flush()
            except Exception as exc:  # noqa: BLE001 - a handler may raise anything
                if isinstance(exc, DBAPIError) and _is_unavailable(exc):
                    raise  # the database failed, not the handler: abort the batch
                if savepoint is not None:
                    savepoint.rollback()
                if isinstance(exc, Defer):
                    ledger.append(_ledger_row(claimed.pk, name, "deferred", exc.reason, now))
                    deferrals.append(exc)
                    continue
                ledger.append(_ledger_row(claimed.pk, name, "failed", _describe(exc), now))
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
            else:
                if savepoint is not None:
                    savepoint.commit()
                ledger.append(_ledger_row(claimed.pk, name, "succeeded", None, now))
                ran.append(name)
        return tuple(ran), tuple(failures), tuple(deferrals)

    def _deferred(
        self, claimed: Claimed, deferrals: Sequence[Defer], now: datetime
    ) -> dict[str, Any]:
        """Close an event a handler deferred: due again later, the attempt given back; past
        the deferral limit (from its receipt), dead-lettered with the reason."""
        reason = "; ".join(dict.fromkeys(d.reason for d in deferrals))
        due = now + timedelta(seconds=max(d.seconds for d in deferrals))
        limit = as_utc(claimed.received_at) + timedelta(seconds=self.retry.defer_limit_seconds)
        if due > limit:
            log.error(
                "event dead-lettered: still deferred after the limit of %g s",
                self.retry.defer_limit_seconds,
                extra={
                    "action": "dead_letter",
                    "event_id": claimed.event_id,
                    "event_type": claimed.event_type,
                },
            )
            final = self._final(claimed, EventStatus.DEAD, None, now)
            final["b_error"] = (
                f"deferred past the limit of {self.retry.defer_limit_seconds:g} s: {reason}"
            )
            return final
        final = self._final(claimed, EventStatus.PENDING, f"{DEFERRED_PREFIX}{reason}", now)
        final.update(b_next=due, b_undo=1)
        return final

    def _final(
        self, claimed: Claimed, status: str, error: str | None, now: datetime
    ) -> dict[str, Any]:
        """The row update that closes a claimed event (``b_`` keys: executemany params)."""
        next_attempt = now
        if status == "failed":
            if claimed.attempts >= self.retry.max_attempts:
                status = EventStatus.DEAD
                log.error(
                    "event dead-lettered after %d attempts",
                    claimed.attempts,
                    extra={
                        "action": "dead_letter",
                        "event_id": claimed.event_id,
                        "event_type": claimed.event_type,
                    },
                )
            else:
                status = EventStatus.PENDING
                delay = self.retry.delay(claimed.attempts, self._rng)
                next_attempt = now + timedelta(seconds=delay)
        finished = status in EventStatus.TERMINAL and status != EventStatus.DEAD
        return {
            "b_id": claimed.pk,
            "b_owner": claimed.owner,
            "b_key": claimed.object_key,
            "b_status": status,
            "b_error": error,
            "b_next": next_attempt,
            "b_processed": now if finished else None,
            "b_undo": 0,
        }

    def _write_outcomes(
        self,
        conn: Connection,
        transitions: list[dict[str, Any]],
        projections: list[dict[str, Any]],
        ledger: list[dict[str, Any]],
        finals: list[dict[str, Any]],
    ) -> None:
        if self._pg:
            closed = conn.execute(
                _PG_WRITE_OUTCOMES, _outcome_arrays(transitions, projections, ledger, finals)
            ).scalar_one()
            if closed != len(finals):
                raise _LeaseLost()
            return
        if transitions:
            conn.execute(
                self._insert(T).on_conflict_do_nothing(),
                transitions,
            )
        if projections:
            stmt = self._insert(P)
            stmt = stmt.on_conflict_do_update(
                index_elements=["object_kind", "object_id"],
                # Every column but the key.
                set_={
                    name: (
                        func.coalesce(stmt.excluded[name], P.c[name])
                        if name == "object_created_at"
                        else stmt.excluded[name]
                    )
                    for name in _OUTCOME_COLUMNS["p"][2:]
                },
            )
            conn.execute(stmt, projections)
        if ledger:
            stmt = self._insert(H)
            stmt = stmt.on_conflict_do_update(
                index_elements=["event_pk", "handler"],
                set_={
                    "status": stmt.excluded.status,
                    "attempts": H.c.attempts + 1,
                    "last_error": stmt.excluded.last_error,
                    "updated_at": stmt.excluded.updated_at,
                },
            )
            conn.execute(stmt, ledger)
        self._close_events(conn, finals)

    def _close_events(self, conn: Connection, finals: list[dict[str, Any]]) -> None:
        """Write the outcomes; raise :class:`_LeaseLost` unless this worker held every lease."""
        if self._pg:
            self._write_outcomes(conn, [], [], [], finals)
            return
        written = self._close_events_each(conn, finals)
        if written != len(finals):
            raise _LeaseLost()
        owner = finals[0]["b_owner"]
        conn.execute(
            delete(L).where(
                self._among(L.c.object_key, [f["b_key"] for f in finals]), L.c.owner == owner
            )
        )

    @staticmethod
    def _close_events_each(conn: Connection, finals: list[dict[str, Any]]) -> int:
        return int(
            conn.execute(
                update(E)
                .where(E.c.id == bindparam("b_id"), E.c.lease_owner == bindparam("b_owner"))
                .values(
                    status=bindparam("b_status"),
                    last_error=bindparam("b_error"),
                    next_attempt_at=bindparam("b_next"),
                    processed_at=bindparam("b_processed"),
                    attempts=E.c.attempts - bindparam("b_undo"),
                    lease_owner=None,
                    lease_expires_at=None,
                ),
                finals,
            ).rowcount
        )

    def finish(self, claimed: Claimed, *, status: str, error: str | None = None) -> str | None:
        """Close a claimed event outside :meth:`dispatch` (an unparseable body, for example);
        returns the status written, or ``None`` when the lease was lost."""
        final = self._final(claimed, status, error, self.now())
        try:
            with self.engine.begin() as conn:
                self._close_events(conn, [final])
        except _LeaseLost:
            return None
        return str(final["b_status"])

    # -- operator -------------------------------------------------------------------------

    def select_events(self, flt: EventFilter) -> list[InboxEvent]:
        query = select(InboxEvent).order_by(InboxEvent.id)  # type: ignore[arg-type]
        query = query.where(*_filter_clauses(flt))
        if flt.limit:
            query = query.limit(flt.limit)
        with Session(self.deferred) as session:
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
            with self.deferred.connect() as conn:
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

    def health(self) -> tuple[dict[str, int], float | None]:
        """Counts by status and the age of the oldest open event, read in a transaction that
        could write: on SQLite that needs the write lock, so a health check fails exactly
        when webhooks could not be stored."""
        with self.engine.begin() as conn:
            counts = _status_counts(conn)
            oldest = conn.execute(
                select(func.min(E.c.received_at)).where(E.c.status.in_(EventStatus.OPEN))
            ).scalar()
        age = None if oldest is None else (self.now() - as_utc(oldest)).total_seconds()
        return counts, age

    def counts(self) -> dict[str, int]:
        with self.deferred.connect() as conn:
            return _status_counts(conn)

    def get(self, event_id: str) -> InboxEvent | None:
        with Session(self.deferred) as session:
            return session.scalars(
                select(InboxEvent).where(InboxEvent.event_id == event_id)  # type: ignore[arg-type]
            ).first()

    def handler_runs(self, event_pk: int) -> dict[str, HandlerRun]:
        with Session(self.deferred) as session:
            rows = session.scalars(
                select(HandlerRun).where(HandlerRun.event_pk == event_pk)  # type: ignore[arg-type]
            )
            return {r.handler: r for r in rows}

    def cutover(self) -> guard.CutOver | None:
        """The account's cut-over (see :class:`receiver.models.CutOver`), if one is set."""
        with self.deferred.connect() as conn:
            return self._cutover(conn)

    def cutover_mode(self) -> str | None:
        """``adopted``, ``new_account``, or ``None`` when neither was recorded."""
        with self.deferred.connect() as conn:
            return conn.execute(select(K.c.mode).where(K.c.name == CUTOVER_NAME)).scalar()

    def set_cutover(self, mode: str, at: datetime | None) -> None:
        """Record the account's cut-over (``adopted`` at ``at``, or a ``new_account``)."""
        if mode not in ("adopted", "new_account"):
            raise ValueError("mode must be 'adopted' or 'new_account'")
        if (mode == "adopted") != (at is not None):
            raise ValueError("an adopted account has a cut-over time; a new account has none")
        values = {
            "mode": mode,
            "cutover_at": as_utc(at) if at is not None else None,
            "recorded_at": self.now(),
        }
        with self.engine.begin() as conn:
            conn.execute(
                self._insert(K)
                .values(name=CUTOVER_NAME, **values)
                .on_conflict_do_update(index_elements=["name"], set_=values)
            )

    def projection(self, kind: str, object_id: str) -> Projection | None:
        with Session(self.deferred) as session:
            return session.get(Projection, (kind, object_id))


def _unavailable(cause: BaseException | None) -> StorageUnavailable:
    error = StorageUnavailable()
    error.__cause__ = cause
    return error


def _is_unavailable(exc: DBAPIError) -> bool:
    """Connection-level failures (server down, network cut, disk locked, schema missing)."""
    return isinstance(exc, (OperationalError, InterfaceError)) or exc.connection_invalidated


def _status_counts(conn: Connection) -> dict[str, int]:
    rows = conn.execute(select(E.c.status, func.count()).group_by(E.c.status)).all()
    return {row[0]: int(row[1]) for row in rows}


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
    if flt.deferred:
        clauses.append(E.c.status == EventStatus.PENDING)
        clauses.append(E.c.last_error.like(f"{DEFERRED_PREFIX}%"))
    return clauses


def _reading(claimed: Claimed) -> Reading:
    """The state a claimed event reports (see :func:`receiver.transitions.read_event`)."""
    if claimed.object_kind is None or claimed.object_id is None:
        return Reading(None)
    return read_event(
        claimed.object_kind, claimed.event_type, claimed.object_status, claimed.object_stage
    )


def _ledger_row(
    event_pk: int, handler: str, status: str, error: str | None, now: datetime
) -> dict[str, Any]:
    return {
        "event_pk": event_pk,
        "handler": handler,
        "status": status,
        "attempts": 1,
        "last_error": error,
        "updated_at": now,
    }


def _with_event_id(event: Event, event_id: str) -> Event:
    from dataclasses import replace

    return replace(event, event_id=event_id)


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
