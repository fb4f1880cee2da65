"""The order index (issue 30, item 2), on SQLite and PostgreSQL: every stored event is
indexed by the shop's order references as a digest (keyed with the data keys), whatever
path stored it; redaction and pruning remove the rows, ``rotate-keys`` keys them again, and
the backfill indexes what was stored before, resumably."""

from __future__ import annotations

import base64
import hashlib
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from receiver import WebhookReceiver
from receiver.atrest.order_index import OrderIndex
from receiver.config.data_at_rest import RetentionPolicy
from receiver.core.events import parse_event
from receiver.core.keyring import parse_data_keys
from receiver.core.order_refs import OrderFields
from receiver.storage.operator_actions import EventFilter
from receiver.storage.sql.tables import ORDER_REF
from receiver.storage.tables import Source
from receiver.store import Store
from receiver.testing import signed_headers
from receiver.testing.factories import build_event, encode
from tests.conftest import SECRETS, AppFactory, backend
from tests.receiver.atrest.test_sealed_at_rest import plaintext_found

pytestmark = pytest.mark.storage

KEY1 = base64.b64encode(b"1" * 32).decode()
KEY2 = base64.b64encode(b"2" * 32).decode()
ORDER = "ord-zebra-4417"


def post(app: Flask, body: bytes) -> Any:
    return app.test_client().post(
        "/webhooks/", data=body, headers=signed_headers(body, SECRETS["primary"])
    )


def store_of(app: Flask) -> Store:
    return WebhookReceiver.state(app).store


def index_rows(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(ORDER_REF).order_by(ORDER_REF.c.event_pk, ORDER_REF.c.path)
        ).all()


def event_pk(store: Store, event_id: str) -> int:
    row = store.operations.get(event_id)
    assert row is not None and row.id is not None
    return row.id


def refs_of(engine: sa.Engine, pk: int) -> dict[str, tuple[str, str | None]]:
    return {r.path: (r.digest, r.key_id) for r in index_rows(engine) if r.event_pk == pk}


def test_every_path_that_stores_an_event_indexes_it_keyed(make_app: AppFactory) -> None:
    """Webhooks, observe(), the reconciler's recovered and synthesised events and replays
    each get one index row per configured field they carry, keyed with the primary data key;
    a duplicate or a conflict adds none; no reference is readable in the database."""
    hooks = WebhookReceiver()
    app, _ = make_app(hooks, data_keys=f"k1:{KEY1}")
    store = store_of(app)
    ring = store.keyring
    body = encode(
        build_event(
            "payment_succeeded",
            event_id="evt_web",
            object_id="pay_web",
            metadata={"order_id": ORDER},
            merchant_order_reference_id=f"{ORDER}-ref",
        )
    )
    assert post(app, body).json["status"] == "inserted"
    assert post(app, body).json["status"] == "duplicate"
    other = encode(
        build_event(
            "payment_succeeded",
            event_id="evt_web",
            object_id="pay_web",
            metadata={"order_id": "another"},
        )
    )
    assert post(app, other).json["status"] == "conflict"
    web = event_pk(store, "evt_web")
    assert refs_of(store.engine, web) == {
        "metadata.order_id": (ring.reference_digest(ORDER, "k1"), "k1"),
        "merchant_order_reference_id": (ring.reference_digest(f"{ORDER}-ref", "k1"), "k1"),
    }
    # An integer order id is its digits; a reference that is no string or integer, none.
    numeric = encode(
        build_event("payment_succeeded", event_id="evt_int", metadata={"order_id": 1234})
    )
    assert post(app, numeric).status_code == 200
    odd = encode(
        build_event("payment_succeeded", event_id="evt_odd", metadata={"order_id": {"x": 1}})
    )
    assert post(app, odd).status_code == 200
    assert refs_of(store.engine, event_pk(store, "evt_int")) == {
        "metadata.order_id": (ring.reference_digest("1234", "k1"), "k1")
    }
    assert refs_of(store.engine, event_pk(store, "evt_odd")) == {}
    # observe(): the shop's own API response.
    obj = build_event("payment_succeeded", object_id="pay_api", metadata={"order_id": ORDER})
    with app.app_context():
        hooks.observe(obj["content"]["object"], kind="payment", app=app)
    # The reconciler: a synthesised event, and an undelivered one with its own bytes.
    synthesised = encode(
        build_event("payment_failed", object_id="pay_rec", metadata={"order_id": ORDER})
    )
    store.inbox.insert_synthesised([(parse_event(synthesised), synthesised)])
    recovered = encode(
        build_event("payment_succeeded", event_id="evt_recov", metadata={"order_id": ORDER})
    )
    store.inbox.insert(parse_event(recovered), recovered, source=Source.RECOVERED)
    store.operations.replay(EventFilter(event_ids=["evt_web"]), parse=parse_event)
    sources = {}
    digest = ring.reference_digest(ORDER, "k1")
    with store.engine.connect() as conn:
        for source, n in conn.execute(
            sa.text(
                "SELECT e.source, count(*) FROM hookledger_order_ref AS r JOIN hookledger_event"
                " AS e ON e.id = r.event_pk WHERE r.digest = :d GROUP BY e.source"
            ),
            {"d": digest},
        ):
            sources[source] = int(n)
    assert sources == {"webhook": 1, "api": 1, "reconcile": 1, "recovered": 1, "replay": 1}
    assert plaintext_found(store.engine, ORDER) == []


