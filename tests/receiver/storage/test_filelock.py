"""The writers' lock excludes other processes (forked ones too) and times out cleanly."""

from __future__ import annotations

import errno
import fcntl
import multiprocessing
import os
import threading
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
    """Hold the lock for ``first`` seconds, then stamp it anew, as a new holder taking it
    over would, and hold it ``second`` seconds more. (Let go, the lock would go to the
    waiter, whose process waits in a blocking ``flock``: a new holder cannot be staged by a
    release and a take.)"""
    lock = WritersLock(path)
    with lock.hold(timeout=5):
        ready.set()
        time.sleep(first)
        assert lock._fd is not None
        filelock._pwrite(lock._fd, filelock._STAMP.pack(time.time()))
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
        # The first holder's time ended at 0.3 s into the wait, before its patience; the
        # second's began then and passed 0.6 s at about 0.9 s.
        assert 0.85 <= waited < 1.6, waited
    finally:
        holder.kill()
        holder.join(10)


# -- the handoff: a waiter's process waits in a blocking flock ----------------------------


def _hold_until(path: str, ready: multiprocessing.synchronize.Event, go: object) -> None:
    """Hold the lock until ``go`` (an Event) is set."""
    with WritersLock(path).hold(timeout=5):
        ready.set()
        assert go.wait(30)  # type: ignore[attr-defined]


def _try_hold(path: str, timeout: float) -> bool:
    try:
        with WritersLock(path).hold(timeout=timeout):
            return True
    except TimeoutError:
        return False


def _other_process_gets_it(path: str, timeout: float) -> bool:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return bool(pool.apply(_try_hold, (path, timeout)))


def _gives_up(lock: WritersLock, timeout: float) -> None:
    """``lock.hold(timeout)`` times out: another holder keeps it (a wait given up)."""
    with pytest.raises(TimeoutError):
        with lock.hold(timeout=timeout):
            pytest.fail("entered while another holder had the lock")


