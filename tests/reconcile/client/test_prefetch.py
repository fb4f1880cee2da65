"""The reconciler's read-ahead (:class:`reconcile.client.prefetch.Prefetch`): order, bounds,
stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from reconcile.client.prefetch import Prefetch
from reconcile.core.errors import TransportError


class Source:
    """A generator-backed source that records what was pulled, from which thread, and whether
    its generator was closed."""

    def __init__(self, n: int, *, fail_at: int | None = None, error: BaseException | None = None):
        self.n = n
        self.fail_at = fail_at
        self.error = error or TransportError("listing failed")
        self.pulled = 0
        self.threads: set[str] = set()
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[int]:
        try:
            for i in range(self.n):
                self.threads.add(threading.current_thread().name)
                if i == self.fail_at:
                    raise self.error
                self.pulled += 1
                yield i
        finally:
            self.closed.set()


def _wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def test_items_arrive_in_order_from_one_background_thread() -> None:
    source = Source(50)
    with Prefetch(source, name="pf-test") as items:
        assert list(items) == list(range(50))
    assert source.threads == {"pf-test"}
    assert source.closed.is_set()


def test_read_ahead_is_bounded_by_depth() -> None:
    source = Source(100)
    prefetch = Prefetch(source, depth=2)
    items = iter(prefetch)
    assert next(items) == 0
    time.sleep(0.3)  # give the producer every chance to run ahead
    # One item consumed, ``depth`` waiting in the queue, one held by the blocked producer.
    assert source.pulled <= 1 + 2 + 1
    prefetch.close()
    assert source.pulled <= 1 + 2 + 1


def test_an_error_of_the_source_is_raised_after_the_items_before_it() -> None:
    source = Source(10, fail_at=7)
    got: list[int] = []
    with pytest.raises(TransportError, match="listing failed"):
        for item in Prefetch(source):
            got.append(item)
    assert got == list(range(7))
    assert source.closed.is_set()


def test_a_failing_consumer_stops_the_thread_and_closes_the_source() -> None:
    source = Source(10_000)
    prefetch = Prefetch(source, depth=1, name="pf-consumer-fails")
    with pytest.raises(RuntimeError, match="database down"):
        with prefetch:
            for item in prefetch:
                if item == 3:
                    raise RuntimeError("database down")
    # close() returned: the thread has let go of the source, which was closed in it.
    assert not any(t.name == "pf-consumer-fails" for t in threading.enumerate())
    assert source.closed.is_set()
    pulled = source.pulled
    time.sleep(0.2)
    assert source.pulled == pulled < 10  # nothing was fetched after the stop


def test_close_does_not_wait_past_stop_timeout_for_a_hung_item() -> None:
    release = threading.Event()

    def hung() -> Iterator[int]:
        yield 1
        release.wait(10)  # a request that hangs
        yield 2

    prefetch = Prefetch(hung(), depth=1, name="pf-hung", stop_timeout=0.3)
    items = iter(prefetch)
    assert next(items) == 1
    started = time.monotonic()
    prefetch.close()
    assert time.monotonic() - started < 2
    release.set()  # the request ends: the thread then stops without producing more
    _wait_for(lambda: not any(t.name == "pf-hung" for t in threading.enumerate()))


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="depth"):
        Prefetch([], depth=0)


def test_an_empty_source_ends_at_once() -> None:
    empty: list[int] = []
    with Prefetch(empty) as items:
        assert list(items) == []