def test_without_a_data_key_the_index_holds_a_plain_sha256(make_app: AppFactory) -> None:
    app, _ = make_app()
    store = store_of(app)
    body = encode(build_event("payment_succeeded", event_id="evt_1", metadata={"order_id": ORDER}))
    assert post(app, body).status_code == 200
    assert refs_of(store.engine, event_pk(store, "evt_1")) == {
        "metadata.order_id": (hashlib.sha256(ORDER.encode()).hexdigest(), None)
    }


def test_the_configured_fields_are_the_ones_indexed(make_app: AppFactory) -> None:
    app, _ = make_app(order_fields="customer_id, metadata.shop.order")
    store = store_of(app)
    body = encode(
        build_event(
            "payment_succeeded",
            event_id="evt_1",
            customer_id="cus_1",
            metadata={"order_id": ORDER, "shop": {"order": "  o-7  "}},
        )
    )
    assert post(app, body).status_code == 200
    assert set(refs_of(store.engine, event_pk(store, "evt_1"))) == {
        "customer_id",
        "metadata.shop.order",
    }
    assert refs_of(store.engine, event_pk(store, "evt_1"))["metadata.shop.order"][0] == (
        hashlib.sha256(b"o-7").hexdigest()
    )
    off, _ = make_app(order_fields="none")
    body = encode(build_event("payment_succeeded", event_id="evt_2", metadata={"order_id": "x"}))
    assert post(off, body).status_code == 200
    assert refs_of(store.engine, event_pk(store, "evt_2")) == {}


def test_an_index_row_belongs_to_its_account(database_url: str, engine: sa.Engine) -> None:
    store = Store(engine, keyring=parse_data_keys(f"k1:{KEY1}"))
    for account in ("default", "seller_42"):
        raw = encode(
            build_event("payment_succeeded", event_id="evt_same", metadata={"order_id": ORDER})
        )
        store.inbox.insert(parse_event(raw), raw, account=account)
    rows = index_rows(engine)
    assert sorted(r.account for r in rows) == ["default", "seller_42"]
    assert len({r.event_pk for r in rows}) == 2


@pytest.mark.skipif(backend() != "postgresql", reason="PostgreSQL's batched delivery statement")
def test_a_batch_of_deliveries_in_one_statement_indexes_those_inserted(
    database_url: str, engine: sa.Engine
) -> None:
    store = Store(engine, keyring=parse_data_keys(f"k1:{KEY1}"))
    rows = []
    for i, account in enumerate(("default", "seller_42", "default")):
        raw = encode(
            build_event("payment_succeeded", event_id=f"evt_b{i}", metadata={"order_id": f"o{i}"})
        )
        rows.append(store.inbox.row(parse_event(raw), raw, account=account))
    stored = store.inbox._insert_deliveries(rows)  # noqa: SLF001 - the group-commit path
    assert [getattr(o, "result", o) for o in stored] == ["inserted"] * 3
    again = store.inbox._insert_deliveries(rows[:2])  # noqa: SLF001
    assert [getattr(o, "result", o) for o in again] == ["duplicate"] * 2
    found = index_rows(engine)
    assert [(r.account, r.digest) for r in found] == [
        (account, store.keyring.reference_digest(f"o{i}", "k1"))
        for i, account in enumerate(("default", "seller_42", "default"))
    ]


def test_redaction_and_pruning_remove_the_index_rows(make_app: AppFactory) -> None:
    app, _ = make_app(data_keys=f"k1:{KEY1}")
    store = store_of(app)
    for i in range(3):
        body = encode(
            build_event("payment_succeeded", event_id=f"evt_{i}", metadata={"order_id": ORDER})
        )
        assert post(app, body).status_code == 200
    WebhookReceiver.state(app).worker(name="t").drain()
    later = store.now() + timedelta(days=40)
    store.clock = lambda: later
    assert store.retention.redact(timedelta(days=30))["events"] == 3
    assert index_rows(store.engine) == []
    body = encode(
        build_event("payment_succeeded", event_id="evt_new", metadata={"order_id": ORDER})
    )
    assert post(app, body).status_code == 200
    WebhookReceiver.state(app).worker(name="t").drain()
    assert len(index_rows(store.engine)) == 1
    much_later = later + timedelta(days=200)
    store.clock = lambda: much_later
    store.retention.prune(RetentionPolicy(done=90, redact=None))
    assert index_rows(store.engine) == []


