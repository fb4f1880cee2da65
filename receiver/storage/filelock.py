"""A writers' lock shared by the processes of one host (``flock`` on a file beside the
SQLite database).

SQLite lets one writer in at a time. A writer that finds the database locked sleeps in
SQLite's busy handler (1, 2, 5, 10, ... up to 100 ms between attempts), so the web processes
of one server, storing webhooks at the same time, wait on each other in sleeps much longer
than the writes themselves: that was the receive path's tail latency on SQLite. Taking this
lock first, the processes queue on the kernel's lock instead and get in within a fraction of
a millisecond of its release. It is advisory and only orders the writers that use it; SQLite's
own lock still guarantees correctness for every writer.

A holder writes the time it took the lock into the file's first bytes (and zeroes them before
letting go), so a waiter can tell a short holder (another web process's commit, a worker's
turn) from a long one (a worker whose handlers run inside its transaction): with ``patience``,
:meth:`WritersLock.hold` gives up with :class:`HeldTooLong` as soon as the current holder has
held the lock for longer than that, rather than waiting it out (see
:mod:`receiver.storage.intake`).

A waiter does not poll. A thread of its process (:class:`_Handoff`) waits in a blocking
``flock``, so the kernel hands the lock over the moment its holder lets go; the waiter itself
waits on that thread with its timeout and patience. Polled, a released lock stayed free until
the next waiter's poll came round and the scheduler ran it (measured under gunicorn, 4 sync
workers on SQLite: 0.28 ms between one holder's release and the next one's hold, at the median,
for a hold of 0.42 ms; handed over by the kernel, 0.06 ms). Where no such thread is to be had
(none can be started; green threads, whose blocking ``flock`` would block the whole process)
a waiter tries the lock every :data:`POLL_SECONDS` instead.
"""

from __future__ import annotations

import _thread
import ctypes
import errno
import fcntl
import os
import struct
import threading
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The least time between two reads of the holder's stamp by a waiter with ``patience``; and
#: between two tries of a waiter that polls (seconds).
POLL_SECONDS = 0.0005

#: How long a process's :class:`_Handoff` thread waits for another wait of its process before
#: it ends (seconds; the next wait starts a new one).
HANDOFF_IDLE_SECONDS = 2.0

#: The holder's stamp: the wall-clock time it took the lock (a double; 0: nobody stamped).
_STAMP = struct.Struct("<d")
_NO_STAMP = bytes(_STAMP.size)


