"""A writers' lock shared by the processes of one host (``flock`` on a file beside the
SQLite database).

SQLite lets one writer in at a time. A writer that finds the database locked sleeps in
SQLite's busy handler (1, 2, 5, 10, ... up to 100 ms between attempts), so the web processes
of one server, storing webhooks at the same time, wait on each other in sleeps much longer
than the writes themselves: that was the receive path's tail latency on SQLite. Taking this
lock first, the processes queue on the kernel's lock instead and get in within a fraction of
a millisecond of its release. It is advisory and only orders the writers that use it; SQLite's
own lock still guarantees correctness for every writer.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: How often a waiting writer tries the lock again (seconds).
POLL_SECONDS = 0.0005


class WritersLock:
    """``with lock.hold(timeout): ...`` excludes the other processes (and threads) using the
    same path. A process that forks gets its own open file (an inherited one would be shared
    with the parent, and ``flock`` would then not exclude the two)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = os.getpid()
        self._threads = threading.Lock()

    def __repr__(self) -> str:
        return f"WritersLock({self.path!r})"

    def _after_fork(self) -> None:
        """In a forked child: a fresh thread lock (the parent's may have been held by a
        thread that does not exist here) and, when first needed, a file of its own."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._threads = threading.Lock()
            self._fd = None  # the inherited descriptor stays open; it is the parent's

    def _file(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    @contextmanager
    def hold(self, timeout: float) -> Iterator[None]:
        """Hold the lock for the block; :class:`TimeoutError` if it stays taken for
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        self._after_fork()
        if not self._threads.acquire(timeout=max(timeout, 0.0)):
            raise TimeoutError("another thread held the writers' lock too long")
        try:
            fd = self._file()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                if time.monotonic() >= deadline:
                    raise TimeoutError("another process held the writers' lock too long")
                time.sleep(POLL_SECONDS)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()
