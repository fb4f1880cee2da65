"""Data at rest, on SQLite and PostgreSQL: what reaches the database is sealed, the body hash
is keyed, a missing key is an error of that row only, retention keeps the guarantees.

Issue: "Data at rest: encrypted payloads with key rotation, status-aware retention and
redaction, a bounded log of rejected deliveries".
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from receiver import Defer, Event, WebhookReceiver
from receiver.core.accounts import Account
from receiver.core.errors import RedactedEvents
from receiver.core.events import parse_event
from receiver.core.keyring import MAGIC
from receiver.core.signature import parse_secrets
from receiver.storage.operator_actions import EventFilter
from receiver.storage.tables import EventStatus, Source
from receiver.store import Store
from receiver.testing import signed_headers
from receiver.testing.factories import build_event, encode
from tests.conftest import SECRETS, AppFactory, backend

pytestmark = pytest.mark.storage

KEY1 = base64.b64encode(b"1" * 32).decode()
KEY2 = base64.b64encode(b"2" * 32).decode()
KEY0 = base64.b64encode(b"0" * 32).decode()
CANARY = "zebra-canary-7731"
EMAIL = f"{CANARY}@example.com"
T0 = datetime(2026, 11, 1, 12, tzinfo=UTC)


def post(app: Flask, body: bytes, **headers: str) -> Any:
    sent = {**signed_headers(body, SECRETS["primary"]), **headers}
    return app.test_client().post("/webhooks/", data=body, headers=sent)


def store_of(app: Flask) -> Store:
    return WebhookReceiver.state(app).store


def drain(app: Flask) -> int:
    return WebhookReceiver.state(app).worker(name="test").drain()


def all_cells(engine: sa.Engine) -> list[tuple[str, Any]]:
    """Every value of every table of the database (as the driver returns it)."""
    cells: list[tuple[str, Any]] = []
    inspector = sa.inspect(engine)
    with engine.connect() as conn:
        for table in inspector.get_table_names():
            for row in conn.execute(sa.text(f'SELECT * FROM "{table}"')):
                cells.extend((table, value) for value in row)
    return cells


def plaintext_found(engine: sa.Engine, needle: str, *, files: bool = True) -> list[str]:
    """Where ``needle`` appears in the clear: in any table cell, and on SQLite (``files``) in
    the database files themselves (the main file, its WAL and shared memory)."""
    raw = needle.encode()
    found = []
    for table, value in all_cells(engine):
        if isinstance(value, memoryview):
            value = bytes(value)
        if (isinstance(value, bytes) and raw in value) or (
            isinstance(value, str) and needle in value
        ):
            found.append(table)
    if files and engine.dialect.name == "sqlite":
        database = Path(str(engine.url.database))
        for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm")):
            if path.exists() and raw in path.read_bytes():
                found.append(path.name)
    return found


def _truncate_log(conn: sqlite3.Connection, seconds: float = 10.0) -> bool:
    """``PRAGMA wal_checkpoint(TRUNCATE)`` until it is not busy; whether it got there."""
    deadline = time.monotonic() + seconds
    while conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def test_no_payload_plaintext_reaches_the_database(make_app: AppFactory) -> None:
    """Bodies (webhooks, conflicts, replays, observed API responses, the reconciler's
    synthesised events), stored headers, handler tracebacks, deferral reasons and an opted-in
    rejected body all carry a distinctive string; none of it is readable in the database, while
    handlers and operators (with the key) read it all."""
    hooks = WebhookReceiver()
    seen: list[str] = []

    @hooks.on("payment_succeeded")
    def paid(event: Event) -> None:
        seen.append(event.raw["content"]["object"]["email"])

    @hooks.on("payment_failed", name="failing")
    def failing(event: Event) -> None:
        raise RuntimeError(f"no order for {event.raw['content']['object']['email']}")

    @hooks.on("refund_succeeded")
    def deferring(event: Event) -> None:
        raise Defer(3600, f"waiting for {CANARY}'s order")

    app, _ = make_app(
        hooks,
        data_keys=f"k1:{KEY1}",
        stored_headers="X-Tenant",
        rejections_body_bytes=4096,
        max_attempts=2,
    )
    store = store_of(app)

    def body(event_type: str, **fields: Any) -> bytes:
        return encode(build_event(event_type, email=EMAIL, metadata={"note": CANARY}, **fields))

    first = body("payment_succeeded", event_id="evt_canary_1", object_id="pay_canary_1")
    assert post(app, first, **{"X-Tenant": f"tenant-{CANARY}"}).json["status"] == "inserted"
    other = body("payment_succeeded", event_id="evt_canary_1", object_id="pay_canary_2")
    assert post(app, other).json["status"] == "conflict"
    assert post(app, body("payment_failed", object_id="pay_canary_3")).status_code == 200
    assert post(app, body("refund_succeeded")).status_code == 200
    forged = body("payment_succeeded")
    response = app.test_client().post(
        "/webhooks/", data=forged, headers={"X-Webhook-Signature-512": "ab" * 64}
    )
    assert response.status_code == 401
    resource = build_event("payment_succeeded", object_id="pay_canary_4", email=EMAIL)
    observed = WebhookReceiver.state(app)
    with app.app_context():
        hooks.observe(resource["content"]["object"], kind="payment", app=app)
    synthesised = build_event(
        "payment_succeeded", object_id="pay_canary_5", metadata={"note": CANARY}
    )
    raw = encode(synthesised)
    assert store.inbox.insert_synthesised([(parse_event(raw), raw)]) != {}
    drain(app)
    store.operations.replay(EventFilter(event_ids=["evt_canary_1"]), parse=parse_event)
    drain(app)
    store.rejections.flush()

    assert plaintext_found(store.engine, CANARY) == []
    # What the database holds, it holds sealed, and the pipeline worked on the plaintext.
    assert seen.count(EMAIL) >= 2  # the webhook and its replay (and the observed/synthesised)
    row = store.operations.get("evt_canary_1")
    assert row is not None and row.key_id == "k1" and row.body.startswith(MAGIC)
    assert row.body_sha256 != hashlib.sha256(first).hexdigest()
    assert store.open_body(row.body, row.event_id) == first
    assert store.open_headers(row.headers, row.event_id)["X-Tenant"] == f"tenant-{CANARY}"
    failed = store.operations.select_events(EventFilter(event_types=["payment_failed"]))[0]
    assert failed.status == EventStatus.DEAD and EMAIL in (failed.last_error or "")
    assert failed.id is not None
    assert EMAIL in (store.operations.handler_runs(failed.id)["failing"].last_error or "")
    deferred = store.operations.select_events(EventFilter(deferred=True))
    assert len(deferred) == 1 and CANARY in (deferred[0].last_error or "")
    rejected = store.rejections.rows()
    assert rejected[0].reason == "signature_mismatch" and rejected[0].body == forged
    assert observed.store is store


def test_rows_stored_before_encryption_are_read_and_deduplicated(make_app: AppFactory) -> None:
    """Without a key, today's behaviour (and a start-up warning); once a key is configured,
    old rows are read as they are and a retry of one is still a duplicate (or a conflict)."""
    plain, _ = make_app()
    a = encode(build_event("payment_succeeded", event_id="evt_old", object_id="pay_old"))
    assert post(plain, a).json["status"] == "inserted"
    row = store_of(plain).operations.get("evt_old")
    assert row is not None and row.key_id is None and row.body == a
    assert row.body_sha256 == hashlib.sha256(a).hexdigest()

    keyed, _ = make_app(data_keys=f"k1:{KEY1}")
    assert post(keyed, a).json["status"] == "duplicate"
    changed = encode(build_event("payment_succeeded", event_id="evt_old", object_id="pay_x"))
    assert post(keyed, changed).json["status"] == "conflict"
    b = encode(build_event("payment_succeeded", event_id="evt_new", object_id="pay_new"))
    assert post(keyed, b).json["status"] == "inserted"
    new = store_of(keyed).operations.get("evt_new")
    assert new is not None and new.key_id == "k1" and new.body != b
    assert drain(keyed) == 2
    assert {e.status for e in store_of(keyed).operations.select_events(EventFilter())} == {"done"}


def test_a_missing_or_wrong_key_is_an_error_of_that_row_only(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Never a crash of the worker, never a 5xx on receipt: the row says which key it needs."""
    calls: Counter[str] = Counter()
    hooks = WebhookReceiver()

    @hooks.on_any()
    def count(event: Event) -> None:
        calls[event.event_id] += 1

    old, _ = make_app(hooks, data_keys=f"k1:{KEY1}", max_attempts=2)
    a = encode(build_event("payment_succeeded", event_id="evt_k1", object_id="pay_k1"))
    assert post(old, a).status_code == 200

    new, _ = make_app(hooks, data_keys=f"k2:{KEY2}", max_attempts=2)
    b = encode(build_event("payment_succeeded", event_id="evt_k2", object_id="pay_k2"))
    c = encode(build_event("refund_succeeded", event_id="evt_swapped", object_id="ref_1"))
    d = encode(build_event("refund_succeeded", event_id="evt_victim", object_id="ref_2"))
    for one in (b, c, d):
        assert post(new, one).status_code == 200
    # A retry of the k1 event reaches a process without k1: acknowledged, not compared.
    with caplog.at_level(logging.WARNING, logger="receiver.store"):
        assert post(new, a).json["status"] == "duplicate"
    assert "not configured" in caplog.text
    # Someone with write access moves a sealed body to another event's row.
    store = store_of(new)
    with store.engine.begin() as conn:
        sealed = conn.execute(
            sa.text("SELECT body FROM hookledger_event WHERE event_id = 'evt_swapped'")
        ).scalar_one()
        conn.execute(
            sa.text("UPDATE hookledger_event SET body = :b WHERE event_id = 'evt_victim'"),
            {"b": sealed},
        )
    drain(new)  # no exception
    assert calls == Counter({"evt_k2": 1, "evt_swapped": 1})
    k1_row, victim = store.operations.get("evt_k1"), store.operations.get("evt_victim")
    assert k1_row is not None and victim is not None
    assert k1_row.status == EventStatus.DEAD and victim.status == EventStatus.DEAD
    assert "sealed with data key 'k1', which is not configured" in (k1_row.last_error or "")
    assert "moved from another row" in (victim.last_error or "")
    # With the key back, the operator requeues it and it runs.
    both, _ = make_app(hooks, data_keys=f"k2:{KEY2},k1:{KEY1}")
    assert len(store_of(both).operations.requeue(EventFilter(event_ids=["evt_k1"]))) == 1
    drain(both)
    assert calls["evt_k1"] == 1