def test_rotate_keys_keys_the_index_again(make_app: AppFactory) -> None:
    old, _ = make_app(data_keys=f"k1:{KEY1}")
    for i in range(5):
        body = encode(
            build_event("payment_succeeded", event_id=f"evt_{i}", metadata={"order_id": f"o{i}"})
        )
        assert post(old, body).status_code == 200
    new, _ = make_app(data_keys=f"k2:{KEY2},k1:{KEY1}")
    store = store_of(new)
    store.rotation.batch_size = 2
    assert store.rotation.status()["remaining"]["order_refs"] == 5
    report = store.rotation.run()
    assert report.complete, report.render()
    assert report.rotated["order_refs"] == 5
    ring = store.keyring
    assert [(r.digest, r.key_id) for r in index_rows(store.engine)] == [
        (ring.reference_digest(f"o{i}", "k2"), "k2") for i in range(5)
    ]
    assert store.rotation.status()["by_key"]["order_refs"] == {"k2": 5}


def test_rotate_keys_reports_index_rows_it_cannot_read(make_app: AppFactory) -> None:
    old, _ = make_app(data_keys=f"k1:{KEY1}")
    body = encode(build_event("payment_succeeded", event_id="evt_1", metadata={"order_id": "o"}))
    assert post(old, body).status_code == 200
    new, _ = make_app(data_keys=f"k2:{KEY2}")  # k1 dropped too early
    report = store_of(new).rotation.run()
    assert not report.complete
    assert report.remaining["order_refs"] == 1
    assert report.unreadable["k1"] >= 1


def test_the_backfill_indexes_earlier_events_and_goes_on_where_it_stopped(
    make_app: AppFactory,
) -> None:
    app, _ = make_app(data_keys=f"k1:{KEY1}")
    store = store_of(app)
    for i in range(7):
        body = encode(
            build_event("payment_succeeded", event_id=f"evt_{i}", metadata={"order_id": f"o{i}"})
        )
        assert post(app, body).status_code == 200
    with store.engine.begin() as conn:  # as before migration 0009
        conn.execute(sa.delete(ORDER_REF))
    index = OrderIndex(store.storage, batch_size=3)
    dry = index.backfill(dry_run=True)
    assert dry.events == 7 and index_rows(store.engine) == []
    stop = threading.Event()
    first = index.backfill(stop=stop, progress=lambda n: stop.set())
    assert first.stopped and first.events == 3 and first.remaining == 4
    assert len(index_rows(store.engine)) == 3
    second = index.backfill()
    assert second.complete and second.events == 4 and second.after_pk == event_pk(store, "evt_6")
    assert [r.digest for r in index_rows(store.engine)] == [
        store.keyring.reference_digest(f"o{i}", "k1") for i in range(7)
    ]
    assert index.backfill().events == 0
    assert index.status()["events_left"] == 0
    # Other fields configured: the next run starts from the first row, and indexes those.
    store.storage.order_fields = OrderFields(("event_type",))
    assert index.status()["fields_changed"]
    third = index.backfill()
    assert third.restarted and third.events == 7
    assert {r.path for r in index_rows(store.engine)} == set()  # no object field of that name


def test_the_backfill_skips_what_it_cannot_open_and_redacted_events(
    make_app: AppFactory,
) -> None:
    old, _ = make_app(data_keys=f"k1:{KEY1}")
    first = encode(build_event("payment_succeeded", event_id="evt_0", metadata={"order_id": "o"}))
    assert post(old, first).status_code == 200
    WebhookReceiver.state(old).worker(name="t").drain()
    store = store_of(old)
    later = datetime.now(UTC) + timedelta(days=40)
    store.clock = lambda: later
    assert store.retention.redact(timedelta(days=30))["events"] == 1
    waiting = encode(build_event("payment_succeeded", event_id="evt_1", metadata={"order_id": "p"}))
    assert post(old, waiting).status_code == 200  # pending, under k1
    new, _ = make_app(data_keys=f"k2:{KEY2}")  # k1 gone
    body = encode(build_event("payment_succeeded", event_id="evt_k2", metadata={"order_id": "x"}))
    assert post(new, body).status_code == 200
    with store.engine.begin() as conn:
        conn.execute(sa.delete(ORDER_REF))
    report = OrderIndex(store_of(new).storage).backfill()
    assert report.events == 1 and dict(report.unreadable) == {"k1": 1}
    assert not report.complete and "evt" not in report.render().split("#")[0]
    assert [r.key_id for r in index_rows(store.engine)] == ["k2"]
