"""The reconcile run's pipeline: the listing read ahead in a thread, one database round trip
per chunk, missed transitions inserted in batches. A failure anywhere loses nothing."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import reconcile.runtime.runner as runner
from receiver import WebhookReceiver
from receiver.core.transitions import State, make_state
from receiver.storage.tables import InboxEvent, Source
from reconcile.client.paging import Pager
from reconcile.core.errors import TransportError
from reconcile.runtime.runner import ReconcileOptions, Reconciler
from reconcile.sandbox import SandboxServer
from reconcile.storage.store import ReconcileStore
from reconcile.storage.tables import SeenBatch
from tests.conftest import AppFactory
from tests.reconcile.runtime.test_reconcile import API_KEY, _app, _reconciler

pytestmark = pytest.mark.storage

E: sa.Table = InboxEvent.__table__  # type: ignore[attr-defined]
S: sa.Table = SeenBatch.__table__  # type: ignore[attr-defined]
START = datetime(2026, 3, 1, tzinfo=UTC)
SUCCEEDED = make_state("payment", "succeeded")
END = START + timedelta(hours=1)
WINDOW = ReconcileOptions(
    kinds=["payments"],
    mode="window",
    since=START - timedelta(minutes=1),
    until=END,
    sweep_budget=0,
)
N = 250
STATUSES = ["succeeded", "failed", "cancelled", "requires_capture", "processing"]
RECOVERED = Counter(
    payment_succeeded=N // 5,
    payment_failed=N // 5,
    payment_cancelled=N // 5,
    payment_authorized=N // 5,
    payment_processing=N // 5,
)


@pytest.fixture
def server() -> Iterator[SandboxServer]:
    with SandboxServer(API_KEY, webhook_url=None, webhook_secret="unused") as sb:
        sb.sandbox.seed_payments(N, START, END, status=STATUSES)
        yield sb


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 100 (three for the N objects)."""
    monkeypatch.setattr(runner, "CHUNK", 100)


def _recovered_events(reconciler: Reconciler) -> set[str]:
    with reconciler.inbox.engine.connect() as conn:
        rows = conn.execute(sa.select(E.c.object_id).where(E.c.source == Source.RECONCILE))
        return {r.object_id for r in rows}


def _seen_rows(reconciler: Reconciler) -> int:
    with reconciler.inbox.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(S)).scalar_one())


def _threads_left() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("reconcile-")]


