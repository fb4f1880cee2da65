"""The session a handler gets: joined to the dispatch transaction, which it cannot end.

A batch's handlers, ledger rows and outcomes are one transaction on one connection
(:mod:`receiver.storage.dispatch`). Each handler that takes the session runs inside a
savepoint of the dispatcher's, with a :class:`HandlerSession` joined to that connection the
way SQLAlchemy documents for an external transaction ("Joining a Session into an External
Transaction", ``join_transaction_mode="create_savepoint"``): the session's own transaction is
a savepoint inside the handler's.

What a handler may do with it:

- read, write, ``flush()``; ``begin_nested()`` (a savepoint of its own) and raw
  ``SAVEPOINT`` / ``RELEASE`` / ``ROLLBACK TO`` of the savepoints it made;
- ``rollback()``: undoes the handler's own writes so far (its savepoint), nothing else, and
  the handler may go on: the usual ``except IntegrityError: session.rollback()``.

Only while the handler runs: once its call is over the session refuses every statement
and flush (:class:`receiver.core.errors.HandlerTransactionError`), so a session kept by
another handler, a thread or a cache never writes into the batch's transaction outside its
handler's savepoint.

What it may not: end the transaction. ``session.commit()``, ``session.begin()``,
``session.close()``, ``session.reset()``, ``session.invalidate()``; on the connection
(``session.connection()``, ``session.get_bind()``) ``commit()``, ``rollback()``, ``close()``,
``begin()``, ``get_transaction()``, ``invalidate()``, the same on its pool connection
(``.connection``); and ``COMMIT``, ``ROLLBACK``, ``BEGIN``, ``END``... sent as SQL. Each is
refused with :class:`receiver.core.errors.HandlerTransactionError` before it reaches the
database, and it is that handler's failure even if the handler catches the exception: its
writes are rolled back, its ledger row says why, the attempt counts.

Under SQLAlchemy, on the driver's own connection: SQLite's refuses every ``BEGIN``,
``COMMIT`` and ``ROLLBACK`` while a handler runs (an authorizer); psycopg's refuses
``commit()``, ``rollback()`` and transaction statements through its ``execute()``. A
handler that still ends the transaction (a psycopg cursor's ``COMMIT``) is seen after it
returns (the driver is no longer in the transaction, or the handler's savepoint is gone) and
:class:`TransactionEnded` is raised; the dispatcher fails that handler alone and runs the
batch's other events again one by one.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import Any, Literal, NoReturn

from sqlalchemy import Connection, event
from sqlalchemy.exc import DBAPIError, DisconnectionError, SQLAlchemyError
from sqlalchemy.orm import Session, SessionTransaction
from sqlalchemy.sql.elements import (
    ReleaseSavepointClause,
    RollbackToSavepointClause,
    SavepointClause,
)

from receiver.core.errors import HandlerTransactionError

#: What a handler's call did: ``None`` (it succeeded) or the error that failed it.
Failure = BaseException | None


#: The session of the handler running in this context (thread), while it runs.
_RUNNING: ContextVar[HandlerSession | None] = ContextVar("hookledger_handler", default=None)


#: Whether a handler (with the session or without) runs in this context (thread).
_IN_HANDLER: ContextVar[bool] = ContextVar("hookledger_in_handler", default=False)


def running_session() -> HandlerSession | None:
    """The session of the handler running now in this thread, if one is (``observe()``
    called from a handler on SQLite stores its observation in it: the handler's worker
    holds the database's only write lock)."""
    return _RUNNING.get()


def in_handler() -> bool:
    """Whether a handler runs now in this thread (with the session or without)."""
    return _IN_HANDLER.get()


@contextmanager
def running_handler() -> Iterator[None]:
    """While the dispatcher runs one handler (see :func:`in_handler`)."""
    token = _IN_HANDLER.set(True)
    try:
        yield
    finally:
        _IN_HANDLER.reset(token)


class TransactionEnded(Exception):
    """A handler ended the batch's transaction under SQLAlchemy (on the driver's own
    connection): nothing of the transaction can be kept. ``error`` is that handler's failure."""

    def __init__(self, error: HandlerTransactionError) -> None:
        super().__init__(str(error))
        self.error = error


class HandlerSession(Session):
    """A :class:`~sqlalchemy.orm.Session` joined to the dispatch connection in a savepoint,
    that refuses every call that would end the dispatch transaction (see the module)."""

    def __init__(self, connection: Connection, guard: TransactionGuard) -> None:
        super().__init__(
            bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
        )
        self._guard = guard
        #: Set when its handler's call is over: the session is never used again.
        self._finished = False

    @property
    def bind_url(self) -> Any:
        """The URL of the database the session writes to."""
        return self._guard._conn.engine.url

    def get_bind(self, *args: Any, **kwargs: Any) -> Any:
        # Every statement and flush asks for the bind first: a session kept after its
        # handler returned (by another handler, a thread, a cache) would write into the
        # batch's transaction outside any handler's savepoint, committed whether or not
        # the handler using it succeeds.
        if self._finished:
            raise HandlerTransactionError(
                "this session was given to a handler whose call is over: a handler may use "
                "only the session it is given, while it runs (not one kept from another "
                "call, nor from another thread after it returned)"
            )
        return super().get_bind(*args, **kwargs)

    def commit(self) -> None:
        self._guard.refuse(
            "session.commit()", "hookledger commits the handler's writes with its ledger row"
        )

    def begin(self, nested: bool = False) -> SessionTransaction:
        if nested:  # begin_nested(): a savepoint of the handler's own
            return super().begin(nested=True)
        self._guard.refuse(
            "session.begin()",
            "the session is already in hookledger's transaction; use session.begin_nested()",
        )

    def close(self) -> None:
        self._guard.refuse("session.close()", "hookledger closes the session")

    def reset(self) -> None:
        self._guard.refuse("session.reset()", "hookledger closes the session")

    def invalidate(self) -> None:
        self._guard.refuse("session.invalidate()", "hookledger closes the session")

    # -- the dispatcher's end of it -------------------------------------------------------

    def _keep(self) -> None:
        """Flush and release the session's savepoint (the handler succeeded)."""
        Session.commit(self)
        Session.close(self)

    def _discard(self) -> None:
        """Roll back the session's savepoint (the handler failed)."""
        Session.close(self)


class TransactionGuard:
    """Runs handlers on one dispatch connection, each in a savepoint, with a
    :class:`HandlerSession`, refusing what would end the connection's transaction."""

    def __init__(self, connection: Connection) -> None:
        self._conn = connection
        self._active = False
        self._refused: list[HandlerTransactionError] = []
        #: Savepoints the running handler made with raw SQL (it may release them).
        self._own_savepoints: set[str] = set()
        event.listen(connection, "before_cursor_execute", self._check_statement)
        #: PostgreSQL: the connection's settings before any handler ran (:meth:`restore`).
        self._settings: tuple[Any, ...] | None = None
        #: The running handler sent something that may change a setting.
        self._changed = False
        if connection.dialect.name == "postgresql":
            self._settings = tuple(connection.exec_driver_sql(_READ_SETTINGS).one())

    def restore(self) -> None:
        """Put back the connection's settings that hookledger's own statements depend on
        (PostgreSQL), as they were before the first handler ran: a handler's ``SET LOCAL
        search_path`` or ``statement_timeout`` (kept when its savepoint is released), a
        session-level ``SET``, ``set_config()`` or ``SET ROLE`` would otherwise apply to
        the batch's ledger and outcome writes (which then failed, and the batch was taken
        for a storage failure and claimed again for ever), to the batch's later handlers,
        and to the pooled connection after the commit. One statement, after a handler that
        succeeded and sent one (``SET``, ``RESET``, ``DISCARD``, ``set_config``), and once
        after the batch's handlers (a function may change one unseen)."""
        if self._settings is None:
            return
        self._conn.exec_driver_sql(_RESTORE_SETTINGS, self._settings)

    def run(self, call: Callable[[Session], None]) -> Failure:
        """Run ``call`` with a :class:`HandlerSession` in a savepoint of its own; return
        ``None`` when it succeeded (its writes kept in the transaction), else its failure
        (its writes rolled back). Raises :class:`TransactionEnded` when the handler ended
        the transaction, and a :class:`~sqlalchemy.exc.SQLAlchemyError` when the database
        was lost (an outage, not the handler's failure).

        The session's savepoint is made before the handler runs, so everything the handler
        does, through the session or a connection it took from it, comes after it. A
        savepoint rolled back stays in the database until it is released (on both
        databases), and only a handler that succeeded has its savepoint released: so rolling
        back to that first savepoint undoes all of a failed handler's writes, whatever it
        did in between (its own ``rollback()``, a failed flush, writes on a held
        connection). One savepoint per handler, as many statements as before."""
        session = HandlerSession(self._conn, self)
        try:
            return self._run(session, call)
        finally:
            session._finished = True  # whatever happened: never used again

    def _run(self, session: HandlerSession, call: Callable[[Session], None]) -> Failure:
        self._refused = []
        self._own_savepoints = set()
        self._changed = False
        session.connection()  # SAVEPOINT: the session's transaction, before the handler's
        first = self._conn.get_nested_transaction()
        assert first is not None
        failure: Failure = None
        with self._guarding():
            token = _RUNNING.set(session)
            try:
                call(session)
                session.flush()  # the handler's pending ORM writes fail here, as its own
            except Exception as exc:  # noqa: BLE001 - a handler may raise anything
                failure = exc
            finally:
                _RUNNING.reset(token)
        if isinstance(failure, DBAPIError) and failure.connection_invalidated:
            raise failure
        self._check_transaction(failure)
        if self._refused:  # the first refusal, even if the handler caught it
            failure = self._refused[0]
        if failure is None:
            try:
                session._keep()  # RELEASE the session's savepoint
                if self._changed:  # a setting it left behind: not the next handler's
                    self.restore()
                return None
            except DBAPIError as exc:
                self._judge(exc, None)
            except SQLAlchemyError as exc:  # a failed flush the handler did not roll back
                failure = exc
        try:
            rolled_back_before = not first.is_active
            session._discard()  # ROLLBACK TO the session's savepoint, if it is still open
            if rolled_back_before:  # the handler's own rollback(), or a failed flush
                self._conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {first._savepoint}")
        except SQLAlchemyError as exc:
            self._judge(exc, failure)
        return failure

    def refuse(self, what: str, why: str) -> NoReturn:
        """Record and raise a refusal of ``what`` (the handler's failure, caught or not)."""
        error = HandlerTransactionError(
            f"a handler may not call {what}: {why}; its writes are rolled back and the "
            "attempt counts as failed"
        )
        self._refused.append(error)
        raise error

    # -- refusals on the connection -------------------------------------------------------

    @contextmanager
    def _guarding(self) -> Iterator[None]:
        """While a handler runs: the connection's and its pool connection's transaction
        methods refuse, and so do transaction statements sent as SQL."""
        conn = self._conn
        pooled: Any = conn.connection
        shadowed: list[tuple[Any, str]] = []

        def shadow(target: Any, label: str, name: str, replacement: Any = None) -> None:
            def refused(*_args: Any, **_kwargs: Any) -> NoReturn:
                self.refuse(f"{label}.{name}()", "it would end hookledger's transaction")

            setattr(target, name, replacement or refused)
            shadowed.append((target, name))

        for name in ("commit", "rollback", "close", "begin", "begin_twophase", "get_transaction"):
            shadow(conn, "session.connection()", name)
        shadow(conn, "session.connection()", "invalidate", self._invalidate(conn.invalidate))
        for name in ("commit", "rollback", "close"):
            shadow(pooled, "session.connection().connection", name)
        shadow(
            pooled,
            "session.connection().connection",
            "invalidate",
            self._invalidate(pooled.invalidate),
        )
        driver: Any = pooled.dbapi_connection
        authorized = isinstance(driver, sqlite3.Connection)
        if authorized:  # every BEGIN, COMMIT, ROLLBACK the driver prepares is refused
            driver.set_authorizer(self._authorize)
        elif type(driver).__module__.startswith("psycopg"):
            # Not close(): the pool closes a connection it found dead with it, and a handler
            # that closes the connection is an outage (the event is given back).
            for name in ("commit", "rollback"):
                shadow(driver, "the driver's connection", name)
            shadow(driver, "the driver's connection", "execute", self._checked(driver))
        self._active = True
        try:
            yield
        finally:
            self._active = False
            for target, name in reversed(shadowed):
                delattr(target, name)
            if authorized:
                with suppress(sqlite3.Error):  # closed under the handler: an outage
                    driver.set_authorizer(None)

    def _authorize(self, action: int, arg1: str | None, *_args: Any) -> int:
        """SQLite's authorizer while a handler runs: no transaction statement."""
        if action == sqlite3.SQLITE_TRANSACTION:
            self._refused.append(
                HandlerTransactionError(
                    f"a handler may not send {arg1 or 'a transaction statement'} on the "
                    "driver's connection: it would end hookledger's transaction; its writes "
                    "are rolled back and the attempt counts as failed"
                )
            )
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_PRAGMA and _args and _args[0] is not None:
            name = (arg1 or "").lower()
            if name not in _SQLITE_PRAGMAS_WITH_ARGUMENT:
                # A connection's setting (query_only, journal_mode, busy_timeout...) outlives
                # the transaction: hookledger's writes and later batches would run under it.
                self._refused.append(
                    HandlerTransactionError(
                        f"a handler may not set PRAGMA {name}: it is a setting of "
                        "hookledger's connection, kept after the handler; its writes are "
                        "rolled back and the attempt counts as failed"
                    )
                )
                return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def _checked(self, driver: Any) -> Callable[..., Any]:
        """psycopg's ``Connection.execute`` refusing transaction statements."""
        real = driver.execute

        def execute(query: Any, *args: Any, **kwargs: Any) -> Any:
            text = query.as_string(driver) if hasattr(query, "as_string") else query
            if isinstance(text, bytes):
                text = text.decode(errors="replace")
            verdict = transaction_control(str(text), self._own_savepoints)
            if verdict is not None:
                self.refuse(f"{verdict!r} as SQL", "it would end hookledger's transaction")
            if _SETTING.search(str(text)):
                self._changed = True
            return real(query, *args, **kwargs)

        return execute

    def _invalidate(self, real: Callable[..., None]) -> Callable[..., None]:
        """SQLAlchemy invalidates a connection it found dead with the exception that told
        it so; a handler calling ``invalidate()`` itself passes none, and is refused."""

        def invalidate(exception: BaseException | None = None, *args: Any, **kw: Any) -> None:
            if exception is None:
                self.refuse("invalidate()", "it would end hookledger's transaction")
            real(exception, *args, **kw)

        return invalidate

    def _check_statement(
        self,
        _conn: Connection,
        _cursor: Any,
        statement: str,
        _parameters: Any,
        context: Any,
        _executemany: bool,
    ) -> None:
        if not self._active:
            return
        if self._settings is not None and _SETTING.search(statement):
            self._changed = True
        compiled = getattr(context, "compiled", None)
        if isinstance(
            getattr(compiled, "statement", None),
            SavepointClause | ReleaseSavepointClause | RollbackToSavepointClause,
        ):
            return  # SQLAlchemy's own savepoints (the session's, begin_nested())
        verdict = transaction_control(statement, self._own_savepoints)
        if verdict is not None:
            self.refuse(f"{verdict!r} as SQL", "it would end hookledger's transaction")

    # -- after the handler ----------------------------------------------------------------

    def _check_transaction(self, failure: Failure) -> None:
        """Raise if the handler left no transaction: lost (an outage) or ended (its fault)."""
        state = driver_transaction(self._conn)
        if state == "lost":
            _outage(failure)
        if state == "ended":
            raise TransactionEnded(
                HandlerTransactionError(
                    "the handler ended hookledger's transaction on the database driver's "
                    "own connection; nothing of it was kept and the attempt counts as failed"
                )
            )

    def _judge(self, exc: SQLAlchemyError, failure: Failure) -> NoReturn:
        """The handler's savepoint could not be released or rolled back: the database was
        lost (raise it), or the handler ended the transaction or its savepoint."""
        if (isinstance(exc, DBAPIError) and exc.connection_invalidated) or (
            driver_transaction(self._conn) == "lost"
        ):
            raise exc
        raise TransactionEnded(
            HandlerTransactionError(
                "the handler ended hookledger's transaction or its savepoint "
                f"({type(exc).__name__}); nothing of it was kept and the attempt counts as "
                "failed"
            )
        ) from (failure or exc)


def _outage(failure: Failure) -> NoReturn:
    if isinstance(failure, SQLAlchemyError):
        raise failure
    raise DisconnectionError("the database connection was lost while a handler ran") from (failure)


def driver_transaction(conn: Connection) -> Literal["open", "ended", "lost"]:
    """What the database driver says of the connection's transaction: still ``open``,
    ``ended`` (committed or rolled back under SQLAlchemy) or ``lost`` (the connection is
    closed or broken)."""
    if conn.invalidated or conn.closed:
        return "lost"
    try:
        driver: Any = conn.connection.dbapi_connection
        if driver is None:
            return "lost"
        info = getattr(driver, "info", None)  # psycopg
        if info is not None and hasattr(info, "transaction_status"):
            if getattr(driver, "closed", False):
                return "lost"
            status = int(info.transaction_status)  # IDLE 0, ACTIVE 1, INTRANS 2, INERROR 3
            if status == 0:
                return "ended"
            return "open" if status in (1, 2, 3) else "lost"
        in_transaction = getattr(driver, "in_transaction", None)  # sqlite3
        if in_transaction is not None:
            return "open" if in_transaction else "ended"
    except Exception:  # noqa: BLE001 - a closed driver connection raises on any question
        return "lost"
    return "open"  # a driver that does not say: judged by the savepoint's release


# -- connection settings a handler may change ----------------------------------------------------

#: SQLite pragmas whose argument names what to read (a table, an index), not a new value.
_SQLITE_PRAGMAS_WITH_ARGUMENT = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_list",
        "index_info",
        "index_xinfo",
        "foreign_key_list",
        "foreign_key_check",
        "integrity_check",
        "quick_check",
    }
)

