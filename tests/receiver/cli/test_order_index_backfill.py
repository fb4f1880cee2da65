"""``hookledger order-index backfill`` interrupted or short of a data key: a search must not
read as "no such order" for the events it has not reached, and the events it could not open
are indexed once the key is back (review of issue 30)."""

from __future__ import annotations

import json
import threading

import pytest
import sqlalchemy as sa
from flask import Flask

from receiver.atrest.order_index import OrderIndex
from receiver.storage.sql.tables import ORDER_REF
from tests.conftest import AppFactory
from tests.receiver.cli.test_order_story import _app, _cli, _event, _post, _store

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
