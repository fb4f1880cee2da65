"""The intake: on SQLite, where a webhook is stored while the database's write lock is held
for long, so that receiving never waits for a handler.

SQLite has one writer at a time, and the worker's dispatch transaction holds the database's
write lock while its handlers run: that is what commits a handler's writes through the
session together with its ledger row, exactly once. A webhook that needed that lock would
wait for the handler (a 10 s carrier call: 503s after the busy timeout). So beside the
database file there is a second SQLite file of hookledger's own, the intake
(``<database>-intake``, or ``HOOKLEDGER_SQLITE_INTAKE_PATH``; WAL, ``synchronous=FULL``, its own
write lock and its own writers' lock file). A delivery whose write finds the database's lock
held for longer than :data:`receiver.storage.inbox.STAGE_AFTER_SECONDS` (by a worker's
handlers, an operator's command, the shop's own writes) is stored here instead, durably, and
answered at once.

- **Dedupe stays exact.** A delivery is judged (new, duplicate, conflict) against the
  database's inbox, read without a lock (a WAL snapshot), and against the intake, under the
  intake's lock. A write to the database's inbox by the receive path holds the intake's lock
  too, from its read of the intake to its commit, and a move deletes from the intake only
  after its commit: whichever comes first, the other one sees it.
- **The move.** Deliveries go from the intake into the inbox in the order they arrived, as
  the receive path would have written them (the order index rows with them, a conflict into
  the conflicts table): by the next web write that gets the database's lock, in the same
  transaction, and by the worker before each claim. One transaction inserts them into the
  inbox (``ON CONFLICT DO NOTHING``: a delivery already there is a duplicate of itself), and
  only after its commit are they deleted from the intake. A crash between the two commits
  leaves them in both; the next move finds them in the inbox and only deletes them. Nothing
  is lost or doubled, and handlers only ever run from the inbox, so exactly-once, fencing,
  per-object order (event time) and the ledger are those of the inbox, unchanged.
- **The first delivery** of a web process (the go-live bound, see
  :meth:`receiver.storage.operator_actions.Operations.note_delivery`) is kept here too when
  the database is locked, and moved in the same transaction as the deliveries, before them.
- **What reads the queue** (``hookledger status`` and ``stats``, the queue-depth and
  oldest-open metrics, the console's queue, the health check) counts the intake's deliveries
  as pending events (:func:`figures_of`), and ``hookledger status`` says how many wait here
  and the oldest one's age. Event listings, the order search, an object's story and replay
  show them once they are in the inbox: within a worker's claim or the next webhook.
  ``hookledger intake list`` lists them (:func:`read_waiting`: no body, no header), and
  ``hookledger intake move`` moves them now.

PostgreSQL has row locks and needs none of this. A SQLite database in memory has none either.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import URL, Engine
from sqlalchemy.exc import DBAPIError

from receiver.core.errors import StorageBusy, StorageUnavailable
from receiver.storage import filelock
from receiver.storage.checkpoints import file_identity
from receiver.storage.context import is_busy
from receiver.storage.database import make_engine
from receiver.storage.filelock import WritersLock
from receiver.storage.held_connections import HeldConnections
from receiver.storage.sql.base import Stored
from receiver.storage.sql.tables import EVENT_COLUMNS

log = logging.getLogger("receiver.store")

T = TypeVar("T")

#: Beside a SQLite database file: its intake (see the module's docstring).
INTAKE_SUFFIX = "-intake"
#: ``HOOKLEDGER_SQLITE_INTAKE_PATH=off``: no intake (a write waits for the lock, as before).
OFF = "off"
#: Beside the intake: the lock its writers queue on (as the database's, see
#: :mod:`receiver.storage.filelock`).
LOCK_SUFFIX = "-hookledger-writers"
#: Deliveries moved into the inbox per transaction, at most.
MOVE_BATCH = 256

TABLE = "hookledger_intake"
NOTES = "hookledger_intake_first_delivery"
#: The database whose intake this is (its real path): one row.
OWNER = "hookledger_intake_owner"
#: The inbox columns an intake row keeps, in :data:`EVENT_COLUMNS` order.
COLUMNS: tuple[str, ...] = tuple(EVENT_COLUMNS)
_INDEX = {name: i for i, name in enumerate(COLUMNS)}
_AFFINITY = {"timestamptz": "TEXT", "bytea": "BLOB", "bigint": "INTEGER", "integer": "INTEGER"}

_CREATE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} ("
    " id INTEGER PRIMARY KEY,"
    " answer TEXT NOT NULL,"
    + "".join(f" {name} {_AFFINITY.get(kind, 'TEXT')}," for name, kind in EVENT_COLUMNS.items())
    + " ref_paths TEXT NOT NULL DEFAULT '[]',"
    " ref_digests TEXT NOT NULL DEFAULT '[]',"
    " UNIQUE (account, event_id, body_sha256))",
    f"CREATE TABLE IF NOT EXISTS {NOTES} (account TEXT PRIMARY KEY, first_at TEXT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {OWNER} (database TEXT NOT NULL)",
)
_INSERT = (
    f"INSERT INTO {TABLE} (answer, {', '.join(COLUMNS)}, ref_paths, ref_digests) "
    f"VALUES (?, {', '.join('?' * len(COLUMNS))}, ?, ?) "
    "ON CONFLICT (account, event_id, body_sha256) DO NOTHING"
)
_SELECT = f"SELECT id, answer, {', '.join(COLUMNS)}, ref_paths, ref_digests FROM {TABLE}"
_FIRST_STORED = (
    f"SELECT body_sha256, key_id FROM {TABLE} WHERE account = ? AND event_id = ? "
    "ORDER BY id LIMIT 1"
)
_ANY = f"SELECT EXISTS (SELECT 1 FROM {TABLE}) OR EXISTS (SELECT 1 FROM {NOTES})"
_NOTE = (
    f"INSERT INTO {NOTES} (account, first_at) VALUES (?, ?) ON CONFLICT (account) DO UPDATE "
    f"SET first_at = min(first_at, excluded.first_at)"
)
_FORGET_NOTE = f"DELETE FROM {NOTES} WHERE account = ? AND first_at = ?"
_FIGURES = f"SELECT account, count(*), min(received_at) FROM {TABLE} GROUP BY account"


class IntakeUnreadable(StorageUnavailable):
    """The intake file is there but cannot be read or written (corrupt, not a database, its
    folder or file not readable): a delivery that needs it is refused as the database's
    outage is (503), and the worker, which only moves from it, dispatches the inbox's
    events meanwhile (see :func:`failure`)."""


class IntakeReplaced(IntakeUnreadable):
    """The intake file this process has open was deleted or replaced (by an operator, a
    restore) while in use: nothing is stored in it any more, since no other process would
    see it; what it holds is moved into the inbox by this process's next write that gets
    the database's lock, and the file at the path is used from then on."""


