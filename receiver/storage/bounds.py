"""Bounds on every wait for PostgreSQL: nothing the worker or the reconciler sends waits
forever for an answer.

Two kinds of wait, two kinds of bound:

- The server answers, but slowly: a lock held by an operator's migration or by another
  session idle in its transaction, a statement that runs long. PostgreSQL's own timeouts,
  set on each new connection (``statement_timeout``, ``lock_timeout``,
  ``idle_in_transaction_session_timeout``), end the statement (SQLSTATE ``57014``,
  ``55P03``) or the session (``25P03``) with an error.
- Nobody answers: a hung proxy or pooler between the two, a stalled disk, a server that
  accepted the connection and then went silent. The server's timeouts never fire (the
  statement may never have reached it), and TCP keepalives do not help either when
  something in between acknowledges the bytes. :class:`AnswerWatch` is the client-side
  bound: a statement (or commit, or ping) with no answer within
  :attr:`Bounds.answer_timeout` has its connection's socket shut down, so the blocked read
  returns with an error, the pool drops that connection, and the caller sees an ordinary
  "database unavailable" error. Past :attr:`Bounds.stall_after` it tells its listeners
  first (the worker logs ``action=stalled`` naming what it waits on).
- Nobody answers a new connection: the server (or a pooler in front of it) accepts the TCP
  connection and never answers the startup. There is no socket to cut yet: the connect
  timeout (``connect_timeout``, 5 s unless the URL names another; never off on a bounded
  engine) ends it, and the watch tells its listeners about it as a stall, naming the host,
  port and database it waits on (never the URL's password), when it outlasts
  :attr:`Bounds.stall_after` or ends by the timeout, whichever comes first.

The defaults fit the worker's lease (:meth:`Bounds.for_lease`). SQLite needs none of this:
its busy timeout bounds every lock wait, and there is no socket.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Engine

from receiver.core.bounds import PHASE
from receiver.core.bounds import Bounds as Bounds
from receiver.core.bounds import phase as phase

log = logging.getLogger("receiver.storage")

# -- what a connection is doing (for the log: never a statement's parameters or literals) --

_VERB = re.compile(r"\s*(\w+)")
_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN|TABLE)\s+\"?([A-Za-z_][\w.]*)", re.IGNORECASE)


def describe_statement(statement: str) -> str:
    """``UPDATE hookledger_inbox``: a statement's verb and first table, nothing else (a
    handler's statement may carry customer data as literals)."""
    verb = _VERB.match(statement)
    table = _TABLE.search(statement[:2000])
    words = [verb.group(1).upper() if verb else "statement"]
    if table is not None:
        words.append(table.group(1)[:63])
    return " ".join(words)


class StallListener(Protocol):
    def stalled(self, waiting_on: str, phase: str, seconds: float) -> None: ...

    def answered(self, waiting_on: str, phase: str, seconds: float) -> None: ...


@dataclass(slots=True)
class _Wait:
    #: The connection to cut at the bound; ``None`` for a connect (its timeout ends it).
    conn: Any
    waiting_on: str
    phase: str
    started: float
    reported: bool = False
    cut: bool = False


