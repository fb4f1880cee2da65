"""What the parts of the store share: the engine, the clock, and the dialect's statements.

The store is four parts, one per concern, each on one :class:`Storage`:
:class:`receiver.storage.inbox.Inbox` (receive), :class:`receiver.storage.queue.Queue` (claim and
leases), :class:`receiver.storage.dispatch.Dispatcher` (guard, handlers, ledger, outcomes) and
:class:`receiver.storage.operator_actions.Operations` (operator queries);
:class:`receiver.store.Store`
composes them. Every operation is one short transaction, and correctness never depends on a
check followed by a separate write.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from receiver.core.clock import Clock, as_utc, utcnow
from receiver.core.errors import StorageUnavailable
from receiver.core.keyring import Keyring
from receiver.storage.database import deferred_begin
from receiver.storage.sql import Statements, statements_for


class Storage:
    """One engine (SQLite or PostgreSQL), its dialect's statements, the clock, and the data
    keys stored payloads are sealed with (:mod:`receiver.storage.sealed_columns`)."""

    def __init__(
        self, engine: Engine, *, clock: Clock = utcnow, keyring: Keyring | None = None
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.keyring = keyring or Keyring()
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
    """A :class:`StorageUnavailable` caused by ``cause``."""
    error = StorageUnavailable()
    error.__cause__ = cause
    return error