class IntakeOfAnotherDatabase(IntakeUnreadable):
    """The intake file was made for another database, which is still there (two
    installations given one ``HOOKLEDGER_SQLITE_INTAKE_PATH``): its webhooks must not be
    moved into this one, nor this one's into it."""


def failure(exc: DBAPIError) -> StorageUnavailable:
    """The refusal an intake's driver error makes: :class:`StorageBusy` when its lock stayed
    taken, else :class:`IntakeUnreadable`."""
    error: StorageUnavailable = StorageBusy() if is_busy(exc) else IntakeUnreadable()
    error.__cause__ = exc
    return error


@dataclass(frozen=True, slots=True)
class Staged:
    """A delivery in the intake: its row ``id`` (arrival order), what it was answered
    (``inserted`` or ``conflict``), its inbox row as the driver binds it (``bound``, in
    :data:`COLUMNS` order) and its order index references."""

    id: int
    answer: str
    bound: tuple[Any, ...]
    paths: list[str]
    digests: list[str]

    def __getitem__(self, name: str) -> Any:
        """The inbox column ``name`` (as bound: a time is its text)."""
        return self.bound[_INDEX[name]]

    @property
    def key(self) -> tuple[str, str]:
        return (str(self["account"]), str(self["event_id"]))


def _staged(row: Sequence[Any]) -> Staged:
    n = len(COLUMNS)
    return Staged(
        id=int(row[0]),
        answer=str(row[1]),
        bound=tuple(row[2 : 2 + n]),
        paths=list(json.loads(row[2 + n] or "[]")),
        digests=list(json.loads(row[3 + n] or "[]")),
    )


