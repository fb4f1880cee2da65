"""Driver connections held per thread, for the receive path's one statement (PostgreSQL).

On PostgreSQL a delivery is one statement that is its own transaction (autocommit): the
insert-or-ignore that also answers the stored row of a known event id. Run through
SQLAlchemy, each took a pool checkout and checkin, a ``Connection``, an isolation level set
and reset, and a result object around it: about a third of the Python a delivery cost
(``bench/ANALYSIS.md``). Here each web server thread keeps one psycopg connection of its own,
made by the engine (its URL, connect arguments and ``connect`` events) and detached from
its pool, in autocommit, for the life of the thread; the statement runs on it directly.

What SQLAlchemy did around the statement is done here:

- A driver error is raised as SQLAlchemy's exception of the same kind
  (:meth:`sqlalchemy.exc.DBAPIError.instance`, its ``orig`` the driver's), so callers tell a
  database outage from a bad row exactly as before, and no parameter (the body) is in it.
- A connection found broken (the server restarted, the network cut it while it sat idle) is
  closed and forgotten, the error marked ``connection_invalidated``, and the statement,
  idempotent and its own transaction, is run once more on a new connection.
- ``engine.dispose()`` closes every held connection; a forked child never uses its
  parent's (it opens its own).

An idle held connection holds no lock and no transaction.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import DBAPIError

log = logging.getLogger("receiver.store")


class HeldConnections:
    """One autocommit driver connection per thread of this process, on ``engine``."""

    def __init__(self, engine: Engine) -> None:
        import psycopg

        self._engine = engine
        self._driver_error: type[Exception] = psycopg.Error
        self._local = threading.local()
        self._lock = threading.Lock()
        self._held: weakref.WeakSet[Any] = weakref.WeakSet()
        event.listen(engine, "engine_disposed", self._on_dispose)

    def __repr__(self) -> str:
        return f"HeldConnections(held={len(self._held)})"

    def fetchall(self, statement: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Run ``statement`` (psycopg placeholders) as its own transaction on this thread's
        connection; its rows. Raises SQLAlchemy's ``DBAPIError`` subclasses."""
        for attempt in (1, 2):
            try:
                conn = self._connection()
            except self._driver_error as exc:  # the pool does not wrap a failure to connect
                raise DBAPIError.instance(
                    None, None, exc, self._driver_error, connection_invalidated=True
                ) from exc
            try:
                return conn.execute(statement, params).fetchall()  # type: ignore[no-any-return]
            except self._driver_error as exc:
                broken = bool(conn.broken or conn.closed)
                if broken:
                    self._forget(conn)
                error = DBAPIError.instance(
                    statement,
                    None,
                    exc,
                    self._driver_error,
                    hide_parameters=True,
                    connection_invalidated=broken,
                )
                if broken and attempt == 1:
                    log.warning(
                        "database connection lost; writing the deliveries again on a new one",
                        extra={"action": "reconnect"},
                    )
                    continue
                raise error from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Close every connection held (the threads open new ones when next used)."""
        with self._lock:
            held = list(self._held)
            self._held.clear()
        for conn in held:
            try:
                conn.close()
            except Exception:  # noqa: BLE001, S110 - closing a dead connection: nothing to do
                pass

    def _connection(self) -> Any:
        pid, held = getattr(self._local, "held", (None, None))
        if held is not None and pid == os.getpid() and not held.closed:
            return held
        # The engine makes it (connect arguments, ``connect`` events); it then leaves the
        # pool, which neither counts nor resets it.
        fairy = self._engine.raw_connection()
        conn: Any = fairy.driver_connection
        fairy.detach()
        conn.autocommit = True
        self._local.held = (os.getpid(), conn)
        with self._lock:
            self._held.add(conn)
        return conn

    def _forget(self, conn: Any) -> None:
        self._local.held = (None, None)
        with self._lock:
            self._held.discard(conn)
        try:
            conn.close()
        except Exception:  # noqa: BLE001, S110 - it is broken already
            pass

    def _on_dispose(self, _engine: Engine) -> None:
        self.close()