@pytest.fixture
def held_elsewhere(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A lock path held by another process until the yielded ``go`` is set."""
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    path = str(tmp_path / "db-hookledger-writers")
    holder = ctx.Process(target=_hold_until, args=(path, ready, go))
    holder.start()
    try:
        assert ready.wait(30)
        yield path, go
    finally:
        go.set()
        holder.join(10)
    assert holder.exitcode == 0


def test_a_waiter_that_gave_up_leaves_the_lock_free_for_others(held_elsewhere) -> None:  # type: ignore[no-untyped-def]
    # Its process's blocking flock cannot be called off: when it gets the lock after the
    # waiter has gone, it lets go at once, or another process would wait for nothing.
    path, go = held_elsewhere
    lock = WritersLock(path)
    _gives_up(lock, 0.1)
    assert lock._handoff is not None and lock._handoff.in_flight
    go.set()
    assert _other_process_gets_it(path, timeout=10)
    deadline = time.monotonic() + 10
    while lock._handoff.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not lock._handoff.in_flight


def test_the_next_waiter_of_the_process_takes_the_flock_still_under_way(
    held_elsewhere,  # type: ignore[no-untyped-def]
) -> None:
    path, go = held_elsewhere
    lock = WritersLock(path)
    _gives_up(lock, 0.1)
    threading.Timer(0.3, go.set).start()
    with lock.hold(timeout=10):
        # Held, and held alone: another process cannot get in.
        assert not _other_process_gets_it(path, timeout=0.2)
    assert _other_process_gets_it(path, timeout=10)


def test_exclusion_holds_while_waits_are_given_up_and_taken_over(tmp_path: Path) -> None:
    # Two processes, each with threads whose short timeouts keep abandoning waits that the
    # process's handoff thread goes on making: never two holders at once. (A LOCK_NB try
    # beside a handoff under way would succeed with it, and the handoff, wanted by nobody,
    # would then let go of the lock a holder thinks it has.)
    path = str(tmp_path / "db-hookledger-writers")
    marker = tmp_path / "inside"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.starmap(_churn, [(path, str(marker), seed) for seed in (1, 2)])
    entered = sum(r[0] for r in results)
    assert entered > 20 and sum(r[1] for r in results) > 0, results
    assert all(r[2] == 0 for r in results), results


def _churn(path: str, marker: str, seed: int) -> tuple[int, int, int]:
    """Threads taking ``path`` with timeouts short enough to give up often; how many got
    in, gave up, and found someone else inside (``marker`` exists only while held)."""
    import random

    lock = WritersLock(path)
    rng = random.Random(seed)
    counts = [0, 0, 0]
    guard = threading.Lock()
    stop = time.monotonic() + 2.0

    def work() -> None:
        while time.monotonic() < stop:
            try:
                with lock.hold(timeout=rng.choice((0.0005, 0.002, 0.01, 0.5))):
                    try:
                        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                    except FileExistsError:
                        with guard:
                            counts[2] += 1
                        continue
                    os.close(fd)
                    time.sleep(rng.choice((0.0, 0.0005, 0.003)))
                    os.unlink(marker)
                    with guard:
                        counts[0] += 1
            except TimeoutError:
                with guard:
                    counts[1] += 1

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return counts[0], counts[1], counts[2]


def test_a_failing_flock_reaches_the_waiter(held_elsewhere, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path, _go = held_elsewhere
    real = fcntl.flock

    def flock(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_EX:  # the handoff's blocking call
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        real(fd, operation)

    monkeypatch.setattr(filelock.fcntl, "flock", flock)
    lock = WritersLock(path)
    with pytest.raises(OSError) as caught:
        with lock.hold(timeout=5):
            pytest.fail("entered while another process held the lock")
    assert caught.value.errno == errno.ENOLCK


def test_an_idle_handoff_thread_ends_and_a_new_wait_starts_another(
    held_elsewhere,  # type: ignore[no-untyped-def]
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setattr(filelock, "HANDOFF_IDLE_SECONDS", 0.05)
    path, go = held_elsewhere
    lock = WritersLock(path)
    threading.Timer(0.2, go.set).start()
    with lock.hold(timeout=10):
        pass
    assert lock._handoff is not None
    thread = lock._handoff._thread
    assert thread is not None and thread.name == "hookledger-lock-db-hookledger-writers"
    thread.join(10)
    assert not thread.is_alive() and lock._handoff._thread is None
    # A later wait starts a thread again.
    other = WritersLock(path)
    with other.hold(timeout=1):
        _gives_up(lock, 0.05)
    with lock.hold(timeout=10):
        pass


def test_a_child_forked_during_a_wait_waits_on_its_own(held_elsewhere) -> None:  # type: ignore[no-untyped-def]
    # The parent's handoff thread (and its flock under way) is not the child's.
    path, go = held_elsewhere
    lock = WritersLock(path)
    _gives_up(lock, 0.1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            try:
                with lock.hold(timeout=0.2):
                    os.write(write, b"entered")
            except TimeoutError:
                go.set()
                with lock.hold(timeout=10):
                    os.write(write, b"waited, then held")
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 32) == b"waited, then held"
    assert os.waitstatus_to_exitcode(status) == 0


def test_no_lock_nb_try_beside_a_handoff_under_way(held_elsewhere, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The hazard the churn above looks for, pinned: once a wait was given up, the process's
    # next waits go through the handoff under way, never through a LOCK_NB try of the same
    # open file (it would succeed as soon as the handoff's call had).
    path, go = held_elsewhere
    lock = WritersLock(path)
    _gives_up(lock, 0.05)
    tries: list[int] = []
    real = filelock._flock

    def flock(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_NB:
            tries.append(fd)
        real(fd, operation)

    monkeypatch.setattr(filelock, "_flock", flock)
    _gives_up(lock, 0.05)
    go.set()
    with lock.hold(timeout=10):
        pass
    assert tries == []


def test_a_lock_nb_try_waits_for_the_handoff_letting_go_of_a_lock_nobody_wanted(
    held_elsewhere,  # type: ignore[no-untyped-def]
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    # The handoff thread got the lock after its waiter gave up, and lets it go: a waiter
    # that reads in_flight between the thread's "no longer under way" and its LOCK_UN
    # would take the lock with a LOCK_NB try (the open file holds it already), and the
    # thread's LOCK_UN would then let go of the lock that waiter holds.
    path, go = held_elsewhere
    lock = WritersLock(path)
    _gives_up(lock, 0.05)
    real = filelock._flock
    unlocking = threading.Event()

    def flock(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_UN and threading.current_thread().name.startswith(
            "hookledger-lock-"
        ):
            unlocking.set()
            time.sleep(0.5)  # the scheduler switching threads just before the call
        real(fd, operation)

    monkeypatch.setattr(filelock, "_flock", flock)
    go.set()
    assert unlocking.wait(10)
    with lock.hold(timeout=10):
        # Held, and held alone: another process cannot get in.
        assert not _other_process_gets_it(path, timeout=1.5)


def test_a_waiter_interrupted_as_the_lock_is_handed_over_lets_it_go(
    held_elsewhere,  # type: ignore[no-untyped-def]
) -> None:
    # A signal's handler raising in the waiting thread (Ctrl-C's KeyboardInterrupt, the
    # SystemExit of gunicorn's SIGQUIT; the group commit goes on with its other waiters)
    # just as the handoff thread got the lock for it: the lock is let go, not kept by an
    # open file nobody holds it with, and a later wait does not take that grant for its own.
    path, go = held_elsewhere
    lock = WritersLock(path)
    _gives_up(lock, 0.05)
    handoff = lock._handoff
    assert handoff is not None
    real = handoff._answered

    class Interrupted:
        def notify(self) -> None:
            real.notify()

        def wait(self, timeout: float | None = None) -> bool:
            while not handoff._granted:  # the signal comes as the thread grants the lock
                real.wait(0.01)
            raise KeyboardInterrupt

    handoff._answered = Interrupted()  # type: ignore[assignment]
    go.set()
    with pytest.raises(KeyboardInterrupt):
        with lock.hold(timeout=10):
            pytest.fail("entered although interrupted")
    handoff._answered = real
    assert _other_process_gets_it(path, timeout=2)
    with WritersLock(path).hold(timeout=1):  # another open file holds it
        _gives_up(lock, 0.2)


def test_a_wait_without_a_thread_to_be_had_polls_and_leaves_the_handoff_usable(
    held_elsewhere,  # type: ignore[no-untyped-def]
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    # "can't start new thread" (a container's limit of processes reached, say): that wait
    # polls, as before the handoff; the handoff is not left marked under way with no thread
    # (every later wait of the process would then time out, the lock free or not).
    path, go = held_elsewhere
    lock = WritersLock(path)

    def start(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", start)
        started = time.monotonic()
        _gives_up(lock, 0.2)
        assert 0.2 <= time.monotonic() - started < 1.0
    go.set()
    with lock.hold(timeout=10):
        assert not _other_process_gets_it(path, timeout=0.2)


def test_under_green_threads_a_wait_polls(held_elsewhere, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # gevent's or eventlet's monkey-patching (gunicorn's gevent and eventlet workers) makes a
    # thread a greenlet: its blocking flock would block the whole process until the other
    # process let go, the waiter's timeout and patience with it. Such a wait polls, the
    # sleeps between tries giving way to the process's other greenlets.
    import _thread

    real = _thread.start_new_thread

    def start_new_thread(function, args, kwargs={}):  # type: ignore[no-untyped-def]  # noqa: B006
        return real(function, args, kwargs)  # (gevent's is a function of Python's)

    path, go = held_elsewhere
    lock = WritersLock(path)
    with monkeypatch.context() as patched:
        patched.setattr(_thread, "start_new_thread", start_new_thread)
        started = time.monotonic()
        _gives_up(lock, 0.2)
        assert 0.2 <= time.monotonic() - started < 1.0
        assert lock._handoff is None  # no thread in a blocking flock
        go.set()
        with lock.hold(timeout=10):
            pass
        assert lock._handoff is None


def test_a_wait_interrupted_while_its_thread_starts_leaves_one_thread(
    held_elsewhere,  # type: ignore[no-untyped-def]
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    # Thread.start() interrupted (a signal's handler raising) once the thread runs: the
    # handoff knows its thread, and a later wait does not start a second one beside it (two
    # blocking flocks of the one open file: the second succeeds with the first).
    path, go = held_elsewhere
    lock = WritersLock(path)
    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        real(self)
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", start)
        with pytest.raises(KeyboardInterrupt):
            with lock.hold(timeout=5):
                pytest.fail("entered while another process held the lock")
    assert lock._handoff is not None
    first = lock._handoff._thread
    assert first is not None and first.is_alive()
    go.set()
    with lock.hold(timeout=10):
        pass
    assert lock._handoff._thread is first
