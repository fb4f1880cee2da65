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

_QUEUED, _TAKEN, _DONE = range(3)


class _Slot(Generic[T, R]):
    __slots__ = ("item", "state", "result", "error")

    def __init__(self, item: T) -> None:
        self.item = item
        self.state = _QUEUED
        self.result: R | None = None
        self.error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """Runs submitted items in batches, one batch at a time.

    ``run_batch(items)`` returns one result per item, in order; an item's result may be an
    exception, which :meth:`submit` raises for that item alone. If ``run_batch`` itself
    raises, every item of the batch gets that exception.
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
        self._cond = threading.Condition()
        self._queue: list[_Slot[T, R]] = []
        self._busy = False

    def submit(self, item: T, *, timeout: float) -> R:
        """Write ``item`` (alone or with others) and return its result after the commit.

        Raises :class:`TimeoutError` when no batch took the item within ``timeout`` seconds
        (it was then not written); once a batch has taken it, waits for that batch.
        """
        slot: _Slot[T, R] = _Slot(item)
        deadline = time.monotonic() + timeout
        with self._cond:
            self._queue.append(slot)
            while True:
                while self._busy and slot.state != _DONE:
                    remaining = deadline - time.monotonic()
                    if slot.state == _QUEUED:
                        if remaining <= 0:
                            self._queue.remove(slot)
                            raise TimeoutError("no writer took the item in time")
                        self._cond.wait(remaining)
                    else:
                        self._cond.wait()
                if slot.state == _DONE:
                    return self._outcome(slot)
                batch = self._lead()
                results: Sequence[R | BaseException] | None = None
                self._cond.release()  # others queue up while this batch is written
                try:
                    results = self._run(batch)
                finally:
                    self._cond.acquire()
                    self._finish(batch, results)
                if slot.state == _DONE:
                    return self._outcome(slot)
                # More were queued ahead of this item than one batch holds: go round again.

    def _lead(self) -> list[_Slot[T, R]]:
        self._busy = True
        batch = self._queue[: self._max_batch]
        del self._queue[: len(batch)]
        for slot in batch:
            slot.state = _TAKEN
        return batch

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
            slot.state = _DONE
        self._busy = False
        self._cond.notify_all()

    @staticmethod
    def _outcome(slot: _Slot[T, R]) -> R:
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]
