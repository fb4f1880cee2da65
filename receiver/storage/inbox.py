"""Receive: store a delivery durably, once, and answer only after the commit.

Dedupe is the unique constraint on (``account``, ``event_id``) with ``INSERT ... ON CONFLICT
DO NOTHING`` (race-safe across processes and hosts, never check-then-insert): an event id is
unique per processor account (:mod:`receiver.core.accounts`). The same ``event_id`` with a
different body is kept in the conflicts table and flagged. Of the request headers only an
allowlist is kept (:mod:`receiver.core.headers`), the rest dropped before the row is built. The
threads of one process that store deliveries at the same moment share one write
(:mod:`receiver.storage.groupcommit`): on SQLite one transaction, and the web processes of one host
queue on a file lock (:mod:`receiver.storage.filelock`), not in SQLite's sleeping busy handler; on
PostgreSQL one statement that is its own transaction (insert-or-ignore of the batch, answering
the stored row's hash for those already there): one round trip and one commit for the batch.

On a SQLite file a webhook never waits for a long holder of the database's write lock (a
worker whose handlers run inside its transaction): a write that finds it held for longer than
:data:`STAGE_AFTER_SECONDS` stores the webhook in the intake instead, a file of its own
(:mod:`receiver.storage.intake`), and the next write that gets the lock moves what waits there
into the inbox first, in the same transaction.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection, select
from sqlalchemy.exc import DBAPIError

import receiver.core.accounts as accounts
import receiver.storage.order_refs as order_refs
from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.core.clock import as_utc
from receiver.core.errors import StorageBusy, StorageUnavailable
from receiver.core.events import Event
from receiver.core.hashing import feed
from receiver.core.headers import DEFAULT_STORED_HEADERS, clean_headers
from receiver.storage.context import Storage, is_transient_conflict, is_unavailable, unavailable
from receiver.storage.filelock import WritersLock
from receiver.storage.groupcommit import GroupCommit
from receiver.storage.held_connections import HeldConnections
from receiver.storage.intake import MOVE_BATCH, Intake, Staged
from receiver.storage.intake import failure as intake_failure
from receiver.storage.sealed_columns import same_body, seal_event_row
from receiver.storage.sql.base import Stored
from receiver.storage.sql.sqlite import (
    CONFLICT_COLUMNS,
    FIRST_DELIVERY_SQL,
    INSERT_CONFLICT_SQL,
    INSERT_REFERENCES_SQL,
    STORED_ROW_SQL,
    SQLiteStatements,
    stored_of,
    utc_text,
)
from receiver.storage.sql.tables import CONFLICT, DIGESTS, EVENT, EVENT_COLUMNS, PATHS
from receiver.storage.tables import EventStatus, Source

log = logging.getLogger("receiver.store")

#: Beside a SQLite database file: the lock its web processes take to write (an empty file
#: but for its holder's stamp, see :mod:`receiver.storage.filelock`).
WRITERS_LOCK_SUFFIX = "-hookledger-writers"

#: SQLite file with an intake: a webhook waits for the database's write lock only while its
#: holder has held it for less than this (seconds; a web process's commit or a worker's turn
#: of about 20 ms); once held longer (a worker's handlers running inside its transaction, an
#: operator's command, the shop's own writes), the webhook is stored in the intake instead.
STAGE_AFTER_SECONDS = 0.04

#: The key of an inbox row's values that lets its write go to the intake (a webhook's).
MAY_STAGE = "hookledger_may_stage"

InsertResult = Literal["inserted", "duplicate", "conflict"]

#: PostgreSQL: whether the threads of a process share one statement per batch (group
#: commit). Off: measured slower (bench/HISTORY.md). PostgreSQL already
#: merges the WAL flushes of concurrent sessions' commits; queueing a process's threads
#: behind one batch in flight cut the sessions writing at once from 8 to 2, and under load
#: the receive rate fell below the yardstick's half (p99 in seconds).
PG_GROUP_COMMIT = False

#: SQLite: the stored rows of some event ids (``{}``: one ``?`` per id).
_STORED_SQL = (
    "SELECT account, event_id, id, body_sha256, key_id FROM hookledger_event"
    " WHERE account IN ({}) AND event_id IN ({})"
)

#: Sources whose event ids hookledger derives from the transition (not the processor's ids).
_DERIVED = frozenset({Source.API, Source.RECONCILE, Source.BACKFILL})

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class Inserted:
    """What :meth:`Inbox.insert` did with a delivery. ``staged``: it was stored in the intake
    (:mod:`receiver.storage.intake`) and enters the inbox with the next move. ``pk``: the
    inbox row's id (of the delivery, or of the stored row it duplicates or conflicts with);
    0 while that row is still in the intake."""

    result: InsertResult
    pk: int
    staged: bool = False


def body_sha256(body: bytes) -> str:
    return feed(hashlib.sha256(), body).hexdigest()


def event_row(
    event: Event,
    body: bytes,
    now: datetime,
    *,
    headers: str,
    secret_id: str | None,
    source: str,
    replay_of: int | None,
    account: str = DEFAULT_ACCOUNT,
) -> dict[str, Any]:
    """The inbox row of a delivery to ``account`` (``headers``: as :func:`clean_headers`
    stores them)."""
    if source not in Source.ALL:
        raise ValueError(f"unknown source {source!r}")
    ref = event.object_ref
    if ref is not None and ref.object_id:
        kind: str | None = ref.kind
        object_id: str | None = ref.object_id
        object_key = accounts.object_key(account, ref.kind, ref.object_id)
        object_status = ref.status
        object_stage = ref.stage
    else:
        kind = object_id = object_status = object_stage = None
        object_key = accounts.event_key(account, event.event_id)
    timestamp = event.timestamp
    return {  # a literal: dict(**keywords) costs a microsecond more, on every delivery
        "account": account,
        "event_id": event.event_id,
        "source": source,
        "merchant_id": _clip(event.merchant_id, 255),
        "event_type": _clip(event.event_type, 64),
        "content_type": _clip(event.content_type, 64),
        "object_kind": kind,
        "object_id": _clip(object_id, 255),
        "object_status": _clip(object_status, 64),
        "object_stage": _clip(object_stage, 64),
        "object_key": object_key[:300],
        "event_time": as_utc(timestamp) if timestamp else now,
        "object_created_at": event.object_created_time,
        "received_at": now,
        "body": body,
        "headers": headers,
        "body_sha256": body_sha256(body),
        "secret_id": secret_id,
        "replay_of": replay_of,
        "status": EventStatus.PENDING,
        "attempts": 0,
        "next_attempt_at": now,
    }


class Inbox:
    """Insert-or-ignore of deliveries, webhooks and synthesised events alike."""

    def __init__(
        self,
        storage: Storage,
        *,
        write_wait: float = 5.0,
        headers: frozenset[str] = DEFAULT_STORED_HEADERS,
        intake: Intake | None = None,
    ) -> None:
        """``write_wait``: on SQLite, how long a delivery waits for this process's other
        threads' inserts before it gives up with :class:`StorageUnavailable`. ``headers``:
        the request headers kept with each delivery (see :func:`stored_headers`).
        ``intake``: a SQLite file's intake (:mod:`receiver.storage.intake`), where a webhook
        goes when the database's write lock is held for long (``None``: it waits)."""
        self.storage = storage
        self.headers = headers
        sql = storage.sql
        self._sql = sql
        self._write_wait = write_wait
        #: This process's threads write through one queue (group commit). SQLite: woken as
        #: soon as the writer is free, rather than each in SQLite's busy handler, which polls
        #: with sleeps of up to 100 ms (that sleeping was the receive path's tail latency).
        #: PostgreSQL (if :data:`PG_GROUP_COMMIT`): one statement per batch; otherwise each
        #: thread's delivery is one statement of its own (one round trip, no BEGIN/COMMIT).
        group = sql.single_writer or (sql.one_statement_batches and PG_GROUP_COMMIT)
        self._group: GroupCommit[dict[str, Any], Inserted] | None = (
            GroupCommit(self._insert_batch) if group else None
        )
        #: PostgreSQL: a batch is one statement, its own transaction (no BEGIN, no COMMIT),
        #: on a driver connection each thread holds (the rare follow-ups go through the pool).
        self._autocommit = storage.engine.execution_options(isolation_level="AUTOCOMMIT")
        self._insert_conflict = sql.insert(CONFLICT).on_conflict_do_nothing(
            index_elements=["account", "event_id", "body_sha256"]
        )
        #: SQLite file: the web processes of this host queue for writing on a file lock,
        #: not in SQLite's sleeping busy handler (see :mod:`receiver.storage.filelock`).
        engine = storage.engine
        database = engine.url.database if sql.single_writer else None
        self._writers = (
            WritersLock(database + WRITERS_LOCK_SUFFIX)
            if database and database != ":memory:" and not database.startswith("file:")
            else None
        )
        #: The driver connection each thread holds for its writes (PostgreSQL: a batch's
        #: one statement; SQLite file: the pre-read and the batch's transaction; the rare
        #: follow-ups and conflicts go through SQLAlchemy). None for a SQLite database in
        #: memory (its one connection is the pool's).
        self._held = (
            HeldConnections(engine)
            if sql.one_statement_batches or self._writers is not None
            else None
        )
        #: A SQLite file's intake (none in memory, none on PostgreSQL).
        self.intake = intake if self._writers is not None else None
        #: Ids of intake rows the inbox refused (left there, not read again by this process).
        self._stuck: set[int] = set()

    def __repr__(self) -> str:
        return f"Inbox(dialect={self._sql.name!r})"

    def insert(
        self,
        event: Event,
        body: bytes,
        *,
        headers: Iterable[tuple[str, str]] = (),
        secret_id: str | None = None,
        source: str = Source.WEBHOOK,
        replay_of: int | None = None,
        account: str = DEFAULT_ACCOUNT,
        may_stage: bool = False,
    ) -> Inserted:
        """Store a delivery to ``account`` durably; return after commit.

        A new ``event_id`` is inserted; the same ``event_id`` with the same body is a
        duplicate; with a different body it is kept in the conflicts table and flagged.
        Raises :class:`StorageUnavailable` when the database cannot be reached, and its
        subclass :class:`StorageBusy` when a lock the insert needs stayed held past the wait
        (the busy timeout on SQLite, the lock or statement timeout on PostgreSQL).

        Deliveries stored by this process's threads at the same moment share one write and
        one commit (:mod:`receiver.storage.groupcommit`); each still gets its own answer, and only
        after the commit.

        ``may_stage`` (the receive path): on a SQLite file with an intake, when the database's
        write lock is held for long, the delivery is stored in the intake instead (answered
        the same, :attr:`Inserted.staged` set); a caller that needs the inbox row's id at
        once (``observe``) leaves it off.
        """
        values = self.row(
            event,
            body,
            headers=headers,
            secret_id=secret_id,
            source=source,
            replay_of=replay_of,
            account=account,
        )
        if may_stage and self.intake is not None:
            values[MAY_STAGE] = True
        if self._group is None:
            outcome = self._insert_batch([values])[0]
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        if self._sql.single_writer and self._held is not None:
            duplicate = self._committed_duplicate(values)
            if duplicate is not None:
                return duplicate
        try:
            return self._group.submit(values, timeout=self._write_wait)
        except TimeoutError:
            # The write in flight (this process's other threads' deliveries) waits for the
            # database's lock: busy, not down.
            log.warning(
                "webhook not stored: the database stayed locked for %g s",
                self._write_wait,
                extra={"action": "busy"},
            )
            raise StorageBusy() from None

    def insert_on(
        self,
        conn: Connection,
        event: Event,
        body: bytes,
        *,
        source: str,
        headers: Iterable[tuple[str, str]] = (),
        secret_id: str | None = None,
        account: str = DEFAULT_ACCOUNT,
    ) -> Inserted:
        """Store a delivery on ``conn``, inside the caller's transaction (it commits, or rolls
        back, with the caller's own writes). Same dedupe and conflict rules as :meth:`insert`."""
        values = self.row(
            event, body, headers=headers, secret_id=secret_id, source=source, account=account
        )
        return self._insert_one(conn, values)

    def insert_synthesised(
        self,
        events: Sequence[tuple[Event, bytes]],
        *,
        source: str = Source.RECONCILE,
        unless_queued: bool = False,
        account: str = DEFAULT_ACCOUNT,
    ) -> dict[str, str]:
        """Insert the reconciler's synthesised events in one transaction (insert-or-ignore).

        Returns ``{event_id: "inserted" | <status of the row already there>}``. A synthesised
        id is deterministic per transition while the remote object's body may have changed
        since (a later refund, say), so a different body under a known id is no conflict.
        With ``unless_queued``, an event whose object already has an event waiting in the
        inbox (pending or being processed) is not inserted but answered ``"queued"``: what the
        worker does next may settle the object (checked in the same transaction).
        """
        if not events:
            return {}
        now = self.storage.now()
        rows = [self.row(e, b, source=source, now=now, account=account) for e, b in events]
        try:
            with self.storage.engine.begin() as conn:
                waiting: set[str] = set()
                if unless_queued:
                    waiting = self._sql.waiting_objects(
                        conn, sorted({r["object_key"] for r in rows})
                    )
                queued = {r["event_id"] for r in rows if r["object_key"] in waiting}
                rows = [r for r in rows if r["event_id"] not in queued]
                inserted = self._sql.insert_events(conn, rows) if rows else {}
                order_refs.write_for(
                    conn,
                    self._sql,
                    [(r, inserted[r["event_id"]]) for r in rows if r["event_id"] in inserted],
                )
                others = [r["event_id"] for r in rows if r["event_id"] not in inserted]
                found: dict[str, str] = {}
                if others:
                    found = {
                        r[0]: r[1]
                        for r in conn.execute(
                            select(EVENT.c.event_id, EVENT.c.status).where(
                                EVENT.c.account == account,
                                self._sql.among(EVENT.c.event_id, others),
                            )
                        )
                    }
        except DBAPIError as exc:
            if not is_unavailable(exc):
                raise
            raise unavailable(exc) from exc
        answers = {r["event_id"]: found.get(r["event_id"], "inserted") for r in rows}
        answers.update(dict.fromkeys(queued, "queued"))
        return answers

    def waiting(self, object_keys: Iterable[str]) -> set[str]:
        """Those of ``object_keys`` (``kind:id``) with an event open in the inbox."""
        keys = sorted(set(object_keys))
        if not keys:
            return set()
        with self.storage.deferred.connect() as conn:
            return self._sql.waiting_objects(conn, keys)

    def row(
        self,
        event: Event,
        body: bytes,
        *,
        headers: Iterable[tuple[str, str]] = (),
        secret_id: str | None = None,
        source: str = Source.WEBHOOK,
        replay_of: int | None = None,
        now: datetime | None = None,
        account: str = DEFAULT_ACCOUNT,
    ) -> dict[str, Any]:
        """The inbox row of a delivery, as :meth:`insert` writes it (sealed with the primary
        data key, if one is configured: see :mod:`receiver.storage.sealed_columns`), with
        its order references (:mod:`receiver.storage.order_refs`)."""
        values = event_row(
            event,
            body,
            self.storage.now() if now is None else now,
            headers=clean_headers(headers, self.headers),
            secret_id=secret_id,
            source=source,
            replay_of=replay_of,
            account=account,
        )
        storage = self.storage
        sealed = seal_event_row(storage.keyring, values)
        return order_refs.add_references(sealed, event.raw, storage.order_fields, storage.keyring)

    # -- the write path -------------------------------------------------------------------

    def _insert_together(self, rows: list[dict[str, Any]]) -> list[Inserted]:
        """Insert deliveries in one transaction (see :meth:`insert`)."""
        if self._writers is None:
            return self._insert_transaction(rows)
        if self.intake is not None and any(values.get(MAY_STAGE) for values in rows):
            return self._insert_or_stage(rows)
        try:
            with self._writers.hold(self._write_wait):
                return self._insert_transaction(rows)
        except TimeoutError as exc:  # another writer kept the lock: busy
            raise StorageBusy() from exc
        except OSError as exc:  # its file cannot be opened
            raise StorageUnavailable() from exc

    def _insert_transaction(
        self,
        rows: list[dict[str, Any]],
        *,
        busy: float | None = None,
        notes: Sequence[tuple[str, str]] = (),
    ) -> list[Inserted]:
        """Insert deliveries in one transaction of the database (the caller holds its writers'
        lock); with an intake, what waits there is moved in the same transaction, first (see
        :mod:`receiver.storage.intake`), with ``notes`` (first deliveries: account, time).
        ``busy``: wait that long for SQLite's lock, then raise :class:`_Busy`."""
        return self._transaction(rows, busy=busy, notes=notes)[0]

    def _transaction(
        self,
        rows: list[dict[str, Any]],
        *,
        busy: float | None = None,
        notes: Sequence[tuple[str, str]] = (),
        limit: int = MOVE_BATCH,
    ) -> tuple[list[Inserted], int, int]:
        """:meth:`_insert_transaction`, how many deliveries it read from the intake (at most
        ``limit``, besides those of ``rows``' event ids) and how many of them it moved.

        With an intake, the database's write lock is taken first (``BEGIN IMMEDIATE``) and
        the intake's lock only then, held from the read of the intake to the commit and the
        delete: the intake's lock is never held while waiting for the database's, so a
        webhook that goes to the intake never waits behind a writer that waits for a long
        holder of the database's lock (an operator's command, the shop's own writes, a
        script). It is taken even before the intake file exists: a webhook staged by
        another process meanwhile (making the file) is judged after this commit."""
        intake = self.intake
        if intake is None:
            return self._write(rows, None, notes, busy), 0, 0
        keys = {(values["account"], values["event_id"]) for values in rows}
        taken: list[tuple[list[Staged], list[tuple[str, str]]]] = []
        replaced: list[bool] = []
        try:
            with ExitStack() as held:

                def take() -> tuple[Sequence[Staged], list[tuple[str, str]]]:
                    # (Inside the database's transaction, its write lock held.)
                    try:
                        held.enter_context(intake.hold(self._write_wait))
                    except OSError:
                        if intake.exists():
                            raise
                        # Its lock file cannot be made (the folder of a configured intake
                        # missing or read-only): no intake either, nothing to move.
                        return (), list(notes)
                    if not intake.exists():
                        return (), list(notes)
                    try:
                        if intake.replaced():
                            # Deleted or replaced while in use: all it holds, then the file
                            # at the path from the next write on.
                            replaced.append(True)
                            staged = intake.pending(2**31, keys, skip=self._stuck)
                        else:
                            staged = intake.pending(limit, keys, skip=self._stuck)
                        waiting = intake.notes()
                    except DBAPIError as exc:
                        raise intake_failure(exc) from exc
                    taken.append((staged, waiting))
                    return staged, [*waiting, *notes]

                stuck: list[Staged] = []
                written = self._write(rows, take, notes, busy, stuck)
                if not taken:
                    return written, 0, 0
                staged, waiting = taken[0]
                left = {each.id for each in stuck}
                moved = [each for each in staged if each.id not in left]
                self._forget(moved, waiting)
                if replaced and not stuck:
                    log.warning(
                        "the intake %s was deleted or replaced while in use: what this "
                        "process held in it is in the inbox now; the file at the path is "
                        "used from now on",
                        intake.path,
                        extra={"action": "intake_reopened"},
                    )
                    intake.close()
                    self._stuck.clear()
                return written, len(staged), len(moved)
        except TimeoutError as exc:  # another writer kept the intake's lock: busy
            raise StorageBusy() from exc
        except OSError as exc:  # the intake's lock file cannot be opened
            raise StorageUnavailable() from exc
        except DBAPIError as exc:  # the intake could not be read
            if not is_unavailable(exc):
                raise
            raise unavailable(exc) from exc

    def _write(
        self,
        rows: list[dict[str, Any]],
        take: Callable[[], tuple[Sequence[Staged], list[tuple[str, str]]]] | None,
        notes: Sequence[tuple[str, str]],
        busy: float | None,
        stuck: list[Staged] | None = None,
    ) -> list[Inserted]:
        """The database's transaction of :meth:`_transaction`: ``take()``, called once the
        database's write lock is held, gives what to move from the intake (and the notes);
        the deliveries the inbox refused are added to ``stuck``."""
        stuck = [] if stuck is None else stuck

        def on_driver(conn: Any) -> list[Inserted]:
            staged, moved_notes = take() if take is not None else ((), list(notes))
            if staged or moved_notes:
                stuck.extend(self._move_on(conn, staged, moved_notes))
            return [self._insert_one_on_driver(conn, values) for values in rows]

        # With an intake each transaction says how long to wait for SQLite's lock (the held
        # connection keeps the last one said), and takes it at BEGIN, before the intake's.
        wait = busy if busy is not None else self._write_wait
        try:
            if self._held is not None:
                return self._held.transaction(
                    on_driver,
                    busy_ms=int(wait * 1000) if self.intake is not None else None,
                    immediate=self.intake is not None,
                )
        except DBAPIError as exc:
            if busy is not None and is_transient_conflict(exc):
                raise _Busy() from exc
            if not is_unavailable(exc):
                raise
            raise unavailable(exc) from exc
        assert take is None  # (an intake is only ever beside a file, whose writes are held)
        try:
            with self.storage.deferred.begin() as conn:
                if notes:
                    self._move_on(conn.connection.driver_connection, (), notes)
                return [self._insert_one(conn, values) for values in rows]
        except DBAPIError as exc:
            if not is_unavailable(exc):
                raise
            raise unavailable(exc) from exc

    # -- SQLite file: the intake ----------------------------------------------------------

    def _insert_or_stage(self, rows: list[dict[str, Any]]) -> list[Inserted]:
        """Write webhooks into the inbox if the database's lock is free or held briefly;
        into the intake if its holder has held it for longer than
        :data:`STAGE_AFTER_SECONDS`. Deliveries that may not wait there (an observation,
        a replay) are written into the inbox as before, waiting for the lock."""
        others = [i for i, values in enumerate(rows) if not values.get(MAY_STAGE)]
        if others:
            mine = [i for i in range(len(rows)) if i not in set(others)]
            outcomes: list[Inserted | None] = [None] * len(rows)
            for part, written in (
                (others, self._insert_together([rows[i] for i in others])),
                (mine, self._insert_or_stage([rows[i] for i in mine])),
            ):
                for index, outcome in zip(part, written, strict=True):
                    outcomes[index] = outcome
            return [o for o in outcomes if o is not None]
        assert self._writers is not None
        try:
            with self._writers.hold(self._write_wait, patience=STAGE_AFTER_SECONDS):
                return self._insert_transaction(rows, busy=STAGE_AFTER_SECONDS)
        except (TimeoutError, _Busy):
            pass  # held for long: the intake
        except OSError as exc:  # the lock's file cannot be opened
            raise StorageUnavailable() from exc
        return self._stage(rows)

    def _stage(self, rows: list[dict[str, Any]]) -> list[Inserted]:
        """Store webhooks in the intake, judged against the inbox and the intake."""
        intake = self.intake
        assert intake is not None
        return self._under_intake_lock(
            intake,
            lambda: intake.transaction(
                lambda conn: [self._stage_one(conn, values) for values in rows]
            ),
        )

    def _stage_one(self, conn: Any, values: dict[str, Any]) -> Inserted:
        """One webhook into the intake (``conn``: its transaction, under its lock): a
        duplicate or a conflict of what the inbox holds (read without a lock: a committed
        row), else of what the intake holds; else new."""
        sql = self._sql
        assert isinstance(sql, SQLiteStatements) and self._held is not None
        account, event_id = values["account"], values["event_id"]
        found = self._held.fetchall(STORED_ROW_SQL, (account, event_id))
        stored = stored_of(found[0] if found else None) or Intake.first_stored(
            conn, account, event_id
        )
        bound = sql.bound_event(values)
        if stored is None:
            Intake.stage(conn, "inserted", bound, values[PATHS], values[DIGESTS])
            return Inserted(result="inserted", pk=0, staged=True)
        if self._judge(values, stored) == "duplicate":
            return Inserted(result="duplicate", pk=stored.pk)
        # Kept to be moved after the first one: the move records it as the conflict it is.
        Intake.stage(conn, "conflict", bound, values[PATHS], values[DIGESTS])
        _log_conflict(values)
        return Inserted(result="conflict", pk=stored.pk, staged=True)

    def _move_on(
        self, conn: Any, staged: Sequence[Staged], notes: Sequence[tuple[str, str]]
    ) -> list[Staged]:
        """Write what waited in the intake into the inbox on the sqlite3 connection ``conn``
        (in the caller's transaction), as the receive path writes a delivery: the first
        deliveries (before the deliveries they bound), then each delivery in arrival order
        with its order index rows; one whose event id is there already is a duplicate (moved
        before: a crash came between the two commits) or a conflict (kept as such).

        Each delivery is written under a savepoint: one the inbox refuses (a constraint it
        breaks: an intake row from another hookledger version, say) is left in the intake,
        logged, and returned, rather than failing every webhook written with the move and
        every move after it."""
        sql = self._sql
        assert isinstance(sql, SQLiteStatements)
        now = utc_text(self.storage.now())
        for account, at in notes:
            conn.execute(FIRST_DELIVERY_SQL, (account, at, now))
        stuck: list[Staged] = []
        for each in staged:
            conn.execute("SAVEPOINT hookledger_move")
            try:
                self._move_one(conn, sql, each)
            except (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.DataError) as exc:
                conn.execute("ROLLBACK TO hookledger_move")
                stuck.append(each)
                if each.id not in self._stuck:
                    log.error(
                        "a webhook in the intake cannot be written into the inbox (%s: %s); "
                        "it stays in the intake",
                        type(exc).__name__,
                        str(exc).splitlines()[0][:200] if str(exc) else "",
                        extra={
                            "action": "intake_stuck",
                            "event_id": each["event_id"],
                            "account": each["account"],
                        },
                    )
            finally:
                conn.execute("RELEASE hookledger_move")
        self._stuck.update(each.id for each in stuck)
        return stuck

    def _move_one(self, conn: Any, sql: SQLiteStatements, each: Staged) -> None:
        """One delivery of :meth:`_move_on`."""
        pk = sql.insert_bound_on_driver(conn, each.bound)
        if pk is not None:
            for path, digest in zip(each.paths, each.digests, strict=True):
                conn.execute(
                    INSERT_REFERENCES_SQL, (pk, path, each["account"], digest, each["key_id"])
                )
            return
        stored = sql.stored_on_driver(conn, *each.key)
        if stored is None:  # ignored, yet not there: cannot be, under the write lock
            raise RuntimeError("an insert was ignored for a row that is not stored")
        values = {
            name: each[name]
            for name in ("account", "event_id", "event_type", "source", "body")
            + ("body_sha256", "key_id")
        }
        if self._judge(values, stored) == "conflict":
            conn.execute(INSERT_CONFLICT_SQL, [each[name] for name in CONFLICT_COLUMNS])
            if each.answer != "conflict":  # (a conflict was logged when it was answered)
                _log_conflict(values)

    def _forget(self, staged: Sequence[Staged], notes: Sequence[tuple[str, str]]) -> None:
        """Delete from the intake what the inbox holds now. A failure only leaves them
        there: the next move finds them in the inbox and deletes them then."""
        assert self.intake is not None
        try:
            self.intake.forget(staged, notes)
        except DBAPIError as exc:
            log.warning(
                "moved deliveries not yet deleted from the intake (the next move will): %s",
                type(exc.orig or exc).__name__,
                extra={"action": "intake_forget"},
            )

    def move_intake(self, *, writers_held: bool = False) -> int:
        """Move the deliveries waiting in the intake into the inbox, in transactions of up to
        :data:`receiver.storage.intake.MOVE_BATCH` (the worker, before each claim, under the
        claim's writers' lock: ``writers_held``; the commands that need every delivery in
        the inbox). Returns how many were moved.
        Raises ``TimeoutError`` when the database's writers' lock stayed taken, and
        :class:`StorageUnavailable` when the database cannot be reached, its lock stayed
        taken (:class:`StorageBusy`) or the intake's did, or
        :class:`receiver.storage.intake.IntakeUnreadable` when the intake cannot be read."""
        intake = self.intake
        try:
            if intake is None or not intake.any():
                return 0
        except DBAPIError as exc:
            raise intake_failure(exc) from exc
        assert self._writers is not None
        moved = 0
        while True:
            with nullcontext() if writers_held else self._writers.hold(self._write_wait):
                _, read, count = self._transaction([])
            moved += count
            if read < MOVE_BATCH:
                return moved

    def note_first_delivery(self, at: datetime, *, account: str = DEFAULT_ACCOUNT) -> None:
        """SQLite file with an intake: keep ``at`` as ``account``'s first delivery (see
        :meth:`receiver.storage.operator_actions.Operations.note_delivery`), in the database
        if its lock is free or held briefly, else in the intake, whence it is moved before
        any delivery. Raises :class:`StorageUnavailable` when neither can be written."""
        intake = self.intake
        assert intake is not None and self._writers is not None
        note = (account, utc_text(as_utc(at)) or "")
        try:
            with self._writers.hold(self._write_wait, patience=STAGE_AFTER_SECONDS):
                self._insert_transaction([], busy=STAGE_AFTER_SECONDS, notes=[note])
                return
        except (TimeoutError, _Busy):
            pass
        except OSError as exc:  # the lock's file cannot be opened
            raise StorageUnavailable() from exc
        self._under_intake_lock(intake, lambda: intake.note(*note))

    def _under_intake_lock(self, intake: Intake, write: Callable[[], T]) -> T:
        """``write()`` to the intake under its lock, once the file is the one at its path;
        a lock held past the wait is busy, a lock file or intake that cannot be opened is
        the storage's outage."""
        try:
            with intake.hold(self._write_wait):
                intake.check_current()
                return write()
        except TimeoutError as exc:  # another writer kept the intake's lock: busy
            raise StorageBusy() from exc
        except OSError as exc:  # the intake's lock file cannot be opened
            raise StorageUnavailable() from exc
        except DBAPIError as exc:
            if not is_unavailable(exc):
                raise
            raise unavailable(exc) from exc

    def _insert_batch(self, rows: list[dict[str, Any]]) -> list[Inserted | BaseException]:
        """:class:`GroupCommit`'s writer: one write for the batch; if it fails for a reason
        other than the database being unavailable, each delivery is tried alone, so one bad
        delivery cannot fail the others. A batch may hold several accounts' deliveries (an
        event id is unique per account only: every lookup below is by account and id)."""
        try:
            if self._sql.one_statement_batches:
                return self._insert_deliveries(rows)
            if self._sql.single_writer and self._held is None:
                return self._insert_unless_stored(rows)
            # (A SQLite file's deliveries were each read by their own thread: none is a
            # committed duplicate.)
            return list(self._insert_together(rows))
        except StorageUnavailable as exc:  # busy or down: each delivery's own, same kind
            return [_same_refusal(exc) for _ in rows]
        except Exception as exc:  # noqa: BLE001 - isolated below, or that delivery's error
            if len(rows) == 1:
                return [exc]
        outcomes: list[Inserted | BaseException] = []
        for values in rows:
            outcomes.extend(self._insert_batch([values]))
        return outcomes

    def _committed_duplicate(self, values: dict[str, Any]) -> Inserted | None:
        """SQLite file: the delivery answered as a duplicate if its event id is committed
        with the same body, read on this thread's own connection without a lock (a WAL
        snapshot: with ``synchronous=FULL`` a row there is durable), so a duplicate never
        queues behind this process's writes nor waits for the writers' lock; ``None``
        otherwise (new, a conflict, or the read failed): the write decides, the
        insert-or-ignore finding a row committed since."""
        assert self._held is not None
        try:
            found = self._held.fetchall(STORED_ROW_SQL, (values["account"], values["event_id"]))
        except (sqlite3.Error, DBAPIError):
            return None  # the write decides, and reports an outage
        stored = stored_of(found[0] if found else None)
        if stored is None or self._judge(values, stored) != "duplicate":
            return None
        return Inserted(result="duplicate", pk=stored.pk)

    def _insert_unless_stored(self, rows: list[dict[str, Any]]) -> list[Inserted | BaseException]:
        """SQLite in memory (a file's deliveries are read by their own threads first:
        :meth:`_committed_duplicate`): a duplicate (its event id stored, its body the same)
        is answered from a read of the committed rows, which takes no lock (a WAL snapshot:
        a row there is committed, with ``synchronous=FULL`` durably); the rest are written,
        under the write lock, by the insert-or-ignore that decides (a row committed since
        the read is found there)."""
        accounts = sorted({values["account"] for values in rows})
        event_ids = sorted({values["event_id"] for values in rows})
        statement = _STORED_SQL.format(
            ", ".join("?" * len(accounts)), ", ".join("?" * len(event_ids))
        )
        found: Sequence[Any]
        try:
            with self.storage.deferred.connect() as conn:
                found = conn.exec_driver_sql(statement, (*accounts, *event_ids)).all()
            known = {(r[0], r[1]): Stored(int(r[2]), r[3], r[4]) for r in found}
        except (sqlite3.Error, DBAPIError):
            known = {}  # the write below decides, and reports an outage
        outcomes: list[Inserted | BaseException | None] = [None] * len(rows)
        write: list[int] = []
        for index, values in enumerate(rows):
            stored = known.get((values["account"], values["event_id"]))
            if stored is not None and self._judge(values, stored) == "duplicate":
                outcomes[index] = Inserted(result="duplicate", pk=stored.pk)
            else:
                write.append(index)
        if write:
            written = self._insert_together([rows[i] for i in write])
            for index, outcome in zip(write, written, strict=True):
                outcomes[index] = outcome
        return [o if o is not None else RuntimeError("delivery not written") for o in outcomes]

    def _insert_one_on_driver(self, conn: Any, values: dict[str, Any]) -> Inserted:
        """SQLite: :meth:`_insert_one` on this thread's held sqlite3 connection (a conflict
        kept in the same transaction: never a second one, which would wait for the database's
        lock again)."""
        sql = self._sql
        assert isinstance(sql, SQLiteStatements)
        pk = sql.insert_delivery_on_driver(conn, values)
        if pk is not None:
            sql.insert_references_on_driver(conn, values, pk)
            return Inserted(result="inserted", pk=pk)
        stored = sql.stored_on_driver(conn, values["account"], values["event_id"])
        if stored is None:  # ignored, yet not there: cannot be, under the write lock
            raise RuntimeError("an insert was ignored for a row that is not stored")
        result = self._judge(values, stored)
        if result == "conflict":
            bound = dict(zip(EVENT_COLUMNS, sql.bound_event(values), strict=True))
            conn.execute(INSERT_CONFLICT_SQL, [bound[name] for name in CONFLICT_COLUMNS])
            _log_conflict(values)
        return Inserted(result=result, pk=stored.pk)

    def _insert_one(self, conn: Connection, values: dict[str, Any]) -> Inserted:
        pk = self._sql.inserted_pk(conn.execute(self._sql.insert_event, values))
        if pk is not None:
            order_refs.write_for(conn, self._sql, [(values, pk)])
            return Inserted(result="inserted", pk=pk)
        stored = self._stored(conn, values["account"], [values["event_id"]])[values["event_id"]]
        result = self._judge(values, stored)
        if result == "conflict":
            conn.execute(self._insert_conflict, conflict_row(values))
            _log_conflict(values)
        return Inserted(result=result, pk=stored.pk)

    def _judge(self, values: dict[str, Any], stored: Stored) -> InsertResult:
        """A delivery whose event id is already stored: a duplicate, or a conflict (the same
        id with a different body)."""
        if values["source"] in _DERIVED:
            # An observed or synthesised event's id is deterministic per transition while
            # the object's body may have changed since: the same transition, no conflict.
            return "duplicate"
        same = same_body(self.storage.keyring, stored.key_id, stored.body_sha256, values)
        if same is None:
            log.warning(
                "event_id delivered again; its stored body hash is keyed with data key %r, "
                "which is not configured: taken as a duplicate",
                stored.key_id,
                extra={"action": "duplicate_uncompared", "event_id": values["event_id"]},
            )
        return "conflict" if same is False else "duplicate"

    # -- PostgreSQL: a batch is one statement ---------------------------------------------

    def _insert_deliveries(self, rows: list[dict[str, Any]]) -> list[Inserted | BaseException]:
        """A batch in one statement (its own transaction). A delivery whose event id came
        earlier in the same batch is written after it, so it is answered as the duplicate (or
        conflict) it is."""
        seen: set[str] = set()
        first: list[int] = []
        again: list[int] = []
        for index, values in enumerate(rows):
            (again if values["event_id"] in seen else first).append(index)
            seen.add(values["event_id"])
        outcomes: list[Inserted | BaseException | None] = [None] * len(rows)
        for index, outcome in zip(
            first, self._write_deliveries([rows[i] for i in first]), strict=True
        ):
            outcomes[index] = outcome
        if again:
            try:
                later = self._insert_deliveries([rows[i] for i in again])
            except Exception as exc:  # noqa: BLE001 - theirs alone: the first ones committed
                error = _storage_error(exc)
                later = [error] * len(again)
            for index, outcome in zip(again, later, strict=True):
                outcomes[index] = outcome
        return [o if o is not None else RuntimeError("delivery not written") for o in outcomes]

    def _write_deliveries(self, rows: list[dict[str, Any]]) -> list[Inserted | BaseException]:
        """Deliveries with distinct event ids: one insert-or-ignore statement, then, only for
        conflicts (rare), one statement storing them. Raises :class:`StorageUnavailable`
        when the database cannot be reached (nothing was written then).

        The statement runs on this thread's held driver connection
        (:mod:`receiver.storage.held_connections`). No pre-ping: a connection that died while
        idle fails the statement, which is then run once more on a new connection (safe:
        the statement is its own transaction and idempotent; had the lost attempt committed,
        the delivery is answered as a duplicate of itself, acknowledged all the same)."""
        try:
            assert self._held is not None
            written = self._sql.insert_deliveries(self._held.fetchall, rows)
            missing = [
                v["event_id"]
                for v in rows
                if v["event_id"] not in written.inserted and v["event_id"] not in written.found
            ]
            if missing:  # committed by another session while the statement ran
                with self._autocommit.connect() as conn:
                    for account in {v["account"] for v in rows}:
                        written.found.update(
                            self._stored(
                                conn,
                                account,
                                [v["event_id"] for v in rows if v["account"] == account],
                                only=missing,
                            )
                        )
        except DBAPIError as exc:
            if not is_unavailable(exc):
                raise
            raise unavailable(exc) from exc
        outcomes: list[Inserted | BaseException] = []
        conflicts: list[int] = []
        for values in rows:
            event_id = values["event_id"]
            pk = written.inserted.get(event_id)
            if pk is not None:
                outcomes.append(Inserted(result="inserted", pk=pk))
                continue
            stored = written.found.get(event_id)
            if stored is None:  # neither inserted nor there (deleted meanwhile): not stored
                outcomes.append(StorageUnavailable())
                continue
            result = self._judge(values, stored)
            if result == "conflict":
                conflicts.append(len(outcomes))
            outcomes.append(Inserted(result=result, pk=stored.pk))
        if conflicts:
            try:
                with self._autocommit.connect() as conn:
                    conn.execute(self._insert_conflict, [conflict_row(rows[i]) for i in conflicts])
            except Exception as exc:  # noqa: BLE001 - the conflicts' alone: the rest committed
                error = _storage_error(exc)
                for index in conflicts:
                    outcomes[index] = error
            else:
                for index in conflicts:
                    _log_conflict(rows[index])
        return outcomes

    def _stored(
        self,
        conn: Connection,
        account: str,
        event_ids: list[str],
        *,
        only: Sequence[str] | None = None,
    ) -> dict[str, Stored]:
        """The stored rows of ``account``'s ``event_ids`` (those also in ``only``, if given)."""
        wanted = [e for e in event_ids if only is None or e in only]
        if not wanted:
            return {}
        query = select(EVENT.c.event_id, EVENT.c.id, EVENT.c.body_sha256, EVENT.c.key_id).where(
            EVENT.c.account == account, self._sql.among(EVENT.c.event_id, wanted)
        )
        return {r[0]: Stored(int(r[1]), r[2], r[3]) for r in conn.execute(query)}


