"""``hookledger order-index backfill`` interrupted or short of a data key: a search must not
read as "no such order" for the events it has not reached, and the events it could not open
are indexed once the key is back (review of issue 30)."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

import receiver.atrest.order_index as order_index
from receiver.atrest.order_index import OrderIndex
from receiver.extension import WebhookReceiver
from receiver.storage.sql.tables import ORDER_REF
from tests.conftest import AppFactory, backend, build_app
from tests.receiver.cli.test_order_story import KEY1, KEY2, _app, _cli, _event, _post, _store

pytestmark = pytest.mark.storage


def _stored_before_the_index(app: Flask, count: int) -> None:
    for i in range(count):
        body = _event("payment_succeeded", f"evt_{i}", f"pay_{i}", f"o{i}")
        assert _post(app, body) == "inserted"
    with _store(app).engine.begin() as conn:
        conn.execute(sa.delete(ORDER_REF))  # as before migration 0009


def _search(app: Flask, order: str) -> dict[str, list[str]]:
    found = json.loads(_cli(app, "events", "--order", order, "--json").stdout)
    return {"listed": [r["event_id"] for r in found["listed"]], "notes": found["notes"]}


def test_a_search_after_a_stopped_backfill_says_the_rest_is_not_indexed(
    make_app: AppFactory,
) -> None:
    app = _app(make_app)
    _stored_before_the_index(app, 4)
    stop = threading.Event()
    index = OrderIndex(_store(app).storage, batch_size=1)
    report = index.backfill(stop=stop, progress=lambda _n: stop.set())
    assert report.stopped and report.events == 1
    found = _search(app, "o3")
    assert found["listed"] == []
    assert any("has not finished (every account)" in n for n in found["notes"]), found
    text = _cli(app, "events", "--order", "o3")
    assert "order-index backfill` has not finished" in text.stderr
    assert _cli(app, "order-index", "backfill").exit_code == 0
    assert _search(app, "o3") == {"listed": ["evt_3"], "notes": []}


def test_a_stopped_backfill_of_one_account_is_covered_by_a_later_complete_one(
    make_app: AppFactory,
) -> None:
    app = _app(make_app)
    _stored_before_the_index(app, 3)
    stop = threading.Event()
    stop.set()
    OrderIndex(_store(app).storage).backfill(accounts=["default"], stop=stop)
    notes = _search(app, "o1")["notes"]
    assert any("has not finished (account(s) default)" in n for n in notes), notes
    # A search of another account is not concerned by it.
    other = json.loads(
        _cli(app, "events", "--order", "o1", "--account", "seller_42", "--json").stdout
    )
    assert not any("has not finished" in n for n in other["notes"]), other
    assert _cli(app, "order-index", "backfill").exit_code == 0
    assert _search(app, "o1") == {"listed": ["evt_1"], "notes": []}


def test_events_a_backfill_could_not_open_are_indexed_once_their_key_is_back(
    make_app: AppFactory,
) -> None:
    """A backfill run with a data key missing (a process configured before the key was
    added back, or a key dropped before rotate-keys finished) skips the events sealed with
    it; a later run with the key must index them, not start after them."""
    app = _app(make_app)  # sealed with k1
    _stored_before_the_index(app, 3)
    without = _app(make_app, keys=f"k2:{KEY2}")
    short = _cli(without, "order-index", "backfill")
    assert short.exit_code == 1, short.output
    assert "cannot be opened: 3 under 'k1'" in short.stdout
    assert "configure those keys (HOOKLEDGER_DATA_KEYS) and run it again" in short.stdout
    status = json.loads(_cli(without, "order-index", "status", "--json").stdout)
    assert status["events_left"] == 3 and status["backfill"]["finished_at"] is None
    notes = _search(without, "o1")["notes"]
    assert any("has not finished (every account)" in n for n in notes), notes
    both = _app(make_app, keys=f"k2:{KEY2},k1:{KEY1}")
    done = _cli(both, "order-index", "backfill")
    assert done.exit_code == 0, done.output
    assert "indexed 3 event(s), 3 reference(s)" in done.stdout
    assert _search(both, "o1") == {"listed": ["evt_1"], "notes": []}
    status = json.loads(_cli(both, "order-index", "status", "--json").stdout)
    assert status["events_left"] == 0 and status["rows_by_key"] == {"k2": 3}


def test_events_after_an_unreadable_one_are_indexed_and_read_again_next_time(
    make_app: AppFactory,
) -> None:
    """Events the backfill could open after one it could not are indexed at once (found by
    a search), and indexed again, not twice, by the run that opens the rest."""
    sealed = _app(make_app)
    assert _post(sealed, _event("payment_succeeded", "evt_k1", "pay_a", "o-a")) == "inserted"
    later = _app(make_app, keys=f"k2:{KEY2}")
    assert _post(later, _event("payment_succeeded", "evt_k2", "pay_b", "o-b")) == "inserted"
    with _store(later).engine.begin() as conn:
        conn.execute(sa.delete(ORDER_REF))
    assert _cli(later, "order-index", "backfill").exit_code == 1
    assert _search(later, "o-b")["listed"] == ["evt_k2"]
    both = _app(make_app, keys=f"k2:{KEY2},k1:{KEY1}")
    assert _cli(both, "order-index", "backfill").exit_code == 0
    assert _search(both, "o-a")["listed"] == ["evt_k1"]
    assert _search(both, "o-b") == {"listed": ["evt_k2"], "notes": []}
    with _store(both).engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(ORDER_REF)).scalar() == 2


def test_a_redaction_during_the_backfill_leaves_no_index_row_of_what_it_redacted(
    make_app: AppFactory, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: `redact` commits between the backfill's read of a batch (the bodies still
    there) and its write of their index rows. The rows must not outlive the bodies they were
    read from: the redaction waits for the batch (it locks what it reads), then deletes them.
    (SQLite: one writer at a time, the batch is atomic.)"""
    if backend() != "postgresql":
        pytest.skip("a race of two writers: PostgreSQL's (SQLite has one writer at a time)")
    app = _app(make_app)
    _stored_before_the_index(app, 2)
    WebhookReceiver.state(app).worker(name="t").drain()  # done: old enough, redactable
    tag = f"hl_redact_{uuid.uuid4().hex[:8]}"
    other, _ = build_app(
        f"{database_url}&application_name={tag}",
        secrets="s1:whsec_default_0123456789",
        data_keys=f"k1:{KEY1}",
    )
    redactor = WebhookReceiver.state(other).store
    later = redactor.now() + timedelta(days=400)
    redactor.clock = lambda: later
    done: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: done.update(counts=redactor.retention.redact(timedelta(days=30)))
    )
    original = order_index.reindex

    def read_then_redact(*args: Any, **kwargs: Any) -> None:
        # The batch has been read: the redaction runs now, and commits unless it has to
        # wait for this transaction.
        thread.start()
        with _store(app).engine.connect() as conn:
            waiting = sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = :tag"
                " AND wait_event_type = 'Lock'"
            )
            while thread.is_alive() and not conn.execute(waiting, {"tag": tag}).scalar():
                thread.join(0.05)
        original(*args, **kwargs)

    monkeypatch.setattr(order_index, "reindex", read_then_redact)
    try:
        OrderIndex(_store(app).storage).backfill()
    finally:
        thread.join()
        WebhookReceiver.state(other).store.engine.dispose()
    assert done["counts"]["events"] == 2
    with _store(app).engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(ORDER_REF)).scalar() == 0
    assert _search(app, "o1")["listed"] == []