def test_redacted_history_keeps_dedupe_the_guard_and_transition_once(make_app: AppFactory) -> None:
    """A processor retry of a redacted event is still a duplicate, a stale event is still
    stale, a transition still runs once; a redacted event never runs again."""
    calls: Counter[str] = Counter()
    hooks = WebhookReceiver()

    @hooks.on("payment_succeeded", "payment_processing")
    def count(event: Event) -> None:
        calls[event.event_type] += 1

    @hooks.on("payment_failed")
    def failing(event: Event) -> None:
        raise RuntimeError("always")

    app, _ = make_app(hooks, data_keys=f"k1:{KEY1}", max_attempts=1)
    store = store_of(app)
    now = [T0]
    store.clock = lambda: now[0]
    paid = encode(
        build_event("payment_succeeded", event_id="evt_paid", object_id="pay_1", timestamp=T0)
    )
    assert post(app, paid).json["status"] == "inserted"
    dead = encode(build_event("payment_failed", event_id="evt_dead", object_id="pay_2"))
    assert post(app, dead).status_code == 200
    drain(app)
    assert calls["payment_succeeded"] == 1

    now[0] = T0 + timedelta(days=40)
    assert store.retention.redact(timedelta(days=30), dry_run=True)["events"] == 1
    assert store.retention.redact(timedelta(days=30)) == {
        "events": 1,
        "conflicts": 0,
        "rejections": 0,
    }
    row = store.operations.get("evt_paid")
    assert row is not None and row.redacted_at is not None and row.status == EventStatus.DONE
    assert (row.body, row.headers, row.last_error, row.key_id) == (b"", "{}", None, "k1")
    kept = store.operations.get("evt_dead")  # a dead letter keeps its body for the operator
    assert kept is not None and kept.redacted_at is None and kept.body

    # The processor retries the redacted event: the same bytes are a duplicate...
    assert post(app, paid).json["status"] == "duplicate"
    # ... other bytes under its id a conflict (the keyed hash survived the body).
    other = encode(build_event("payment_succeeded", event_id="evt_paid", object_id="pay_9"))
    assert post(app, other).json["status"] == "conflict"
    # An older state of the same payment is stale; the same state again is not run twice.
    older = build_event(
        "payment_processing",
        event_id="evt_late",
        object_id="pay_1",
        timestamp=T0 - timedelta(hours=1),
    )
    again = build_event("payment_succeeded", event_id="evt_again", object_id="pay_1")
    assert post(app, encode(older)).status_code == 200
    assert post(app, encode(again)).status_code == 200
    drain(app)
    assert store.operations.get("evt_late").status == EventStatus.STALE  # type: ignore[union-attr]
    assert store.operations.get("evt_again").status == EventStatus.DUPLICATE  # type: ignore[union-attr]
    assert calls == Counter({"payment_succeeded": 1})

    # A redacted event is never dispatched again: replay and requeue refuse it...
    with pytest.raises(RedactedEvents, match="#1.*cannot be replayed"):
        store.operations.replay(EventFilter(event_ids=["evt_paid"]), parse=parse_event)
    result = app.test_cli_runner().invoke(args=["hookledger", "replay", "--event-id", "evt_paid"])
    assert result.exit_code == 2 and "redacted" in result.output
    with store.engine.begin() as conn:  # (a dead redacted row can only come from an edit)
        conn.execute(sa.text("UPDATE hookledger_event SET status='dead' WHERE id = 1"))
    with pytest.raises(RedactedEvents, match="cannot be requeued"):
        store.operations.requeue(EventFilter(event_ids=["evt_paid"]))
    # ... and a worker that meets one (a row edited back to pending) dead-letters it unrun.
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE hookledger_event SET status='pending' WHERE id = 1"))
    drain(app)
    row = store.operations.get("evt_paid")
    assert row is not None and row.status == EventStatus.DEAD
    assert "redacted" in (row.last_error or "")
    assert calls == Counter({"payment_succeeded": 1})