#: What hookledger's statements depend on: where its tables are, who it is, how long a
#: statement or a lock wait may take, how times are read and written.
_PG_SETTINGS = (
    "search_path",
    "role",
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "TimeZone",
    "DateStyle",
)
#: A statement that may change one (an ``UPDATE ... SET`` on a line of its own too: then
#: the settings are merely put back for nothing).
_SETTING = re.compile(r"^\s*(?:SET|RESET|DISCARD)\b|set_config\s*\(", re.IGNORECASE | re.MULTILINE)
_READ_SETTINGS = "SELECT " + ", ".join(f"current_setting('{name}')" for name in _PG_SETTINGS)
_RESTORE_SETTINGS = "SELECT " + ", ".join(
    f"set_config('{name}', %s, false)" for name in _PG_SETTINGS
)


# -- transaction statements sent as SQL ------------------------------------------------------

#: Words that begin a statement ending, beginning or preparing a transaction.
_ENDING = frozenset({"COMMIT", "END", "ABORT", "BEGIN", "START"})
_CONTROL = _ENDING | {"ROLLBACK", "SAVEPOINT", "RELEASE", "PREPARE"}
_FIRST_WORD = re.compile(r"\s*(?:(?:--[^\n]*(?:\n|$)|/\*.*?\*/)\s*)*([A-Za-z]+)", re.DOTALL)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
#: SQLAlchemy names its savepoints so: a handler's SQL may not make or end one.
_SQLALCHEMY_SAVEPOINT = "sa_savepoint_"


