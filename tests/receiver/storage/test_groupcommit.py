"""Group commit: threads share batches, each gets its own answer, nothing is lost or doubled."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from receiver.storage.groupcommit import GroupCommit


class _Recorder:
    """A batch writer that records its batches; it can be held inside a batch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.inside = threading.Event()

    def __call__(self, items: list[int]) -> Sequence[int | BaseException]:
        self.inside.set()
        assert self.hold.wait(10)
        self.batches.append(list(items))
        return [ValueError(f"bad {i}") if i < 0 else i * 10 for i in items]


def _held_leader(group: GroupCommit[int, int], writer: _Recorder) -> ThreadPoolExecutor:
    """Start a submit whose batch stays inside the writer until ``writer.hold`` is set."""
    writer.hold.clear()
    pool = ThreadPoolExecutor(max_workers=64)
    pool.submit(group.submit, 0, timeout=10)
    assert writer.inside.wait(5)
    return pool


def test_waiting_items_share_one_batch_and_each_gets_its_own_result() -> None:
    writer = _Recorder()
    group = GroupCommit(writer)
    pool = _held_leader(group, writer)
    futures = [pool.submit(group.submit, i, timeout=10) for i in range(1, 21)]
    while sum(len(b) for b in writer.batches) == 0 and len(group._queue) < 20:
        threading.Event().wait(0.01)
    writer.hold.set()
    assert [f.result(10) for f in futures] == [i * 10 for i in range(1, 21)]
    pool.shutdown()
    assert writer.batches[0] == [0]
    # Everything that queued behind the held batch was written together, once each.
    assert sorted(i for b in writer.batches[1:] for i in b) == list(range(1, 21))
    assert len(writer.batches) == 2


def test_an_items_error_is_raised_for_that_item_only() -> None:
    writer = _Recorder()
    group = GroupCommit(writer)
    pool = _held_leader(group, writer)
    good = pool.submit(group.submit, 7, timeout=10)
    bad = pool.submit(group.submit, -1, timeout=10)
    while len(group._queue) < 2:
        threading.Event().wait(0.01)
    writer.hold.set()
    assert good.result(10) == 70
    with pytest.raises(ValueError, match="bad -1"):
        bad.result(10)
    pool.shutdown()


def test_a_failing_batch_fails_each_of_its_items() -> None:
    def broken(items: list[int]) -> Sequence[int]:
        raise OSError("disk gone")

    group: GroupCommit[int, int] = GroupCommit(broken)
    with pytest.raises(OSError, match="disk gone"):
        group.submit(1, timeout=1)
    # The group is usable again afterwards.
    with pytest.raises(OSError):
        group.submit(2, timeout=1)


def test_a_result_count_unlike_the_batch_is_an_error_not_a_wrong_answer() -> None:
    group: GroupCommit[int, int] = GroupCommit(lambda items: [])
    with pytest.raises(RuntimeError, match="result count"):
        group.submit(1, timeout=1)


def test_an_item_not_taken_in_time_times_out_and_is_never_written() -> None:
    writer = _Recorder()
    group = GroupCommit(writer)
    pool = _held_leader(group, writer)
    with pytest.raises(TimeoutError):
        group.submit(5, timeout=0.1)
    writer.hold.set()
    pool.shutdown(wait=True)
    assert writer.batches == [[0]]
    assert group.submit(6, timeout=1) == 60


def test_more_items_than_a_batch_holds_are_all_written_once() -> None:
    writer = _Recorder()
    group = GroupCommit(writer, max_batch=3)
    pool = _held_leader(group, writer)
    futures = [pool.submit(group.submit, i, timeout=10) for i in range(1, 11)]
    while len(group._queue) < 10:
        threading.Event().wait(0.01)
    writer.hold.set()
    assert [f.result(10) for f in futures] == [i * 10 for i in range(1, 11)]
    pool.shutdown()
    assert all(len(b) <= 3 for b in writer.batches)
    assert sorted(i for b in writer.batches for i in b) == list(range(11))


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError):
        GroupCommit(lambda items: items, max_batch=0)


class _Interrupted(BaseException):
    """Stands for a KeyboardInterrupt or SystemExit raised in a waiting thread."""


def test_a_thread_whose_turn_to_lead_came_as_it_was_interrupted_passes_the_turn_on() -> None:
    # Each waiter is woken once, and the one woken to lead the next batch is told so alone:
    # if it dies then (a worker's graceful timeout, Ctrl-C), the turn must not die with it,
    # or every later delivery would wait for a leader that is gone (503s for ever).
    writer = _Recorder()
    group: GroupCommit[int, int] = GroupCommit(writer)
    real_wait = group._wait

    def wait(slot, deadline):  # type: ignore[no-untyped-def]
        real_wait(slot, deadline)
        if slot.item == 1:
            raise _Interrupted()

    group._wait = wait  # type: ignore[method-assign]
    pool = _held_leader(group, writer)
    first = pool.submit(group.submit, 1, timeout=10)
    while len(group._queue) < 1:
        threading.Event().wait(0.01)
    second = pool.submit(group.submit, 2, timeout=10)
    while len(group._queue) < 2:
        threading.Event().wait(0.01)
    writer.hold.set()
    with pytest.raises(_Interrupted):
        first.result(10)
    assert second.result(10) == 20
    assert group.submit(3, timeout=1) == 30
    pool.shutdown()
    written = [i for b in writer.batches for i in b]
    assert 1 not in written and sorted(written) == [0, 2, 3]


def test_many_threads_with_short_waits_each_item_written_once_or_refused_unwritten() -> None:
    # Items time out while others are handed the lead and batches finish: an item refused
    # (TimeoutError) is never written, every other is written exactly once with its answer.
    import random
    import time

    seen: list[int] = []

    def write(items: list[int]) -> list[int]:
        time.sleep(random.uniform(0, 0.004))
        seen.extend(items)
        return [i * 10 for i in items]

    group: GroupCommit[int, int] = GroupCommit(write, max_batch=4)

    def one(i: int) -> int | None:
        try:
            return group.submit(i, timeout=random.choice((0.001, 0.005, 1.0)))
        except TimeoutError:
            return None

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(one, range(2000)))
    written = [i for i, answer in enumerate(answers) if answer is not None]
    assert all(answers[i] == i * 10 for i in written)
    assert sorted(seen) == written
    assert 0 < len(written)
    assert not group._busy and not group._queue
