"""WAL checkpoints are taken by the process's thread, outside the writers' lock, never in a
commit (below the fallback's size); the thread follows forks and lets idle files go."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine

from receiver.storage import checkpoints
from receiver.storage.checkpoints import CHECKPOINTS, FALLBACK_PAGES, Checkpoints
from receiver.storage.database import make_engine

PAGE = 4096


def _engine(path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x BLOB)")
    return engine


def _write(engine: Engine, commits: int) -> None:
    for _ in range(commits):
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (randomblob(3000))")


def _wal_frames(path: Path) -> tuple[int, int]:
    """(frames in the log, frames checkpointed), from a connection of the test's own."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        _, frames, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return frames, done
    finally:
        conn.close()


def test_a_new_database_is_watched_with_its_log_there(tmp_path: Path) -> None:
    # A new database has no log until its first read: the connect listener reads it, or the
    # thread would take the file for one no longer open and let it go.
    path = tmp_path / "db.sqlite3"
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.connect():
            assert (tmp_path / "db.sqlite3-wal").exists()
            own = Checkpoints(thread=False)
            own.watch(str(path))
            own.look()
            assert own.watching() == [str(path)]
    finally:
        engine.dispose()


def _copied_into(path: Path, pages: int) -> bool:
    """Whether the database file at ``path`` holds ``pages`` pages within 10 s: what was
    written has been checkpointed into it."""
    deadline = time.monotonic() + 10
    while path.stat().st_size < pages * PAGE and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.stat().st_size >= pages * PAGE


def _writer_and_round(
    path: Path, columns: str, *, autocheckpoint: bool
) -> tuple[sqlite3.Connection, Checkpoints]:
    """A WAL database at ``path`` with a table ``t (columns)``, a connection writing it
    (without checkpoints of its own unless ``autocheckpoint``) and a :class:`Checkpoints`
    watching it whose rounds the test takes (:meth:`Checkpoints.look`)."""
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    if not autocheckpoint:
        writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute(f"CREATE TABLE t ({columns})")
    own = Checkpoints(thread=False)
    own.watch(str(path))
    return writer, own


def _in_a_child(write: Callable[[], None], path: Path) -> int:
    """Run ``write`` in a forked child, which then waits up to 10 s for its 300 pages to be
    checkpointed into ``path``: 0 if they were, 2 if not, 1 if ``write`` failed."""
    read, out = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            write()
            code = 0 if _copied_into(path, 300) else 2
        finally:
            os.write(out, bytes([code]))
            os._exit(0)
    os.close(out)
    try:
        return os.read(read, 1)[0]
    finally:
        os.close(read)
        os.waitpid(pid, 0)


def test_commits_leave_checkpoints_to_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bug: SQLite's automatic checkpoint ran inside a commit every 1,000 pages, and so
    # inside the writers' lock every other writer of the host waits on. With the thread
    # kept out, 1,200 pages of commits leave the database file as it was: no commit
    # checkpointed.
    monkeypatch.setattr(CHECKPOINTS, "watch", lambda path: None)
    path = tmp_path / "db.sqlite3"
    engine = _engine(path)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == FALLBACK_PAGES
        size = path.stat().st_size
        _write(engine, 1200)
        assert path.stat().st_size == size
    finally:
        engine.dispose()


def test_the_thread_checkpoints_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    engine = _engine(path)
    try:
        assert str(path) in CHECKPOINTS.watching()
        _write(engine, 300)
        assert _copied_into(path, 300)
        _write(engine, 50)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            frames, done = _wal_frames(path)
            if frames == done:
                break
            time.sleep(0.05)
        assert frames == done
    finally:
        engine.dispose()


def test_a_database_in_memory_is_not_watched() -> None:
    before = CHECKPOINTS.watching()
    engine = make_engine("sqlite://")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 1000
    finally:
        engine.dispose()
    assert CHECKPOINTS.watching() == before