class AnswerWatch:
    """Cuts a connection that has waited longer than ``timeout`` for an answer; tells its
    listeners about a wait longer than ``stall_after`` (once), and when it ends."""

    def __init__(self, bounds: Bounds) -> None:
        timeout = bounds.answer_timeout
        assert timeout is not None
        self.bounds = bounds
        self.timeout = timeout
        self.stall_after = bounds.stall_after or timeout
        self._lock = threading.Lock()
        self._waits: dict[int, _Wait] = {}
        self._tokens = itertools.count()
        self._listeners: list[StallListener] = []
        self._thread: threading.Thread | None = None
        self._tick = min(0.25, self.stall_after / 4)

    def __repr__(self) -> str:
        return f"AnswerWatch(timeout={self.timeout:g})"

    def add_listener(self, listener: StallListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: StallListener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def enter(self, conn: Any, waiting_on: str) -> int:
        """Start a wait for an answer on ``conn`` (``None``: a connect, never cut here)."""
        token = next(self._tokens)
        with self._lock:
            self._waits[token] = _Wait(conn, waiting_on, PHASE.get(), time.monotonic())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="hookledger-answer-watch", daemon=True
                )
                self._thread.start()
        return token

    def leave(self, token: int, *, timed_out: bool = False) -> bool:
        """End a wait; return whether it was cut. ``timed_out``: it ended without an answer
        by a bound of its own (a connect's timeout): a stall, told as one if it was not yet."""
        with self._lock:
            wait = self._waits.pop(token, None)
            listeners = list(self._listeners) if wait is not None else []
        if wait is None:
            return False
        seconds = time.monotonic() - wait.started
        if timed_out:
            if not wait.reported:
                for listener in listeners:
                    _tell(listener.stalled, wait, seconds)
        elif wait.reported and not wait.cut:
            for listener in listeners:
                _tell(listener.answered, wait, seconds)
        return wait.cut

    def _run(self) -> None:
        while True:
            time.sleep(self._tick)
            now = time.monotonic()
            stalled: list[tuple[_Wait, float]] = []
            with self._lock:
                listeners = list(self._listeners)
                for wait in self._waits.values():
                    waited = now - wait.started
                    if not wait.reported and waited >= self.stall_after:
                        wait.reported = True
                        stalled.append((wait, waited))
                    if not wait.cut and wait.conn is not None and waited >= self.timeout:
                        wait.cut = True
                        _cut(wait.conn)
                        log.warning(
                            "no answer from the database for %.1f s (%s%s): connection cut",
                            waited,
                            wait.waiting_on,
                            f", {wait.phase}" if wait.phase else "",
                            extra={
                                "action": "stall_cut",
                                "phase": wait.phase,
                                "waiting_on": wait.waiting_on,
                            },
                        )
            for wait, waited in stalled:
                for listener in listeners:
                    _tell(listener.stalled, wait, waited)


def _tell(method: Callable[[str, str, float], None], wait: _Wait, seconds: float) -> None:
    try:
        method(wait.waiting_on, wait.phase, seconds)
    except Exception:  # noqa: BLE001 - a listener never stops the watch
        log.exception("a stall listener failed")


def _cut(conn: Any) -> None:
    """Shut down ``conn``'s socket: a read blocked on it returns at once with an error."""
    try:
        fd = int(conn.fileno())
        sock = socket.socket(fileno=os.dup(fd))
    except Exception:  # noqa: BLE001 - closed meanwhile: nothing left to cut
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


# -- the watched psycopg connection ----------------------------------------------------------

_WATCHES: weakref.WeakKeyDictionary[Engine, AnswerWatch] = weakref.WeakKeyDictionary()
_BOUNDS: weakref.WeakKeyDictionary[Engine, Bounds] = weakref.WeakKeyDictionary()
_CLASS: list[Any] = []


def bounds_of(engine: Engine) -> Bounds | None:
    """The bounds ``engine``'s connections set (``None``: the server's own settings)."""
    return _BOUNDS.get(getattr(engine, "engine", engine))


def answer_watch(engine: Engine) -> AnswerWatch | None:
    """The watch bounding ``engine``'s waits (``None``: unbounded, or SQLite)."""
    return _WATCHES.get(getattr(engine, "engine", engine))


