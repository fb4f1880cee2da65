"""What the parts of the store share: the engine, the clock, and the dialect's statements.

The store is four parts, one per concern, each on one :class:`Storage`:
:class:`receiver.storage.inbox.Inbox` (receive), :class:`receiver.storage.queue.Queue` (claim and
leases), :class:`receiver.storage.dispatch.Dispatcher` (guard, handlers, ledger, outcomes) and
:class:`receiver.storage.operator_actions.Operations` (operator queries);
:class:`receiver.store.Store` composes them. Every operation is one short transaction, and
correctness never depends on a check followed by a separate write.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from receiver.core.clock import Clock, as_utc, utcnow
from receiver.core.errors import StorageBusy, StorageUnavailable
from receiver.core.keyring import Keyring
from receiver.core.order_refs import OrderFields
from receiver.storage.database import deferred_begin
from receiver.storage.sql import Statements, statements_for


class Storage:
    """One engine (SQLite or PostgreSQL), its dialect's statements, the clock, the data
    keys stored payloads are sealed with (:mod:`receiver.storage.sealed_columns`) and the
    shop's order reference fields every stored event is indexed by
    (:mod:`receiver.storage.order_refs`)."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Clock = utcnow,
        keyring: Keyring | None = None,
        order_fields: OrderFields | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.keyring = keyring or Keyring()
        self.order_fields = order_fields if order_fields is not None else OrderFields()
        self.sql: Statements = statements_for(engine)
        #: Reads, and transactions whose first statement writes: on SQLite a deferred BEGIN,
        #: so reads never queue for the lock and an insert holds it only from its INSERT on.
        #: Every other transaction (``engine.begin()``) takes SQLite's lock up front.
        self.deferred = deferred_begin(engine)

    def __repr__(self) -> str:
        return f"Storage(dialect={self.engine.dialect.name!r})"

    @property
    def single_writer(self) -> bool:
        """SQLite: one writer at a time for the whole database."""
        return self.sql.single_writer

    def now(self) -> datetime:
        return as_utc(self.clock())


def is_unavailable(exc: DBAPIError) -> bool:
    """Connection-level failures (server down, network cut, disk locked, schema missing)."""
    return isinstance(exc, (OperationalError, InterfaceError)) or exc.connection_invalidated


def unavailable(cause: BaseException | None) -> StorageUnavailable:
    """The refusal a database failure ``cause`` makes of a delivery: :class:`StorageBusy`
    when the database answered but a lock stayed held past the wait (:func:`is_busy`), else
    :class:`StorageUnavailable` (the database down, unreachable, not answering)."""
    error = StorageBusy() if cause is not None and is_busy(cause) else StorageUnavailable()
    error.__cause__ = cause
    return error


def is_busy(exc: BaseException) -> bool:
    """Whether a database failure is a wait that ran out, not an outage: SQLite busy or
    locked past its busy timeout, a PostgreSQL lock or statement timeout (``55P03``,
    ``57014``), a deadlock or a serialization failure. (The same failures a handler's retry
    soon may not meet: :func:`is_transient_conflict`.)"""
    return is_transient_conflict(exc)


#: PostgreSQL's conflicts between concurrent transactions (SQLSTATE): worth another try soon.
TRANSIENT_SQLSTATES: Final = {
    "40001": "serialization failure",
    "40P01": "deadlock",
    "55P03": "lock not available",
    "57014": "statement or lock timeout",
}


def driver_error(exc: BaseException) -> BaseException | None:
    """The database driver's own exception behind ``exc`` (SQLAlchemy's ``orig``, or ``exc``
    itself when a handler used the driver directly), if it is one."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    module = type(orig).__module__.split(".")[0]
    return orig if module in ("sqlite3", "psycopg", "psycopg2") else None


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL error (``None`` for SQLite and for anything else)."""
    orig = driver_error(exc)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(state) if state else None


def is_transient_conflict(exc: BaseException) -> bool:
    """A conflict with another transaction that a retry soon may not meet: SQLite busy or
    locked, a PostgreSQL deadlock, lock or statement timeout, or serialization failure."""
    orig = driver_error(exc)
    if orig is None:
        return False
    name = str(getattr(orig, "sqlite_errorname", "") or "")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return True
    if type(orig).__module__.split(".")[0] == "sqlite3" and not name:
        return str(orig).startswith(("database is locked", "database table is locked"))
    return sqlstate(exc) in TRANSIENT_SQLSTATES


def is_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` came from a database (through SQLAlchemy or a driver used directly)."""
    return isinstance(exc, DBAPIError) or driver_error(exc) is not None


def describe_database_error(exc: BaseException) -> str:
    """One line naming a database error: its class, SQLSTATE and the driver's first line;
    never the statement's parameters."""
    orig = driver_error(exc) or exc
    state = sqlstate(exc)
    first = (str(orig).strip().splitlines() or [""])[0][:200]
    label = type(orig).__name__ + (f" (SQLSTATE {state})" if state else "")
    return f"{label}: {first}" if first else label
