"""SQLite's statements (see :class:`receiver.storage.sql.base.Statements`).

SQLite has one writer at a time, and every transaction that writes takes the lock up front
(``BEGIN IMMEDIATE``, see :mod:`receiver.storage.database`): a read and the write that depends on
it, in one transaction, are atomic without row locks.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    Connection,
    CursorResult,
    Select,
    Table,
    bindparam,
    delete,
    exists,
    func,
    select,
)
from sqlalchemy import text as sql_text
from sqlalchemy import update as sql_update
from sqlalchemy.dialects import sqlite

from receiver.storage.sql.base import Outcomes, Statements, Stored
from receiver.storage.sql.tables import (
    DIGESTS,
    EVENT,
    EVENT_COLUMNS,
    HANDLER_RUN,
    LEASE,
    OUTCOME_COLUMNS,
    PATHS,
    PROJECTION,
    TRANSITION,
)

#: Close one claimed event (executemany over a batch's ``finals``), only while its worker
#: holds the event's lease and its object's lease. Not whether the object's lease has
#: expired: the dispatch transaction has held SQLite's write lock since it began (before any
#: of its handlers ran, see :meth:`receiver.storage.dispatch.Dispatcher.dispatch_many`), and
#: another worker can take a lease only by writing its own name into it, so a lease that
#: still names this worker was nobody else's meanwhile, however long the handlers took (the
#: heartbeat, on another connection, cannot renew it while this transaction holds the lock).
CLOSE_EVENT = (
    sql_update(EVENT)
    .where(
        EVENT.c.id == bindparam("b_id"),
        EVENT.c.lease_owner == bindparam("b_owner"),
        exists().where(
            LEASE.c.object_key == EVENT.c.object_key,
            LEASE.c.owner == bindparam("b_owner"),
        ),
    )
    .values(
        status=bindparam("b_status"),
        last_error=bindparam("b_error"),
        next_attempt_at=bindparam("b_next"),
        processed_at=bindparam("b_processed"),
        attempts=EVENT.c.attempts - bindparam("b_undo"),
        lease_owner=None,
        lease_expires_at=None,
    )
)


def _upsert_projection() -> Any:
    stmt = sqlite.insert(PROJECTION)
    return stmt.on_conflict_do_update(
        index_elements=["account", "object_kind", "object_id"],
        # Every column but the key.
        set_={
            name: (
                func.coalesce(stmt.excluded[name], PROJECTION.c[name])
                if name == "object_created_at"
                else stmt.excluded[name]
            )
            for name in OUTCOME_COLUMNS["p"][3:]
        },
    )


def _upsert_ledger() -> Any:
    stmt = sqlite.insert(HANDLER_RUN)
    return stmt.on_conflict_do_update(
        index_elements=["event_pk", "handler"],
        set_={
            "status": stmt.excluded.status,
            "attempts": HANDLER_RUN.c.attempts + 1,
            "last_error": stmt.excluded.last_error,
            "updated_at": stmt.excluded.updated_at,
        },
    )


#: ``INDEXED BY``: without statistics SQLite would rather read every due event through the
#: (status, next_attempt_at) index and sort them all, at each claim: a cost of the backlog.
DUE_CANDIDATES = sql_text(
    "SELECT id, object_key FROM hookledger_event INDEXED BY ix_hookledger_event_open_due"
    " WHERE status IN ('pending', 'processing') AND account = :account"
    " AND next_attempt_at <= :now"
    " AND (lease_expires_at IS NULL OR lease_expires_at < :now)"
    " ORDER BY next_attempt_at, id LIMIT :scan"
).bindparams(bindparam("now", type_=EVENT.c.next_attempt_at.type))

#: Accounts with open events after ``:after``: a skip scan of the open-events index, one
#: probe per account (see :meth:`receiver.storage.sql.base.Statements.accounts_open`).
ACCOUNTS_OPEN = sql_text(
    "WITH RECURSIVE a(account, n) AS ("
    " SELECT (SELECT account FROM hookledger_event INDEXED BY ix_hookledger_event_open_due"
    " WHERE status IN ('pending', 'processing') AND account > :after"
    " ORDER BY account LIMIT 1), 1"
    " UNION ALL"
    " SELECT (SELECT e.account FROM hookledger_event AS e INDEXED BY ix_hookledger_event_open_due"
    " WHERE e.status IN ('pending', 'processing') AND e.account > a.account"
    " ORDER BY e.account LIMIT 1), a.n + 1"
    " FROM a WHERE a.account IS NOT NULL AND a.n < :limit"
    ") SELECT account FROM a WHERE account IS NOT NULL"
)

#: ``+status``: SQLite then uses no index for this term, so it seeks the object index for
#: the keys; with a plain ``status IN`` it would rather read every open event (the backlog)
#: through the status index and sort them, at each claim.
OPEN_OF_OBJECTS = sql_text("+hookledger_event.status IN ('pending', 'processing')")


def waiting_sql(count: int) -> str:
    """:meth:`SQLiteStatements.waiting_objects` for ``count`` keys (``:k0``, ``:k1``...).
    ``INDEXED BY``: SQLite's planner would rather filter every open event by status."""
    keys = ", ".join(f":k{i}" for i in range(count))
    return (
        "SELECT DISTINCT object_key FROM hookledger_event INDEXED BY ix_hookledger_event_object "
        f"WHERE object_key IN ({keys}) AND status IN ('pending', 'processing')"
    )