def test_a_round_checkpoints_only_a_changed_log_and_lets_idle_files_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    connect = checkpoints._connect
    monkeypatch.setattr(checkpoints, "_connect", lambda p: opened.append(p) or connect(p))
    path = tmp_path / "db.sqlite3"
    writer, own = _writer_and_round(path, "x BLOB", autocheckpoint=False)
    for _ in range(20):
        writer.execute("INSERT INTO t VALUES (randomblob(3000))")
    own.look()
    frames, done = _wal_frames(path)
    assert frames == done > 0
    assert opened == [str(path)]
    (db,) = own._databases.values()
    db.look_at = 0.0
    own.look()  # nothing written since: no checkpoint
    assert opened == [str(path)]
    assert db.interval > checkpoints.INTERVAL  # looked at less often while idle
    writer.close()
    for name in ("db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    db.look_at = 0.0
    own.look()
    assert own.watching() == []  # the file is gone: forgotten


def test_a_failing_checkpoint_is_warned_of_once_it_persists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(checkpoints, "WARN_AFTER", 0.0)
    path = tmp_path / "db.sqlite3"
    writer, own = _writer_and_round(path, "x BLOB", autocheckpoint=True)
    (db,) = own._databases.values()

    class Broken:
        def execute(self, *_args: object) -> object:
            raise sqlite3.OperationalError("disk I/O error")

        def close(self) -> None:
            pass

    connect = checkpoints._connect
    monkeypatch.setattr(checkpoints, "_connect", lambda _path: Broken())
    writer.execute("INSERT INTO t VALUES (1)")
    own.look()
    assert [r.action for r in caplog.records if hasattr(r, "action")] == ["checkpoint_failing"]
    monkeypatch.setattr(checkpoints, "_connect", connect)
    writer.execute("INSERT INTO t VALUES (2)")
    db.look_at = 0.0
    own.look()
    assert _wal_frames(path)[0] == _wal_frames(path)[1]
    writer.close()


def test_a_forked_child_checkpoints_with_a_thread_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    engine = _engine(path)
    _write(engine, 5)
    engine.dispose()

    def write_in_child() -> None:  # the parent's thread is not here
        child = make_engine(f"sqlite:///{path}")
        _write(child, 300)

    assert _in_a_child(write_in_child, path) == 0


def test_a_forked_child_checkpoints_what_its_parent_watched(tmp_path: Path) -> None:
    # A child that opens no connection of its own (it writes on one it does not watch,
    # as one inheriting its parent's pool would) still has a thread: os.register_at_fork.
    path = tmp_path / "db.sqlite3"
    engine = _engine(path)
    engine.dispose()
    assert str(path) in CHECKPOINTS.watching()

    def write_unwatched() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA wal_autocheckpoint=0")
        for _ in range(300):
            conn.execute("INSERT INTO t VALUES (randomblob(3000))")

    assert _in_a_child(write_unwatched, path) == 0


@pytest.mark.parametrize("how", ["moved", "replaced"])
def test_a_file_moved_or_replaced_is_let_go_not_opened_by_its_name(
    tmp_path: Path, how: str
) -> None:
    # The bug: the thread opened the database by its name. With the file moved away, that
    # created an empty file there, whose first read deleted the log the process's
    # connections still wrote (their commits since then gone with a crash); a file put in
    # its place had the log of the file in use checkpointed into it.
    path = tmp_path / "db.sqlite3"
    writer, own = _writer_and_round(path, "n INTEGER", autocheckpoint=False)
    os.rename(path, tmp_path / "moved.sqlite3")
    if how == "replaced":
        other = sqlite3.connect(tmp_path / "other.sqlite3")
        other.execute("CREATE TABLE other (x)")
        other.commit()
        other.close()
        os.rename(tmp_path / "other.sqlite3", path)
    before = path.read_bytes() if how == "replaced" else None
    writer.executemany("INSERT INTO t VALUES (?)", [(n,) for n in range(100)])
    own.look()
    assert (tmp_path / "db.sqlite3-wal").exists()  # the log in use, left alone
    if how == "moved":
        assert not path.exists()
    else:
        assert path.read_bytes() == before
    assert own.watching() == []
    assert writer.execute("SELECT count(*) FROM t").fetchone() == (100,)
    writer.close()


def test_the_thread_holds_no_connection_between_checkpoints(tmp_path: Path) -> None:
    # The bug: the thread kept its connection to a file open until the file had been idle for
    # 10 s, so the process's last connection to close was not the last one: it left the log
    # (the last one checkpoints it into the file and deletes it). A copy of the database file
    # alone missed the last commits, a change of journal_mode failed ("database is locked"),
    # and a test suite creating a database a test held three descriptors per file (out of
    # 256 by default on macOS).
    path = tmp_path / "db.sqlite3"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE t (n INTEGER)")
    writer.execute("INSERT INTO t VALUES (1)")
    own = Checkpoints(thread=False)
    own.watch(str(path))
    own.look()
    writer.execute("INSERT INTO t VALUES (2)")
    writer.close()
    assert not (tmp_path / "db.sqlite3-wal").exists()
    shutil.copyfile(path, tmp_path / "copy.sqlite3")
    copy = sqlite3.connect(tmp_path / "copy.sqlite3")
    try:
        assert copy.execute("SELECT count(*) FROM t").fetchone() == (2,)
    finally:
        copy.close()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        assert other.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    finally:
        other.close()


def test_a_file_whose_log_is_gone_is_forgotten_until_it_is_opened_again(tmp_path: Path) -> None:
    # The bug: a file was forgotten only once deleted, so the thread went on looking at every
    # file the process had ever closed (a test suite's thousands of temporary databases,
    # each kept until the next session deletes it) every 2 s: 4% of a core for 5,000.
    path = tmp_path / "db.sqlite3"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA schema_version")  # read, as take_checkpoints_aside does
    own = Checkpoints(thread=False)
    own.watch(str(path))
    own.look()
    assert own.watching() == [str(path)]
    writer.execute("CREATE TABLE t (x)")
    (db,) = own._databases.values()
    writer.close()  # the last connection: the log is checkpointed and deleted
    assert not (tmp_path / "db.sqlite3-wal").exists()
    db.look_at = 0.0
    own.look()
    assert own.watching() == []
    again = sqlite3.connect(path, isolation_level=None)
    try:
        again.execute("PRAGMA journal_mode").fetchone()
        own.watch(str(path))
        assert own.watching() == [str(path)]
    finally:
        again.close()