def transaction_control(sql: str, own_savepoints: set[str]) -> str | None:
    """The first statement of ``sql`` that would end, begin or prepare the transaction, or
    release or roll back to a savepoint it did not make (``SAVEPOINT x`` adds ``x`` to
    ``own_savepoints``); ``None`` when there is none. Comments, quoted strings, dollar-quoted
    bodies and ``BEGIN ... END`` / ``CASE ... END`` blocks inside a statement are skipped."""
    if ";" not in sql:
        first = _FIRST_WORD.match(sql)
        if first is None or first.group(1).upper() not in _CONTROL:
            return None
    for words in _statements(sql):
        verdict = _judge_statement(words, own_savepoints)
        if verdict is not None:
            return verdict
    return None


def _judge_statement(words: list[str], own: set[str]) -> str | None:
    if not words:
        return None
    head = [w.upper() for w in words]
    text = " ".join(head[:2])
    first = head[0]
    if first in _ENDING:
        return text
    if first == "PREPARE":  # PREPARE TRANSACTION (two-phase); PREPARE name AS is a query
        return text if len(head) > 1 and head[1] == "TRANSACTION" else None
    if first == "SAVEPOINT":
        name = _name(words[1:])
        if name is None or name.startswith(_SQLALCHEMY_SAVEPOINT):
            return "SAVEPOINT " + (name or "")
        own.add(name)
        return None
    if first == "RELEASE":
        rest = words[2:] if len(head) > 1 and head[1] == "SAVEPOINT" else words[1:]
        name = _name(rest)
        return None if name is not None and name in own else "RELEASE " + (name or "")
    if first != "ROLLBACK":
        return None
    # ROLLBACK [WORK | TRANSACTION] [TO [SAVEPOINT] name]
    rest = words[1:]
    if rest and rest[0].upper() in ("WORK", "TRANSACTION"):
        rest = rest[1:]
    if not rest or rest[0].upper() != "TO":
        return "ROLLBACK"
    rest = rest[1:]
    if rest and rest[0].upper() == "SAVEPOINT":
        rest = rest[1:]
    name = _name(rest)
    return None if name is not None and name in own else "ROLLBACK TO " + (name or "")


