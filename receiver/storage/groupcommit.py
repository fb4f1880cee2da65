"""Group commit: the threads of one process share a transaction (and its fsync) when they
write at the same time.

SQLite has one writer per database, and with ``synchronous=FULL`` every commit waits for the
disk. When several threads of a web worker store webhooks at once, each would otherwise queue
for the lock and pay a commit of its own. (On PostgreSQL it is off by default: see
:data:`receiver.storage.inbox.PG_GROUP_COMMIT`.) Here the first thread in becomes the *leader*: it
takes every delivery queued so far (its own included), writes them in one transaction and
commits once; the others (*followers*) wait and get their own result. Nothing is acknowledged
before its commit, and each delivery still gets its own answer (inserted, duplicate,
conflict, or an error).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_QUEUED, _TAKEN, _LEAD, _DONE = range(4)


class _Slot(Generic[T, R]):
    __slots__ = ("item", "state", "result", "error", "wake")

    def __init__(self, item: T) -> None:
        self.item = item
        self.state = _QUEUED
        self.result: R | None = None
        self.error: BaseException | None = None
        #: Released (once) to wake the submitting thread: its item is done, or it leads.
        self.wake = threading.Lock()
        self.wake.acquire()


class GroupCommit(Generic[T, R]):
    """Runs submitted items in batches, one batch at a time.

    ``run_batch(items)`` returns one result per item, in order; an item's result may be an
    exception, which :meth:`submit` raises for that item alone. If ``run_batch`` itself
    raises, every item of the batch gets that exception.

    Each waiting thread is woken once, by the leader of the batch that held its item (done)
    or by the leader before it (its turn to lead the next batch, which holds its item): no
    thread is woken to find that it must wait again, and no wake-up contends for a shared
    lock (on a busy web worker every wake-up is a switch and a wait for the GIL).
    """

    def __init__(
        self,
        run_batch: Callable[[list[T]], Sequence[R | BaseException]],
        *,
        max_batch: int = 64,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._mutex = threading.Lock()
        self._queue: list[_Slot[T, R]] = []
        self._busy = False

    def submit(self, item: T, *, timeout: float) -> R:
        """Write ``item`` (alone or with others) and return its result after the commit.

        Raises :class:`TimeoutError` when no batch took the item within ``timeout`` seconds
        (it was then not written); once a batch has taken it, waits for that batch.
        """
        slot: _Slot[T, R] = _Slot(item)
        with self._mutex:
            self._queue.append(slot)
            lead = not self._busy
            if lead:
                self._busy = True
                slot.state = _LEAD
        if not lead:
            try:
                self._wait(slot, time.monotonic() + timeout)
            except BaseException:
                self._abandon(slot)
                raise
            if slot.state == _DONE:
                return self._outcome(slot)
        self._lead_batch()
        return self._outcome(slot)

    def _wait(self, slot: _Slot[T, R], deadline: float) -> None:
        """Until ``slot`` is done or leads; :class:`TimeoutError` (the item taken out of the
        queue, never written) if no batch took it by ``deadline``."""
        if slot.wake.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return
        with self._mutex:
            if slot.state == _QUEUED:
                self._queue.remove(slot)
                raise TimeoutError("no writer took the item in time")
        slot.wake.acquire()  # taken meanwhile (or to lead): its wake-up is on its way

    def _abandon(self, slot: _Slot[T, R]) -> None:
        """A waiting thread interrupted (or timed out): its item leaves the queue if no
        batch took it, and a turn to lead passes on, so the next items are not left
        waiting for a leader that is gone."""
        with self._mutex:
            if slot.state == _TAKEN or slot.state == _DONE:
                return  # its batch writes it (it is not to lead)
            if slot in self._queue:
                self._queue.remove(slot)
            if slot.state != _LEAD:
                return
            following = self._next_leader()
        if following is not None:
            following.wake.release()

    def _next_leader(self) -> _Slot[T, R] | None:
        """(Under the mutex, as a turn to lead ends.) The first item queued, told it leads
        the next batch (its thread is woken by the caller, after the mutex); none queued:
        the next submit leads."""
        following = self._queue[0] if self._queue else None
        if following is None:
            self._busy = False
        else:
            following.state = _LEAD
        return following

    def _lead_batch(self) -> None:
        """Write the next batch (this thread's item first in it), then hand over."""
        with self._mutex:
            batch = self._queue[: self._max_batch]
            del self._queue[: len(batch)]
            for each in batch:
                each.state = _TAKEN
        results: Sequence[R | BaseException] | None = None
        try:
            results = self._run(batch)
        finally:
            self._finish(batch, results)

    def _run(self, batch: list[_Slot[T, R]]) -> Sequence[R | BaseException]:
        try:
            results = self._run_batch([slot.item for slot in batch])
        except Exception as exc:  # noqa: BLE001 - handed to every item of the batch
            return [exc] * len(batch)
        if len(results) != len(batch):
            error = RuntimeError("run_batch returned a result count unlike the batch's")
            return [error] * len(batch)
        return results

    def _finish(
        self, batch: list[_Slot[T, R]], results: Sequence[R | BaseException] | None
    ) -> None:
        for index, slot in enumerate(batch):
            if results is None:  # interrupted (KeyboardInterrupt, SystemExit)
                slot.error = RuntimeError("the batch writing this item was interrupted")
            elif isinstance(results[index], BaseException):
                slot.error = results[index]  # type: ignore[assignment]
            else:
                slot.result = results[index]  # type: ignore[assignment]
        with self._mutex:
            for slot in batch:
                slot.state = _DONE
            following = self._next_leader()
        # The leader's own slot is the batch's first: it is not waiting.
        for slot in batch[1:]:
            slot.wake.release()
        if following is not None:
            following.wake.release()

    @staticmethod
    def _outcome(slot: _Slot[T, R]) -> R:
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]