class _Busy(Exception):
    """SQLite's write lock stayed taken past the short wait of a write that may go to the
    intake instead."""


def conflict_row(values: dict[str, Any]) -> dict[str, Any]:
    """The conflicts-table row of a delivery (``values``: its inbox row, sealed as stored)."""
    return dict(
        account=values["account"],
        event_id=values["event_id"],
        source=values["source"],
        body=values["body"],
        headers=values["headers"],
        body_sha256=values["body_sha256"],
        secret_id=values["secret_id"],
        received_at=values["received_at"],
        key_id=values["key_id"],
    )


def _log_conflict(values: dict[str, Any]) -> None:
    log.warning(
        "event_id delivered again with a different body",
        extra={
            "action": "conflict",
            "event_id": values["event_id"],
            "event_type": values["event_type"],
        },
    )


def _same_refusal(exc: StorageUnavailable) -> StorageUnavailable:
    """A refusal of the same kind as ``exc`` (busy or unavailable), for another delivery."""
    error = type(exc)()
    error.__cause__ = exc.__cause__
    return error


def _storage_error(exc: Exception) -> Exception:
    """``exc`` as a delivery's outcome: :class:`StorageUnavailable` for a database outage
    (:class:`StorageBusy` when the database was busy)."""
    if isinstance(exc, DBAPIError) and is_unavailable(exc):
        return unavailable(exc)
    return exc


def _clip(value: str | None, size: int) -> str | None:
    return value[:size] if isinstance(value, str) else None
