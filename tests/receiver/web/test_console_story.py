"""The console's order search and object story (issue 30) through Flask's test client: behind
the access rule, accounts named, masked, and what the index cannot see said; an operator
without the data keys cannot read order ids out of it."""

from __future__ import annotations

import base64
import json
import re

import pytest
from flask import Flask

from receiver import Event
from receiver.extension import WebhookReceiver
from receiver.testing import signed_headers
from receiver.testing.factories import build_event, encode
from receiver.web.console import SECURITY_HEADERS, Console
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage

PASSWORD = "correct horse battery"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()}
KEY1 = base64.b64encode(b"1" * 32).decode()
SECRET = {"default": "whsec_default_0123456789", "seller_42": "whsec_seller_0123456789"}
ACCOUNTS = json.dumps({"seller_42": {"secrets": f"s1:{SECRET['seller_42']}"}})
CARD = "4111 1111 1111 1111"


def _app(make_app: AppFactory, keys: str | None = f"k1:{KEY1}") -> Flask:
    hooks = WebhookReceiver()

    @hooks.on("payment_failed", name="shop.notify")
    def notify(event: Event) -> None:
        raise RuntimeError(f"declined card {CARD}")

    config = {"secrets": f"s1:{SECRET['default']}", "accounts": ACCOUNTS, "max_attempts": 1}
    if keys:
        config["data_keys"] = keys
    app, _ = make_app(hooks, **config)
    app.secret_key = "console-test-secret"
    Console(app, password=PASSWORD)
    return app


def _post(
    app: Flask, account: str, event_type: str, event_id: str, object_id: str, order: str
) -> None:
    body = encode(
        build_event(
            event_type, event_id=event_id, object_id=object_id, metadata={"order_id": order}
        )
    )
    answer = app.test_client().post(
        f"/webhooks/{account}/", data=body, headers=signed_headers(body, SECRET[account])
    )
    assert answer.status_code == 200, answer.data


def _seed(app: Flask) -> None:
    _post(app, "default", "payment_failed", "evt_dead", "pay_1", "1234")
    _post(app, "seller_42", "payment_succeeded", "evt_sold", "pay_1", "1234")
    _post(app, "default", "payment_succeeded", "evt_other", "pay_9", "<b>9</b>")
    WebhookReceiver.state(app).worker(name="t").drain()


def test_the_pages_are_behind_the_access_rule(make_app: AppFactory) -> None:
    app = _app(make_app)
    _seed(app)
    http = app.test_client()
    for path in ("/hookledger/orders?order=1234", "/hookledger/object?kind=payment&id=pay_1"):
        response = http.get(path)
        assert response.status_code == 401 and b"evt_" not in response.data
        shown = http.get(path, headers=AUTH)
        assert shown.status_code == 200
        for name, value in SECURITY_HEADERS.items():
            assert shown.headers[name] == value


def test_find_an_order_in_every_account_and_open_its_story(make_app: AppFactory) -> None:
    app = _app(make_app)
    _seed(app)
    http = app.test_client()
    html = http.get("/hookledger/orders?order=+1234+", headers=AUTH).get_data(as_text=True)
    rows = re.findall(r'data-event-id="([^"]+)" data-account="([^"]+)"', html)
    assert sorted(rows) == [("evt_dead", "default"), ("evt_sold", "seller_42")]
    assert "data-note" not in html
    links = re.findall(r'class="story" href="([^"]+)"', html)
    assert len(links) == 2 and all("kind=payment" in link for link in links)
    one = http.get("/hookledger/orders?order=1234&account=seller_42", headers=AUTH)
    assert re.findall(r'data-event-id="([^"]+)"', one.get_data(as_text=True)) == ["evt_sold"]
    # An order id of HTML is a value, never markup.
    odd = http.get("/hookledger/orders?order=%3Cb%3E9%3C%2Fb%3E", headers=AUTH).get_data(
        as_text=True
    )
    assert re.findall(r'data-event-id="([^"]+)"', odd) == ["evt_other"] and "<b>9</b>" not in odd
    # The same payment id in two accounts: the story asks which.
    both = http.get("/hookledger/object?kind=payment&id=pay_1", headers=AUTH)
    assert both.status_code == 200
    chooser = both.get_data(as_text=True)
    assert "is in 2 accounts" in chooser and "account=seller_42" in chooser
    story = http.get(
        "/hookledger/object?kind=payment&id=pay_1&account=default", headers=AUTH
    ).get_data(as_text=True)
    assert 'data-event-id="evt_dead"' in story and "evt_sold" not in story
    assert "shop.notify" in story and "RuntimeError" in story
    assert CARD not in story and "•••1111" in story
    assert "dead-lettered: its handlers did not all succeed" in story
    assert http.get("/hookledger/object?kind=payment&id=nope", headers=AUTH).status_code == 404
    assert http.get("/hookledger/object?kind=bogus&id=pay_1", headers=AUTH).status_code == 404
    # The event page links to its object's story.
    event = http.get("/hookledger/events?event_id=evt_sold", headers=AUTH).get_data(as_text=True)
    pk = re.search(r'href="/hookledger/events/(\d+)"', event)
    assert pk is not None
    page = http.get(f"/hookledger/events/{pk.group(1)}", headers=AUTH).get_data(as_text=True)
    assert 'id="object-story" href="/hookledger/object?account=seller_42' in page


def test_an_operator_without_the_data_keys_learns_no_order_id(make_app: AppFactory) -> None:
    """The console of a process without the data keys finds nothing by an order id, says why,
    and shows no digest to guess against (nor does any page show the index)."""
    keyed = _app(make_app)
    _seed(keyed)
    bare = _app(make_app, keys=None)
    http = bare.test_client()
    html = http.get("/hookledger/orders?order=1234", headers=AUTH).get_data(as_text=True)
    assert re.findall(r'data-event-id="([^"]+)"', html) == []
    assert "which this process does not have" in html
    digest = WebhookReceiver.state(keyed).store.keyring.reference_digest("1234", "k1")
    for path in ("/hookledger/orders?order=1234", "/hookledger/events", "/hookledger/events/1"):
        assert digest not in http.get(path, headers=AUTH).get_data(as_text=True)


def test_no_page_shows_the_card_number_a_handler_quoted_in_its_error(
    make_app: AppFactory,
) -> None:
    """The order search lists the dead-lettered event with its reason; the listings, the
    dead letters and the event page show the same error text (the last line, the ledger's
    traceback): masked everywhere, as on the object page."""
    app = _app(make_app)
    _seed(app)
    http = app.test_client()
    pages = [
        "/hookledger/orders?order=1234",
        "/hookledger/events",
        "/hookledger/dead",
        "/hookledger/events/1",
        "/hookledger/object?kind=payment&id=pay_1&account=default",
    ]
    for path in pages:
        html = http.get(path, headers=AUTH).get_data(as_text=True)
        assert "RuntimeError: declined card" in html, path
        assert CARD not in html and "•••1111" in html, path