#: One delivery on the driver (:meth:`SQLiteStatements.insert_delivery_on_driver`).
INSERT_DELIVERY_SQL = (
    f"INSERT INTO hookledger_event ({', '.join(EVENT_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(EVENT_COLUMNS))}) ON CONFLICT (account, event_id) DO NOTHING"
)
#: A delivery's order index rows on the driver
#: (:meth:`SQLiteStatements.insert_references_on_driver`).
INSERT_REFERENCES_SQL = (
    "INSERT INTO hookledger_order_ref (event_pk, path, account, digest, key_id) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (event_pk, path) DO NOTHING"
)
STORED_ROW_SQL = (
    "SELECT id, body_sha256, key_id FROM hookledger_event WHERE account = ? AND event_id = ?"
)
#: The columns of a conflict's row (see :func:`receiver.storage.inbox.conflict_row`), all also
#: columns of the inbox row.
CONFLICT_COLUMNS = (
    "account",
    "event_id",
    "source",
    "body",
    "headers",
    "body_sha256",
    "secret_id",
    "received_at",
    "key_id",
)
#: A conflicting delivery on the driver (its values bound as :meth:`SQLiteStatements.bound_event`
#: binds them).
INSERT_CONFLICT_SQL = (
    f"INSERT INTO hookledger_event_conflict ({', '.join(CONFLICT_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(CONFLICT_COLUMNS))}) "
    "ON CONFLICT (account, event_id, body_sha256) DO NOTHING"
)
#: An account's first delivery (``account``, time, recorded at: times as :func:`utc_text`),
#: unless an earlier one is kept (see
#: :meth:`receiver.storage.operator_actions.Operations.record_first_delivery`).
FIRST_DELIVERY_SQL = (
    "INSERT INTO hookledger_cutover (account, name, mode, cutover_at, recorded_at) "
    "VALUES (?, 'first_delivery', 'delivery', ?, ?) ON CONFLICT (account, name) DO UPDATE SET "
    "cutover_at = CASE WHEN excluded.cutover_at < hookledger_cutover.cutover_at "
    "THEN excluded.cutover_at ELSE hookledger_cutover.cutover_at END"
)


def stored_of(row: Sequence[Any] | None) -> Stored | None:
    """A row of :data:`STORED_ROW_SQL` (``None``: no such row)."""
    return None if row is None else Stored(int(row[0]), row[1], row[2])


def utc_text(value: datetime | None) -> str | None:
    """An aware time as the inbox stores it on SQLite: in UTC, ``YYYY-MM-DD HH:MM:SS.ffffff``
    (the text SQLAlchemy's ``UTCDateTime`` and SQLite ``DATETIME`` processors write, which
    the reads parse back). A naive time is refused, as they refuse it."""
    if value is None:
        return None
    if value.tzinfo is not UTC:
        if value.utcoffset() is None:
            raise ValueError("Datetime values must have timezone information.")
        value = value.astimezone(UTC)
    return value.isoformat(" ", "microseconds")[:-6]  # without its "+00:00"