@pytest.mark.usefixtures("small_chunks")
def test_recovered_events_are_inserted_one_batch_per_chunk(
    make_app: AppFactory, server: SandboxServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, _ = _app(make_app)
    reconciler = _reconciler(app, server)
    batches: list[int] = []
    insert = reconciler.inbox.inbox.insert_synthesised

    def spy(events: Any, **kw: Any) -> dict[str, str]:
        batches.append(len(events))
        return insert(events, **kw)

    monkeypatch.setattr(reconciler.inbox.inbox, "insert_synthesised", spy)
    report = reconciler.run(WINDOW)
    kind = report.kinds["payments"]
    assert (kind.checked, kind.recovered, report.unresolved) == (N, RECOVERED, 0)
    assert batches == [100, 100, 50]  # one transaction per chunk
    assert len(_recovered_events(reconciler)) == N
    assert _seen_rows(reconciler) == 0  # the run's marks are gone with it
    assert _threads_left() == []
    reconciler.client.close()


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("fail_in", ["observe", "insert_synthesised"])
def test_a_database_failure_mid_run_loses_nothing(
    make_app: AppFactory,
    server: SandboxServer,
    monkeypatch: pytest.MonkeyPatch,
    fail_in: str,
) -> None:
    """The run fails (its first chunk was diffed and recovered, the second not); the next run
    finds the first chunk's events queued and recovers the rest."""
    app, _ = _app(make_app)
    reconciler = _reconciler(app, server)
    calls = Counter[str]()
    if fail_in == "observe":
        # The second chunk's statement fails.
        real_observe = reconciler.store.observe

        def observe(*args: Any, **kw: Any) -> Any:
            calls["observe"] += 1
            if calls["observe"] == 2:
                raise sa.exc.OperationalError("SELECT", {}, Exception("cut"))
            return real_observe(*args, **kw)

        monkeypatch.setattr(reconciler.store, "observe", observe)
    else:
        # The first chunk's events (100) are inserted, the second chunk's insert fails.
        real_insert = reconciler.inbox.inbox.insert_synthesised

        def insert(events: Any, **kw: Any) -> dict[str, str]:
            calls["insert"] += 1
            if calls["insert"] == 2:
                raise sa.exc.OperationalError("INSERT", {}, Exception("cut"))
            return real_insert(events, **kw)

        monkeypatch.setattr(reconciler.inbox.inbox, "insert_synthesised", insert)
    with pytest.raises(sa.exc.OperationalError):
        reconciler.run(WINDOW)
    assert _threads_left() == []  # the read-ahead thread was stopped
    assert ReconcileStore(reconciler.inbox.engine).runs(1)[0].status == "failed"
    # The first chunk's events were inserted before the failure (a chunk is one transaction).
    assert len(_recovered_events(reconciler)) == 100
    monkeypatch.undo()

    again = reconciler.run(WINDOW)
    kind = again.kinds["payments"]
    assert (kind.checked, again.unresolved, again.status) == (N, 0, "ok")
    # What the failed run had inserted is queued already; the rest is recovered now.
    queued = 100
    assert kind.queued == queued
    assert sum(kind.recovered.values()) == N - queued
    assert len(_recovered_events(reconciler)) == N
    assert _seen_rows(reconciler) == 0  # both runs' marks are gone
    reconciler.client.close()


class FailingPager(Pager):
    """The real pager's rows up to ``after``, then a transport failure."""

    def __init__(self, inner: Pager, after: int) -> None:  # noqa: D107 - no base init
        self.inner = inner
        self.after = after
        self.pages = 0
        self.requests = 0
        self.incomplete = []

    def _rows(self) -> Iterator[dict[str, Any]]:
        for i, row in enumerate(self.inner):
            self.pages, self.requests = self.inner.pages, self.inner.requests
            if i == self.after:
                raise TransportError("the processor went away")
            yield row

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._rows()


@pytest.mark.parametrize("chunk", [100, 500])
def test_a_listing_failure_still_diffs_and_recovers_what_was_listed(
    make_app: AppFactory,
    server: SandboxServer,
    monkeypatch: pytest.MonkeyPatch,
    chunk: int,
) -> None:
    """As before chunks grew: the whole hundreds listed before the failure are diffed and
    their transitions recovered, whatever the chunk size."""
    monkeypatch.setattr(runner, "CHUNK", chunk)
    app, _ = _app(make_app)
    reconciler = _reconciler(app, server)
    real = reconciler._pager
    monkeypatch.setattr(reconciler, "_pager", lambda *a: FailingPager(real(*a), after=230))
    report = reconciler.run(WINDOW)
    kind = report.kinds["payments"]
    assert kind.remote_errors == ["TransportError: the processor went away"]
    assert kind.checked == 200
    assert sum(kind.recovered.values()) == 200
    assert len(_recovered_events(reconciler)) == 200
    assert kind.pages >= 3
    assert kind.local_only == 0  # not checked after a listing failure
    assert report.status == "incomplete"  # the processor could not be read to the end
    assert ReconcileStore(reconciler.inbox.engine).watermark("payment") is None
    assert _threads_left() == []
    reconciler.client.close()


def test_observe_marks_seen_and_reads_the_projection(make_app: AppFactory) -> None:
    from receiver.testing import WebhookTestClient

    app, _ = _app(make_app)
    client = WebhookTestClient(app)
    client.send("payment_succeeded", object_id="pay_b", created="2026-03-01T00:10:00.000Z")
    client.send("payment_failed", object_id="pay_z", created="2026-03-01T00:20:00.000Z")
    client.drain()
    engine = WebhookReceiver.state(app).store.engine
    store = ReconcileStore(engine)
    run_id = store.start_run("window", "test")
    assert store.observe(run_id, "payment", []) == {}
    # Only what is out of step comes back: pay_a is not projected, pay_b is in step.
    listed: list[tuple[str, State | None]] = [("pay_a", SUCCEEDED), ("pay_b", SUCCEEDED)]
    assert store.observe(run_id, "payment", listed) == {"pay_a": None}
    # pay_b again (seen twice is fine), with another remote status; pay_c with none.
    listed = [("pay_b", make_state("payment", "failed")), ("pay_c", None)]
    differing = store.observe(run_id, "payment", listed)
    assert set(differing) == {"pay_b"}
    local = differing["pay_b"]
    assert local is not None and local.state == SUCCEEDED and local.event_pk > 0
    odd = ["pay_'quoted\"\\", "pay_é", "pay_\u2028"]
    assert store.observe(run_id, "payment", [(i, SUCCEEDED) for i in odd]) == dict.fromkeys(odd)
    # Disputes are compared on their stage too.
    client.send("dispute_won", object_id="dp_1", dispute_stage="dispute")
    client.drain()
    reopened = make_state("dispute", "dispute_won", "pre_arbitration")
    assert set(store.observe(run_id, "dispute", [("dp_1", reopened)])) == {"dp_1"}
    same = make_state("dispute", "dispute_won", "dispute")
    assert store.observe(run_id, "dispute", [("dp_1", same)]) == {}
    # pay_z is known locally and was not seen; pay_b was (twice).
    assert store.local_only(run_id, "payment", START, END) == (1, ["pay_z"])
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(S)).scalar_one() == 5
    assert store.local_only(run_id, "refund", START, END) == (0, [])
    store.finish_run(run_id, "ok", {})
    assert store.local_only(run_id, "payment", START, END) == (2, ["pay_b", "pay_z"])


def test_local_only_samples_the_first_ids_in_order(make_app: AppFactory) -> None:
    from receiver.testing import WebhookTestClient

    app, _ = _app(make_app)
    client = WebhookTestClient(app)
    for i in reversed(range(25)):
        client.send("payment_succeeded", object_id=f"pay_{i:02d}", created="2026-03-01T00:10:00Z")
    client.drain()
    store = ReconcileStore(WebhookReceiver.state(app).store.engine)
    run_id = store.start_run("window", "test")
    store.mark_seen(run_id, "payment", ["pay_00", "pay_03"])
    count, sample = store.local_only(run_id, "payment", START, END, sample=5)
    assert count == 23
    assert sample == ["pay_01", "pay_02", "pay_04", "pay_05", "pay_06"]