class Intake:
    """One intake file: its writers' lock, a driver connection per thread, its statements."""

    def __init__(
        self, path: str, *, busy_timeout: float = 5.0, database: str | None = None
    ) -> None:
        """``database``: the path of the database this is the intake of (recorded in the
        intake when it is made, checked when it is opened: :class:`IntakeOfAnotherDatabase`)."""
        self.path = path
        self.busy_timeout = busy_timeout
        self.database = database
        self._refused = False
        #: The file this process has open (device, inode), to tell when the path's changed.
        self._identity: tuple[int, int] | None = None
        # Nobody judges how long the intake's lock is held (no ``patience``): no stamps.
        self._lock = WritersLock(path + LOCK_SUFFIX, stamped=False)
        self._guard = threading.Lock()
        self._engine: Engine | None = None
        self._held: HeldConnections | None = None
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"Intake({self.path!r})"

    def exists(self) -> bool:
        """Whether the file is there (nothing was ever staged otherwise: nothing to read)."""
        # (Asked under the intake's lock, inside the database's transaction: see
        # :func:`receiver.storage.filelock.exists`.)
        return self._held is not None or filelock.exists(self.path)

    def replaced(self) -> bool:
        """Whether the file this process has open is no longer the one at the path (deleted
        or replaced while in use)."""
        if self._held is None or self._pid != os.getpid() or self._identity is None:
            return False
        return file_identity(self.path) != self._identity

    def check_current(self) -> None:
        """:class:`IntakeReplaced` (logged) if the file this process has open is no longer
        the one at the path: a delivery must not be stored where no other process looks."""
        if self.replaced():
            log.error(
                "the intake %s was deleted or replaced while in use: webhooks are refused "
                "until this process moves what it holds into the inbox",
                self.path,
                extra={"action": "intake_replaced"},
            )
            raise IntakeReplaced(f"{self.path} was deleted or replaced")

    def hold(self, timeout: float) -> AbstractContextManager[None]:
        """The intake's writers' lock (every write to the intake, and every write to the
        inbox that reads the intake, holds it: see the module's docstring)."""
        return self._lock.hold(timeout)

    def _connections(self) -> HeldConnections:
        """This process's connections (the file and its tables made if need be)."""
        if self._held is not None and self._pid == os.getpid():
            return self._held
        if self._pid != os.getpid():  # a forked child: the parent's lock may be held
            self._guard = threading.Lock()
        with self._guard:
            if self._held is None or self._pid != os.getpid():
                engine = make_engine(file_url(self.path), sqlite_busy_timeout=self.busy_timeout)
                held = HeldConnections(engine)
                owner = os.path.realpath(self.database) if self.database else None

                def create(conn: Any) -> None:
                    _create(conn, owner)

                # A deferred BEGIN: an intake made before is only read, without the lock; two
                # processes making it at once: the one that read first makes it again.
                try:
                    try:
                        held.transaction(create)
                    except DBAPIError:
                        held.transaction(create, immediate=True)
                except IntakeOfAnotherDatabase as exc:
                    engine.dispose()
                    if not self._refused:
                        self._refused = True
                        log.error(
                            "the intake %s is another database's (%s); set "
                            "HOOKLEDGER_SQLITE_INTAKE_PATH to a file of this one's own",
                            self.path,
                            exc,
                            extra={"action": "intake_of_another_database"},
                        )
                    raise
                except BaseException:
                    engine.dispose()
                    raise
                self._identity = file_identity(self.path)
                self._engine, self._held, self._pid = engine, held, os.getpid()
        assert self._held is not None
        return self._held

    # -- writes (the caller holds :meth:`hold`) ------------------------------------------------

    def transaction(self, work: Callable[[Any], T]) -> T:
        """``work(connection)`` in one intake transaction (``BEGIN IMMEDIATE``)."""
        return self._connections().transaction(
            work, busy_ms=int(self.busy_timeout * 1000), immediate=True
        )

    @staticmethod
    def stage(
        conn: Any, answer: str, bound: Sequence[Any], paths: Sequence[str], digests: Sequence[str]
    ) -> bool:
        """Keep a delivery (its inbox row as bound) on ``conn``, in the caller's transaction;
        ``False`` if the same delivery (account, event id and body hash) is kept already."""
        cursor = conn.execute(
            _INSERT, (answer, *bound, json.dumps(list(paths)), json.dumps(list(digests)))
        )
        return bool(cursor.rowcount == 1)

    @staticmethod
    def first_stored(conn: Any, account: str, event_id: str) -> Stored | None:
        """The body hash (and its key) of the first delivery of ``account``'s ``event_id``
        kept here (``pk`` 0: it has no inbox id yet), read on ``conn``."""
        row = conn.execute(_FIRST_STORED, (account, event_id)).fetchone()
        return None if row is None else Stored(0, row[0], row[1])

    def note(self, account: str, at: str) -> None:
        """Keep ``at`` (:func:`receiver.storage.sql.sqlite.utc_text`) as ``account``'s first
        delivery, unless an earlier one is kept."""
        self.transaction(lambda conn: conn.execute(_NOTE, (account, at)))

    def forget(self, staged: Collection[Staged], notes: Collection[tuple[str, str]]) -> None:
        """Delete deliveries (and first-delivery notes) that are in the inbox now."""
        if not staged and not notes:
            return

        def work(conn: Any) -> None:
            ids = [s.id for s in staged]
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                conn.execute(
                    f"DELETE FROM {TABLE} WHERE id IN ({', '.join('?' * len(chunk))})", chunk
                )
            for account, at in notes:
                conn.execute(
                    f"DELETE FROM {NOTES} WHERE account = ? AND first_at = ?", (account, at)
                )

        self.transaction(work)

    # -- reads ---------------------------------------------------------------------------------

    def any(self) -> bool:
        """Whether a delivery or a note waits here (a read: no lock)."""
        if not self.exists():
            return False
        rows = self._connections().fetchall(_ANY, ())
        return bool(rows and rows[0][0])

    def pending(
        self, limit: int, keys: Collection[tuple[str, str]] = (), *, skip: Collection[int] = ()
    ) -> list[Staged]:
        """The ``limit`` first deliveries (in arrival order) but those of ``skip`` (ids), and
        any of ``keys`` (account, event id) besides; read without a transaction (the caller
        holds :meth:`hold`, so nothing comes or goes meanwhile)."""
        held = self._connections()
        ids = sorted(skip)
        others = f" WHERE id NOT IN ({', '.join('?' * len(ids))})" if ids else ""
        where = f"id IN (SELECT id FROM {TABLE}{others} ORDER BY id LIMIT ?)"
        params: list[Any] = [*ids, limit]
        if keys:
            pairs = sorted(keys)
            where += f" OR (account, event_id) IN (VALUES {', '.join(['(?, ?)'] * len(pairs))})"
            params += [part for pair in pairs for part in pair]
        return [_staged(r) for r in held.fetchall(f"{_SELECT} WHERE {where} ORDER BY id", params)]

    def notes(self) -> list[tuple[str, str]]:
        """The first-delivery notes waiting: (account, time as text)."""
        return [
            (str(r[0]), str(r[1]))
            for r in self._connections().fetchall(
                f"SELECT account, first_at FROM {NOTES} ORDER BY account", ()
            )
        ]

    def close(self) -> None:
        """Close this process's connections (they are opened again when next needed)."""
        with self._guard:
            engine, self._engine, self._held = self._engine, None, None
        if engine is not None:
            engine.dispose()