class SQLiteStatements(Statements):
    name: ClassVar[str] = "sqlite"
    single_writer: ClassVar[bool] = True
    accounts_open_sql: ClassVar[Any] = ACCOUNTS_OPEN

    def __init__(self) -> None:
        # SQLite reports the new row's id as ``lastrowid`` (no RETURNING round through the
        # cursor).
        self._insert_event = sqlite.insert(EVENT).on_conflict_do_nothing(
            index_elements=["account", "event_id"]
        )
        self._upsert_projection = _upsert_projection()
        self._upsert_ledger = _upsert_ledger()
        # What SQLAlchemy does to each value of an inbox row: times as SQLite's text, by
        # :func:`utc_text` (the same text as SQLAlchemy's processors, in a third of the time).
        dialect = sqlite.dialect()
        self._event_binds = [
            (
                name,
                utc_text
                if kind == "timestamptz"
                else EVENT.c[name].type.dialect_impl(dialect).bind_processor(dialect),
            )
            for name, kind in EVENT_COLUMNS.items()
        ]
        self._event_values = operator.itemgetter(*(name for name, _ in self._event_binds))
        self._event_processed = [
            (index, bind) for index, (_, bind) in enumerate(self._event_binds) if bind
        ]

    def insert(self, table: Table) -> Any:
        return sqlite.insert(table)

    def among(self, column: Any, values: Iterable[Any]) -> Any:
        return column.in_(list(values))

    # -- inbox ----------------------------------------------------------------------------

    @property
    def insert_event(self) -> Any:
        return self._insert_event

    def inserted_pk(self, result: CursorResult[Any]) -> int | None:
        pk = result.lastrowid if result.rowcount == 1 else None
        return None if pk is None else int(pk)

    def insert_events(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> dict[str, int]:
        stmt = (
            sqlite.insert(EVENT)
            .on_conflict_do_nothing(index_elements=["account", "event_id"])
            .returning(EVENT.c.event_id, EVENT.c.id)
        )
        return {r[0]: int(r[1]) for r in conn.execute(stmt, list(rows))}

    def bound_event(self, values: dict[str, Any]) -> list[Any]:
        """The values of an inbox row (:data:`EVENT_COLUMNS`, in that order) as the driver
        binds them: times as :func:`utc_text`, the rest as SQLAlchemy's types bind them.

        Taken in one C call (``itemgetter``), then only the few that a processor changes
        (the times) are changed: a Python loop over every column cost a microsecond on
        every delivery."""
        bound = list(self._event_values(values))
        for index, bind in self._event_processed:
            bound[index] = bind(bound[index])
        return bound

    def insert_delivery_on_driver(self, conn: Any, values: dict[str, Any]) -> int | None:
        """Insert-or-ignore one delivery on a sqlite3 connection (in the caller's
        transaction): the new row's id, ``None`` if its event id is stored already."""
        return self.insert_bound_on_driver(conn, self.bound_event(values))

    def insert_bound_on_driver(self, conn: Any, bound: Sequence[Any]) -> int | None:
        """:meth:`insert_delivery_on_driver` of a row already bound (:meth:`bound_event`)."""
        cursor = conn.execute(INSERT_DELIVERY_SQL, bound)
        return int(cursor.lastrowid) if cursor.rowcount == 1 else None

    def insert_references_on_driver(self, conn: Any, values: dict[str, Any], pk: int) -> None:
        """The order index rows of a delivery (its inbox row ``values``) just inserted as
        ``pk`` on a sqlite3 connection (in the caller's transaction; see
        :mod:`receiver.storage.order_refs`)."""
        paths = values[PATHS]
        if not paths:
            return
        account, key_id = values["account"], values["key_id"]
        for path, digest in zip(paths, values[DIGESTS], strict=True):
            conn.execute(INSERT_REFERENCES_SQL, (pk, path, account, digest, key_id))

    def stored_on_driver(self, conn: Any, account: str, event_id: str) -> Stored | None:
        """The stored row of ``account``'s ``event_id``, read on a sqlite3 connection."""
        return stored_of(conn.execute(STORED_ROW_SQL, (account, event_id)).fetchone())

    def waiting_objects(self, conn: Connection, object_keys: Sequence[str]) -> set[str]:
        if not object_keys:
            return set()
        names = {f"k{i}": key for i, key in enumerate(object_keys)}
        return {r[0] for r in conn.execute(sql_text(waiting_sql(len(names))), names)}

    def events_of_objects(self, columns: Sequence[Any], object_keys: Sequence[str]) -> Select[Any]:
        # SQLite seeks the object index for each key of the list.
        return select(*columns).where(EVENT.c.object_key.in_(list(object_keys)))

    # -- queue ----------------------------------------------------------------------------

    def due_candidates(self, due: Any, now: datetime, scan: int, account: str) -> Any:
        return DUE_CANDIDATES.bindparams(now=now, scan=scan, account=account)

    @property
    def open_of_objects(self) -> Any:
        return OPEN_OF_OBJECTS

    def skip_locked(self, query: Select[Any]) -> Select[Any]:
        return query  # the transaction holds the database's one write lock

    def lock_free(self, conn: Connection, event_pks: Sequence[int]) -> set[int]:
        return set(event_pks)

    def take_object_leases(
        self, conn: Connection, keys: Sequence[str], owner: str, now: datetime, expires: datetime
    ) -> set[str]:
        insert = sqlite.insert(LEASE)
        upsert = insert.on_conflict_do_update(
            index_elements=["object_key"],
            set_={"owner": insert.excluded.owner, "expires_at": insert.excluded.expires_at},
            where=LEASE.c.expires_at < now,
        ).returning(LEASE.c.object_key)
        rows = conn.execute(
            upsert, [{"object_key": k, "owner": owner, "expires_at": expires} for k in keys]
        )
        return {row[0] for row in rows}

    # -- dispatch -------------------------------------------------------------------------
    #
    # Each column is matched against the set of its values (SQLite probes the primary key's
    # index for each combination); the rows are then narrowed to the exact tuples here.

    def transition_owners(
        self, conn: Connection, keys: Collection[tuple[str, str, str, str]]
    ) -> dict[tuple[str, str, str, str], int]:
        if not keys:
            return {}
        rows = conn.execute(
            select(
                TRANSITION.c.account,
                TRANSITION.c.object_kind,
                TRANSITION.c.object_id,
                TRANSITION.c.state,
                TRANSITION.c.event_pk,
            ).where(
                self.among(TRANSITION.c.account, {a for a, _, _, _ in keys}),
                self.among(TRANSITION.c.object_kind, {k for _, k, _, _ in keys}),
                self.among(TRANSITION.c.object_id, {i for _, _, i, _ in keys}),
                self.among(TRANSITION.c.state, {t for _, _, _, t in keys}),
            )
        )
        return {
            (r[0], r[1], r[2], r[3]): int(r[4]) for r in rows if (r[0], r[1], r[2], r[3]) in keys
        }

    def projections(self, conn: Connection, objects: Collection[tuple[str, str, str]]) -> list[Any]:
        if not objects:
            return []
        rows = conn.execute(
            select(
                PROJECTION.c.account,
                PROJECTION.c.object_kind,
                PROJECTION.c.object_id,
                PROJECTION.c.status,
                PROJECTION.c.stage,
                PROJECTION.c.event_time,
                PROJECTION.c.event_pk,
            ).where(
                self.among(PROJECTION.c.account, {a for a, _, _ in objects}),
                self.among(PROJECTION.c.object_kind, {k for _, k, _ in objects}),
                self.among(PROJECTION.c.object_id, {i for _, _, i in objects}),
            )
        )
        return [r for r in rows if (r[0], r[1], r[2]) in objects]

    def succeeded_handlers(self, conn: Connection, event_pks: Sequence[int]) -> dict[int, set[str]]:
        done: dict[int, set[str]] = {}
        if event_pks:
            for pk, handler in conn.execute(
                select(HANDLER_RUN.c.event_pk, HANDLER_RUN.c.handler).where(
                    self.among(HANDLER_RUN.c.event_pk, event_pks),
                    HANDLER_RUN.c.status == "succeeded",
                )
            ):
                done.setdefault(int(pk), set()).add(handler)
        return done

    def write_outcomes(self, conn: Connection, outcomes: Outcomes, now: datetime) -> bool:
        # The caller's transaction began with BEGIN IMMEDIATE: nothing changes between the
        # check (closing the events under their leases) and the writes that follow it.
        finals = list(outcomes.finals)
        if conn.execute(CLOSE_EVENT, finals).rowcount != len(finals):
            return False  # a lease was lost: the caller rolls back, nothing more to write
        if outcomes.transitions:
            conn.execute(sqlite.insert(TRANSITION).on_conflict_do_nothing(), outcomes.transitions)
        if outcomes.projections:
            conn.execute(self._upsert_projection, outcomes.projections)
        if outcomes.ledger:
            conn.execute(self._upsert_ledger, outcomes.ledger)
        for owner in {final["b_owner"] for final in finals}:
            keys = [final["b_key"] for final in finals if final["b_owner"] == owner]
            conn.execute(
                delete(LEASE).where(self.among(LEASE.c.object_key, keys), LEASE.c.owner == owner)
            )
        return True
