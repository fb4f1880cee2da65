"""``hookledger events --order`` and ``hookledger object`` (issue 30, items 2 and 3), as
support uses them on a bad night: an order whose webhook is dead-lettered, an order under a
rotated data key, an order in a seller's account, one order id in two accounts, order ids
with odd characters, a command run without the data keys."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from receiver import Event, WebhookReceiver
from receiver.core.events import parse_event
from receiver.storage.object_story import RECON_OBJECT, RECON_RUN
from receiver.storage.sql.tables import ORDER_REF
from receiver.store import Store
from receiver.testing import signed_headers
from receiver.testing.factories import build_event, encode
from reconcile.storage.store import ReconcileStore
from reconcile.storage.tables import FollowedObject, ReconcileRun
from tests.conftest import AppFactory
from tests.support import reconcile_ready

pytestmark = pytest.mark.storage

KEY1 = base64.b64encode(b"1" * 32).decode()
KEY2 = base64.b64encode(b"2" * 32).decode()
SECRET = {"default": "whsec_default_0123456789", "seller_42": "whsec_seller_0123456789"}
ACCOUNTS = json.dumps({"seller_42": {"secrets": f"s1:{SECRET['seller_42']}"}})
CARD = "4111 1111 1111 1111"


def _hooks() -> WebhookReceiver:
    hooks = WebhookReceiver()

    @hooks.on("payment_failed", name="shop.notify")
    def notify(event: Event) -> None:
        raise RuntimeError(f"mail server refused the customer's card {CARD}")

    @hooks.on("payment_succeeded", name="shop.ship")
    def ship(event: Event) -> None:
        pass

    return hooks


def _app(make_app: AppFactory, keys: str | None = f"k1:{KEY1}", **config: Any) -> Flask:
    settings: dict[str, Any] = {
        "secrets": f"s1:{SECRET['default']}",
        "accounts": ACCOUNTS,
        "max_attempts": 1,
        **config,
    }
    if keys is not None:
        settings["data_keys"] = keys
    app, _ = make_app(_hooks(), **settings)
    return app


def _post(app: Flask, body: bytes, account: str = "default") -> str:
    answer = app.test_client().post(
        f"/webhooks/{account}/", data=body, headers=signed_headers(body, SECRET[account])
    )
    return str((answer.get_json() or {}).get("status") or answer.status_code)


def _cli(app: Flask, *args: str) -> Any:
    return app.test_cli_runner().invoke(args=["hookledger", *args])


def _store(app: Flask) -> Store:
    return WebhookReceiver.state(app).store


def _event(event_type: str, event_id: str, object_id: str, order: Any, **fields: Any) -> bytes:
    return encode(
        build_event(
            event_type,
            event_id=event_id,
            object_id=object_id,
            metadata={"order_id": order},
            **fields,
        )
    )


def test_find_an_order_whose_webhook_is_dead_lettered_and_read_its_story(
    make_app: AppFactory,
) -> None:
    app = _app(make_app)
    assert _post(app, _event("payment_failed", "evt_f", "pay_1", "1234")) == "inserted"
    assert _post(app, _event("payment_succeeded", "evt_other", "pay_2", "9999")) == "inserted"
    # Still in the queue (no worker ran): found all the same.
    queued = json.loads(_cli(app, "events", "--order", "1234", "--json").stdout)["listed"]
    assert [(r["event_id"], r["status"]) for r in queued] == [("evt_f", "pending")]
    WebhookReceiver.state(app).worker(name="t").drain()
    found = _cli(app, "events", "--order", " 1234 ")
    assert found.exit_code == 0, found.output
    lines = found.stdout.splitlines()
    assert len(lines) == 2 and "default evt_f payment_failed dead webhook payment:pay_1" in lines[0]
    assert "1 event(s) listed" in lines[1]
    listed = json.loads(_cli(app, "events", "--order", "1234", "--json").stdout)
    assert [r["event_id"] for r in listed["listed"]] == ["evt_f"] and listed["notes"] == []
    # The reason listed is masked as in the story (the handler quoted a card number).
    assert CARD not in found.stdout and "card •••1111)" in lines[0]
    assert CARD not in json.dumps(listed)
    shown = _cli(app, "show", "evt_f")
    assert shown.exit_code == 0, shown.output
    assert CARD not in shown.stdout and "card •••1111" in shown.stdout
    assert json.loads(_cli(app, "events", "--order", "12", "--json").stdout)["listed"] == []
    assert _cli(app, "events", "--order", "  ").exit_code == 2

    story = _cli(app, "object", "payment:pay_1")
    assert story.exit_code == 0, story.output
    text = story.stdout
    assert "payment:pay_1 (account default)" in text
    assert "-> dead (attempts 1)" in text and "handler shop.notify: failed (attempts 1)" in text
    assert CARD not in text and "1111" in text  # the card number in the traceback is masked
    # The state was reached (the guard moved the projection), its handler did not succeed.
    assert "projection      failed (by #" in text
    assert "dead-lettered: its handlers did not all succeed" in text
    data = json.loads(_cli(app, "object", "payment:pay_1", "--json").stdout)
    assert data["deliveries"][0]["status"] == "dead"
    assert data["deliveries"][0]["ledger"][0]["status"] == "failed"
    assert CARD not in json.dumps(data)
    assert data["last_word"]["status"] == "failed" and data["last_word"]["source"] == "webhook"
    # The object page's kinds, the account/kind:id form, and what is not there.
    assert _cli(app, "object", "default/payment:pay_1").exit_code == 0
    assert _cli(app, "object", "payment:pay_nope").exit_code == 1
    bad = _cli(app, "object", "pay_1")
    assert bad.exit_code == 2 and "kind:id" in bad.stderr


def test_the_whole_story_every_delivery_transition_source_and_run(make_app: AppFactory) -> None:
    """A webhook, its duplicate and a conflicting body, the shop's observe(), a reconcile
    event stored during a run (whose report names the object), a replay and the sweep's last
    check: each delivery with its answer, each transition with its source."""
    hooks = _hooks()
    app, _ = make_app(
        hooks, secrets=f"s1:{SECRET['default']}", data_keys=f"k1:{KEY1}", max_attempts=1
    )
    state = WebhookReceiver.state(app)
    store = state.store
    engine = store.engine
    reconcile_ready(engine)
    first = _event("payment_processing", "evt_p", "pay_s", "o-1")
    assert _post(app, first) == "inserted"
    assert _post(app, first) == "duplicate"
    conflicting = _event("payment_processing", "evt_p", "pay_s", "o-1", amount=999)
    assert _post(app, conflicting) == "conflict"
    state.worker(name="t").drain()
    paid = build_event("payment_succeeded", object_id="pay_s", metadata={"order_id": "o-1"})
    with app.app_context():
        hooks.observe(paid["content"]["object"], kind="payment", app=app)
    state.worker(name="t").drain()
    runs = ReconcileStore(engine)
    run = runs.start_run("incremental", "test")
    recovered = _event("payment_succeeded", "evt_rec", "pay_s", "o-1")
    store.inbox.insert_synthesised([(parse_event(recovered), recovered)])
    runs.finish_run(
        run, "unresolved", {"kinds": {"payments": {"mismatched_sample": ["pay_s: odd"]}}}
    )
    state.worker(name="t").drain()
    assert _cli(app, "replay", "--event-id", "evt_p").exit_code == 0
    with engine.begin() as conn:
        conn.execute(
            sa.insert(FollowedObject.__table__),  # type: ignore[attr-defined]
            {
                "account": "default",
                "kind": "payment",
                "object_id": "pay_s",
                "first_seen_at": store.now(),
                "status": "succeeded",
                "stage": None,
                "last_checked_at": store.now() + timedelta(minutes=5),
                "next_check_at": store.now() + timedelta(hours=1),
                "checks": 3,
            },
        )
    data = json.loads(_cli(app, "object", "payment:pay_s", "--json").stdout)
    sources = [d["source"] for d in data["deliveries"]]
    assert sources == ["webhook", "api", "reconcile", "replay"], sources
    assert [d["status"] for d in data["deliveries"]][:3] == ["done", "done", "duplicate"]
    assert data["deliveries"][0]["conflicting_deliveries"] == 1
    assert data["deliveries"][2]["reconcile_run"] == run
    assert data["deliveries"][3]["replay_of"] == data["deliveries"][0]["id"]
    assert [(t["state"], t["source"]) for t in data["transitions"]] == [
        ("processing", "webhook"),
        ("succeeded", "api"),
    ]
    assert [r["id"] for r in data["reconcile_runs"]] == [run]
    why = data["reconcile_runs"][0]["why"]
    assert "stored #" in why and "its report names the object" in why
    assert data["sweep"]["checks"] == 3
    assert data["last_recovered"]["source"] == "reconcile"
    assert data["last_recovered"]["status"] == "succeeded"
    assert data["last_word"]["source"] == "sweep" and data["last_word"]["status"] == "succeeded"
    text = _cli(app, "object", "payment:pay_s").stdout
    assert "stored by reconcile run #" in text and "sweep           follows it" in text
    assert "1 delivery(ies) of its event id with another body" in text
    assert "by #" in text and "(api)" in text


def test_an_order_in_a_sellers_account_and_one_order_id_in_two_accounts(
    make_app: AppFactory,
) -> None:
    app = _app(make_app)
    assert _post(app, _event("payment_succeeded", "evt_a", "pay_x", "1234")) == "inserted"
    body = _event("payment_succeeded", "evt_b", "pay_x", "1234")
    assert _post(app, body, "seller_42") == "inserted"
    both = json.loads(_cli(app, "events", "--order", "1234", "--json").stdout)
    assert sorted(r["account"] for r in both["listed"]) == ["default", "seller_42"]
    text = _cli(app, "events", "--order", "1234").stdout
    assert " seller_42 evt_b " in text and " default evt_a " in text
    one = json.loads(
        _cli(app, "events", "--order", "1234", "--account", "seller_42", "--json").stdout
    )
    assert [r["account"] for r in one["listed"]] == ["seller_42"]
    # The same payment id in both accounts: the story asks which one.
    ambiguous = _cli(app, "object", "payment:pay_x")
    assert ambiguous.exit_code == 2
    assert "2 accounts (default, seller_42)" in ambiguous.stderr
    seller = json.loads(
        _cli(app, "object", "payment:pay_x", "--account", "seller_42", "--json").stdout
    )
    assert seller["account"] == "seller_42" and seller["object_key"] == "seller_42/payment:pay_x"
    assert _cli(app, "object", "seller_42/payment:pay_x").exit_code == 0
    clash = _cli(app, "object", "seller_42/payment:pay_x", "--account", "default")
    assert clash.exit_code == 2


@pytest.mark.parametrize(
    "order",
    ["ORD/2024 #1 ä'\"<x>", "  spaced  ", "12345678901234567890", "%_\\", "\u200bzero-width"],
)
def test_order_ids_with_odd_characters_are_found_exactly(make_app: AppFactory, order: str) -> None:
    app = _app(make_app)
    assert _post(app, _event("payment_succeeded", "evt_odd", "pay_odd", order)) == "inserted"
    assert (
        _post(app, _event("payment_succeeded", "evt_near", "pay_near", order + "x")) == "inserted"
    )
    found = json.loads(_cli(app, "events", "--order", order, "--json").stdout)
    assert [r["event_id"] for r in found["listed"]] == ["evt_odd"]
    like = json.loads(_cli(app, "events", "--order", "%", "--json").stdout)
    assert like["listed"] == []


def test_a_command_without_the_data_keys_says_it_cannot_search_them(
    make_app: AppFactory,
) -> None:
    keyed = _app(make_app)
    assert _post(keyed, _event("payment_succeeded", "evt_k", "pay_k", "1234")) == "inserted"
    bare = _app(make_app, keys=None)
    result = _cli(bare, "events", "--order", "1234")
    assert result.exit_code == 0
    assert "0 event(s) listed" in result.stdout
    assert "data key(s) 'k1', which this process does not have" in result.stderr


def test_an_order_under_a_rotated_key_is_found_before_and_after_rotate_keys(
    make_app: AppFactory,
) -> None:
    old = _app(make_app)
    assert _post(old, _event("payment_succeeded", "evt_old", "pay_o", "1234")) == "inserted"
    new = _app(make_app, keys=f"k2:{KEY2},k1:{KEY1}")
    assert _post(new, _event("refund_succeeded", "evt_new", "ref_o", "1234")) == "inserted"
    listed = json.loads(_cli(new, "events", "--order", "1234", "--json").stdout)["listed"]
    assert sorted(r["event_id"] for r in listed) == ["evt_new", "evt_old"]
    assert _cli(new, "rotate-keys").exit_code == 0
    only = _app(make_app, keys=f"k2:{KEY2}")
    listed = json.loads(_cli(only, "events", "--order", "1234", "--json").stdout)
    assert sorted(r["event_id"] for r in listed["listed"]) == ["evt_new", "evt_old"]
    assert listed["notes"] == []
    with _store(only).engine.connect() as conn:
        keys = {r[0] for r in conn.execute(sa.select(ORDER_REF.c.key_id))}
    assert keys == {"k2"}


def test_the_backfill_command_and_the_status(make_app: AppFactory) -> None:
    app = _app(make_app)
    for i in range(3):
        assert (
            _post(app, _event("payment_succeeded", f"evt_{i}", f"pay_{i}", f"o{i}")) == "inserted"
        )
    with _store(app).engine.begin() as conn:
        conn.execute(sa.delete(ORDER_REF))  # as before migration 0009
    assert json.loads(_cli(app, "events", "--order", "o1", "--json").stdout)["listed"] == []
    notes = json.loads(_cli(app, "events", "--order", "o1", "--json").stdout)["notes"]
    assert any("order-index backfill" in note for note in notes)
    dry = json.loads(_cli(app, "order-index", "backfill", "--dry-run", "--json").stdout)
    assert dry["events"] == 3 and dry["dry_run"]
    done = _cli(app, "order-index", "backfill")
    assert done.exit_code == 0, done.output
    assert "indexed 3 event(s), 3 reference(s)" in done.stdout and "complete" in done.stdout
    listed = json.loads(_cli(app, "events", "--order", "o1", "--json").stdout)
    assert [r["event_id"] for r in listed["listed"]] == ["evt_1"] and listed["notes"] == []
    status = json.loads(_cli(app, "order-index", "status", "--json").stdout)
    assert status["events_left"] == 0 and status["rows_by_key"] == {"k1": 3}
    text = _cli(app, "order-index", "status").stdout
    assert "fields metadata.order_id,merchant_order_reference_id" in text


def test_the_reconcilers_table_clauses_match_its_models() -> None:
    for clause, model in ((RECON_RUN, ReconcileRun), (RECON_OBJECT, FollowedObject)):
        table = model.__table__  # type: ignore[attr-defined]
        assert clause.name == table.name
        for column in clause.columns:
            assert column.name in table.columns, column.name
            theirs = table.columns[column.name].type
            assert column.type._type_affinity is theirs._type_affinity, column.name


def test_an_adopted_object_whose_events_are_pruned_still_has_a_story(
    make_app: AppFactory,
) -> None:
    """Adoption records a projection and a transition without an event; pruning deletes
    events but keeps their transitions: the story says which."""
    from receiver.config.data_at_rest import RetentionPolicy
    from receiver.storage.sql.tables import PROJECTION, TRANSITION

    app = _app(make_app)
    store = _store(app)
    now = store.now()
    with store.engine.begin() as conn:
        conn.execute(
            sa.insert(PROJECTION),
            {
                "account": "default",
                "object_kind": "payment",
                "object_id": "pay_old",
                "status": "succeeded",
                "stage": None,
                "event_time": now,
                "object_created_at": now,
                "event_pk": 0,
                "updated_at": now,
            },
        )
        conn.execute(
            sa.insert(TRANSITION),
            {
                "account": "default",
                "object_kind": "payment",
                "object_id": "pay_old",
                "state": "succeeded",
                "event_pk": 0,
                "created_at": now,
            },
        )
    adopted = json.loads(_cli(app, "object", "payment:pay_old", "--json").stdout)
    assert adopted["deliveries"] == [] and adopted["projection"]["event_pk"] == 0
    assert [(t["state"], t["source"]) for t in adopted["transitions"]] == [
        ("succeeded", "adoption")
    ]
    assert "by adoption (nothing dispatched)" in _cli(app, "object", "payment:pay_old").stdout
    assert _post(app, _event("payment_succeeded", "evt_gone", "pay_gone", "o-9")) == "inserted"
    WebhookReceiver.state(app).worker(name="t").drain()
    later = now + timedelta(days=200)
    store.clock = lambda: later
    store.retention.prune(RetentionPolicy(done=90, redact=None))
    gone = json.loads(_cli(app, "object", "payment:pay_gone", "--json").stdout)
    assert gone["deliveries"] == []
    assert [(t["state"], t["source"]) for t in gone["transitions"]] == [("succeeded", "pruned")]
    # Its order is no longer found (the index rows went with the event).
    assert json.loads(_cli(app, "events", "--order", "o-9", "--json").stdout)["listed"] == []