def _name(words: list[str]) -> str | None:
    """A savepoint's name as the database compares it (unquoted names fold to lower case)."""
    if not words:
        return None
    word = words[0]
    if word.startswith('"'):
        return word.strip('"')
    return word.lower()


def _statements(sql: str) -> Iterator[list[str]]:
    """The first words of each statement of ``sql`` (up to six, quoted identifiers kept with
    their quotes)."""
    i, n = 0, len(sql)
    words: list[str] = []
    depth = 0  # BEGIN ... END (a trigger's or function's body), CASE ... END
    while i < n:
        ch = sql[i]
        if ch == ";" and depth == 0:
            yield words
            words = []
            i += 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif ch == "'":
            i = _after_quote(sql, i, "'")
        elif ch == '"':
            end = _after_quote(sql, i, '"')
            if len(words) < 6:
                words.append(sql[i:end])
            i = end
        elif ch == "$" and (dollar := _DOLLAR.match(sql, i)) is not None:
            end = sql.find(dollar.group(0), dollar.end())
            i = n if end < 0 else end + len(dollar.group(0))
        elif ch.isalpha() or ch == "_":
            match = _WORD.match(sql, i)
            assert match is not None
            word = match.group(0)
            upper = word.upper()
            if words and upper in ("BEGIN", "CASE"):
                depth += 1
            elif words and upper == "END" and depth > 0:
                depth -= 1
            if len(words) < 6:
                words.append(word)
            i = match.end()
        else:
            i += 1
    yield words


def _after_quote(sql: str, start: int, quote: str) -> int:
    """The index after the quoted text starting at ``start`` (a doubled quote is kept)."""
    i = start + 1
    while True:
        end = sql.find(quote, i)
        if end < 0:
            return len(sql)
        if sql.startswith(quote * 2, end):
            i = end + 2
            continue
        return end + 1
