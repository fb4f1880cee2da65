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
