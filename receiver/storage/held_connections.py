"""Driver connections held per thread, for the receive path's writes.

On PostgreSQL a delivery is one statement that is its own transaction (autocommit): the
insert-or-ignore that also answers the stored row of a known event id. On SQLite a batch of
deliveries (group commit) is one transaction of such inserts, after a read of the rows
already stored. Run through SQLAlchemy, each took pool checkouts and checkins,
``Connection`` objects, an isolation level set and reset (PostgreSQL), ``BEGIN`` and
``COMMIT`` through its events (SQLite), and result objects around them: about a third of the
Python a delivery cost (``bench/ANALYSIS.md``). Here each web server thread keeps one
driver connection of its own (psycopg or sqlite3), made by the engine (its URL, connect
arguments and ``connect`` events: SQLite's pragmas included) and detached from its pool, in
autocommit, for the life of the thread; the statements run on it directly.

What SQLAlchemy did around the statement is done here:

- A driver error is raised as SQLAlchemy's exception of the same kind
  (:meth:`sqlalchemy.exc.DBAPIError.instance`, its ``orig`` the driver's), so callers tell a
  database outage from a bad row exactly as before, and no parameter (the body) is in it.
- A connection found broken (the server restarted, the network cut it while it sat idle) is
  closed and forgotten, the error marked ``connection_invalidated``, and a statement that
  is idempotent and its own transaction (:meth:`HeldConnections.fetchall`) is run once more
  on a new connection. A transaction (:meth:`HeldConnections.transaction`) that fails is
  rolled back, and the connection dropped if even that fails.
- ``engine.dispose()`` closes every held connection; a forked child never uses its
  parent's (it opens its own).

An idle held connection holds no lock and no transaction.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine, event
from sqlalchemy.exc import DBAPIError

log = logging.getLogger("receiver.store")

T = TypeVar("T")


class _Held:
    """A thread's connection, and the process that opened it (weakly referenced by the
    registry: a thread that ends drops it, and the driver closes it when collected)."""

    __slots__ = ("conn", "pid", "busy_ms", "__weakref__")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.pid = os.getpid()
        #: SQLite: the ``busy_timeout`` this connection was last given by
        #: :meth:`HeldConnections.transaction` (``None``: the engine's, unknown here).
        self.busy_ms: int | None = None


class HeldConnections:
    """One autocommit driver connection per thread of this process, on ``engine``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._pg = engine.dialect.name == "postgresql"
        if self._pg:
            import psycopg

            self._driver_error: type[Exception] = psycopg.Error
        else:
            self._driver_error = sqlite3.Error
        self._local = threading.local()
        self._lock = threading.Lock()
        self._held: weakref.WeakSet[_Held] = weakref.WeakSet()
        event.listen(engine, "engine_disposed", self._on_dispose)

    def __repr__(self) -> str:
        return f"HeldConnections(held={len(self._held)})"

    def connections(self) -> list[Any]:
        """The driver connections held now (by threads of this process)."""
        with self._lock:
            return [held.conn for held in self._held if held.pid == os.getpid()]

    def fetchall(self, statement: str, params: Any) -> list[tuple[Any, ...]]:
        """Run ``statement`` (the driver's placeholders) as its own transaction on this
        thread's connection; its rows. Raises SQLAlchemy's ``DBAPIError`` subclasses."""
        for attempt in (1, 2):
            conn = self._connection()
            try:
                return conn.execute(statement, params).fetchall()  # type: ignore[no-any-return]
            except self._driver_error as exc:
                broken = self._broken(conn)
                if broken:
                    self._forget(conn)
                error = self._error(statement, exc, broken=broken)
                if broken and attempt == 1:
                    log.warning(
                        "database connection lost; writing the deliveries again on a new one",
                        extra={"action": "reconnect"},
                    )
                    continue
                raise error from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def transaction(
        self, work: Callable[[Any], T], *, busy_ms: int | None = None, immediate: bool = False
    ) -> T:
        """``work(connection)`` between ``BEGIN`` (deferred on SQLite: the first write takes
        the lock) and ``COMMIT`` on this thread's connection, rolled back if anything fails.
        Driver errors are raised as SQLAlchemy's ``DBAPIError`` subclasses; anything else
        ``work`` raises, as it is. SQLite: ``busy_ms``, how long to wait for the database's
        write lock (the connection keeps it for its next transactions); ``immediate``: take
        the lock at ``BEGIN``."""
        held = self._held_one()
        conn = held.conn
        statement = "BEGIN"
        try:
            if busy_ms is not None and held.busy_ms != busy_ms:
                # Said once per connection and value (a connection keeps it), not per
                # transaction: one statement fewer for each of the receive path's writes.
                statement = "PRAGMA busy_timeout"
                held.busy_ms = None
                conn.execute(f"PRAGMA busy_timeout={int(busy_ms):d}")
                held.busy_ms = busy_ms
                statement = "BEGIN"
            conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            statement = "(the transaction's statements)"
            result = work(conn)
            statement = "COMMIT"
            conn.execute("COMMIT")
            return result
        except BaseException as exc:
            self._roll_back(conn)
            if isinstance(exc, self._driver_error):
                raise self._error(statement, exc, broken=self._broken(conn)) from exc
            raise

    def _roll_back(self, conn: Any) -> None:
        try:
            if self._pg or conn.in_transaction:
                conn.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - a connection that cannot roll back is not reused
            self._forget(conn)

    def _broken(self, conn: Any) -> bool:
        return bool(conn.broken or conn.closed) if self._pg else False

    def _error(self, statement: str | None, exc: Exception, *, broken: bool) -> DBAPIError:
        """``exc`` as SQLAlchemy raises it (never with the parameters: the body)."""
        error = DBAPIError.instance(
            statement,
            None,
            exc,
            self._driver_error,
            hide_parameters=True,
            connection_invalidated=broken,
        )
        assert isinstance(error, DBAPIError)  # ``exc`` is the driver's own
        return error

    def close(self) -> None:
        """Close every connection held (the threads open new ones when next used)."""
        with self._lock:
            held = list(self._held)
            self._held.clear()
        for each in held:
            if each.pid != os.getpid():
                continue  # a parent's: its socket is not this process's to close
            try:
                each.conn.close()
            except Exception:  # noqa: BLE001, S110 - closing a dead connection: nothing to do
                pass

    def _connection(self) -> Any:
        return self._held_one().conn

    def _held_one(self) -> _Held:
        """This thread's connection (opened if need be) and what is known of it."""
        held: _Held | None = getattr(self._local, "held", None)
        if held is not None and held.pid == os.getpid() and held in self._held:
            return held  # not closed by :meth:`close` or forgotten meanwhile
        # The engine makes it (connect arguments, ``connect`` events); it then leaves the
        # pool, which neither counts nor resets it.
        try:
            fairy = self._engine.raw_connection()
        except self._driver_error as exc:  # the pool does not wrap a failure to connect
            raise self._error(None, exc, broken=True) from exc
        conn: Any = fairy.driver_connection
        fairy.detach()
        if self._pg:
            conn.autocommit = True
        else:  # the engine's ``connect`` event leaves sqlite3 in autocommit already
            conn.isolation_level = None
        held = self._local.held = _Held(conn)
        with self._lock:
            self._held.add(held)
        return held

    def _forget(self, conn: Any) -> None:
        held: _Held | None = getattr(self._local, "held", None)
        self._local.held = None
        if held is not None:
            with self._lock:
                self._held.discard(held)
        try:
            conn.close()
        except Exception:  # noqa: BLE001, S110 - it is broken already
            pass

    def _on_dispose(self, _engine: Engine) -> None:
        self.close()