def _libc_holding_the_gil() -> Any:
    """libc, its functions called *without* releasing the GIL (``ctypes.PyDLL``), or ``None``
    where that is not to be had.

    A lock's holder makes a few system calls inside its critical section (its stamp, the
    intake's lock, the intake's file looked for, the release). Python's own ``os.pwrite``,
    ``os.stat`` and ``fcntl.flock`` release the GIL around each, and in a web process whose
    other threads are busy the holder then waits for the GIL to come back, up to the
    interpreter's switch interval (5 ms) each time, while every other process's writers
    wait for the lock it holds. These calls never block (``LOCK_NB`` or ``LOCK_UN``, 8 bytes
    into the page cache, a file looked up), so they keep the GIL instead."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        libc.flock.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.flock.restype = ctypes.c_int
        libc.pwrite.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long)
        libc.pwrite.restype = ctypes.c_ssize_t
        libc.access.argtypes = (ctypes.c_char_p, ctypes.c_int)
        libc.access.restype = ctypes.c_int
    except (OSError, AttributeError):  # pragma: no cover - no such libc
        return None
    return libc


_LIBC = _libc_holding_the_gil()


def _check(result: int) -> bool:
    """Whether a libc call that returned ``result`` is to be made again (interrupted);
    ``OSError`` for a failure."""
    if result >= 0:
        return False
    code = ctypes.get_errno()
    if code == errno.EINTR:
        return True
    raise OSError(code, os.strerror(code))


def _flock(fd: int, operation: int) -> None:
    """``fcntl.flock(fd, operation)``, never blocking (``LOCK_NB`` or ``LOCK_UN``), keeping
    the GIL; ``OSError`` as ``fcntl.flock`` raises it."""
    if _LIBC is None:  # pragma: no cover
        fcntl.flock(fd, operation)
        return
    while _check(_LIBC.flock(fd, operation)):
        pass


def _pwrite(fd: int, data: bytes) -> None:
    """``os.pwrite(fd, data, 0)`` (a few bytes), keeping the GIL."""
    if _LIBC is None:  # pragma: no cover
        os.pwrite(fd, data, 0)
        return
    while _check(_LIBC.pwrite(fd, data, len(data), 0)):
        pass


def exists(path: str) -> bool:
    """Whether there is a file at ``path``, keeping the GIL (a caller holding a lock: see
    :func:`_libc_holding_the_gil`)."""
    encoded = os.fsencode(path)
    if _LIBC is None or b"\0" in encoded:  # pragma: no cover
        return os.path.exists(path)
    return bool(_LIBC.access(encoded, os.F_OK) == 0)


class HeldTooLong(TimeoutError):
    """The lock's holder has held it for longer than the waiter's ``patience``."""


class _Handoff:
    """One process's waits for a lock's ``flock``, made by a thread of its own in a blocking
    ``flock`` (the GIL released), so the kernel hands the lock over as soon as its holder lets
    it go. The waiting thread waits on this one, with its own timeout and patience.

    A blocking ``flock`` cannot be given up, so the thread may still be waiting when its waiter
    has given up: the lock it then gets is let go at once, or taken by the next waiter of the
    process (``wanted``). Meanwhile (``in_flight``) every waiter of the process goes through
    it: a ``LOCK_NB`` try on the same open file would succeed whenever the thread's call had,
    and the thread, seeing nobody wanting it, would let go of a lock a holder thinks it has.
    """

    def __init__(self, fd: int, name: str) -> None:
        self._fd = fd
        self._name = name
        self._mutex = threading.Lock()
        self._asked = threading.Condition(self._mutex)  # the thread waits for a wait
        self._answered = threading.Condition(self._mutex)  # the waiter waits for the lock
        #: The thread is in (or about to make) a blocking ``flock``.
        self.in_flight = False
        #: A waiter wants the lock the thread's ``flock`` gets.
        self._wanted = False
        #: The thread got the lock for the waiter, who has not taken it yet.
        self._granted = False
        self._error: OSError | None = None
        self._thread: threading.Thread | None = None

    def take(self, deadline: float, patience: float | None) -> bool:
        """Wait for the lock (the caller holds its process's thread lock, and the process does
        not hold the ``flock``): return holding it, or raise ``TimeoutError`` at ``deadline``
        (monotonic), :class:`HeldTooLong` when the holder's stamp says it has held it for
        longer than ``patience``, or the ``OSError`` of the ``flock``. ``False``, not holding
        it, when no thread could be started for the wait (the process's limit of threads
        reached, or the interpreter shutting down): the caller polls instead."""
        with self._mutex:
            self._wanted = True
            try:
                if not self.in_flight:
                    self.in_flight = True
                    if self._thread is None:
                        self._thread = threading.Thread(
                            target=self._run, name=f"hookledger-lock-{self._name}", daemon=True
                        )
                        try:
                            self._thread.start()
                        except RuntimeError:  # no thread to be had: the caller polls
                            self._thread = None
                            self.in_flight = False
                            return False
                    else:
                        self._asked.notify()
                look_at = 0.0
                while not self._granted:
                    if self._error is not None:
                        error, self._error = self._error, None
                        raise error
                    now = time.monotonic()
                    look_at = _judge_wait(self._fd, now, deadline, patience, look_at)
                    self._answered.wait(min(deadline, look_at) - now)
                self._granted = False
                return True
            finally:
                self._wanted = False
                self._error = None
                if self._granted:
                    # Got for this waiter, which leaves with an exception (a signal's
                    # handler raising as the lock was handed over): let it go, or the open
                    # file would keep it for nobody, and the next wait take this grant.
                    self._granted = False
                    _flock(self._fd, fcntl.LOCK_UN)

    def under_way(self) -> bool:
        """Whether the thread is in a ``flock`` (``in_flight``), or has yet to let go of the
        lock it got for nobody: read under the mutex, as the thread marks its ``flock`` done
        and lets go in one hold of it (a ``LOCK_NB`` try between the two would succeed, the
        open file holding the lock, just before the thread let go of it)."""
        with self._mutex:
            return self.in_flight

    def _run(self) -> None:
        while True:
            with self._mutex:
                if not self.in_flight:
                    self._asked.wait(HANDOFF_IDLE_SECONDS)
                    if not self.in_flight:
                        self._thread = None
                        return
            error: OSError | None = None
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)  # blocks, the GIL released
            except OSError as exc:
                error = exc
            with self._mutex:
                self.in_flight = False
                if error is not None:
                    if self._wanted:
                        self._error = error
                elif self._wanted:
                    self._granted = True
                else:  # its waiter gave up meanwhile, and no other came: let it go
                    try:
                        _flock(self._fd, fcntl.LOCK_UN)
                    except OSError:  # pragma: no cover - the descriptor is its own
                        pass
                self._answered.notify()


class WritersLock:
    """``with lock.hold(timeout): ...`` excludes the other processes (and threads) using the
    same path. A process that forks gets its own open file (an inherited one would be shared
    with the parent, and ``flock`` would then not exclude the two)."""

    def __init__(self, path: str, *, stamped: bool = True) -> None:
        """``stamped``: the holder writes the time it took the lock into the file (for a
        waiter's ``patience``); a lock no waiter ever judges (the intake's) does without,
        two writes fewer per hold."""
        self.path = path
        self.stamped = stamped
        self._fd: int | None = None
        self._pid = os.getpid()
        self._threads = threading.Lock()
        self._handoff: _Handoff | None = None

    def __repr__(self) -> str:
        return f"WritersLock({self.path!r})"

    def _after_fork(self) -> None:
        """In a forked child: a fresh thread lock (the parent's may have been held by a
        thread that does not exist here) and, when first needed, a file of its own."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._threads = threading.Lock()
            self._fd = None  # the inherited descriptor stays open; it is the parent's
            self._handoff = None  # its thread is the parent's

    def _file(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    @contextmanager
    def hold(self, timeout: float, *, patience: float | None = None) -> Iterator[None]:
        """Hold the lock for the block; :class:`TimeoutError` if it stays taken for
        ``timeout`` seconds. With ``patience``: :class:`HeldTooLong` (a ``TimeoutError``) as
        soon as the process holding it has held it for longer than ``patience`` seconds, or
        another thread of this one has kept it from us for that long."""
        if patience is not None and not self.stamped:
            raise ValueError("patience needs a stamped lock (its holder's time)")
        deadline = time.monotonic() + timeout
        self._after_fork()
        wait = timeout if patience is None else min(timeout, patience)
        if not self._threads.acquire(timeout=max(wait, 0.0)):
            if patience is not None:
                raise HeldTooLong("another thread held the writers' lock too long")
            raise TimeoutError("another thread held the writers' lock too long")
        try:
            fd = self._file()
            if not self._try(fd):
                if not _native_threads():
                    self._poll(fd, deadline, patience)
                else:
                    if self._handoff is None:
                        self._handoff = _Handoff(fd, os.path.basename(self.path))
                    if not self._handoff.take(deadline, patience):
                        self._poll(fd, deadline, patience)
            if not self.stamped:
                try:
                    yield
                finally:
                    _flock(fd, fcntl.LOCK_UN)
                return
            try:
                _pwrite(fd, _STAMP.pack(time.time()))
                yield
            finally:
                try:
                    _pwrite(fd, _NO_STAMP)
                finally:
                    _flock(fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def _poll(self, fd: int, deadline: float, patience: float | None) -> None:
        """Wait for the lock by a ``LOCK_NB`` try every :data:`POLL_SECONDS`, where no
        :class:`_Handoff` thread could be started (a thread limit reached must not leave the
        handoff marked under way for good, every later write of the process timing out) or
        threads are green (see :func:`_native_threads`)."""
        look_at = 0.0
        while not self._try(fd):
            look_at = _judge_wait(fd, time.monotonic(), deadline, patience, look_at)
            time.sleep(POLL_SECONDS)

    def _try(self, fd: int) -> bool:
        """Take the lock if it is free, without waiting; never while this process's
        :class:`_Handoff` thread is in a ``flock`` of its own (only a waiter of this process,
        holding its thread lock as the caller does, starts one)."""
        if self._handoff is not None and self._handoff.under_way():
            return False
        try:
            _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            return False
        return True


def _judge_wait(
    fd: int, now: float, deadline: float, patience: float | None, look_at: float
) -> float:
    """One look of a waiter (:meth:`_Handoff.take`, :meth:`WritersLock._poll`) at its wait,
    at ``now``: :class:`HeldTooLong` if the holder's stamp says it has held the lock for longer
    than ``patience``, ``TimeoutError`` at ``deadline``; else when the stamp is worth reading
    again (``look_at``, as given back the last time; ``inf`` without patience): not before the
    hold can have passed ``patience`` (a read per wake-up would be a system call, and a wait
    for the GIL, for nothing). A new holder only stamps a later time."""
    if patience is None:
        look_at = float("inf")
    elif now >= look_at:
        held = _held_for(fd)
        if held > patience:
            raise HeldTooLong("another process has held the writers' lock too long")
        look_at = now + max(patience - held, POLL_SECONDS)
    if now >= deadline:
        raise TimeoutError("another process held the writers' lock too long")
    return look_at


def _native_threads() -> bool:
    """Whether a thread is one of the system's: not where ``threading`` was monkey-patched
    into greenlets (gunicorn's gevent and eventlet workers), whose "thread" in a blocking
    ``flock`` would block the whole process, every request of it and the waiter's own timeout
    and patience, until another process let go of the lock."""
    return isinstance(_thread.start_new_thread, types.BuiltinFunctionType)


def _held_for(fd: int) -> float:
    """How long the current holder has held the lock (0 when it has not stamped it yet)."""
    try:
        raw = os.pread(fd, _STAMP.size, 0)
    except OSError:
        return 0.0
    if len(raw) < _STAMP.size:
        return 0.0
    (since,) = _STAMP.unpack(raw)
    return time.time() - since if since > 0 else 0.0
