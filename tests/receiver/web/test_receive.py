"""The receive path over real HTTP semantics (Flask test client), real HMAC, real databases."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from receiver.core.errors import ConfigurationError
from receiver.core.signature import sign
from receiver.extension import WebhookReceiver
from receiver.storage.tables import EventConflict, InboxEvent
from receiver.testing import WebhookTestClient, signed_headers
from receiver.testing.factories import build_event, encode
from receiver.web.blueprint import _received
from tests.conftest import SECRETS, AppFactory

pytestmark = pytest.mark.storage


def _count(app: Flask, model: Any = InboxEvent) -> int:
    engine = WebhookReceiver.state(app).store.engine
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(model)).scalar_one())


def _post(app: Flask, body: bytes, headers: dict[str, str]) -> Any:
    return app.test_client().post("/webhooks/", data=body, headers=headers)


def test_signed_event_is_stored_byte_for_byte(make_app: AppFactory) -> None:
    app, _ = make_app()
    body = encode(build_event("payment_succeeded", object_id="pay_1"))
    headers = signed_headers(body, SECRETS["primary"])
    response = _post(app, body, headers)
    assert response.status_code == 200
    assert response.get_json()["status"] == "inserted"
    row = WebhookReceiver.state(app).store.operations.get(json.loads(body)["event_id"])
    assert row is not None
    assert row.body == body
    assert row.secret_id == "primary"
    assert row.source == "webhook"
    assert (row.object_kind, row.object_id, row.object_status) == ("payment", "pay_1", "succeeded")
    assert row.event_type == "payment_succeeded"
    stored_headers = json.loads(row.headers)
    assert stored_headers["X-Webhook-Signature-512"] == headers["X-Webhook-Signature-512"]
    assert len(row.body_sha256) == 64
    assert row.status == "pending" and row.attempts == 0


def test_previous_secret_is_accepted_and_recorded(make_app: AppFactory) -> None:
    app, _ = make_app()
    body = encode(build_event("refund_succeeded"))
    assert _post(app, body, signed_headers(body, SECRETS["previous"])).status_code == 200
    row = WebhookReceiver.state(app).store.operations.get(json.loads(body)["event_id"])
    assert row is not None and row.secret_id == "previous"


def test_header_name_case_insensitive_and_uppercase_hex(make_app: AppFactory) -> None:
    app, _ = make_app()
    body = encode(build_event("payment_failed"))
    headers = {"x-webhook-signature-512": sign(body, SECRETS["primary"]).upper()}
    assert _post(app, body, headers).status_code == 200


def test_reserialised_body_is_rejected_and_not_stored(make_app: AppFactory) -> None:
    app, _ = make_app()
    event = build_event("payment_succeeded")
    signature = sign(encode(event), SECRETS["primary"])
    pretty = json.dumps(event, indent=2).encode()
    response = _post(app, pretty, {"X-Webhook-Signature-512": signature})
    assert response.status_code == 401
    assert response.get_json()["error"]["type"] == "authentication_error"
    assert _count(app) == 0


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-Webhook-Signature-512": "not-hex"},
        {"X-Webhook-Signature-512": sign(b"other body", SECRETS["primary"])},
        {"X-Webhook-Signature-512": "\u00e9" * 128},
    ],
    ids=["missing", "malformed", "wrong", "non-ascii"],
)
def test_bad_signatures_get_401_and_nothing_is_stored(
    make_app: AppFactory, headers: dict[str, str]
) -> None:
    app, _ = make_app()
    body = encode(build_event("payment_succeeded"))
    wrong_key = signed_headers(body, "not-a-configured-secret")
    for attempt in (headers, wrong_key):
        response = _post(app, body, attempt)
        assert response.status_code == 401
        error = response.get_json()["error"]
        assert set(error) == {"type", "code", "message"}
    assert _count(app) == 0


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1,2,3]",
        b'{"event_type":"payment_succeeded"}',
        b'{"event_id":""}',
        b'{"event_id":42}',
        b"\xff\xfe\x00garbage",
        b"",
    ],
    ids=["not-json", "array", "no-event-id", "empty-id", "int-id", "not-utf8", "empty"],
)
def test_signed_but_malformed_gets_400_and_nothing_is_stored(
    make_app: AppFactory, body: bytes
) -> None:
    app, _ = make_app()
    response = _post(app, body, signed_headers(body, SECRETS["primary"]))
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "HL_04"
    assert _count(app) == 0


@pytest.mark.parametrize("event_id", ["evt_1", 'e"\\/\u00e9\u2028\ud800\x00\x1f', ""])
@pytest.mark.parametrize("result", ["inserted", "duplicate", "conflict"])
def test_the_answer_is_the_json_it_always_was(result: str, event_id: str) -> None:
    assert _received(result, event_id) == json.dumps({"status": result, "event_id": event_id})


def test_body_over_the_cap_gets_413_and_nothing_is_stored(make_app: AppFactory) -> None:
    app, _ = make_app(max_body_bytes=16_384)
    event = build_event("payment_succeeded", metadata={"pad": "x" * 20_000})
    body = encode(event)
    response = _post(app, body, signed_headers(body, SECRETS["primary"]))
    assert response.status_code == 413
    assert _count(app) == 0
    small = encode(build_event("payment_succeeded"))
    assert _post(app, small, signed_headers(small, SECRETS["primary"])).status_code == 200


def test_unknown_type_content_and_fields_are_stored_and_acknowledged(
    make_app: AppFactory,
) -> None:
    app, _ = make_app()
    client = WebhookTestClient(app)
    unknown = {
        "merchant_id": "m",
        "event_id": "evt_unknown_1",
        "event_type": "payment_teleported",
        "content": {"type": "hologram_details", "object": {"id": "h1"}},
        "timestamp": "2026-08-12T08:14:55.392Z",
        "processor_merchant_id": "new-top-level-field",
    }
    assert client.post(unknown).status_code == 200
    extra = build_event("payment_succeeded")
    extra["content"]["object"]["brand_new_field"] = {"nested": [1, 2]}
    assert client.post(extra, headers={"Content-Type": "text/plain"}).status_code == 200
    assert _count(app) == 2
    row = WebhookReceiver.state(app).store.operations.get("evt_unknown_1")
    assert row is not None and row.object_key == "event:evt_unknown_1"


def test_duplicate_is_acknowledged_and_stored_once(make_app: AppFactory) -> None:
    app, _ = make_app()
    client = WebhookTestClient(app)
    body = encode(build_event("payment_succeeded"))
    first, second = client.post(body), client.post(body)
    assert (first.status_code, second.status_code) == (200, 200)
    assert second.get_json()["status"] == "duplicate"
    assert _count(app) == 1


def test_same_event_id_with_a_different_body_is_flagged_not_dropped(
    make_app: AppFactory,
) -> None:
    app, _ = make_app()
    client = WebhookTestClient(app)
    original = build_event("payment_succeeded", event_id="evt_conflict_1", amount=1000)
    changed = build_event("payment_succeeded", event_id="evt_conflict_1", amount=999999)
    assert client.post(original).get_json()["status"] == "inserted"
    response = client.post(changed)
    assert response.status_code == 200
    assert response.get_json()["status"] == "conflict"
    assert client.post(changed).get_json()["status"] == "conflict"
    assert _count(app) == 1
    assert _count(app, EventConflict) == 1
    row = WebhookReceiver.state(app).store.operations.get("evt_conflict_1")
    assert row is not None and json.loads(row.body)["content"]["object"]["amount"] == 1000


def test_storage_unavailable_gets_503(tmp_path: Any) -> None:
    app = Flask("down")
    missing_dir = tmp_path / "no" / "such" / "dir"
    app.config.update(
        HOOKLEDGER_DATABASE_URL=f"sqlite:///{missing_dir / 'x.sqlite3'}",
        HOOKLEDGER_SECRETS="primary:" + SECRETS["primary"],
    )
    WebhookReceiver(app)
    body = encode(build_event("payment_succeeded"))
    response = _post(app, body, signed_headers(body, SECRETS["primary"]))
    assert response.status_code == 503
    assert response.get_json()["error"]["type"] == "api_error"
    assert app.test_client().get("/webhooks/health").status_code == 503
    WebhookReceiver.state(app).store.engine.dispose()


def test_storage_unavailable_on_postgres_gets_503() -> None:
    app = Flask("down-pg")
    app.config.update(
        # A loopback port nothing listens on: the connection is refused.
        HOOKLEDGER_DATABASE_URL="postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2",
        HOOKLEDGER_SECRETS="primary:" + SECRETS["primary"],
    )
    WebhookReceiver(app)
    body = encode(build_event("payment_succeeded"))
    assert _post(app, body, signed_headers(body, SECRETS["primary"])).status_code == 503
    WebhookReceiver.state(app).store.engine.dispose()


def test_no_secret_is_a_startup_error(database_url: str, monkeypatch: Any) -> None:
    monkeypatch.delenv("HOOKLEDGER_SECRETS", raising=False)
    app = Flask("nosecret")
    app.config["HOOKLEDGER_DATABASE_URL"] = database_url
    with pytest.raises(ConfigurationError, match="no webhook secret"):
        WebhookReceiver(app)


def test_health_shows_no_counts_the_stats_command_does(make_app: AppFactory) -> None:
    # The counts moved off the unauthenticated route (see test_health.py).
    app, _ = make_app()
    WebhookTestClient(app).send("payment_succeeded")
    assert app.test_client().get("/webhooks/health").get_json() == {"status": "ok"}
    stats = app.test_cli_runner().invoke(args=["hookledger", "stats", "--json"])
    payload = json.loads(stats.output)
    assert payload["events"] == {"pending": 1}
    assert payload["oldest_open_age_seconds"] >= 0


def _sqlite_statements(app: Flask) -> list[str]:
    """Every statement the app's SQLite connections send from now on (BEGINs included)."""
    engine = WebhookReceiver.state(app).store.engine
    if engine.dialect.name != "sqlite":
        pytest.skip("SQLite's transaction modes")
    engine.dispose()
    seen: list[str] = []

    @sa.event.listens_for(engine, "connect")
    def _trace(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.set_trace_callback(seen.append)

    return seen


def test_sqlite_insert_takes_the_write_lock_at_its_insert_not_at_begin(
    make_app: AppFactory,
) -> None:
    # Without an intake: the insert's first statement writes, so a deferred BEGIN cannot fail
    # to upgrade, and the lock is held only from the INSERT to the COMMIT (not while Python
    # builds the row). Transactions that read before they write keep BEGIN IMMEDIATE.
    app, _ = make_app(sqlite_intake_path="off")
    seen = _sqlite_statements(app)
    # A process's first signed delivery also writes, once, the first-delivery row (issue
    # 20, item 4): write-first too, so a deferred BEGIN.
    WebhookTestClient(app).send("payment_succeeded")
    assert {s for s in seen if s.startswith("BEGIN")} == {"BEGIN"}
    seen.clear()
    WebhookTestClient(app).send("payment_succeeded")
    begins = [s for s in seen if s.startswith("BEGIN")]
    first_insert = next(
        i for i, s in enumerate(seen) if s.startswith("INSERT INTO hookledger_event")
    )
    assert begins == ["BEGIN"]
    assert seen[first_insert - 1] == "BEGIN"
    seen.clear()
    WebhookReceiver.state(app).store.queue.claim_batch("w1", 30, limit=1)
    assert [s for s in seen if s.startswith("BEGIN")][0] == "BEGIN IMMEDIATE"


def test_sqlite_with_an_intake_takes_the_databases_lock_at_begin_before_the_intakes(
    make_app: AppFactory,
) -> None:
    # With an intake (the default on a file), a write takes SQLite's lock at BEGIN, and the
    # intake's only then (it reads the intake inside the transaction): the intake's lock is
    # never held while waiting for the database's (a webhook sent to the intake would wait).
    app, _ = make_app()
    if WebhookReceiver.state(app).store.inbox.intake is None:
        pytest.skip("a SQLite file's intake")
    seen = _sqlite_statements(app)
    WebhookTestClient(app).send("payment_succeeded")
    seen.clear()
    WebhookTestClient(app).send("payment_succeeded")
    assert [s for s in seen if s.startswith("BEGIN")] == ["BEGIN IMMEDIATE"]
    assert seen.index("BEGIN IMMEDIATE") < next(
        i for i, s in enumerate(seen) if s.startswith("INSERT INTO hookledger_event")
    )


def test_sqlite_writer_queue_timeout_gets_503_and_stores_nothing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A delivery that waits longer than the busy timeout for this process's writer (another
    # thread's batch is stuck) answers 503, so the processor retries, rather than hanging;
    # nothing of it is stored, and the stuck batch still gets its own answer.
    app = Flask("busy")
    app.config.update(
        HOOKLEDGER_DATABASE_URL=f"sqlite:///{tmp_path / 'busy.sqlite3'}",
        HOOKLEDGER_SECRETS="primary:" + SECRETS["primary"],
        HOOKLEDGER_SQLITE_BUSY_TIMEOUT=0.2,
        HOOKLEDGER_AUTO_MIGRATE=True,
    )
    WebhookReceiver(app)
    store = WebhookReceiver.state(app).store
    real = store.inbox._insert_together
    release, entered = threading.Event(), threading.Event()

    def stuck(rows: list[dict[str, Any]]) -> Any:
        if rows[0]["event_id"] == "evt_stuck":
            entered.set()
            release.wait(10)
        return real(rows)

    monkeypatch.setattr(store.inbox, "_insert_together", stuck)
    first = encode(build_event("payment_succeeded", event_id="evt_stuck"))
    answers: list[int] = []
    thread = threading.Thread(
        target=lambda: answers.append(
            _post(app, first, signed_headers(first, SECRETS["primary"])).status_code
        )
    )
    thread.start()
    assert entered.wait(5)
    body = encode(build_event("payment_succeeded", event_id="evt_busy_1"))
    response = _post(app, body, signed_headers(body, SECRETS["primary"]))
    assert response.status_code == 503
    assert response.get_json()["error"]["type"] == "api_error"
    release.set()
    thread.join(10)
    assert answers == [200]
    assert _count(app) == 1  # evt_stuck only
    assert _post(app, body, signed_headers(body, SECRETS["primary"])).status_code == 200
    assert _count(app) == 2
    store.engine.dispose()


def test_group_commit_answers_each_delivery_and_isolates_a_bad_one(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Threads storing at once share writes (SQLite: one transaction; PostgreSQL: one
    # statement). Each delivery still gets its own answer: a copy arriving in the same batch
    # as its original is a duplicate, the same id with another body a conflict, and a
    # delivery that fails in the database fails alone (the batch is retried item by item).
    from concurrent.futures import ThreadPoolExecutor

    from receiver.core.events import parse_event

    app, _ = make_app()
    store = WebhookReceiver.state(app).store
    inbox = store.inbox
    refused = sa.exc.IntegrityError("INSERT", {}, Exception("refused"))
    if store.engine.dialect.name == "sqlite":
        for name in ("_insert_one", "_insert_one_on_driver"):  # through SQLAlchemy, or not
            real_one = getattr(inbox, name)

            def one(conn: Any, values: dict[str, Any], real: Any = real_one) -> Any:
                if values["event_id"] == "evt_bad":
                    raise refused
                return real(conn, values)

            monkeypatch.setattr(inbox, name, one)
    else:
        real_batch = inbox._write_deliveries

        def batch(rows: list[dict[str, Any]]) -> Any:
            if any(values["event_id"] == "evt_bad" for values in rows):
                raise refused
            return real_batch(rows)

        monkeypatch.setattr(inbox, "_write_deliveries", batch)
    bodies = [encode(build_event("payment_succeeded", event_id=f"evt_g{i}")) for i in range(20)]
    bodies.append(encode(build_event("payment_succeeded", event_id="evt_bad")))
    changed = [
        encode(build_event("payment_succeeded", event_id=f"evt_g{i}", amount=999_999))
        for i in range(5)
    ]
    deliveries = bodies * 2 + changed  # every event twice, five a third time changed

    def store_one(body: bytes) -> str:
        try:
            return store.inbox.insert(parse_event(body), body).result
        except sa.exc.IntegrityError:
            return "error"

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(store_one, deliveries))
    per_event: dict[str, list[str]] = {}
    for body, result in zip(deliveries, results, strict=True):
        per_event.setdefault(json.loads(body)["event_id"], []).append(result)
    assert per_event.pop("evt_bad") == ["error", "error"]
    for event_id, answers in per_event.items():
        if event_id in {f"evt_g{i}" for i in range(5)}:
            # Whichever body came first is inserted; the other body is a conflict.
            assert answers.count("inserted") == 1, (event_id, answers)
            assert "conflict" in answers and set(answers) <= {"inserted", "duplicate", "conflict"}
        else:
            assert sorted(answers) == ["duplicate", "inserted"], (event_id, answers)
    assert _count(app) == 20
    assert _count(app, EventConflict) == 5


def test_a_batch_answers_each_delivery_in_order(make_app: AppFactory) -> None:
    # The group-commit writer (SQLite's transaction, PostgreSQL's one statement over arrays):
    # new ids inserted, an id repeated in the batch a duplicate of the first, an id stored
    # earlier with another body a conflict.
    from receiver.core.events import parse_event

    app, _ = make_app()
    inbox = WebhookReceiver.state(app).store.inbox
    stored = encode(build_event("payment_succeeded", event_id="evt_b_old", amount=1))
    assert inbox.insert(parse_event(stored), stored).result == "inserted"
    first = encode(build_event("payment_succeeded", event_id="evt_b_1"))
    bodies = [
        first,
        encode(build_event("payment_succeeded", event_id="evt_b_2")),
        first,
        encode(build_event("payment_succeeded", event_id="evt_b_old", amount=2)),
        stored,
    ]
    rows = [inbox.row(parse_event(body), body) for body in bodies]
    outcomes = inbox._insert_batch(rows)
    results = [getattr(o, "result", o) for o in outcomes]
    assert results == ["inserted", "inserted", "duplicate", "conflict", "duplicate"]
    assert _count(app) == 3
    assert _count(app, EventConflict) == 1


def test_a_batch_of_several_accounts_answers_each_delivery_by_account_and_id(
    make_app: AppFactory,
) -> None:
    """One group-commit batch with deliveries to three accounts (written together, not one
    write per account, which cost a commit per delivery with many accounts): the same event
    id in two accounts is two events, a repeat within one account a duplicate, an id stored
    earlier in one account with another body a conflict there and new in another account."""
    from receiver.core.events import parse_event

    app, _ = make_app()
    inbox = WebhookReceiver.state(app).store.inbox
    stored = encode(build_event("payment_succeeded", event_id="evt_m_old", amount=1))
    assert inbox.insert(parse_event(stored), stored, account="a").result == "inserted"
    shared = encode(build_event("payment_succeeded", event_id="evt_m_1"))
    changed = encode(build_event("payment_succeeded", event_id="evt_m_old", amount=2))
    deliveries = [
        ("a", shared),
        ("b", shared),
        ("a", shared),
        ("a", changed),
        ("b", changed),
        ("c", encode(build_event("payment_succeeded", event_id="evt_m_2"))),
        ("a", stored),
    ]
    rows = [inbox.row(parse_event(body), body, account=acct) for acct, body in deliveries]
    outcomes = inbox._insert_batch(rows)
    results = [getattr(o, "result", o) for o in outcomes]
    assert results == [
        "inserted",
        "inserted",
        "duplicate",
        "conflict",
        "inserted",
        "inserted",
        "duplicate",
    ]
    pks = [getattr(o, "pk", None) for o in outcomes]
    assert pks[0] != pks[1] and pks[2] == pks[0] and pks[6] != pks[4]
    assert _count(app) == 5
    assert _count(app, EventConflict) == 1


def test_postgres_connection_lost_while_idle_is_written_again_on_a_new_one(
    make_app: AppFactory,
) -> None:
    # No ping before use: the driver connection a web thread holds for its deliveries
    # (receiver.storage.held_connections), killed while idle, fails the statement, which is
    # run once more on a new connection (it is idempotent).
    app, _ = make_app()
    store = WebhookReceiver.state(app).store
    if store.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's connections")
    client = WebhookTestClient(app)
    assert client.post(build_event("payment_succeeded")).get_json()["status"] == "inserted"
    held = store.inbox._held  # this thread's connection, and no other test's
    assert held is not None
    pids = [conn.info.backend_pid for conn in held.connections()]
    killer = sa.create_engine(store.engine.url, poolclass=sa.pool.NullPool)
    with killer.connect() as conn:
        for pid in pids:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    assert pids
    time.sleep(0.1)
    response = client.post(build_event("payment_succeeded", event_id="evt_after_kill"))
    assert response.status_code == 200
    assert response.get_json()["status"] == "inserted"
    assert [conn.info.backend_pid for conn in held.connections()] != pids
    with killer.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT count(*) FROM hookledger_event WHERE event_id = 'evt_after_kill'")
        ).scalar_one()
    killer.dispose()
    assert stored == 1


def test_postgres_held_connections_close_with_the_engine(make_app: AppFactory) -> None:
    app, _ = make_app()
    store = WebhookReceiver.state(app).store
    if store.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's connections")
    assert WebhookTestClient(app).post(build_event("payment_succeeded")).status_code == 200
    held = store.inbox._held
    assert held is not None
    connections = held.connections()
    assert connections and not any(conn.closed for conn in connections)
    store.engine.dispose()
    assert all(conn.closed for conn in connections)
    # The next delivery opens a new one.
    assert WebhookTestClient(app).post(build_event("payment_succeeded")).status_code == 200


def test_postgres_idle_connections_are_pinged_before_use(database_url: str) -> None:
    from receiver.storage.database import make_engine

    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's pooled connections")
    engine = make_engine(database_url, ping_after_idle=0.0)
    try:
        with engine.connect() as conn:
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        killer = sa.create_engine(engine.url, poolclass=sa.pool.NullPool)
        with killer.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        killer.dispose()
        time.sleep(0.1)
        with engine.connect() as conn:  # the dead one is found at checkout and replaced
            assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != pid
    finally:
        engine.dispose()


def _hold_writers_lock(path: str, seconds: float, ready: Any) -> None:
    from receiver.storage.filelock import WritersLock

    with WritersLock(path).hold(timeout=5):
        ready.set()
        time.sleep(seconds)


def _sqlite_file_app(
    tmp_path: Any, name: str, busy_timeout: float, *, intake: str = "off"
) -> tuple[Flask, str]:
    """An app on a SQLite file, and the path of that file's writers' lock. Without an intake
    unless told (``""``: the default one): a delivery waits for the lock, as these tests
    measure (receiver/storage/test_intake.py tests the intake)."""
    from receiver.storage.inbox import WRITERS_LOCK_SUFFIX

    database = tmp_path / "shared.sqlite3"
    app = Flask(name)
    app.config.update(
        HOOKLEDGER_DATABASE_URL=f"sqlite:///{database}",
        HOOKLEDGER_SECRETS="primary:" + SECRETS["primary"],
        HOOKLEDGER_SQLITE_BUSY_TIMEOUT=busy_timeout,
        HOOKLEDGER_SQLITE_INTAKE_PATH=intake,
        HOOKLEDGER_AUTO_MIGRATE=True,
    )
    WebhookReceiver(app)
    return app, str(database) + WRITERS_LOCK_SUFFIX


def _another_process_holds(lock: str, seconds: float) -> Any:
    """A started process (another web process of the host, say) holding ``lock`` for
    ``seconds``; returned once it holds it."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_writers_lock, args=(lock, seconds, ready))
    holder.start()
    assert ready.wait(30)
    return holder


def test_sqlite_web_processes_queue_on_the_writers_lock_and_answer_503_past_the_timeout(
    tmp_path: Any,
) -> None:
    # Another web process of the host is writing (it holds the writers' lock) for longer than
    # the busy timeout: this delivery gets 503 and is not stored; once it is free, 200.
    app, lock = _sqlite_file_app(tmp_path, "two-procs", busy_timeout=0.3)
    holder = _another_process_holds(lock, 2.0)
    try:
        body = encode(build_event("payment_succeeded", event_id="evt_wait_1"))
        assert _post(app, body, signed_headers(body, SECRETS["primary"])).status_code == 503
        assert _count(app) == 0
    finally:
        holder.join(30)
    assert _post(app, body, signed_headers(body, SECRETS["primary"])).status_code == 200
    assert _count(app) == 1
    WebhookReceiver.state(app).store.engine.dispose()


def test_sqlite_a_duplicate_is_answered_while_this_process_waits_for_the_writers_lock(
    tmp_path: Any,
) -> None:
    # Another web process holds the writers' lock; a new delivery to this one waits for it
    # (its thread leads this process's write). A duplicate arriving meanwhile is answered
    # from the committed row at once: it neither queues behind that write nor needs the lock.
    app, lock = _sqlite_file_app(tmp_path, "dup-while-locked", busy_timeout=4.0)
    stored = encode(build_event("payment_succeeded", event_id="evt_dup_1"))
    assert _post(app, stored, signed_headers(stored, SECRETS["primary"])).status_code == 200
    holder = _another_process_holds(lock, 3.0)
    try:
        fresh = encode(build_event("payment_succeeded", event_id="evt_new_1"))
        waiting: dict[str, Any] = {}
        writer = threading.Thread(
            target=lambda: waiting.update(
                response=_post(app, fresh, signed_headers(fresh, SECRETS["primary"]))
            )
        )
        writer.start()
        time.sleep(0.5)  # the new delivery now waits for the lock
        started = time.monotonic()
        again = _post(app, stored, signed_headers(stored, SECRETS["primary"]))
        elapsed = time.monotonic() - started
        assert again.status_code == 200 and again.get_json()["status"] == "duplicate"
        assert elapsed < 1.5, f"the duplicate waited {elapsed:.1f} s behind the write"
        assert writer.is_alive()  # it was answered while the write still waited
        writer.join(30)
        assert waiting["response"].status_code == 200  # the lock came free within its wait
    finally:
        holder.join(30)
    assert _count(app) == 2
    WebhookReceiver.state(app).store.engine.dispose()
