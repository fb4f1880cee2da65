"""The ops console through Flask's test client: closed by default, CSRF on every action,
every page renders what it says (the browser tests drive it in Chromium)."""

from __future__ import annotations

import base64
import json
import re

import pytest
from flask import Flask

from receiver import Event
from receiver.core.errors import ConfigurationError
from receiver.extension import WebhookReceiver
from receiver.testing import WebhookTestClient
from receiver.web.console import Console
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage

PASSWORD = "correct horse battery"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()}


def _app(make_app: AppFactory) -> Flask:
    hooks = WebhookReceiver()

    @hooks.on("payment_failed", name="notify")
    def notify(event: Event) -> None:
        raise RuntimeError("mail server down")

    app, _ = make_app(hooks, max_attempts=1)
    app.secret_key = "console-test-secret"
    Console(app, password=PASSWORD)
    client = WebhookTestClient(app)
    client.send("payment_succeeded", event_id="evt_ok", object_id="pay_1")
    client.send("payment_failed", event_id="evt_dead", object_id="pay_2",
                metadata={"pan": "4111111111111111"})  # fmt: skip
    client.send("payment_processing", event_id="evt_late", object_id="pay_1")
    client.drain()
    return app


def test_closed_by_default(make_app: AppFactory) -> None:
    app, _ = make_app()
    app.secret_key = "x"
    with pytest.raises(ConfigurationError, match="access rule"):
        Console(app)
    with pytest.raises(ConfigurationError, match="12 characters"):
        Console(app, password="short")
    bare, _ = make_app()
    with pytest.raises(ConfigurationError, match="SECRET_KEY"):
        Console(bare, password=PASSWORD)


def test_unauthenticated_requests_see_nothing(make_app: AppFactory) -> None:
    app = _app(make_app)
    http = app.test_client()
    for path in ("/hookledger/events", "/hookledger/events/1", "/hookledger/dead",
                 "/hookledger/reconcile", "/hookledger/conflicts"):  # fmt: skip
        response = http.get(path)
        assert response.status_code == 401
        assert b"evt_" not in response.data and response.data == b"authentication required\n"
    wrong = {"Authorization": "Basic " + base64.b64encode(b"ops:wrong").decode()}
    assert http.get("/hookledger/events", headers=wrong).status_code == 401
    assert http.post("/hookledger/events/2/requeue").status_code == 401


def test_a_callable_access_rule(make_app: AppFactory) -> None:
    app, _ = make_app()
    app.secret_key = "k"
    allowed = {"yes": False}
    Console(app, access=lambda: allowed["yes"], url_prefix="/ops")
    assert app.test_client().get("/ops/events").status_code == 403
    allowed["yes"] = True
    assert app.test_client().get("/ops/events").status_code == 200


