"""PostgreSQL's statements (see :class:`receiver.storage.sql.base.Statements`).

The per-batch writes are single statements over parallel arrays (``unnest``): their text is
fixed whatever the batch size, so psycopg caches and prepares them; an executemany would send
one statement per row, a multi-row VALUES one placeholder per value.

Lock order: statements that lock lease rows take them in ``object_key`` order. A batch's
commit locks its events before its leases; a claim locks events without ever waiting (``SKIP
LOCKED``) before its leases. So a commit and a claim may wait for each other, never in a
circle.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    Connection,
    CursorResult,
    Select,
    Table,
    Text,
    any_,
    bindparam,
    func,
    select,
    text,
    true,
)
from sqlalchemy.dialects import postgresql

from receiver.core.order_refs import MAX_FIELDS
from receiver.storage.sql.base import DeliveriesWritten, Fetchall, Outcomes, Statements, Stored
from receiver.storage.sql.tables import (
    DIGESTS,
    EVENT,
    EVENT_COLUMNS,
    OPEN_SQL,
    OUTCOME_COLUMNS,
    PATHS,
)

INSERT_EVENTS = text(
    f"INSERT INTO hookledger_event ({', '.join(EVENT_COLUMNS)}) SELECT * FROM unnest("
    + ", ".join(f"CAST(:{name} AS {kind}[])" for name, kind in EVENT_COLUMNS.items())
    + ") ON CONFLICT (account, event_id) DO NOTHING RETURNING event_id, id"
)

#: A batch of webhook deliveries (distinct event ids) in one statement, one round trip: the
#: rows inserted answer their new id; the others, the id, body hash and hash key of the row
#: already there (read in the statement's snapshot, taken before the insert: a row committed
#: by another session while the statement waited on its conflict is missing, read it again).
#: The parameters are sent with psycopg's own placeholders (``exec_driver_sql``: nothing to
#: compile per request), a fixed text whatever the batch size (prepared once per connection).
INSERT_DELIVERIES = (
    "WITH v AS (SELECT * FROM unnest("
    + ", ".join(f"CAST(%({name})s AS {kind}[])" for name, kind in EVENT_COLUMNS.items())
    + f") AS v({', '.join(EVENT_COLUMNS)})), "
    f"ins AS (INSERT INTO hookledger_event ({', '.join(EVENT_COLUMNS)}) "
    f"SELECT {', '.join(EVENT_COLUMNS)} FROM v "
    "ON CONFLICT (account, event_id) DO NOTHING RETURNING id, account, event_id), "
    # The order index rows of the rows inserted (see :mod:`receiver.storage.order_refs`):
    # a data-modifying WITH runs to completion whether or not the query reads it.
    "refs AS (INSERT INTO hookledger_order_ref (event_pk, path, account, digest, key_id) "
    "SELECT ins.id, r.path, ins.account, r.digest, r.key_id FROM unnest("
    "CAST(%(r_account)s AS varchar[]), CAST(%(r_event_id)s AS varchar[]), "
    "CAST(%(r_path)s AS varchar[]), CAST(%(r_digest)s AS varchar[]), "
    "CAST(%(r_key_id)s AS varchar[])) AS r(account, event_id, path, digest, key_id) "
    "JOIN ins ON ins.account = r.account AND ins.event_id = r.event_id) "
    "SELECT v.event_id, ins.id, e.id, e.body_sha256, e.key_id FROM v "
    "LEFT JOIN ins ON ins.account = v.account AND ins.event_id = v.event_id "
    "LEFT JOIN hookledger_event AS e ON ins.id IS NULL AND e.account = v.account "
    "AND e.event_id = v.event_id"
)

#: One delivery: the same in one statement with scalar parameters (an array per column costs
#: the driver and the server about twice the time of the insert itself for a single row).
INSERT_DELIVERY = (
    f"WITH ins AS (INSERT INTO hookledger_event ({', '.join(EVENT_COLUMNS)}) VALUES ("
    + ", ".join(f"%({name})s" for name in EVENT_COLUMNS)
    + ") ON CONFLICT (account, event_id) DO NOTHING RETURNING id) "
    "SELECT %(event_id)s, id, NULL, NULL, NULL FROM ins UNION ALL "
    "SELECT event_id, NULL, id, body_sha256, key_id FROM hookledger_event "
    "WHERE account = %(account)s AND event_id = %(event_id)s AND NOT EXISTS (SELECT 1 FROM ins)"
)


#: One delivery with ``n`` order references: the same statement, which also writes its order
#: index rows when the row is inserted (a data-modifying WITH: still one statement, one round
#: trip; see :mod:`receiver.storage.order_refs`). The references are scalar parameters
#: (``rp0``, ``rd0``...): arrays cost the driver more than the rows they carry.
def insert_delivery_references(n: int) -> str:
    rows = ", ".join(f"(%(rp{i})s, %(rd{i})s)" for i in range(n))
    return INSERT_DELIVERY.replace(
        "RETURNING id) ",
        "RETURNING id), refs AS (INSERT INTO hookledger_order_ref (event_pk, path, account,"
        " digest, key_id) SELECT ins.id, r.path, %(account)s, r.digest, %(key_id)s FROM ins"
        f" CROSS JOIN (VALUES {rows}) AS r(path, digest)) ",
        1,
    )


INSERT_DELIVERY_REFERENCES = {n: insert_delivery_references(n) for n in range(1, MAX_FIELDS + 1)}

#: A probe of the object index per key (``LATERAL ... LIMIT 1``): the planner would
#: otherwise filter, or hash, every open event, a cost that grows with the backlog. The
#: status is tested above an ``OFFSET 0`` fence, so the probe reads the object index alone:
#: with the status term inside and no statistics (a new database, autovacuum behind), the
#: planner ANDed the status index into the probe, reading every open event of every account
#: for each key (1,000 accounts' recoveries queued: 3 ms per key).
WAITING_OBJECTS = text(
    "SELECT k FROM unnest(CAST(:keys AS text[])) AS k CROSS JOIN LATERAL (SELECT 1 FROM "
    "(SELECT e.status FROM hookledger_event AS e WHERE e.object_key = k OFFSET 0) AS o "
    "WHERE o.status IN ('pending', 'processing') LIMIT 1) AS waiting"
)

#: Each object's head: its earliest open event (event time, then id), every column. A probe
#: of the object index per key, in that order, the status tested above an ``OFFSET 0`` fence
#: (as :data:`WAITING_OBJECTS`): ``object_key = ANY(...)`` with the status term, kept as a
#: generic plan made on a new ledger, ANDed a bitmap of the whole open-events index into the
#: read. Without a vacuum (autovacuum behind) that index keeps an entry for every event ever
#: claimed: at each claim it read them all, a cost that grew with the done history (100,000
#: done events: 660 pages per claim).
HEADS = text(
    f"SELECT {', '.join(f'h.{c.name}' for c in EVENT.c)}"
    " FROM unnest(CAST(:keys AS text[])) AS k CROSS JOIN LATERAL (SELECT o.* FROM"
    " (SELECT e.* FROM hookledger_event AS e WHERE e.object_key = k"
    " ORDER BY e.event_time, e.id OFFSET 0) AS o"
    " WHERE o.status IN ('pending', 'processing') LIMIT 1) AS h"
).columns(*EVENT.c)

#: A claim's unused leases given back: each found by a probe of the lease table's key, then
#: deleted by its row address. ``object_key = ANY(...)`` was planned, generically, while the
#: table was a page: a sequential scan, kept while the table fills with the deleted leases
#: of every object ever claimed until a vacuum (autovacuum behind: 1,900 pages read per claim
#: after 100,000 events, the largest part of the dispatch's slowdown as its history grew).
GIVE_BACK_LEASES = text(
    "DELETE FROM hookledger_object_lease AS lease USING (SELECT l.ctid AS tid"
    " FROM unnest(CAST(:keys AS text[])) AS k CROSS JOIN LATERAL (SELECT ctid"
    " FROM hookledger_object_lease WHERE object_key = k AND owner = :owner LIMIT 1) AS l)"
    " AS mine WHERE lease.ctid = mine.tid"
)

TAKE_LEASES = text(
    "INSERT INTO hookledger_object_lease (object_key, owner, expires_at) "
    "SELECT k, :owner, :expires FROM unnest(CAST(:keys AS text[])) AS k "
    # Objects another claimer is leasing right now are skipped, never waited for. Advisory
    # locks are the database's: the key is seeded with this lease table's oid, so that an
    # installation in another schema of the same database never holds up this one's claims.
    "WHERE pg_try_advisory_xact_lock(hashtextextended('hookledger:' || k, "
    "CAST(CAST(CAST('hookledger_object_lease' AS regclass) AS oid) AS bigint))) "
    # Lease rows are locked in key order, as a commit locks them (see the module docstring).
    "ORDER BY k "
    "ON CONFLICT (object_key) DO UPDATE "
    "SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at "
    "WHERE hookledger_object_lease.expires_at < :now "
    "RETURNING object_key"
)

#: Accounts with open events after ``:after``: a skip scan of the open-events index, one
#: probe per account (see :meth:`receiver.storage.sql.base.Statements.accounts_open`).
ACCOUNTS_OPEN = text(
    "WITH RECURSIVE a(account, n) AS ("
    " SELECT (SELECT account FROM hookledger_event"
    " WHERE status IN ('pending', 'processing') AND account > :after"
    " ORDER BY account LIMIT 1), 1"
    " UNION ALL"
    " SELECT (SELECT e.account FROM hookledger_event AS e"
    " WHERE e.status IN ('pending', 'processing') AND e.account > a.account"
    " ORDER BY e.account LIMIT 1), a.n + 1"
    " FROM a WHERE a.account IS NOT NULL AND a.n < :limit"
    ") SELECT account FROM a WHERE account IS NOT NULL"
)

#: Every given account's due events in one statement: per account (in the array's order) a
#: walk of the open-events index in due order, ``LIMIT :share``, locked without waiting (a
#: query per account cost a round trip each: with 16 accounts per claim, a quarter of the
#: dispatch rate).
DUE_OF_ACCOUNTS = text(
    "SELECT a.ord, c.object_key, c.id, c.next_attempt_at FROM unnest(CAST(:accounts AS text[]),"
    " CAST(:floors AS timestamptz[])) WITH ORDINALITY AS a(account, floor, ord)"
    " CROSS JOIN LATERAL (SELECT e.id, e.object_key, e.next_attempt_at FROM hookledger_event AS e"
    " WHERE e.account = a.account AND e.status IN ('pending', 'processing')"
    # The walk starts at the account's floor (an index bound): the entries below it are those
    # of events done since (dead row versions, until a vacuum). No floor: from the start.
    " AND e.next_attempt_at >= COALESCE(a.floor, '-infinity')"
    " AND e.next_attempt_at <= :now"
    " AND (e.lease_expires_at IS NULL OR e.lease_expires_at < :now)"
    " ORDER BY e.next_attempt_at, e.id LIMIT :share FOR UPDATE OF e SKIP LOCKED) AS c"
    " ORDER BY a.ord, c.next_attempt_at, c.id"
)

#: The guard's reads: one probe of a unique index per key (``LATERAL ... LIMIT 1`` keeps the
#: planner from joining, or matching each column against a set of values, which reads the
#: whole table once it judges the set large, or the table small: a worker's connection
#: keeps the generic plan it made while the ledger was small, and reuses it for good).
TRANSITION_OWNERS = text(
    "SELECT k.account, k.kind, k.id, k.state, t.event_pk FROM unnest("
    "CAST(:accounts AS text[]), CAST(:kinds AS text[]), CAST(:ids AS text[]),"
    " CAST(:states AS text[])) AS k(account, kind, id, state)"
    " CROSS JOIN LATERAL (SELECT t.event_pk FROM hookledger_transition AS t"
    " WHERE t.account = k.account AND t.object_kind = k.kind AND t.object_id = k.id"
    " AND t.state = k.state LIMIT 1) AS t"
)
PROJECTIONS = text(
    "SELECT k.account, k.kind, k.id, p.status, p.stage, p.event_time, p.event_pk"
    " FROM unnest(CAST(:accounts AS text[]), CAST(:kinds AS text[]), CAST(:ids AS text[]))"
    " AS k(account, kind, id)"
    " CROSS JOIN LATERAL (SELECT p.status, p.stage, p.event_time, p.event_pk"
    " FROM hookledger_projection AS p WHERE p.account = k.account AND p.object_kind = k.kind"
    " AND p.object_id = k.id LIMIT 1) AS p"
)
#: ``OFFSET 0``: an event has several ledger rows; the subquery stays a probe per event.
SUCCEEDED_HANDLERS = text(
    "SELECT k.pk, r.handler FROM unnest(CAST(:pks AS bigint[])) AS k(pk)"
    " CROSS JOIN LATERAL (SELECT r.handler FROM hookledger_handler_run AS r"
    " WHERE r.event_pk = k.pk AND r.status = 'succeeded' OFFSET 0) AS r"
)

#: One statement writes a dispatched batch's outcomes (transitions, projections, ledger rows,
#: the events' final states) and frees its object leases, if and only if the worker still
#: holds every event's lease and every event's *object* lease, unexpired at ``:now``. It
#: returns that verdict; on ``false`` it wrote nothing but the events' rows, and the caller
#: rolls back (the handlers' writes with it): the object may belong to another worker now.
#:
#: - ``closed`` updates the events still leased to the worker (locking their rows first);
#: - ``held`` then locks the object lease rows still the worker's and unexpired, in key order.
#:   Its sort reads all of ``closed`` before it locks anything, so a claimer holding one of
#:   these events is never waited for while we hold a lease it may want. Locked, the leases
#:   cannot be taken by a claimer until this transaction ends; a lease taken meanwhile is
#:   re-read (its new owner no longer matches) and left out;
#: - ``ok``: both counts are the batch's size; the inserts and ``freed`` depend on it.
WRITE_OUTCOMES = text(
    "WITH closed AS ("
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
    "), held AS ("
    " SELECT lease.object_key, lease.owner FROM hookledger_object_lease AS lease"
    " JOIN closed ON lease.object_key = closed.object_key AND lease.owner = closed.owner"
    " WHERE lease.expires_at >= CAST(:now AS timestamptz)"
    " ORDER BY lease.object_key"
    " FOR UPDATE OF lease"
    "), ok AS ("
    " SELECT (SELECT count(*) FROM held) = :n AND (SELECT count(*) FROM closed) = :n AS ok"
    "), t AS ("
    " INSERT INTO hookledger_transition (account, object_kind, object_id, state, event_pk,"
    " created_at)"
    " SELECT * FROM unnest(CAST(:t_account AS text[]), CAST(:t_object_kind AS text[]),"
    " CAST(:t_object_id AS text[]),"
    " CAST(:t_state AS text[]), CAST(:t_event_pk AS bigint[]),"
    " CAST(:t_created_at AS timestamptz[]))"
    " WHERE (SELECT ok FROM ok)"
    " ON CONFLICT DO NOTHING"
    "), p AS ("
    " INSERT INTO hookledger_projection (account, object_kind, object_id, status, stage,"
    " event_time, object_created_at, event_pk, updated_at)"
    " SELECT * FROM unnest(CAST(:p_account AS text[]), CAST(:p_object_kind AS text[]),"
    " CAST(:p_object_id AS text[]),"
    " CAST(:p_status AS text[]), CAST(:p_stage AS text[]), CAST(:p_event_time AS timestamptz[]),"
    " CAST(:p_object_created_at AS timestamptz[]), CAST(:p_event_pk AS bigint[]),"
    " CAST(:p_updated_at AS timestamptz[]))"
    " WHERE (SELECT ok FROM ok)"
    " ON CONFLICT (account, object_kind, object_id) DO UPDATE SET status = EXCLUDED.status,"
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
    " WHERE (SELECT ok FROM ok)"
    " ON CONFLICT (event_pk, handler) DO UPDATE SET status = EXCLUDED.status,"
    " attempts = hookledger_handler_run.attempts + 1, last_error = EXCLUDED.last_error,"
    " updated_at = EXCLUDED.updated_at"
    "), freed AS ("
    " DELETE FROM hookledger_object_lease AS lease USING held"
    " WHERE lease.object_key = held.object_key AND lease.owner = held.owner"
    " AND (SELECT ok FROM ok)"
    ")"
    " SELECT ok FROM ok"
)


def outcome_arrays(outcomes: Outcomes) -> dict[str, list[Any]]:
    """The parameters of :data:`WRITE_OUTCOMES`: each part's rows as parallel arrays, one per
    column. Times stay aware (the columns are ``timestamptz``; a naive value would be read in
    the session's time zone)."""
    params: dict[str, list[Any]] = {}
    parts = (
        ("t", outcomes.transitions),
        ("p", outcomes.projections),
        ("l", outcomes.ledger),
        ("b", outcomes.finals),
    )
    for part, rows in parts:
        for column in OUTCOME_COLUMNS[part]:
            name = column if part == "b" else f"{part}_{column}"
            params[name] = [row[column] for row in rows]
    return params


class PostgreSQLStatements(Statements):
    name: ClassVar[str] = "postgresql"
    single_writer: ClassVar[bool] = False
    one_statement_batches: ClassVar[bool] = True
    accounts_open_sql: ClassVar[Any] = ACCOUNTS_OPEN
    open_index_keeps_done: ClassVar[bool] = True

    def __init__(self) -> None:
        self._insert_event = (
            postgresql.insert(EVENT)
            .on_conflict_do_nothing(index_elements=["account", "event_id"])
            .returning(EVENT.c.id)
        )

    def insert(self, table: Table) -> Any:
        return postgresql.insert(table)

    def among(self, column: Any, values: Iterable[Any]) -> Any:
        """``column = ANY(:values)``: one array parameter, so the statement is the same whatever
        the number of values, compiled and prepared once instead of re-rendered with one
        placeholder per value on every call."""
        listed = list(values)
        return column == any_(bindparam(None, listed, type_=postgresql.ARRAY(column.type)))

    # -- inbox ----------------------------------------------------------------------------

    @property
    def insert_event(self) -> Any:
        return self._insert_event

    def inserted_pk(self, result: CursorResult[Any]) -> int | None:
        pk = result.scalar()
        return None if pk is None else int(pk)

    def insert_deliveries(
        self, fetchall: Fetchall, rows: Sequence[dict[str, Any]]
    ) -> DeliveriesWritten:
        params: dict[str, Any]
        if len(rows) == 1:  # the row itself: psycopg reads the named parameters it needs
            params = rows[0]
            sql = INSERT_DELIVERY
            paths = params[PATHS]
            if paths:
                sql = INSERT_DELIVERY_REFERENCES[len(paths)]
                params = dict(params)
                for i, (path, digest) in enumerate(zip(paths, params[DIGESTS], strict=True)):
                    params[f"rp{i}"], params[f"rd{i}"] = path, digest
        else:
            sql = INSERT_DELIVERIES
            params = {column: [row[column] for row in rows] for column in EVENT_COLUMNS}
            refs = [
                (row["account"], row["event_id"], path, digest, row["key_id"])
                for row in rows
                for path, digest in zip(row.get(PATHS) or (), row.get(DIGESTS) or (), strict=True)
            ]
            for index, name in enumerate(
                ("r_account", "r_event_id", "r_path", "r_digest", "r_key_id")
            ):
                params[name] = [ref[index] for ref in refs]
        inserted: dict[str, int] = {}
        found: dict[str, Stored] = {}
        for event_id, new_pk, pk, digest, key_id in fetchall(sql, params):
            if new_pk is not None:
                inserted[event_id] = int(new_pk)
            elif pk is not None:
                found[event_id] = Stored(int(pk), digest, key_id)
        return DeliveriesWritten(inserted=inserted, found=found)

    def insert_events(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> dict[str, int]:
        params = {column: [row[column] for row in rows] for column in EVENT_COLUMNS}
        return {r[0]: int(r[1]) for r in conn.execute(INSERT_EVENTS, params)}

    def waiting_objects(self, conn: Connection, object_keys: Sequence[str]) -> set[str]:
        if not object_keys:
            return set()
        return {r[0] for r in conn.execute(WAITING_OBJECTS, {"keys": list(object_keys)})}

    def events_of_objects(self, columns: Sequence[Any], object_keys: Sequence[str]) -> Select[Any]:
        # A probe of the object index per key (``LATERAL``, kept from being flattened into
        # a join by ``OFFSET 0``): with ``object_key = ANY(...)``, or a join, and no
        # statistics, the planner scanned the whole inbox once the keys were a few dozen.
        keys = (
            select(
                func.unnest(bindparam(None, list(object_keys), type_=postgresql.ARRAY(Text)))
                .table_valued("k")
                .render_derived(name="keys", with_types=False)
                .c.k
            )
        ).subquery("keys")
        probe = (
            select(*columns).where(EVENT.c.object_key == keys.c.k).offset(0).lateral("of_object")
        )
        return select(probe).select_from(keys.join(probe, true()))

    # -- queue ----------------------------------------------------------------------------

    def due_of_accounts(
        self,
        conn: Connection,
        due: Any,
        now: datetime,
        share: int,
        accounts: Sequence[str],
        floors: Sequence[datetime] | None = None,
    ) -> list[list[tuple[str, int, datetime | None]]]:
        found: list[list[tuple[str, int, datetime | None]]] = [[] for _ in accounts]
        params = {
            "accounts": list(accounts),
            "floors": list(floors) if floors is not None else [None] * len(accounts),
            "now": now,
            "share": share,
        }
        rows = conn.execute(DUE_OF_ACCOUNTS, params)
        for ord_, object_key, pk, due_at in rows:
            found[int(ord_) - 1].append((object_key, int(pk), due_at))
        return found

    def due_candidates(self, due: Any, now: datetime, scan: int, account: str) -> Any:
        return self.skip_locked(
            select(EVENT.c.id, EVENT.c.object_key)
            .where(EVENT.c.account == account, due)
            .order_by(EVENT.c.next_attempt_at, EVENT.c.id)
            .limit(scan)
        )

    @property
    def open_of_objects(self) -> Any:
        return OPEN_SQL

    def heads(self, conn: Connection, object_keys: Sequence[str]) -> dict[str, Any]:
        if not object_keys:
            return {}
        return {row.object_key: row for row in conn.execute(HEADS, {"keys": list(object_keys)})}

    def give_back_leases(self, conn: Connection, object_keys: Sequence[str], owner: str) -> None:
        conn.execute(GIVE_BACK_LEASES, {"keys": list(object_keys), "owner": owner})

    def skip_locked(self, query: Select[Any]) -> Select[Any]:
        return query.with_for_update(skip_locked=True)

    def lock_free(self, conn: Connection, event_pks: Sequence[int]) -> set[int]:
        if not event_pks:
            return set()
        query = select(EVENT.c.id).where(self.among(EVENT.c.id, event_pks))
        return {int(row[0]) for row in conn.execute(self.skip_locked(query))}

    def take_object_leases(
        self, conn: Connection, keys: Sequence[str], owner: str, now: datetime, expires: datetime
    ) -> set[str]:
        params = {"keys": list(keys), "owner": owner, "expires": expires, "now": now}
        return {row[0] for row in conn.execute(TAKE_LEASES, params)}

    # -- dispatch -------------------------------------------------------------------------

    def transition_owners(
        self, conn: Connection, keys: Collection[tuple[str, str, str, str]]
    ) -> dict[tuple[str, str, str, str], int]:
        if not keys:
            return {}
        accounts, kinds, ids, states = (list(column) for column in zip(*keys, strict=True))
        params = {"accounts": accounts, "kinds": kinds, "ids": ids, "states": states}
        return {
            (r[0], r[1], r[2], r[3]): int(r[4]) for r in conn.execute(TRANSITION_OWNERS, params)
        }

    def projections(self, conn: Connection, objects: Collection[tuple[str, str, str]]) -> list[Any]:
        if not objects:
            return []
        accounts, kinds, ids = (list(column) for column in zip(*objects, strict=True))
        return list(conn.execute(PROJECTIONS, {"accounts": accounts, "kinds": kinds, "ids": ids}))

    def succeeded_handlers(self, conn: Connection, event_pks: Sequence[int]) -> dict[int, set[str]]:
        done: dict[int, set[str]] = {}
        if event_pks:
            for pk, handler in conn.execute(SUCCEEDED_HANDLERS, {"pks": list(event_pks)}):
                done.setdefault(int(pk), set()).add(handler)
        return done

    def write_outcomes(self, conn: Connection, outcomes: Outcomes, now: datetime) -> bool:
        params: dict[str, Any] = outcome_arrays(outcomes)
        params.update(now=now, n=len(outcomes.finals))
        return bool(conn.execute(WRITE_OUTCOMES, params).scalar_one())
