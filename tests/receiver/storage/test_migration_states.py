"""Migration 0003 on a database with data: transitions re-keyed by state, dispute stages
filled in, and (SQLite) event ids never reused after ``prune``."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

import receiver.storage.database as db
from receiver.core.events import Event, parse_event
from receiver.extension import WebhookReceiver
from receiver.testing import WebhookTestClient
from receiver.testing.factories import build_event, encode
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _event_row(pk: int, event_type: str, object_id: str, **fields: object) -> dict[str, object]:
    body = encode(build_event(event_type, object_id=object_id, event_id=f"evt_{pk}", **fields))
    event = parse_event(body)
    ref = event.object_ref
    assert ref is not None
    return {
        "id": pk,
        "event_id": event.event_id,
        "source": "webhook",
        "event_type": event_type,
        "content_type": event.content_type,
        "object_kind": ref.kind,
        "object_id": ref.object_id,
        "object_status": ref.status,
        "object_key": f"{ref.kind}:{ref.object_id}",
        "event_time": T0,
        "received_at": T0,
        "body": body,
        "headers": "{}",
        "body_sha256": "x" * 64,
        "status": "done",
        "attempts": 1,
        "next_attempt_at": T0,
    }


def test_upgrade_rekeys_transitions_and_fills_stages(database_url: str) -> None:
    engine = db.make_engine(database_url)
    try:
        db.upgrade(engine, "0002")
        meta = sa.MetaData()
        meta.reflect(engine)
        events, transitions = meta.tables["hookledger_event"], meta.tables["hookledger_transition"]
        projections = meta.tables["hookledger_projection"]
        rows = [
            _event_row(1, "payment_captured", "pay_1", status="partially_captured_and_capturable"),
            _event_row(2, "dispute_opened", "dp_1", dispute_stage="pre_arbitration"),
            _event_row(3, "refund_succeeded", "ref_1", status="success"),
            _event_row(5, "payment_succeeded", "pay_9"),
        ]
        with engine.begin() as conn:
            conn.execute(events.insert(), rows)
            conn.execute(
                transitions.insert(),
                [
                    {
                        "object_kind": k,
                        "object_id": i,
                        "event_type": t,
                        "event_pk": pk,
                        "created_at": T0,
                    }
                    for k, i, t, pk in [
                        ("payment", "pay_1", "payment_captured", 1),
                        ("dispute", "dp_1", "dispute_opened", 2),
                        ("refund", "ref_1", "refund_succeeded", 3),
                        ("payout", "po_1", "payout_success", 4),  # its event was pruned
                        ("payment", "pay_9", "payment_succeeded", 5),
                    ]
                ],
            )
            conn.execute(
                projections.insert(),
                [
                    {
                        "object_kind": "dispute",
                        "object_id": "dp_1",
                        "status": "dispute_opened",
                        "rank": 10,
                        "event_pk": 2,
                        "updated_at": T0,
                    },
                    {
                        "object_kind": "payment",
                        "object_id": "pay_9",
                        "status": "succeeded",
                        "rank": 80,
                        "event_pk": 5,
                        "updated_at": T0,
                    },
                ],
            )
            # ``prune`` deleted the newest event; its transition stays (the guard needs it).
            conn.execute(events.delete().where(events.c.id == 5))
        db.upgrade(engine)
        with engine.connect() as conn:
            states = {
                (r.object_kind, r.object_id): (r.state, r.event_pk)
                for r in conn.execute(sa.text("SELECT * FROM hookledger_transition"))
            }
            stage = conn.execute(
                sa.text("SELECT object_stage FROM hookledger_event WHERE id = 2")
            ).scalar()
            projected = {
                r.object_id: (r.status, r.stage)
                for r in conn.execute(sa.text("SELECT * FROM hookledger_projection"))
            }
        assert states == {
            ("payment", "pay_1"): ("partially_captured_and_capturable", 1),
            ("dispute", "dp_1"): ("pre_arbitration/dispute_opened", 2),
            ("refund", "ref_1"): ("succeeded", 3),
            ("payout", "po_1"): ("success", 4),
            ("payment", "pay_9"): ("succeeded", 5),
        }
        assert stage == "pre_arbitration"
        assert projected == {
            "dp_1": ("dispute_opened", "pre_arbitration"),
            "pay_9": ("succeeded", None),
        }
        # The old shape comes back on a downgrade, data included.
        db.downgrade(engine, "0002")
        with engine.connect() as conn:
            back = {
                r.object_id: r.event_type
                for r in conn.execute(sa.text("SELECT * FROM hookledger_transition"))
            }
        assert back["pay_1"] == "payment_captured" and back["dp_1"] == "dispute_opened"
    finally:
        engine.dispose()


def test_a_pruned_id_is_never_handed_out_again(make_app: AppFactory, database_url: str) -> None:
    """Regression: SQLite reused the id of a pruned event; a re-delivered old event then got
    the id of its transition's owner, and the guard ran its handlers a second time."""
    hooks = WebhookReceiver()
    calls: Counter[str] = Counter()

    @hooks.on("payment_succeeded", name="ship")
    def ship(event: Event) -> None:
        calls[event.event_id] += 1

    app, _ = make_app(hooks)
    client = WebhookTestClient(app)
    body = build_event("payment_succeeded", object_id="pay_once", event_id="evt_once")
    client.post(body)
    client.drain()
    store = WebhookReceiver.state(app).store
    first = store.operations.get("evt_once")
    assert first is not None and first.id is not None
    with store.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM hookledger_handler_run"))
        conn.execute(sa.text("DELETE FROM hookledger_event"))
    # The processor retries the same event (same bytes) after the prune.
    client.post(body)
    again = store.operations.get("evt_once")
    assert again is not None and again.id is not None and again.id > first.id
    client.drain()
    assert calls == Counter(evt_once=1)
    assert store.operations.get("evt_once").status == "duplicate"  # type: ignore[union-attr]


def test_upgrade_keeps_sqlite_ids_above_any_reference(database_url: str) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("AUTOINCREMENT is SQLite's; PostgreSQL sequences never reuse ids")
    engine = db.make_engine(database_url)
    try:
        db.upgrade(engine, "0002")
        meta = sa.MetaData()
        meta.reflect(engine)
        with engine.begin() as conn:
            conn.execute(
                meta.tables["hookledger_event"].insert(), [_event_row(1, "payment_succeeded", "p1")]
            )
            conn.execute(
                meta.tables["hookledger_transition"].insert(),
                [
                    {
                        "object_kind": "payment",
                        "object_id": "p0",
                        "event_type": "payment_succeeded",
                        "event_pk": 41,
                        "created_at": T0,
                    }
                ],
            )
        db.upgrade(engine)
        body = encode(build_event("payment_succeeded", object_id="p2"))
        from receiver.store import Store

        inserted = Store(engine).inbox.insert(parse_event(body), body)
        assert inserted.pk > 41
    finally:
        engine.dispose()
