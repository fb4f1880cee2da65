"""SQLite WAL checkpoints taken outside the writers' lock.

In WAL mode a commit appends its pages to the ``-wal`` file; a *checkpoint* copies them back
into the database file and flushes it to disk. By default SQLite runs one inside the commit
that takes the log past 1,000 pages, in the committing thread, after SQLite's own write lock
is let go. hookledger's writers hold their own lock (:mod:`receiver.storage.filelock`) across
``COMMIT``, so that checkpoint ran inside it, and every other writer of the host waited for
it. Its cost grows with the database (the pages are spread over the file): on a 380 MB
inbox it took about 9 ms, once every 75 deliveries or so, 120 us per delivery on average,
all of it while the other web processes' webhooks waited.

So hookledger's connections take automatic checkpoints only far later
(:data:`FALLBACK_PAGES`, a safety net), and one daemon thread per process takes them
instead: every :data:`INTERVAL` seconds, for each database file this process has opened,
if its log changed since the last look, a ``PASSIVE`` checkpoint on a connection of its own
(it waits for no reader or writer, and no writer waits for it). Between two looks a few
thousand pages at most are written, at the highest rates measured. A ``PASSIVE`` checkpoint
does not rewind the log, and under steady writes SQLite rarely finds it fully copied when a
writer begins (the moment it rewinds it), so the log file grows to :data:`FALLBACK_PAGES`,
where the committing connection's own checkpoint copies the little left and the log
rewinds. Should the thread be stopped or stuck, that checkpoint keeps the log bounded, as
before but later.

A database only idle is looked at less and less often (up to :data:`IDLE_INTERVAL`), and
forgotten once its log is gone (the last connection to it closed). The thread opens its
connection for each checkpoint and closes it after (about 0.2 ms with hookledger's schema, at
most ten times a second), holding nothing open between two: a connection kept open would keep
the process's last connection to close from checkpointing the log into the file and deleting
it (a copy of the file alone would miss the last commits, a change of ``journal_mode`` would
fail), and a test suite creating a database a test would hold three descriptors per file. A
file that is gone, or no longer the one the process's connections opened (moved, replaced), is
forgotten, never opened by its name: a connection to another file there would read and
checkpoint the log of the file in use, and on a file it created there it would delete that
log. A forked child (a gunicorn worker, say) gets a thread of its own for the files its parent
watched, and a fork waits for the thread to be out of SQLite (a child forked while it held one
of SQLite's mutexes would hang on it).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from urllib.parse import quote

log = logging.getLogger("hookledger.storage")

#: Seconds between two looks at a database that is being written.
INTERVAL = 0.1
#: The longest wait between two looks at an idle database (seconds).
IDLE_INTERVAL = 2.0
#: ``wal_autocheckpoint`` of hookledger's connections: SQLite checkpoints in the committing
#: connection only when the log has grown this far (pages). While the thread runs that
#: checkpoint finds little left to copy; it is also what rewinds a log that steady writes
#: kept the thread's checkpoints from rewinding (see docs/architecture.md).
FALLBACK_PAGES = 10_000
#: Failing checkpoints are logged as a warning once they have failed for this long (seconds).
WARN_AFTER = 30.0


@dataclass(slots=True, eq=False)
class _Database:
    path: str
    wal: str
    #: ``(st_dev, st_ino)`` of the file the process's connection opened at ``path``.
    ident: tuple[int, int]
    seen: tuple[int, int] | None = None
    interval: float = INTERVAL
    look_at: float = 0.0
    failing_since: float | None = None
    warned: bool = False


class Checkpoints:
    """The process's checkpointing thread and the database files it looks after."""

    def __init__(self, *, thread: bool = True) -> None:
        """``thread=False``: no thread is started; :meth:`look` takes the rounds (tests)."""
        self._start = thread
        self._mutex = threading.Lock()
        self._databases: dict[str, _Database] = {}
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        #: Held by the thread while it is inside SQLite, and by a fork (``before_fork``):
        #: a child forked while the thread held one of SQLite's own mutexes would hang on it.
        self._in_sqlite = threading.Lock()

    def __repr__(self) -> str:
        return f"Checkpoints(databases={len(self._databases)})"

    def watch(self, path: str) -> None:
        """Look after the WAL of the database file ``path`` (absolute), which a connection of
        this process has just opened and read (its log exists until the last connection to
        the file closes), from now on."""
        if self._pid != os.getpid():
            self.after_fork()
        ident = file_identity(path)
        if ident is None:
            return
        with self._mutex:
            # A new entry each time, looked at at once: one the thread is about to forget
            # (its log gone a moment before this connection came) is not this one.
            self._databases[path] = _Database(path, path + "-wal", ident)
            self._ensure_thread()

    def after_fork(self) -> None:
        """In a forked child (``os.register_at_fork``; :meth:`watch` checks too): the
        parent's thread is not here, and its lock may have been held by it. A new lock, and a
        thread of the child's own if any database is watched: pooled connections the child
        inherited commit without a checkpoint of their own, as the parent's did. (The thread
        holds no connection between two checkpoints, so the child inherits none of its.)"""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._in_sqlite = threading.Lock()
        self._thread = None
        for each in self._databases.values():
            each.look_at = 0.0
        if self._databases:
            with self._mutex:
                self._ensure_thread()

    def before_fork(self) -> None:
        """Before ``fork()``: wait for the thread to be out of SQLite (see ``_in_sqlite``)."""
        self._in_sqlite.acquire()

    def after_fork_in_parent(self) -> None:
        self._in_sqlite.release()

    def _ensure_thread(self) -> None:
        """(Under the mutex.) The thread, started unless it runs (or ``thread=False``)."""
        if self._start and (self._thread is None or not self._thread.is_alive()):
            self._thread = threading.Thread(
                target=self._run, name="hookledger-checkpoints", daemon=True
            )
            self._thread.start()

    def watching(self) -> list[str]:
        with self._mutex:
            return list(self._databases)

    def _run(self) -> None:
        while True:
            try:
                pause = self.look()
            except Exception:  # noqa: BLE001 - the thread must live on
                log.debug("checkpoint round failed", exc_info=True)
                pause = IDLE_INTERVAL
            time.sleep(pause)

    def look(self) -> float:
        """One round: checkpoint each database whose log changed and is due for a look;
        returns the seconds until the next one is due."""
        with self._mutex:
            databases = list(self._databases.values())
        now = time.monotonic()
        pause = IDLE_INTERVAL
        for db in databases:
            if db.look_at <= now:
                self._look_at(db, now)
            pause = min(pause, max(db.look_at - now, 0.0))
        return max(pause, INTERVAL / 2)

    def _look_at(self, db: _Database, now: float) -> None:
        try:
            stat = os.stat(db.wal)
        except FileNotFoundError:
            # The file is gone, or its log is: SQLite deletes the log when the last connection
            # to the file closes (one that has read the file keeps it open, and a watched one
            # has: see take_checkpoints_aside), so none of this process's is open, and the
            # next one watches the file again. Kept, files long closed (a test suite's
            # thousands of temporary databases) would each be looked at every 2 s.
            self._forget(db)
            return
        except OSError:  # not readable now: looked at again later, as an unchanged one
            state = db.seen
        else:
            state = (stat.st_mtime_ns, stat.st_size)
        if state == db.seen:
            db.interval = min(db.interval * 2, IDLE_INTERVAL)
            db.look_at = now + db.interval
            return
        db.seen, db.interval = state, INTERVAL
        db.look_at = now + INTERVAL
        self._checkpoint(db, now)

    def _checkpoint(self, db: _Database, now: float) -> None:
        try:
            with self._in_sqlite:
                conn = _connect(db.path)
                try:
                    # Moved or replaced since? Checked once the connection has its file and
                    # before its first statement reads it: the log at that name is the one
                    # the process's connections write, of the file they opened. (Closed
                    # unread, a connection leaves the log alone.)
                    moved = file_identity(db.path) != db.ident
                    if not moved:
                        conn.execute("PRAGMA synchronous=FULL")
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                finally:
                    conn.close()
        except sqlite3.Error as exc:
            if file_identity(db.path) != db.ident:  # gone (mode=rw creates nothing) or replaced
                self._forget(db)
                return
            if db.failing_since is None:
                db.failing_since = now
            if not db.warned and now - db.failing_since >= WARN_AFTER:
                db.warned = True
                log.warning(
                    "SQLite WAL checkpoints of %s have failed for %.0f s (%s); SQLite "
                    "checkpoints in the writers' commits instead once the log reaches %d pages",
                    os.path.basename(db.path),
                    now - db.failing_since,
                    type(exc).__name__,
                    FALLBACK_PAGES,
                    extra={"action": "checkpoint_failing"},
                )
            return
        if moved:
            self._forget(db)
            return
        db.failing_since, db.warned = None, False

    def _forget(self, db: _Database) -> None:
        with self._mutex:
            if self._databases.get(db.path) is db:
                del self._databases[db.path]


