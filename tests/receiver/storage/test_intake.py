"""SQLite's intake (issue 29, item 1): while another process holds the database's write lock
for long (a worker whose handler runs inside its transaction), a webhook is stored in the
intake and answered, judged exactly as in the inbox; the move brings it into the inbox as the
receive path would have written it, and a move interrupted between its two commits neither
loses nor doubles anything."""

from __future__ import annotations

import base64
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

import receiver.storage.database as db
from receiver import WebhookReceiver
from receiver.core.errors import StorageUnavailable
from receiver.core.events import parse_event
from receiver.storage.filelock import HeldTooLong, WritersLock
from receiver.storage.inbox import WRITERS_LOCK_SUFFIX
from receiver.storage.intake import Intake, figures_of
from receiver.storage.order_refs import matching_events
from receiver.storage.sql.tables import EVENT
from receiver.store import Store
from receiver.testing import signed_headers
from receiver.testing.factories import build_event, encode
from receiver.web.metrics import Metrics
from receiver.worker.heartbeat import check
from receiver.worker.runner import Worker
from tests.conftest import SECRETS, backend
from tests.receiver.web.test_metrics import TOKEN, scrape, value

pytestmark = [
    pytest.mark.storage,
    pytest.mark.skipif(backend() != "sqlite", reason="SQLite's intake (PostgreSQL has none)"),
]


class Holder(threading.Thread):
    """Holds the database's writers' lock on a file of its own, as another process does
    (``flock`` excludes another open file of the same process just as it does another
    process's), for at most ``seconds``."""

    def __init__(self, path: str, seconds: float) -> None:
        super().__init__(daemon=True)
        self.path, self.seconds = path, seconds
        self.ready, self.release = threading.Event(), threading.Event()

    def run(self) -> None:
        with WritersLock(self.path).hold(timeout=10):
            self.ready.set()
            self.release.wait(self.seconds)


@contextmanager
def another_process_holds_the_lock(database: Path, seconds: float = 30.0) -> Iterator[Holder]:
    """Another writer (a worker running a slow handler, say) holds the database's writers'
    lock for the block (at most ``seconds``)."""
    holder = Holder(str(database) + WRITERS_LOCK_SUFFIX, seconds)
    holder.start()
    try:
        assert holder.ready.wait(30)
        yield holder
    finally:
        holder.release.set()
        holder.join(30)


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "shop.sqlite3"
    engine = db.make_engine(f"sqlite:///{path}")
    db.upgrade(engine)
    engine.dispose()
    return path


@pytest.fixture
def store(database: Path) -> Iterator[Store]:
    # A write would wait up to 60 s for the lock: only the intake answers in time.
    engine = db.make_engine(f"sqlite:///{database}", sqlite_busy_timeout=60)
    made = Store(engine, write_wait=60)
    yield made
    engine.dispose()


def receive(store: Store, body: bytes) -> Any:
    return store.inbox.insert(parse_event(body), body, may_stage=True)


def rows(store: Store, sql: str) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(sql).all()]