def _token(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match
    return match.group(1)


def test_pages_and_actions(make_app: AppFactory) -> None:
    app = _app(make_app)
    http = app.test_client()
    events = http.get("/hookledger/events", headers=AUTH)
    assert events.status_code == 200
    html = events.get_data(as_text=True)
    assert html.index("evt_late") < html.index("evt_dead") < html.index("evt_ok")  # newest first
    assert "script" not in events.headers["Content-Security-Policy"].replace("'none'", "")
    assert events.headers["X-Frame-Options"] == "DENY"
    filtered = http.get("/hookledger/events?status=dead", headers=AUTH).get_data(as_text=True)
    assert "evt_dead" in filtered and "evt_ok" not in filtered
    stale = http.get("/hookledger/stale", headers=AUTH).get_data(as_text=True)
    assert "evt_late" in stale

    dead = http.get("/hookledger/events?event_id=evt_dead", headers=AUTH).get_data(as_text=True)
    pk = int(re.search(r'href="/hookledger/events/(\d+)"', dead).group(1))  # type: ignore[union-attr]
    page = http.get(f"/hookledger/events/{pk}", headers=AUTH).get_data(as_text=True)
    assert "RuntimeError: mail server down" in page and "Traceback" in page
    assert "4111111111111111" not in page and "•••1111" in page
    assert "client_secret" in page and "_secret_" not in page.split("client_secret", 1)[1][:80]

    # An action without the token (or with a wrong one) does nothing.
    for data in ({}, {"csrf_token": "forged"}):
        refused = http.post(f"/hookledger/events/{pk}/requeue", headers=AUTH, data=data)
        assert refused.status_code == 400
    assert WebhookReceiver.state(app).store.operations.get("evt_dead").status == "dead"  # type: ignore[union-attr]
    # A token from another site's page (Origin) does nothing either.
    token = _token(page)
    cross = http.post(f"/hookledger/events/{pk}/requeue", headers={**AUTH, "Origin": "https://evil.example"},
                      data={"csrf_token": token})  # fmt: skip
    assert cross.status_code == 400

    # Bulk requeue: a dry-run count first, then the confirmation.
    listing = http.get("/hookledger/dead", headers=AUTH).get_data(as_text=True)
    token = _token(listing)
    form = {"csrf_token": token, "scope": "matching", "type": "", "since": "", "until": ""}
    count = http.post("/hookledger/dead/requeue", headers=AUTH, data=form)
    assert "<strong>1</strong> dead event(s) would be requeued" in count.get_data(as_text=True)
    assert WebhookReceiver.state(app).store.operations.get("evt_dead").status == "dead"  # type: ignore[union-attr]
    form = {"csrf_token": token, "scope": "selected", "pk": str(pk), "confirm": "yes"}
    done = http.post("/hookledger/dead/requeue", headers=AUTH, data=form)
    assert done.status_code == 302
    assert WebhookReceiver.state(app).store.operations.get("evt_dead").status == "pending"  # type: ignore[union-attr]

    assert http.get("/hookledger/reconcile", headers=AUTH).status_code == 200
    assert http.get("/hookledger/conflicts", headers=AUTH).status_code == 200


def test_the_example_shop_mounts_metrics_and_the_console(database_url: str) -> None:
    from examples.shop.app import create_app
    from tests.conftest import SECRETS_SPEC

    app = create_app(
        {
            "HOOKLEDGER_DATABASE_URL": database_url,
            "HOOKLEDGER_SECRETS": SECRETS_SPEC,
            "HOOKLEDGER_AUTO_MIGRATE": True,
            "HOOKLEDGER_METRICS_TOKEN": "a-metrics-token-0123456789",
            "HOOKLEDGER_CONSOLE_PASSWORD": PASSWORD,
            "SHOP_SECRET_KEY": "shop-secret",
        }
    )
    http = app.test_client()
    bearer = {"Authorization": "Bearer a-metrics-token-0123456789"}
    assert http.get("/metrics", headers=bearer).status_code == 200
    assert http.get("/hookledger/events", headers=AUTH).status_code == 200
    assert http.get("/hookledger/events").status_code == 401
    WebhookReceiver.state(app).store.engine.dispose()


TWO_ACCOUNTS = json.dumps(
    {
        "eu": {"secrets": "s1:whsec_eu_0123456789abcdef"},
        "us": {"secrets": "s1:whsec_us_fedcba9876543210"},
    }
)


def _two_accounts(make_app: AppFactory) -> Flask:
    """The same event ids in two accounts (no merchant id: each URL takes any body), a dead
    letter in each."""
    hooks = WebhookReceiver()

    @hooks.on("payment_failed", name="notify")
    def notify(event: Event) -> None:
        raise RuntimeError("mail server down")

    app, _ = make_app(hooks, max_attempts=1, secrets="", accounts=TWO_ACCOUNTS)
    app.secret_key = "console-test-secret"
    Console(app, password=PASSWORD)
    for account in ("eu", "us"):
        client = WebhookTestClient(app, account=account)
        client.send("payment_succeeded", event_id="evt_ok", object_id="pay_1")
        client.send("payment_failed", event_id=f"evt_dead_{account}", object_id="pay_2")
    WebhookTestClient(app, account="eu").drain()
    return app


def _listed(html: str) -> list[str]:
    return re.findall(r'<tr data-event-id="([^"]+)">', html)


def test_several_accounts_filter_and_name_their_account(make_app: AppFactory) -> None:
    app = _two_accounts(make_app)
    http = app.test_client()
    html = http.get("/hookledger/events", headers=AUTH).get_data(as_text=True)
    assert sorted(_listed(html)) == ["evt_dead_eu", "evt_dead_us", "evt_ok", "evt_ok"]
    assert "<th>account</th>" in html and 'id="account-filter"' in html
    queues = html.split('id="account-queues"', 1)[1]
    assert 'data-account="eu"' in queues and 'data-account="us"' in queues
    eu = http.get("/hookledger/events?account=eu", headers=AUTH).get_data(as_text=True)
    assert sorted(_listed(eu)) == ["evt_dead_eu", "evt_ok"]
    assert '<option value="eu" selected>' in eu
    both = http.get("/hookledger/events?account=eu&account=us", headers=AUTH)
    assert len(_listed(both.get_data(as_text=True))) == 4
    # A removed account (not configured) can still be looked at; a malformed id is ignored.
    assert (
        _listed(http.get("/hookledger/events?account=old", headers=AUTH).get_data(as_text=True))
        == []
    )
    malformed = http.get("/hookledger/events?account=Bad%20Id", headers=AUTH)
    assert len(_listed(malformed.get_data(as_text=True))) == 4

    # The event page names its account; paging links keep the filter.
    pk = WebhookReceiver.state(app).store.operations.get("evt_ok", account="us").id  # type: ignore[union-attr]
    page = http.get(f"/hookledger/events/{pk}", headers=AUTH).get_data(as_text=True)
    assert re.search(r'<dd id="account"><a [^>]*>us</a></dd>', page)
    paged = http.get("/hookledger/events?account=us&limit=1", headers=AUTH).get_data(as_text=True)
    assert "account=us" in paged.split('rel="next"', 1)[0].rsplit("href=", 1)[1]

    # Requeue all matching on the dead page filtered to eu: eu's dead letter only.
    dead = http.get("/hookledger/dead?account=eu", headers=AUTH).get_data(as_text=True)
    assert _listed(dead) == ["evt_dead_eu"]
    assert '<input type="hidden" name="account" value="eu">' in dead
    form = {"csrf_token": _token(dead), "scope": "matching", "type": "", "since": "",
            "until": "", "account": "eu"}  # fmt: skip
    count = http.post("/hookledger/dead/requeue", headers=AUTH, data=form).get_data(as_text=True)
    assert "<strong>1</strong> dead event(s) of account(s) eu would be requeued" in count
    assert '<input type="hidden" name="account" value="eu">' in count
    done = http.post("/hookledger/dead/requeue", headers=AUTH, data={**form, "confirm": "yes"})
    assert done.status_code == 302
    operations = WebhookReceiver.state(app).store.operations
    assert operations.get("evt_dead_eu", account="eu").status == "pending"  # type: ignore[union-attr]
    assert operations.get("evt_dead_us", account="us").status == "dead"  # type: ignore[union-attr]
    stale = http.get("/hookledger/stale?account=us", headers=AUTH).get_data(as_text=True)
    assert 'id="account-scope"' in stale


def test_the_object_filter_finds_an_object_in_every_account(make_app: AppFactory) -> None:
    """Issue 28, hole 10: the object filter compared the stored key, ``eu/payment:pay_1``
    outside the default account, with ``payment:pay_1``: it found nothing there. Now
    ``kind:id`` is the object in the accounts chosen, or in every account (each row naming
    its account), and the object links of the listing (``account/kind:id``) keep working."""
    app = _two_accounts(make_app)
    http = app.test_client()

    def listed(query: str) -> list[str]:
        html = http.get(f"/hookledger/events?{query}", headers=AUTH).get_data(as_text=True)
        rows = re.findall(r'<td class="account"><a [^>]*>([^<]+)</a></td>', html)
        assert len(rows) == len(_listed(html))
        return sorted(f"{a} {e}" for a, e in zip(rows, _listed(html), strict=True))

    assert listed("object=payment:pay_1&account=eu") == ["eu evt_ok"]
    assert listed("object=payment:pay_1") == ["eu evt_ok", "us evt_ok"]
    assert listed("object=us/payment:pay_1") == ["us evt_ok"]
    assert listed("object=pay_2&account=us") == ["us evt_dead_us"]
    eu = http.get("/hookledger/events?account=eu", headers=AUTH).get_data(as_text=True)
    assert "object=eu/payment:pay_1" in eu.replace("%2F", "/").replace("%3A", ":")


def test_one_account_shows_no_account_column(make_app: AppFactory) -> None:
    app = _app(make_app)
    html = app.test_client().get("/hookledger/events", headers=AUTH).get_data(as_text=True)
    assert "<th>account</th>" not in html and "account-filter" not in html
    assert "account-queues" not in html