def file_url(path: str) -> str:
    """The SQLAlchemy URL of the SQLite file at ``path``, whatever its characters (a ``?``,
    ``#`` or ``%`` in a directory's name is a path's, not a URL's query or escape)."""
    return URL.create("sqlite", database=path).render_as_string(hide_password=False)


def _create(conn: Any, owner: str | None = None) -> None:
    """Make the intake's tables (if need be), and record ``owner`` as its database, or check
    that it is: :class:`IntakeOfAnotherDatabase` if another database, still there, is."""
    tables = {
        str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    if not ({TABLE, NOTES, OWNER} <= tables and _missing(conn) == []):
        for statement in _CREATE:
            conn.execute(statement)
        # A newer hookledger may keep more inbox columns: add them to an intake made before.
        for name in _missing(conn):
            kind = EVENT_COLUMNS[name]
            conn.execute(f"ALTER TABLE {TABLE} ADD COLUMN {name} {_AFFINITY.get(kind, 'TEXT')}")
    if owner is None:
        return
    recorded = _owner(conn)
    if recorded == owner:
        return
    if recorded is not None and os.path.exists(recorded):
        raise IntakeOfAnotherDatabase(f"made for {recorded}")
    # New, or made before owners were recorded, or its database moved (with it): ours.
    conn.execute(f"DELETE FROM {OWNER}")
    conn.execute(f"INSERT INTO {OWNER} (database) VALUES (?)", (owner,))


def _owner(conn: Any) -> str | None:
    """The database recorded as the intake's (``None``: none yet)."""
    row = conn.execute(f"SELECT database FROM {OWNER} LIMIT 1").fetchone()
    return None if row is None else str(row[0])


def _missing(conn: Any) -> list[str]:
    """The inbox columns the intake's table lacks."""
    have = {str(r[1]) for r in conn.execute(f"PRAGMA table_info({TABLE})").fetchall()}
    return [name for name in EVENT_COLUMNS if name not in have]


# -- where an engine's intake is --------------------------------------------------------------

#: The intake of each engine a :class:`receiver.store.Store` was made on (``None``: none).
_PATHS: weakref.WeakKeyDictionary[Engine, str | None] = weakref.WeakKeyDictionary()


def resolve(engine: Engine, setting: str | None = None) -> str | None:
    """The intake of ``engine``'s database: ``setting`` (``HOOKLEDGER_SQLITE_INTAKE_PATH``) if
    given, ``<database>-intake`` otherwise, ``None`` with ``off``, on PostgreSQL, and for a
    SQLite database in memory or opened by URI."""
    if engine.dialect.name != "sqlite":
        return None
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    text = (setting or "").strip()
    if text.lower() == OFF:
        return None
    return text or database + INTAKE_SUFFIX


def register(engine: Engine, path: str | None) -> None:
    """Remember ``engine``'s intake (for :func:`figures_of`)."""
    _PATHS[engine] = path


def path_of(engine: Engine) -> str | None:
    """``engine``'s intake: as a store registered it, else the default (:func:`resolve`)."""
    try:
        return _PATHS[engine]
    except KeyError:
        return resolve(engine)


@dataclass(frozen=True, slots=True)
class Waiting:
    """An account's deliveries in the intake: how many, and the first one's receipt."""

    count: int
    oldest: datetime


def figures_of(engine: Engine) -> dict[str, Waiting]:
    """The deliveries waiting in ``engine``'s intake, per account (none without one). A read
    on a connection of its own (no lock): for status, stats, metrics and the console."""
    return read_figures(engine)[0]


def read_figures(engine: Engine) -> tuple[dict[str, Waiting], str | None]:
    """:func:`figures_of`, and why the intake could not be read, if it is there and could not
    (``None`` otherwise): for ``hookledger status``, which calls it a problem."""
    path = path_of(engine)
    if path is None or not os.path.exists(path):
        return {}, None
    database = engine.url.database
    try:
        conn = sqlite3.connect(path, timeout=5.0)
        try:
            rows = conn.execute(_FIGURES).fetchall()
            try:
                recorded = _owner(conn)
            except sqlite3.OperationalError:  # (made before owners were recorded)
                recorded = None
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if "no such table" in str(exc):  # (made a moment ago, its tables not yet)
            return {}, None
        log.warning(
            "the intake %s could not be read: %s",
            path,
            type(exc).__name__,
            extra={"action": "intake_unreadable"},
        )
        return {}, f"{type(exc).__name__}: {str(exc)[:200]}"
    if (
        recorded is not None
        and database
        and recorded != os.path.realpath(database)
        and os.path.exists(recorded)
    ):
        return {}, f"it is the intake of another database, {recorded}"
    return {str(r[0]): Waiting(int(r[1]), _time(r[2])) for r in rows}, None


@dataclass(frozen=True, slots=True)
class Listed:
    """A delivery waiting in the intake, as ``hookledger intake list`` shows it: never its
    body or headers."""

    id: int
    answer: str
    account: str
    event_id: str
    event_type: str
    object_key: str
    source: str
    received_at: datetime


_LISTED = (
    f"SELECT id, answer, account, event_id, event_type, object_key, source, received_at "
    f"FROM {TABLE} ORDER BY id LIMIT ?"
)


def read_waiting(engine: Engine, *, limit: int) -> tuple[list[Listed], str | None]:
    """The first ``limit`` deliveries waiting in ``engine``'s intake, in arrival order (the
    order they are moved in), and why the intake could not be read (as :func:`read_figures`).
    A read on a connection of its own: no lock, and no intake is made where there is none."""
    path = path_of(engine)
    _, problem = read_figures(engine)
    if path is None or problem is not None or not os.path.exists(path):
        return [], problem
    try:
        conn = sqlite3.connect(path, timeout=5.0)
        try:
            rows = conn.execute(_LISTED, (limit,)).fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if "no such table" in str(exc):
            return [], None
        return [], f"{type(exc).__name__}: {str(exc)[:200]}"
    return [
        Listed(
            id=int(r[0]),
            answer=str(r[1]),
            account=str(r[2]),
            event_id=str(r[3]),
            event_type=str(r[4] or ""),
            object_key=str(r[5] or ""),
            source=str(r[6] or ""),
            received_at=_time(r[7]),
        )
        for r in rows
    ], None


def _time(text: Any) -> datetime:
    value = datetime.fromisoformat(str(text))
    return value if value.tzinfo else value.replace(tzinfo=UTC)