def intake_rows(database: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(f"{database}-intake")
    try:
        return [
            (r[0], r[1]) for r in conn.execute("SELECT event_id, answer FROM hookledger_intake")
        ]
    finally:
        conn.close()


def test_webhooks_wait_in_the_intake_while_another_process_holds_the_lock(
    store: Store, database: Path
) -> None:
    first = encode(
        build_event("payment_succeeded", event_id="evt_i_1", metadata={"order_id": "o-1"})
    )
    second = encode(build_event("refund_succeeded", event_id="evt_i_2"))
    with another_process_holds_the_lock(database):
        a, b = receive(store, first), receive(store, second)
        # Stored (durably, in the intake) and answered while the lock is still held.
        assert (a.result, a.staged, b.result, b.staged) == ("inserted", True, "inserted", True)
        assert rows(store, "SELECT count(*) FROM hookledger_event") == [(0,)]
        assert intake_rows(database) == [("evt_i_1", "inserted"), ("evt_i_2", "inserted")]
        # Counted as open events, pending, as old as they are.
        status = check(store.engine, require_worker=False)
        assert status.intake == 2 and status.open_events["pending"] == 2
        assert status.oldest_open_age_seconds is not None
        counts, age = store.operations.stats()
        assert counts["pending"] == 2 and age is not None
    assert store.inbox.move_intake() == 2
    found = rows(
        store, "SELECT event_id, status, source, received_at FROM hookledger_event ORDER BY id"
    )
    assert [(r[0], r[1], r[2]) for r in found] == [
        ("evt_i_1", "pending", "webhook"),
        ("evt_i_2", "pending", "webhook"),
    ]
    # As the receive path writes it: the order index row with it, the receipt time kept.
    with store.engine.connect() as conn:
        found_by_order = conn.execute(
            sa.select(EVENT.c.event_id).where(EVENT.c.id.in_(matching_events(store.keyring, "o-1")))
        ).all()
    assert [r[0] for r in found_by_order] == ["evt_i_1"]
    assert intake_rows(database) == []
    assert figures_of(store.engine) == {}
    assert check(store.engine, require_worker=False).intake == 0


def test_a_webhook_is_judged_against_the_inbox_and_the_intake(store: Store, database: Path) -> None:
    stored = encode(build_event("payment_succeeded", event_id="evt_j_old"))
    assert receive(store, stored).staged is False  # the lock is free: into the inbox
    other = encode(build_event("payment_failed", event_id="evt_j_old"))
    new = encode(build_event("payment_succeeded", event_id="evt_j_new"))
    new_other = encode(build_event("payment_failed", event_id="evt_j_new"))
    with another_process_holds_the_lock(database):
        answers = [
            (r.result, r.staged)
            for r in (
                receive(store, stored),  # in the inbox, same body
                receive(store, other),  # in the inbox, another body
                receive(store, other),  # that conflict again
                receive(store, new),  # new: into the intake
                receive(store, new),  # in the intake, same body
                receive(store, new_other),  # in the intake, another body
            )
        ]
    assert answers == [
        ("duplicate", False),
        ("conflict", True),
        ("conflict", True),
        ("inserted", True),
        ("duplicate", False),
        ("conflict", True),
    ]
    assert store.inbox.move_intake() == 3
    assert rows(store, "SELECT event_id, event_type FROM hookledger_event ORDER BY id") == [
        ("evt_j_old", "payment_succeeded"),
        ("evt_j_new", "payment_succeeded"),
    ]
    assert sorted(rows(store, "SELECT event_id FROM hookledger_event_conflict")) == [
        ("evt_j_new",),
        ("evt_j_old",),
    ]


def test_a_move_cut_between_its_two_commits_is_finished_by_the_next(
    store: Store, database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = [encode(build_event("payment_succeeded", event_id=f"evt_c_{i}")) for i in range(5)]
    conflicting = encode(build_event("payment_failed", event_id="evt_c_0"))
    with another_process_holds_the_lock(database):
        for body in [*bodies, conflicting]:
            assert receive(store, body).staged
    # The inbox commits, then the process dies before the intake's delete.
    monkeypatch.setattr(Intake, "forget", lambda *_args: None)
    assert store.inbox.move_intake() == 6
    assert len(intake_rows(database)) == 6
    monkeypatch.undo()
    # The next move finds them all in the inbox: nothing doubled, the intake emptied.
    assert store.inbox.move_intake() == 6
    assert intake_rows(database) == []
    assert rows(store, "SELECT count(*), count(DISTINCT event_id) FROM hookledger_event") == [
        (5, 5)
    ]
    assert rows(store, "SELECT count(*) FROM hookledger_event_conflict") == [(1,)]
    refs = rows(store, "SELECT count(*), count(DISTINCT event_pk) FROM hookledger_order_ref")
    assert refs == [(5, 5)]  # each event's order reference, once


def test_the_first_delivery_waits_in_the_intake_and_is_moved_with_the_deliveries(
    store: Store, database: Path
) -> None:
    early = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    with another_process_holds_the_lock(database):
        store.operations.note_delivery(early + timedelta(seconds=5))
        # Another web process of the host noted an earlier one meanwhile (the intake keeps
        # the earliest).
        other = Store(db.make_engine(f"sqlite:///{database}"), write_wait=60)
        other.operations.note_delivery(early)
        receive(store, encode(build_event("payment_succeeded", event_id="evt_f_1")))
        assert rows(store, "SELECT count(*) FROM hookledger_cutover") == [(0,)]
        other.engine.dispose()
    assert store.inbox.move_intake() == 1
    found = rows(store, "SELECT name, mode, cutover_at FROM hookledger_cutover")
    assert found == [("first_delivery", "delivery", "2026-01-02 03:04:05.000000")]


def test_the_next_webhook_that_gets_the_lock_moves_what_waited(
    store: Store, database: Path
) -> None:
    with another_process_holds_the_lock(database):
        assert receive(store, encode(build_event("payment_succeeded", event_id="evt_n_1"))).staged
    later = receive(store, encode(build_event("payment_succeeded", event_id="evt_n_2")))
    assert (later.result, later.staged) == ("inserted", False)
    assert rows(store, "SELECT event_id FROM hookledger_event ORDER BY id") == [
        ("evt_n_1",),
        ("evt_n_2",),
    ]
    assert intake_rows(database) == []


def test_without_an_intake_a_webhook_waits_for_the_lock(database: Path) -> None:
    engine = db.make_engine(f"sqlite:///{database}", sqlite_busy_timeout=60)
    store = Store(engine, write_wait=60, intake="off")
    assert store.inbox.intake is None
    with another_process_holds_the_lock(database, seconds=1.0):
        outcome = receive(store, encode(build_event("payment_succeeded", event_id="evt_w_1")))
    assert (outcome.result, outcome.staged) == ("inserted", False)
    assert not Path(f"{database}-intake").exists()
    engine.dispose()


def test_the_receive_endpoint_answers_and_the_worker_moves_then_dispatches(
    database: Path,
) -> None:
    app = Flask("intake")
    app.config.update(
        HOOKLEDGER_DATABASE_URL=f"sqlite:///{database}",
        HOOKLEDGER_SECRETS="primary:" + SECRETS["primary"],
        HOOKLEDGER_SQLITE_BUSY_TIMEOUT=60,
    )
    hooks = WebhookReceiver()
    seen: list[str] = []

    @hooks.on("payment_succeeded")
    def handler(event: Any) -> None:
        seen.append(event.event_id)

    hooks.init_app(app)
    Metrics(app, token=TOKEN)
    http = app.test_client()
    body = encode(build_event("payment_succeeded", event_id="evt_w_http"))
    with another_process_holds_the_lock(database) as holder:
        # The first delivery of this process (its go-live note) and the delivery itself.
        response = http.post(
            "/webhooks/", data=body, headers=signed_headers(body, SECRETS["primary"])
        )
        assert holder.is_alive()  # answered while the lock was held, not after
        assert response.status_code == 200
        assert response.get_json() == {"status": "inserted", "event_id": "evt_w_http"}
        # The queue's metrics count it (reads: no lock needed).
        found = scrape(http)
        assert value(found, "hookledger_queue_depth", status="pending") == 1
        assert value(found, "hookledger_oldest_open_event_age_seconds") >= 0
    assert hooks.drain(app) == 1
    assert seen == ["evt_w_http"]
    WebhookReceiver.state(app).store.engine.dispose()


def test_a_waiter_with_patience_gives_up_on_a_long_holder_at_once(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with another_process_holds_the_lock(path):
        started = time.monotonic()
        with pytest.raises(HeldTooLong):
            with WritersLock(str(path) + WRITERS_LOCK_SUFFIX).hold(60, patience=0.05):
                pytest.fail("entered while another process held the lock")
        # Not after the holder let go (it holds it for 30 s at most).
        assert time.monotonic() - started < 25


def test_the_intake_is_beside_the_database_or_where_configured(tmp_path: Path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'a.sqlite3'}")
    beside, elsewhere = Store(engine).inbox.intake, Store(engine, intake=str(tmp_path / "x"))
    assert beside is not None and beside.path == f"{tmp_path / 'a.sqlite3'}-intake"
    assert elsewhere.inbox.intake is not None and elsewhere.inbox.intake.path == str(tmp_path / "x")
    engine.dispose()
    memory = db.make_engine("sqlite://")
    assert Store(memory).inbox.intake is None
    memory.dispose()


def test_an_intake_held_past_the_busy_timeout_refuses_the_webhook_as_busy(
    database: Path,
) -> None:
    app = Flask("busy-intake")
    app.config.update(
        HOOKLEDGER_DATABASE_URL=f"sqlite:///{database}",
        HOOKLEDGER_SECRETS="primary:" + SECRETS["primary"],
        HOOKLEDGER_SQLITE_BUSY_TIMEOUT=0.3,
    )
    WebhookReceiver(app)
    http = app.test_client()
    first = encode(build_event("payment_succeeded", event_id="evt_b_1"))
    with another_process_holds_the_lock(database):
        # The intake made, then held by a process stopped in the middle of writing it.
        assert (
            http.post(
                "/webhooks/", data=first, headers=signed_headers(first, SECRETS["primary"])
            ).status_code
            == 200
        )
        blocker = sqlite3.connect(f"{database}-intake", isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            body = encode(build_event("payment_succeeded", event_id="evt_b_2"))
            refused = http.post(
                "/webhooks/", data=body, headers=signed_headers(body, SECRETS["primary"])
            )
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
    assert refused.status_code == 503
    assert refused.get_json()["error"]["code"] == "HL_09"
    WebhookReceiver.state(app).store.engine.dispose()


def test_rotate_keys_moves_the_intake_in_first_and_seals_it_again(database: Path) -> None:
    k1, k2 = base64.b64encode(b"1" * 32).decode(), base64.b64encode(b"2" * 32).decode()

    def app_with(keys: str) -> Flask:
        app = Flask("rotate")
        app.config.update(
            HOOKLEDGER_DATABASE_URL=f"sqlite:///{database}",
            HOOKLEDGER_SECRETS="primary:" + SECRETS["primary"],
            HOOKLEDGER_DATA_KEYS=keys,
        )
        WebhookReceiver(app)
        return app

    old = app_with(f"k1:{k1}")
    body = encode(build_event("payment_succeeded", event_id="evt_r_1"))
    with another_process_holds_the_lock(database):
        posted = old.test_client().post(
            "/webhooks/", data=body, headers=signed_headers(body, SECRETS["primary"])
        )
        assert posted.status_code == 200
    assert intake_rows(database) == [("evt_r_1", "inserted")]
    new = app_with(f"k2:{k2},k1:{k1}")
    result = new.test_cli_runner().invoke(args=["hookledger", "rotate-keys", "--json"])
    assert result.exit_code == 0, result.output
    assert intake_rows(database) == []
    with WebhookReceiver.state(new).store.engine.connect() as conn:
        keys = conn.exec_driver_sql("SELECT event_id, key_id FROM hookledger_event").all()
    assert [tuple(k) for k in keys] == [("evt_r_1", "k2")]
    for app in (old, new):
        WebhookReceiver.state(app).store.engine.dispose()


@pytest.mark.parametrize("folder", ["what?now", "shop#1", "100%25", "a b"])
def test_the_intake_is_beside_a_database_whose_path_has_a_urls_characters(
    tmp_path: Path, folder: str
) -> None:
    # The intake was opened at f"sqlite:///{path}": a "?" or "#" in the path cut it short
    # (the webhooks went to another file, beside the folder, shared by every database
    # whose folder starts alike, and invisible to `hookledger status`), a "%25" was decoded.
    path = tmp_path / folder / "shop.sqlite3"
    path.parent.mkdir()
    url = sa.URL.create("sqlite", database=str(path)).render_as_string(hide_password=False)
    made = db.make_engine(url)
    db.upgrade(made)
    made.dispose()
    engine = db.make_engine(url, sqlite_busy_timeout=60)
    store = Store(engine, write_wait=60)
    body = encode(build_event("payment_succeeded", event_id="evt_odd_path"))
    with another_process_holds_the_lock(path):
        assert receive(store, body).staged
    assert intake_rows(path) == [("evt_odd_path", "inserted")]
    assert figures_of(engine)["default"].count == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder]  # nothing beside the folder
    store.inbox.move_intake()
    assert rows(store, "SELECT event_id FROM hookledger_event") == [("evt_odd_path",)]
    engine.dispose()


def _stamped(database: Path) -> bool:
    """Whether some writer holds the database's writers' lock (its stamp is set)."""
    return Path(str(database) + WRITERS_LOCK_SUFFIX).read_bytes()[:8] != bytes(8)


def test_a_webhook_does_not_wait_for_a_move_that_waits_for_the_databases_lock(
    database: Path,
) -> None:
    # Another process (the shop's own write, an operator's script) holds SQLite's lock
    # without the writers' lock; a worker's move waits for it. The move held the intake's
    # lock while it waited, so a webhook, sent to the intake, waited for the move: 503
    # after the busy timeout (`hookledger worker` moves before every claim).
    receiving = Store(db.make_engine(f"sqlite:///{database}", sqlite_busy_timeout=3), write_wait=3)
    mover = Store(db.make_engine(f"sqlite:///{database}", sqlite_busy_timeout=30), write_wait=30)
    first = encode(build_event("payment_succeeded", event_id="evt_mv_1"))
    second = encode(build_event("payment_succeeded", event_id="evt_mv_2"))
    with another_process_holds_the_lock(database):
        assert receive(receiving, first).staged
    script = sqlite3.connect(str(database), isolation_level=None)
    script.execute("BEGIN IMMEDIATE")
    outcome: list[Any] = []
    moving = threading.Thread(target=lambda: outcome.append(mover.inbox.move_intake()))
    try:
        moving.start()
        for _ in range(1000):  # the mover holds the writers' lock: it waits for SQLite's
            if _stamped(database):
                break
            time.sleep(0.01)
        time.sleep(0.2)  # (the old code took the intake's lock at once, then waited)
        answered = receive(receiving, second)
        assert answered.result == "inserted" and answered.staged
        assert moving.is_alive()  # answered while the move still waits
    finally:
        script.execute("ROLLBACK")
        script.close()
        moving.join(60)
    assert outcome == [2]
    assert rows(mover, "SELECT event_id FROM hookledger_event ORDER BY id") == [
        ("evt_mv_1",),
        ("evt_mv_2",),
    ]
    assert intake_rows(database) == []
    receiving.engine.dispose()
    mover.engine.dispose()


def test_a_webhook_staged_while_another_process_writes_it_before_any_intake_is_a_duplicate(
    database: Path,
) -> None:
    # Process A writes evt_x into the inbox (no intake file yet) and is slow to commit;
    # process B, finding the lock held for long, stages the same delivery. A did not take
    # the intake's lock when no intake file existed: B read the inbox before A's commit
    # and both were answered "inserted".
    a = Store(db.make_engine(f"sqlite:///{database}", sqlite_busy_timeout=30), write_wait=30)
    b = Store(db.make_engine(f"sqlite:///{database}", sqlite_busy_timeout=30), write_wait=30)
    assert a.inbox.intake is not None and not a.inbox.intake.exists()
    inside, go = threading.Event(), threading.Event()
    original = a.inbox._insert_one_on_driver

    def slow_commit(conn: Any, values: dict[str, Any]) -> Any:
        written = original(conn, values)
        inside.set()
        assert go.wait(60)
        return written

    a.inbox._insert_one_on_driver = slow_commit  # type: ignore[method-assign]
    body = encode(build_event("payment_succeeded", event_id="evt_x"))
    answers: dict[str, Any] = {}
    writer = threading.Thread(target=lambda: answers.update(a=receive(a, body)))
    writer.start()
    try:
        assert inside.wait(30)
        time.sleep(0.1)  # A has held the writers' lock for longer than a webhook waits
        stager = threading.Thread(target=lambda: answers.update(b=receive(b, body)))
        stager.start()
        stager.join(2)  # the old code: staged at once, as new
    finally:
        go.set()
        writer.join(60)
    stager.join(60)
    assert sorted(answer.result for answer in answers.values()) == ["duplicate", "inserted"]
    assert answers["a"].result == "inserted"
    b.inbox.move_intake()
    assert rows(a, "SELECT event_id FROM hookledger_event") == [("evt_x",)]
    a.engine.dispose()
    b.engine.dispose()


def test_an_unreadable_intake_is_a_problem_of_status_and_stops_no_dispatch(
    database: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An intake file that is not a database (a bad restore, a disk fault, a stray file at
    # its path): every webhook is refused (503), so what is in the inbox must still be
    # dispatched, and `hookledger status` must say what is wrong. The worker's move raised
    # and it claimed nothing, ever; status said ok.
    app = Flask("broken-intake")
    app.config.update(
        HOOKLEDGER_DATABASE_URL=f"sqlite:///{database}",
        HOOKLEDGER_SECRETS="primary:" + SECRETS["primary"],
    )
    hooks = WebhookReceiver()
    seen: list[str] = []

    @hooks.on("payment_succeeded")
    def handler(event: Any) -> None:
        seen.append(event.event_id)

    hooks.init_app(app)
    http = app.test_client()
    body = encode(build_event("payment_succeeded", event_id="evt_in_inbox"))
    response = http.post("/webhooks/", data=body, headers=signed_headers(body, SECRETS["primary"]))
    assert response.get_json()["status"] == "inserted"
    Path(f"{database}-intake").write_bytes(b"not a database " * 500)
    later = encode(build_event("payment_succeeded", event_id="evt_refused"))
    refused = http.post("/webhooks/", data=later, headers=signed_headers(later, SECRETS["primary"]))
    assert refused.status_code == 503
    assert hooks.drain(app) == 1
    assert seen == ["evt_in_inbox"]
    assert any(r.__dict__.get("action") == "intake_unreadable" for r in caplog.records)
    status = check(WebhookReceiver.state(app).store.engine, require_worker=False)
    assert not status.ok
    assert any("intake" in problem and "cannot be read" in problem for problem in status.problems)
    WebhookReceiver.state(app).store.engine.dispose()


def test_an_objects_earlier_event_waiting_in_the_intake_is_dispatched_first(
    database: Path,
) -> None:
    # The processor sent pay_ord's later event first (into the inbox), then its earlier one
    # while a lock was held long (into the intake). The worker's move waited for the
    # writers' lock on its own and gave up (another worker's handler held it); its claim,
    # which waited again, then took the later event as the object's head: dispatched
    # before the earlier one, which the inbox alone would have put first.
    t0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    later = encode(
        build_event("payment_succeeded", object_id="pay_ord", event_id="evt_o_2", timestamp=t0)
    )
    earlier = encode(
        build_event(
            "payment_processing",
            object_id="pay_ord",
            event_id="evt_o_1",
            timestamp=t0 - timedelta(minutes=1),
        )
    )
    engine = db.make_engine(f"sqlite:///{database}", sqlite_busy_timeout=1)
    store = Store(engine, write_wait=1)
    assert not receive(store, later).staged
    with another_process_holds_the_lock(database):
        assert receive(store, earlier).staged
    hooks = WebhookReceiver()
    seen: list[str] = []

    @hooks.on("payment_processing", "payment_succeeded")
    def handler(event: Any) -> None:
        seen.append(event.event_id)

    worker = Worker(store, hooks.registry)
    gave_up = threading.Event()
    real_move = store.inbox.move_intake

    def move(**kwargs: Any) -> int:
        try:
            return real_move(**kwargs)
        except TimeoutError:
            gave_up.set()
            raise

    store.inbox.move_intake = move  # type: ignore[method-assign]
    holder = Holder(str(database) + WRITERS_LOCK_SUFFIX, 30)
    holder.start()
    assert holder.ready.wait(30)
    # Another worker's handler holds the writers' lock: it lets go as soon as this worker's
    # move has given up (the old order), or after 1.5 s.
    releaser = threading.Thread(
        target=lambda: (gave_up.wait(1.5), holder.release.set()), daemon=True
    )
    releaser.start()
    try:
        for _ in range(20):
            worker.run_once()
            if len(seen) == 2:
                break
    finally:
        holder.release.set()
        holder.join(30)
    assert seen == ["evt_o_1", "evt_o_2"]
    engine.dispose()


def test_an_intake_whose_folder_is_missing_does_not_refuse_webhooks_while_the_lock_is_free(
    database: Path,
) -> None:
    # HOOKLEDGER_SQLITE_INTAKE_PATH in a folder that does not exist (a typo): a webhook is
    # stored in the database as before while its lock is free (only one that would wait for
    # a long holder is refused, 503).
    engine = db.make_engine(f"sqlite:///{database}", sqlite_busy_timeout=5)
    store = Store(engine, write_wait=5, intake=str(database.parent / "missing" / "intake"))
    body = encode(build_event("payment_succeeded", event_id="evt_no_folder"))
    assert receive(store, body).result == "inserted"
    assert rows(store, "SELECT event_id FROM hookledger_event") == [("evt_no_folder",)]
    engine.dispose()


def test_two_databases_given_one_intake_do_not_move_each_others_webhooks(
    tmp_path: Path,
) -> None:
    # Two shops on one host, one HOOKLEDGER_SQLITE_INTAKE_PATH between them (a shared env
    # file): shop A's webhook, staged while its lock was held, was moved into shop B's
    # database by B's next write, and B's handlers would have run on A's payment.
    shared = str(tmp_path / "intake.sqlite3")
    stores: dict[str, tuple[Path, Store]] = {}
    for name in ("shop_a", "shop_b"):
        path = tmp_path / f"{name}.sqlite3"
        made = db.make_engine(f"sqlite:///{path}")
        db.upgrade(made)
        made.dispose()
        engine = db.make_engine(f"sqlite:///{path}", sqlite_busy_timeout=5)
        stores[name] = (path, Store(engine, write_wait=5, intake=shared))
    (path_a, a), (_, b) = stores["shop_a"], stores["shop_b"]
    with another_process_holds_the_lock(path_a):
        assert receive(a, encode(build_event("payment_succeeded", event_id="evt_of_a"))).staged
    with pytest.raises(StorageUnavailable):  # refused: 503, and status says why
        receive(b, encode(build_event("payment_succeeded", event_id="evt_of_b")))
    assert rows(b, "SELECT event_id FROM hookledger_event") == []
    problems = check(b.engine, require_worker=False).problems
    assert any("another database" in problem for problem in problems)
    assert check(a.engine, require_worker=False).intake == 1
    a.inbox.move_intake()
    assert rows(a, "SELECT event_id FROM hookledger_event") == [("evt_of_a",)]
    for _, store in stores.values():
        store.engine.dispose()


def test_an_intake_moved_with_its_database_is_still_its_own(tmp_path: Path) -> None:
    # A restore elsewhere (both files copied to a new folder, the old one gone).
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    path = old / "shop.sqlite3"
    made = db.make_engine(f"sqlite:///{path}")
    db.upgrade(made)
    made.dispose()
    engine = db.make_engine(f"sqlite:///{path}", sqlite_busy_timeout=5)
    store = Store(engine, write_wait=5)
    with another_process_holds_the_lock(path):
        assert receive(store, encode(build_event("payment_succeeded", event_id="evt_mv"))).staged
    engine.dispose()
    store.inbox.intake.close()  # type: ignore[union-attr]
    old.rename(new)
    engine = db.make_engine(f"sqlite:///{new / 'shop.sqlite3'}", sqlite_busy_timeout=5)
    moved = Store(engine, write_wait=5)
    assert moved.inbox.move_intake() == 1
    assert rows(moved, "SELECT event_id FROM hookledger_event") == [("evt_mv",)]
    engine.dispose()


def test_a_webhook_the_inbox_refuses_stays_in_the_intake_and_blocks_nothing(
    store: Store, database: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An intake row the inbox's constraints refuse (here a NOT NULL column left empty, as a
    # row staged by another hookledger version could be): the move wrote it in the same
    # transaction as every webhook that got the lock, so every webhook was refused and
    # every move failed, the worker's too, for good.
    with another_process_holds_the_lock(database):
        assert receive(store, encode(build_event("payment_succeeded", event_id="evt_bad"))).staged
        assert receive(store, encode(build_event("payment_succeeded", event_id="evt_ok"))).staged
    conn = sqlite3.connect(f"{database}-intake")
    conn.execute("UPDATE hookledger_intake SET status = NULL WHERE event_id = 'evt_bad'")
    conn.commit()
    conn.close()
    later = receive(store, encode(build_event("payment_succeeded", event_id="evt_later")))
    assert later.result == "inserted" and not later.staged
    assert rows(store, "SELECT event_id FROM hookledger_event ORDER BY id") == [
        ("evt_ok",),
        ("evt_later",),
    ]
    assert intake_rows(database) == [("evt_bad", "inserted")]  # kept, counted as pending
    assert any(r.__dict__.get("action") == "intake_stuck" for r in caplog.records)
    assert store.inbox.move_intake() == 0
    assert check(store.engine, require_worker=False).intake == 1


def test_an_intake_deleted_while_in_use_is_not_written_where_nobody_looks(
    store: Store, database: Path
) -> None:
    # An operator deletes the intake's files (taking them for scratch files) while a web
    # process has the intake open: that process went on storing webhooks in the deleted
    # file, answered 200, where no worker and no `hookledger status` would ever see them
    # (lost when it restarts).
    with another_process_holds_the_lock(database):
        assert receive(store, encode(build_event("payment_succeeded", event_id="evt_d_1"))).staged
    for each in database.parent.glob(f"{database.name}-intake*"):
        if not each.name.endswith("-hookledger-writers"):
            each.unlink()
    with another_process_holds_the_lock(database):
        with pytest.raises(StorageUnavailable):  # 503: the processor sends it again
            receive(store, encode(build_event("payment_succeeded", event_id="evt_d_2")))
    # The next write that gets the lock moves what the deleted file held into the inbox.
    assert not receive(store, encode(build_event("payment_succeeded", event_id="evt_d_3"))).staged
    assert rows(store, "SELECT event_id FROM hookledger_event ORDER BY id") == [
        ("evt_d_1",),
        ("evt_d_3",),
    ]
    # From then on the file at the path is used, seen by the others.
    with another_process_holds_the_lock(database):
        assert receive(store, encode(build_event("payment_succeeded", event_id="evt_d_4"))).staged
    assert figures_of(store.engine)["default"].count == 1
    other = Store(db.make_engine(f"sqlite:///{database}", sqlite_busy_timeout=5), write_wait=5)
    assert other.inbox.move_intake() == 1
    other.engine.dispose()