def _watched_class() -> Any:
    """psycopg's connection, with every wait for the server (a statement, a commit, a
    fetch, a ping: psycopg sends them all through ``wait``) under an :class:`AnswerWatch`."""
    if _CLASS:
        return _CLASS[0]
    import psycopg

    class WatchedConnection(psycopg.Connection):
        hookledger_watch: AnswerWatch | None = None
        hookledger_doing: str = "statement"

        def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
            watch = self.hookledger_watch
            if watch is None:
                return super().wait(gen, *args, **kwargs)
            token = watch.enter(self, self.hookledger_doing)
            cut = False
            try:
                return super().wait(gen, *args, **kwargs)
            except psycopg.Error as exc:
                cut = watch.leave(token)
                token = -1
                if cut:
                    raise psycopg.OperationalError(
                        f"no answer from the database within {watch.timeout:g} s "
                        f"({self.hookledger_doing}): connection cut"
                    ) from exc
                raise
            finally:
                if token >= 0:
                    watch.leave(token)

        def commit(self) -> None:
            self.hookledger_doing = "COMMIT"
            super().commit()

        def rollback(self) -> None:
            self.hookledger_doing = "ROLLBACK"
            super().rollback()

    _CLASS.append(WatchedConnection)
    return WatchedConnection


#: A bounded engine's connect timeout (seconds) when its URL turns it off (``0``) or names
#: none (:func:`receiver.storage.database.make_engine` sets 5 s by default).
CONNECT_TIMEOUT = 5


def connect_timeout(given: Any) -> int:
    """The connect timeout of a bounded engine: the URL's, unless it is off or unreadable."""
    try:
        seconds = int(float(given))
    except (TypeError, ValueError):
        return CONNECT_TIMEOUT
    return seconds if seconds > 0 else CONNECT_TIMEOUT


def describe_target(cparams: dict[str, Any]) -> str:
    """``connect to db.internal:5432/shop``: where a connect waits, from its parameters,
    never the password (nor the user, options or anything else the URL carries)."""
    host = str(cparams.get("host") or cparams.get("hostaddr") or "the local socket")[:100]
    port = cparams.get("port")
    where = f"{host}:{port}" if port and not host.startswith("/") else host
    database = cparams.get("dbname")
    return f"connect to {where}/{str(database)[:63]}" if database else f"connect to {where}"


def _watched_connect(watch: AnswerWatch | None, cargs: Any, cparams: dict[str, Any]) -> Any:
    """Open a watched connection; the wait for the server's answer to the startup is told
    to ``watch``'s listeners as a stall when it outlasts the stall bound or the connect
    timeout (it cannot be cut: the timeout ends it)."""
    cls = _watched_class()
    if watch is None:
        return cls.connect(*cargs, **cparams)
    import psycopg

    token = watch.enter(None, describe_target(cparams))
    timed_out = False
    try:
        return cls.connect(*cargs, **cparams)
    except psycopg.OperationalError as exc:
        timed_out = isinstance(exc, getattr(psycopg.errors, "ConnectionTimeout", ())) or (
            "timeout expired" in str(exc)
        )
        raise
    finally:
        watch.leave(token, timed_out=timed_out)


def bound(engine: Engine, bounds: Bounds) -> None:
    """Put ``engine`` (PostgreSQL, psycopg) under ``bounds``: each new connection sets the
    server's timeouts, and its waits are watched (see the module docstring)."""
    from sqlalchemy import event

    if engine.dialect.name != "postgresql" or engine.dialect.driver != "psycopg":
        return
    _BOUNDS[engine] = bounds
    watch = AnswerWatch(bounds) if bounds.answer_timeout is not None else None
    if watch is not None:
        _WATCHES[engine] = watch
    sql = bounds.session_sql()

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        cparams["connect_timeout"] = connect_timeout(cparams.get("connect_timeout"))
        conn = _watched_connect(watch, cargs, cparams)
        conn.hookledger_watch = watch
        conn.hookledger_doing = "SET timeouts"
        autocommit = conn.autocommit
        conn.autocommit = True
        try:
            conn.execute(sql)
        except BaseException:
            conn.close()
            raise
        conn.autocommit = autocommit
        return conn

    if watch is None:
        return

    @event.listens_for(engine, "before_cursor_execute")
    def _before(
        conn: Any, _cursor: Any, statement: str, _params: Any, _context: Any, _many: bool
    ) -> None:
        dbapi = conn.connection.dbapi_connection
        if dbapi is not None:
            dbapi.hookledger_doing = describe_statement(statement)
