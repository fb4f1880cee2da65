"""What differs between the two databases, as one interface.

The parts of the store (:mod:`receiver.storage.inbox`, :mod:`receiver.storage.queue`,
:mod:`receiver.storage.dispatch`,
:mod:`receiver.storage.operator_actions`) hold the logic and call these builders where PostgreSQL
and SQLite
need different SQL. :mod:`receiver.storage.sql.postgresql` and :mod:`receiver.storage.sql.sqlite`
implement them in the same order, so the two versions of one statement can be read side by side.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import Connection, CursorResult, Select, Table, delete, func, select

from receiver.storage.sql.tables import EVENT, LEASE

#: Runs one statement with the driver's own placeholders as its own transaction; its rows.
Fetchall = Callable[[str, Mapping[str, Any]], list[tuple[Any, ...]]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcomes:
    """What a dispatched batch writes, as rows of parameters (see
    :data:`receiver.storage.sql.tables.OUTCOME_COLUMNS`): all of it commits, or none of it."""

    transitions: Sequence[dict[str, Any]] = field(default_factory=list)
    projections: Sequence[dict[str, Any]] = field(default_factory=list)
    ledger: Sequence[dict[str, Any]] = field(default_factory=list)
    #: One row per claimed event (``b_`` keys): its final status, and the worker (``b_owner``)
    #: that must still hold its object's lease (``b_key``).
    finals: Sequence[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Stored:
    """What the inbox holds under an event id: the row's id, its body hash and the data key
    that hash is keyed with (``None``: plain SHA-256)."""

    pk: int
    body_sha256: str
    key_id: str | None


@dataclass(frozen=True, slots=True)
class DeliveriesWritten:
    """What :meth:`Statements.insert_deliveries` did: the ids of the rows inserted, and the
    rows found in their place for the others (those committed before the statement began; a
    row committed while it ran is in neither: read it again)."""

    inserted: dict[str, int]
    found: dict[str, Stored]


class Statements(ABC):
    """The dialect-specific statements of the inbox, for one engine's dialect."""

    #: The SQLAlchemy dialect name.
    name: ClassVar[str]
    #: One writer at a time for the whole database (SQLite): its transactions take the lock
    #: up front, so a read followed by a write in one of them is atomic.
    single_writer: ClassVar[bool]
    #: A batch of deliveries is one statement, run as its own transaction (autocommit), that
    #: also answers what was found instead (:meth:`insert_deliveries`); otherwise a batch is
    #: one transaction of :attr:`insert_event` per delivery.
    one_statement_batches: ClassVar[bool] = False

    @abstractmethod
    def insert(self, table: Table) -> Any:
        """The dialect's ``INSERT`` (with ``ON CONFLICT``) on ``table``."""

    @abstractmethod
    def among(self, column: Any, values: Iterable[Any]) -> Any:
        """``column IN (values)``."""

    # -- inbox ----------------------------------------------------------------------------

    @property
    @abstractmethod
    def insert_event(self) -> Any:
        """Insert-or-ignore one delivery on ``event_id`` (built once: building it per request
        cost more than executing it)."""

    @abstractmethod
    def inserted_pk(self, result: CursorResult[Any]) -> int | None:
        """The id of the row :attr:`insert_event` inserted, ``None`` if it was ignored."""

    def insert_deliveries(
        self, fetchall: Fetchall, rows: Sequence[dict[str, Any]]
    ) -> DeliveriesWritten:
        """Insert-or-ignore deliveries with distinct event ids in one statement, run by
        ``fetchall`` (its own transaction: see :attr:`one_statement_batches`)."""
        raise NotImplementedError(f"{self.name}: one transaction per batch instead")

    @abstractmethod
    def insert_events(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> dict[str, int]:
        """Insert-or-ignore many new events at once; return the inbox ids of those inserted
        by event id."""

    @abstractmethod
    def waiting_objects(self, conn: Connection, object_keys: Sequence[str]) -> set[str]:
        """Those of ``object_keys`` with an event open in the inbox (pending or being
        processed), found through the object index: one probe per key, whatever the number
        of open events of other objects."""

    @abstractmethod
    def events_of_objects(self, columns: Sequence[Any], object_keys: Sequence[str]) -> Select[Any]:
        """``columns`` of every stored event of ``object_keys``, read through the object
        index only (an object has few events; the inbox may hold millions, and the open
        ones may be a backlog), whatever the planner's statistics."""

    # -- queue ----------------------------------------------------------------------------

    #: The statement of :meth:`accounts_open` (``:after``, ``:limit``).
    accounts_open_sql: ClassVar[Any]

    @abstractmethod
    def due_candidates(self, due: Any, now: datetime, scan: int, account: str) -> Any:
        """The query of up to ``scan`` due events of ``account`` (``due``, at ``now``):
        ``id, object_key`` by ``next_attempt_at, id``, read through the index over open
        events in that order (it stops after ``scan`` rows, whatever the backlog)."""

    #: Whether the index over open events keeps the entries of events that are no longer
    #: open until a vacuum (PostgreSQL: the dead row versions of every event done since),
    #: at its low end, where each walk in due order starts; the queue then starts its walks
    #: at a floor (see :meth:`receiver.storage.queue.Queue._candidates`).
    open_index_keeps_done: ClassVar[bool] = False

    def due_of_accounts(
        self,
        conn: Connection,
        due: Any,
        now: datetime,
        share: int,
        accounts: Sequence[str],
        floors: Sequence[datetime] | None = None,
    ) -> list[list[tuple[str, int, datetime | None]]]:
        """Each of ``accounts``' up to ``share`` due events (``object_key, id`` and, where
        :attr:`open_index_keeps_done`, ``next_attempt_at``, else ``None``; in due order, as
        :meth:`due_candidates`), in ``accounts`` order: here one query per account (on
        SQLite a statement is a call into the library, not a round trip). ``floors``: per
        account, where its walk starts (``next_attempt_at`` at or after it); only where
        :attr:`open_index_keeps_done`, ignored elsewhere."""
        return [
            [
                (row.object_key, int(row.id), None)
                for row in conn.execute(self.due_candidates(due, now, share, account))
            ]
            for account in accounts
        ]

    def accounts_open(self, conn: Connection, after: str, limit: int) -> list[str]:
        """Up to ``limit`` accounts with open events, in order, after ``after``: a skip
        scan of the index over open events (one probe per account, whatever the backlog)."""
        rows = conn.execute(self.accounts_open_sql, {"after": after, "limit": limit})
        return [row[0] for row in rows]

    @property
    @abstractmethod
    def open_of_objects(self) -> Any:
        """The "open event" condition for reads of given objects' events (``object_key IN
        ...``): written so that the object index serves them, never an index over every
        open event (whose size is the backlog's)."""

    def heads(self, conn: Connection, object_keys: Sequence[str]) -> dict[str, Any]:
        """The head of each of ``object_keys`` that has an open event: its earliest open
        event (event time, then id), every column, by object key. Read through the object
        index (an object has few events), never an index over every open event."""
        ranked = (
            select(
                EVENT,
                func.row_number()
                .over(partition_by=EVENT.c.object_key, order_by=(EVENT.c.event_time, EVENT.c.id))
                .label("position"),
            )
            .where(self.among(EVENT.c.object_key, object_keys), self.open_of_objects)
            .subquery()
        )
        return {
            row.object_key: row
            for row in conn.execute(select(ranked).where(ranked.c.position == 1))
        }

    def give_back_leases(self, conn: Connection, object_keys: Sequence[str], owner: str) -> None:
        """Delete ``owner``'s leases of ``object_keys`` (a claim's leases it did not use)."""
        conn.execute(
            delete(LEASE).where(self.among(LEASE.c.object_key, object_keys), LEASE.c.owner == owner)
        )

    @abstractmethod
    def skip_locked(self, query: Select[Any]) -> Select[Any]:
        """``query`` locking the rows it reads, skipping rows other claimers have locked."""

    @abstractmethod
    def lock_free(self, conn: Connection, event_pks: Sequence[int]) -> set[int]:
        """Lock the events ``event_pks`` without waiting; return those locked."""

    @abstractmethod
    def take_object_leases(
        self, conn: Connection, keys: Sequence[str], owner: str, now: datetime, expires: datetime
    ) -> set[str]:
        """Lease the objects ``keys`` whose lease is free or expired to ``owner`` until
        ``expires``, in one conditional upsert; return the keys leased."""

    # -- dispatch -------------------------------------------------------------------------
    #
    # The guard's reads are lookups by key, one probe of a unique index per key: their cost
    # is the batch's, never the history's, whatever the planner's statistics.

    @abstractmethod
    def transition_owners(
        self, conn: Connection, keys: Collection[tuple[str, str, str, str]]
    ) -> dict[tuple[str, str, str, str], int]:
        """The owning event of each of the transitions ``keys`` (account, kind, id, state)
        that exists."""

    @abstractmethod
    def projections(self, conn: Connection, objects: Collection[tuple[str, str, str]]) -> list[Any]:
        """The projections of ``objects`` (account, kind, id) that exist: rows of
        ``account, object_kind, object_id, status, stage, event_time, event_pk``."""

    @abstractmethod
    def succeeded_handlers(self, conn: Connection, event_pks: Sequence[int]) -> dict[int, set[str]]:
        """The handlers that already succeeded for each of ``event_pks`` (the ledger)."""

    @abstractmethod
    def write_outcomes(self, conn: Connection, outcomes: Outcomes, now: datetime) -> bool:
        """Write a batch's outcomes and free its object leases, in the caller's transaction.

        Returns ``False`` unless every event was still leased to its worker, and every
        event's *object* lease was still that worker's and (PostgreSQL) unexpired at ``now``:
        the caller must then roll back (another worker may own the object; its handlers'
        effects, not these, are the ones that count). The check and the writes are one
        atomic step. On SQLite (:attr:`single_writer`) an expired lease that still names the
        worker is held: the caller's transaction has had the database's only write lock
        since before its handlers ran, so nobody could have taken the lease meanwhile.
        """