def file_identity(path: str) -> tuple[int, int] | None:
    """The file at ``path`` (device, inode), ``None`` if there is none (also the intake's
    check that its file is still the one it opened)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _connect(path: str) -> sqlite3.Connection:
    """The thread's connection to the database file ``path``: ``mode=rw``, so that it never
    creates a file (an empty file with the log of the one moved away would delete the log)."""
    return sqlite3.connect(
        f"file:{quote(path)}?mode=rw", uri=True, timeout=0.0, isolation_level=None
    )


#: The process's checkpoints (one thread, started by the first SQLite connection it watches).
CHECKPOINTS = Checkpoints()
os.register_at_fork(
    before=CHECKPOINTS.before_fork,
    after_in_parent=CHECKPOINTS.after_fork_in_parent,
    after_in_child=CHECKPOINTS.after_fork,
)


def take_checkpoints_aside(cursor: sqlite3.Cursor) -> None:
    """On a new connection to a database in WAL mode: its commits leave checkpoints to the
    process's thread (see the module's text); other databases are left as they are."""
    row = cursor.execute("PRAGMA journal_mode").fetchone()
    if row is None or str(row[0]).lower() != "wal":
        return
    path = next((r[2] for r in cursor.execute("PRAGMA database_list") if r[1] == "main"), "")
    if not path:
        return
    # A read: a new database's log is created at its first (after PRAGMA journal_mode=WAL it
    # is not there yet), and a file without one is taken for a file no longer open.
    cursor.execute("PRAGMA schema_version").fetchone()
    cursor.execute(f"PRAGMA wal_autocheckpoint={FALLBACK_PAGES:d}")
    CHECKPOINTS.watch(path)


__all__ = ["CHECKPOINTS", "Checkpoints", "file_identity", "take_checkpoints_aside"]