def test_prune_keeps_each_kind_for_its_own_age(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()

    @hooks.on("payment_failed")
    def failing(event: Event) -> None:
        raise RuntimeError("always")

    app, _ = make_app(hooks, data_keys=f"k1:{KEY1}", max_attempts=1)
    store = store_of(app)
    now = [T0]
    store.clock = lambda: now[0]
    post(app, encode(build_event("payment_succeeded", event_id="evt_done", object_id="p1")))
    post(app, encode(build_event("payment_failed", event_id="evt_dead", object_id="p2")))
    post(app, encode(build_event("payment_succeeded", event_id="evt_done", object_id="p3")))
    app.test_client().post("/webhooks/", data=b"{}")  # a rejected delivery
    drain(app)
    post(app, encode(build_event("refund_succeeded", event_id="evt_open")))  # never drained
    store.rejections.flush()

    policy = WebhookReceiver.state(app).settings.data.retention
    now[0] = T0 + timedelta(days=20)
    assert store.retention.prune(policy) == {
        "events": 0,
        "dead": 0,
        "conflicts": 0,
        "rejections": 1,
    }
    now[0] = T0 + timedelta(days=100)
    assert store.retention.prune(policy, dry_run=True) == {
        "events": 1,
        "dead": 0,
        "conflicts": 1,
        "rejections": 0,
    }
    report = store.retention.run(policy)
    assert report.pruned == {"events": 1, "dead": 0, "conflicts": 1, "rejections": 0}
    assert report.redacted == {"events": 0, "conflicts": 0, "rejections": 0}  # pruned first
    assert store.operations.get("evt_done") is None and store.operations.get("evt_dead") is not None
    now[0] = T0 + timedelta(days=200)
    assert store.retention.prune(policy)["dead"] == 1
    assert store.operations.get("evt_open") is not None  # open events are never deleted
    assert store.operations.projection("payment", "p1") is not None  # the guard's memory stays
    runner = app.test_cli_runner()
    result = runner.invoke(args=["hookledger", "prune", "--dead-days", "0", "--json", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["policy"].startswith("redact=30,done=90,dead=never")


def test_rotate_keys_seals_everything_again_and_reports_what_it_cannot(
    make_app: AppFactory,
) -> None:
    hooks = WebhookReceiver()

    @hooks.on("payment_failed", name="failing")
    def failing(event: Event) -> None:
        raise RuntimeError(f"card of {EMAIL} declined")

    legacy, _ = make_app(hooks, max_attempts=1)
    l1 = encode(build_event("payment_succeeded", event_id="evt_l1", object_id="p1"))
    post(legacy, l1)
    post(legacy, encode(build_event("payment_failed", event_id="evt_l2", object_id="p2")))
    drain(legacy)

    k1, _ = make_app(hooks, data_keys=f"k1:{KEY1}", max_attempts=1, rejections_body_bytes=64)
    a1 = encode(build_event("payment_succeeded", event_id="evt_a1", object_id="p3"))
    post(k1, a1)
    c1 = encode(build_event("payment_succeeded", event_id="evt_a1", object_id="p4"))
    assert post(k1, c1).json["status"] == "conflict"
    post(k1, encode(build_event("payment_failed", event_id="evt_a2", object_id="p5")))
    k1.test_client().post("/webhooks/", data=b'{"forged": true}')
    drain(k1)
    store_of(k1).rejections.flush()

    # A stored account's secrets and API keys are rotated with the rest.
    store_of(k1).accounts.add(
        Account(
            id="shop-9",
            merchant_id="merchant_9",
            secrets=parse_secrets("s1:whsec_rotated_9"),
            api_key="snd_rotated_9",
            admin_key="adm_rotated_9",
        )
    )

    k2, _ = make_app(hooks, data_keys=f"k2:{KEY2},k1:{KEY1}", rejections_body_bytes=64)
    # The same conflicting body again: under k2 its hash differs, so it is a second record.
    assert post(k2, c1).json["status"] == "conflict"
    rotation = store_of(k2).rotation
    assert rotation.status()["remaining"] == {
        "events": 4,
        "conflicts": 1,
        "rejections": 1,
        "handler_errors": 2,
        "order_refs": 4,  # the events' order references (their metadata.order_id)
        "accounts": 1,
    }
    result = k2.test_cli_runner().invoke(args=["hookledger", "rotate-keys", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["complete"] and report["rotated"] == {
        "events": 4,
        "conflicts": 1,
        "rejections": 1,
        "handler_errors": 2,
        "order_refs": 4,  # the events' order references (their metadata.order_id)
        "accounts": 1,
    }
    with store_of(k2).engine.connect() as conn:  # the two records of one body are one again
        assert conn.execute(sa.text("SELECT count(*) FROM hookledger_event_conflict")).scalar() == 1
    # Only k2 is needed now, for everything.
    only, _ = make_app(hooks, data_keys=f"k2:{KEY2}")
    store = store_of(only)
    for event in store.operations.select_events(EventFilter()):
        assert event.key_id == "k2"
        assert parse_event(store.open_body(event.body, event.event_id)).event_id == event.event_id
        store.open_headers(event.headers, event.event_id)
        assert "[sealed" not in (event.last_error or "")
    stored = store.accounts.get("shop-9")
    assert stored is not None and stored.api_key == "snd_rotated_9"
    assert stored.admin_key == "adm_rotated_9"
    assert [(s.id, s.value) for s in stored.secrets] == [("s1", b"whsec_rotated_9")]
    with store.engine.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM hookledger_account")).mappings().one()
    assert row["key_id"] == "k2"
    assert all(row[c].startswith("{enc1:k2:") for c in ("secrets", "api_key", "admin_key"))
    failed = store.operations.get("evt_l2")
    assert failed is not None and failed.id is not None
    assert EMAIL in (store.operations.handler_runs(failed.id)["failing"].last_error or "")
    assert store.rejections.rows()[0].body == b'{"forged": true}'
    assert post(only, l1).json["status"] == "duplicate"  # re-keyed hash of a legacy row
    assert post(only, a1).json["status"] == "duplicate"
    assert (
        post(only, encode(build_event("refund_failed", event_id="evt_a1"))).json["status"]
        == "conflict"
    )
    # The rows are sealed now; the bytes they held in the clear stay in the database's free
    # space until it is vacuumed (the README says so), then they are gone from the files too.
    assert plaintext_found(store.engine, EMAIL, files=False) == []
    if backend() == "sqlite":
        store.engine.dispose()
        direct = sqlite3.connect(str(store.engine.url.database), isolation_level=None)
        direct.execute("VACUUM")
        # A checkpoint that meets another one under way (a process's checkpoint thread, see
        # receiver.storage.checkpoints) answers "busy" at once and truncates nothing: the
        # log keeps the old frames. Again until it is not busy, as the README says.
        assert _truncate_log(direct)
        direct.close()
        assert plaintext_found(store.engine, EMAIL) == []

    # A row sealed with a key nobody has any more is reported, not fatal.
    k0, _ = make_app(data_keys=f"k0:{KEY0}")
    post(k0, encode(build_event("payment_succeeded", event_id="evt_k0", object_id="p6")))
    result = only.test_cli_runner().invoke(args=["hookledger", "rotate-keys"])
    assert result.exit_code == 1, result.output
    assert "hookledger_event #" in result.output and "'k0'" in result.output
    status = only.test_cli_runner().invoke(args=["hookledger", "keys", "status", "--json"])
    assert json.loads(status.output)["by_key"]["events"] == {"k0": 1, "k2": 4}


def test_rejected_deliveries_are_recorded_bounded_and_without_values(
    make_app: AppFactory,
) -> None:
    app, _ = make_app(max_body_bytes=5000, max_event_age=7200)
    client = app.test_client()
    good = encode(build_event("payment_succeeded"))
    custom = {"X-Custom-Secret": "value-never-stored-4242"}
    assert client.post("/webhooks/", data=good, headers=custom).status_code == 401
    bad_sig = {"X-Webhook-Signature-512": "zz", **custom}
    assert client.post("/webhooks/", data=good, headers=bad_sig).status_code == 401
    wrong = {"X-Webhook-Signature-512": "ab" * 64}
    assert client.post("/webhooks/", data=good, headers=wrong).status_code == 401
    assert post(app, b"x" * 6000).status_code == 413
    assert post(app, b"{not json").status_code == 400
    old = encode(build_event("payment_succeeded", timestamp=datetime.now(UTC) - timedelta(days=2)))
    response = post(app, old)
    assert response.status_code == 400 and response.json["error"]["code"] == "HL_06"
    assert post(app, good).status_code == 200
    store = store_of(app)
    store.rejections.flush()
    rows = {r.reason: r for r in store.rejections.rows()}
    assert set(rows) == {
        "signature_missing",
        "signature_malformed",
        "signature_mismatch",
        "too_large",
        "malformed_event",
        "too_old",
    }
    mismatch = rows["signature_mismatch"]
    assert mismatch.secret_ids == ("primary", "previous") and mismatch.http_status == 401
    assert "x-webhook-signature-512" in mismatch.header_names and mismatch.body is None
    assert mismatch.size == len(good) and rows["too_large"].size == 6000
    assert "x-custom-secret" in rows["signature_missing"].header_names
    assert plaintext_found(store.engine, "value-never-stored-4242") == []
    result = app.test_cli_runner().invoke(args=["hookledger", "rejections"])
    assert result.exit_code == 0, result.output
    assert "signature_mismatch 401" in result.output and "tried [primary,previous]" in result.output
    assert "6 recorded" in result.output


def test_the_rejection_log_is_rate_limited_and_capped(make_app: AppFactory) -> None:
    app, _ = make_app(rejections_per_minute=5, rejections_max_rows=3)
    client = app.test_client()
    for _ in range(40):
        client.post("/webhooks/", data=b"{}", headers={"X-Webhook-Signature-512": "ab" * 64})
    store = store_of(app)
    store.rejections.flush()
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT reason, suppressed FROM hookledger_rejection")).all()
        total_ids = conn.execute(sa.text("SELECT max(id) FROM hookledger_rejection")).scalar()
    assert len(rows) <= 3 and total_ids == 6  # 5 admitted by the bucket, 1 count-only row
    assert rows[-1] == ("rate_limited", 35)  # nothing unaccounted: 5 rows + 35 counted
    summary = store.rejections.summary()
    assert summary["not_recorded"] == 35


def test_the_reconciler_stores_sealed_rows(database_url: str, engine: sa.Engine) -> None:
    """``reconcile``'s inbox takes HOOKLEDGER_DATA_KEYS from the environment."""
    from reconcile.cli.context import Context

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOOKLEDGER_DATA_KEYS", f"k1:{KEY1}")
        inbox = Context(database_url, None, None).inbox()
    raw = encode(build_event("payment_succeeded", object_id="pay_rec", email=EMAIL))
    inbox.inbox.insert(parse_event(raw), raw, source=Source.RECOVERED)
    assert inbox.keyring.primary == "k1"
    assert plaintext_found(engine, CANARY) == []
    inbox.engine.dispose()


def test_redaction_keys_the_body_hash_with_the_primary_so_old_keys_can_go(
    make_app: AppFactory,
) -> None:
    """A redacted row has no body left to hash again: redaction keys its hash with the
    primary key first, so retiring an older key never loses duplicate detection."""
    old, _ = make_app(data_keys=f"k1:{KEY1}")
    paid = encode(build_event("payment_succeeded", event_id="evt_r", object_id="pay_r"))
    assert post(old, paid).json["status"] == "inserted"
    drain(old)
    new, _ = make_app(data_keys=f"k2:{KEY2},k1:{KEY1}")
    store = store_of(new)
    store.clock = lambda: datetime.now(UTC) + timedelta(days=40)
    assert store.retention.redact(timedelta(days=30))["events"] == 1
    row = store.operations.get("evt_r")
    assert row is not None and row.key_id == "k2" and row.body == b""
    assert store.rotation.status()["redacted_elsewhere"] == {}
    only, _ = make_app(data_keys=f"k2:{KEY2}")
    assert post(only, paid).json["status"] == "duplicate"
    other = encode(build_event("payment_succeeded", event_id="evt_r", object_id="pay_other"))
    assert post(only, other).json["status"] == "conflict"


def test_the_commands(make_app: AppFactory) -> None:
    """keys new, rotate-keys without a key, redact and retention, one line on errors."""
    plain, _ = make_app()
    runner = plain.test_cli_runner()
    new = runner.invoke(args=["hookledger", "keys", "new", "--id", "k7"])
    assert new.exit_code == 0 and new.output.startswith("k7:")
    key = new.output.splitlines()[0].split(":", 1)[1]
    assert len(base64.urlsafe_b64decode(key)) == 32
    refused = runner.invoke(args=["hookledger", "rotate-keys"])
    assert refused.exit_code == 2 and "HOOKLEDGER_DATA_KEYS" in refused.output
    app, _ = make_app(data_keys=f"k7:{key}")
    store = store_of(app)
    post(app, encode(build_event("payment_succeeded", event_id="evt_cmd")))
    drain(app)
    store.clock = lambda: datetime.now(UTC) + timedelta(days=31)
    runner = app.test_cli_runner()
    dry = runner.invoke(args=["hookledger", "redact", "--dry-run"])
    assert dry.exit_code == 0 and dry.output.startswith("1 event(s)") and "would be" in dry.output
    result = runner.invoke(args=["hookledger", "retention", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["redacted"]["events"] == 1
    assert runner.invoke(args=["hookledger", "redact", "--older-than-days", "0.5"]).exit_code == 2


def test_the_rejection_writer_needs_no_flush(make_app: AppFactory) -> None:
    app, _ = make_app()
    assert app.test_client().post("/webhooks/", data=b"{}").status_code == 401
    store = store_of(app)
    deadline = datetime.now(UTC) + timedelta(seconds=10)
    while not store.rejections.rows() and datetime.now(UTC) < deadline:
        threading.Event().wait(0.05)
    assert [r.reason for r in store.rejections.rows()] == ["signature_missing"]


def test_a_web_process_without_a_data_key_warns_at_start(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="receiver.atrest"):
        make_app()
    assert "no data key (HOOKLEDGER_DATA_KEYS)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="receiver.atrest"):
        make_app(data_keys=f"k1:{KEY1}")
    assert caplog.text == ""
