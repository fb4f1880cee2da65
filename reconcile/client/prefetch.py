"""Read ahead: iterate an iterable in a background thread, through a bounded queue.

The reconciler lists a processor's objects page by page over HTTP and writes each chunk to
the database. Done in turn, a run costs the sum of the two; with :class:`Prefetch` the next
page is fetched while the current chunk is diffed and written, so the run costs about the
larger of the two. The queue holds at most ``depth`` items, so memory stays constant however
long the listing is.

* Items arrive in order; the iterable is only ever touched by the one background thread (so
  a client session or a pager's state is never shared between threads).
* An exception raised by the iterable (a :class:`~reconcile.core.errors.ProcessorError`, say) is
  raised in the consumer after the items produced before it, and ends the iteration.
* :meth:`Prefetch.close` (or leaving the ``with`` block, or the consumer failing) stops the
  thread: it produces no further item once it sees the stop, and ``close`` waits for it, so
  nothing touches the iterable after ``close`` returns (the pager's counters are final) --
  unless the item being produced takes longer than ``stop_timeout`` (a hung request): then
  ``close`` returns anyway and the daemon thread ends once that item is done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from queue import Empty, Full, Queue
from types import TracebackType
from typing import Generic, TypeVar

__all__ = ["Prefetch"]

T = TypeVar("T")

#: How often a blocked producer or consumer looks at the stop flag (seconds).
_POLL = 0.1


class _End:
    """The producer's last message: the iterable is exhausted, or failed with ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class Prefetch(Generic[T]):
    """Iterate ``source`` in a daemon thread, at most ``depth`` items ahead of the consumer.

    >>> with Prefetch(range(3)) as items:
    ...     list(items)
    [0, 1, 2]
    """

    def __init__(
        self,
        source: Iterable[T],
        *,
        depth: int = 2,
        name: str = "prefetch",
        stop_timeout: float | None = None,
    ) -> None:
        if depth < 1:
            raise ValueError("depth must be at least 1")
        self._stop_timeout = stop_timeout
        self._source = source
        self._queue: Queue[T | _End] = Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name=name, daemon=True)
        self._started = False

    # -- producer (background thread) --------------------------------------------------------

    def _produce(self) -> None:
        end = _End(None)
        try:
            iterator = iter(self._source)
            try:
                while not self._stop.is_set():
                    try:
                        item = next(iterator)
                    except StopIteration:
                        break
                    if not self._put(item):
                        break
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()  # a generator's finally blocks run here, in its own thread
        except BaseException as exc:  # noqa: BLE001 - handed over to the consumer
            end = _End(exc)
        self._put(end)

    def _put(self, item: T | _End) -> bool:
        """Queue ``item``, waiting for room; ``False`` if stopped meanwhile."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL)
                return True
            except Full:
                continue
        return False

    # -- consumer ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        if self._started:
            raise RuntimeError("a Prefetch can be iterated once")
        self._started = True
        self._thread.start()
        try:
            while True:
                item = self._get()
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                yield item
        finally:
            self.close()

    def _get(self) -> T | _End:
        while True:
            try:
                return self._queue.get(timeout=_POLL)
            except Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    # Cannot happen (the producer always ends with a message) unless the
                    # interpreter is shutting down; do not wait forever.
                    return _End(RuntimeError("the prefetch thread ended without a result"))

    def close(self) -> None:
        """Stop the producer and wait until it has let go of the iterable (at most
        ``stop_timeout`` seconds: it stops between two items, not inside one)."""
        self._stop.set()
        if not self._started:
            return
        deadline = None if self._stop_timeout is None else time.monotonic() + self._stop_timeout
        while self._thread.is_alive():
            # Unblock a producer waiting for room (it also looks at the stop flag meanwhile).
            try:
                self._queue.get_nowait()
            except Empty:
                pass
            self._thread.join(timeout=_POLL)
            if deadline is not None and time.monotonic() >= deadline:
                return  # a daemon thread: it ends after the item it is producing

    def __enter__(self) -> Prefetch[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
