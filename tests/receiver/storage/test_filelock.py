"""The writers' lock excludes other processes (forked ones too) and times out cleanly."""

from __future__ import annotations

import errno
import fcntl
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from receiver.storage import filelock
from receiver.storage.filelock import WritersLock


def _hold(path: str, seconds: float, ready: multiprocessing.synchronize.Event) -> None:
    with WritersLock(path).hold(timeout=5):
        ready.set()
        time.sleep(seconds)


def test_another_process_holding_it_makes_a_writer_wait_then_time_out(tmp_path: Path) -> None:
    path = str(tmp_path / "db-hookledger-writers")
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold, args=(path, 1.5, ready))
    holder.start()
    try:
        assert ready.wait(30)
        lock = WritersLock(path)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            with lock.hold(timeout=0.2):
                pytest.fail("entered while another process held the lock")
        assert 0.2 <= time.monotonic() - started < 1.0
        # Released by the holder: the waiter gets in soon after.
        with lock.hold(timeout=10):
            assert not holder.is_alive() or time.monotonic() - started >= 1.0
    finally:
        holder.join(10)
    assert holder.exitcode == 0


def test_a_forked_child_does_not_share_its_parents_lock(tmp_path: Path) -> None:
    # flock belongs to the open file: a child using the parent's inherited descriptor would
    # "hold" the lock together with its parent. The lock reopens its file after a fork.
    lock = WritersLock(str(tmp_path / "db-hookledger-writers"))
    with lock.hold(timeout=1):
        pass  # the parent has opened the file
    read, write = os.pipe()
    with lock.hold(timeout=1):
        pid = os.fork()
        if pid == 0:  # the child: must not get in while the parent holds the lock
            try:
                with lock.hold(timeout=0.2):
                    os.write(write, b"entered")
            except TimeoutError:
                os.write(write, b"waited")
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
    assert os.read(read, 16) == b"waited"
    assert os.waitstatus_to_exitcode(status) == 0


def test_threads_of_one_process_take_turns(tmp_path: Path) -> None:
    import threading

    lock = WritersLock(str(tmp_path / "db-hookledger-writers"))
    inside = 0
    worst = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, worst
        for _ in range(20):
            with lock.hold(timeout=5):
                with guard:
                    inside += 1
                    worst = max(worst, inside)
                time.sleep(0.0005)
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert worst == 1


def test_an_unopenable_lock_file_is_an_os_error(tmp_path: Path) -> None:
    lock = WritersLock(str(tmp_path / "missing" / "db-hookledger-writers"))
    with pytest.raises(OSError):
        with lock.hold(timeout=0.1):
            pass


def test_an_unstamped_lock_writes_nothing_and_takes_no_patience(tmp_path: Path) -> None:
    path = tmp_path / "intake-hookledger-writers"
    lock = WritersLock(str(path), stamped=False)
    with lock.hold(timeout=1):
        assert path.read_bytes() == b""
        # It still excludes another process's (or another lock object's) holder.
        with pytest.raises(TimeoutError):
            with WritersLock(str(path)).hold(timeout=0.05):
                pytest.fail("entered while the unstamped lock was held")
    assert path.read_bytes() == b""
    with pytest.raises(ValueError):
        with lock.hold(timeout=1, patience=0.04):
            pytest.fail("patience without a stamp")


def test_the_calls_that_keep_the_gil_fail_as_pythons_own(tmp_path: Path) -> None:
    # (flock, pwrite and the file lookup made through libc without releasing the GIL.)
    with pytest.raises(OSError) as caught:
        filelock._flock(987_654, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert caught.value.errno == errno.EBADF
    with pytest.raises(OSError) as caught:
        filelock._pwrite(987_654, b"x")
    assert caught.value.errno == errno.EBADF
    assert filelock.exists(str(tmp_path)) and not filelock.exists(str(tmp_path / "none"))
    assert not filelock.exists(str(tmp_path) + "\0x")
    path = tmp_path / "lock"
    first, second = (os.open(path, os.O_RDWR | os.O_CREAT) for _ in range(2))
    try:
        filelock._flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(OSError) as caught:
            filelock._flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert caught.value.errno in (errno.EAGAIN, errno.EACCES)
        filelock._pwrite(first, b"12345678")
        assert path.read_bytes() == b"12345678"
        filelock._flock(first, fcntl.LOCK_UN)
        filelock._flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(first)
        os.close(second)


def _hold_twice(
    path: str, first: float, second: float, ready: multiprocessing.synchronize.Event
) -> None:
    """Hold the lock for ``first`` seconds, let go, take it again at once for ``second``."""
    lock = WritersLock(path)
    with lock.hold(timeout=5):
        ready.set()
        time.sleep(first)
    with lock.hold(timeout=5):
        time.sleep(second)


def test_patience_counts_from_when_the_holder_took_the_lock_even_a_new_holder(
    tmp_path: Path,
) -> None:
    # The waiter reads the holder's stamp only when the hold can have passed its patience:
    # a holder that took the lock before the wait trips it early, and one that took it
    # during the wait (a new stamp) trips it patience after that, never sooner or later.
    path = str(tmp_path / "db-hookledger-writers")
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_twice, args=(path, 0.4, 3.0, ready))
    holder.start()
    try:
        assert ready.wait(30)
        time.sleep(0.1)  # held for 0.1 s already when the wait starts
        lock = WritersLock(path)
        started = time.monotonic()
        with pytest.raises(filelock.HeldTooLong):
            with lock.hold(timeout=10, patience=0.6):
                pytest.fail("entered while another process held the lock")
        waited = time.monotonic() - started
        # The first hold ended at 0.3 s into the wait, before its patience; the second
        # began then and passed 0.6 s at about 0.9 s.
        assert 0.85 <= waited < 1.6, waited
    finally:
        holder.kill()
        holder.join(10)
