"""The ops console in a real browser (Debian's Chromium, driven by Playwright).

Without Chromium (or Playwright) these tests skip and say why, except under ``CI=true``,
where that is a failure (``.ci/run`` installs Chromium). ``HOOKLEDGER_CONSOLE_SCREENSHOT=path``
also saves a screenshot of the events page there (``docs/console.png``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from receiver import Event
from receiver.extension import WebhookReceiver
from receiver.testing import WebhookTestClient
from receiver.testing.factories import build_event
from receiver.web.console import Console
from tests.conftest import AppFactory
from tests.support import serve, unavailable

PASSWORD = "correct horse battery"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def _chromium() -> str:
    found = os.environ.get("HOOKLEDGER_CHROMIUM") or shutil.which("chromium")
    reason = None
    if not found:
        reason = "Chromium is not installed (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        reason = "Playwright is not installed (pip install -e '.[dev]')"
    if reason:
        unavailable(fail=f"the browser tests are required under CI=true: {reason}", skip=reason)
    assert found
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield b
        b.close()


def seed(app: Flask) -> None:
    """A shop's day: deliveries, a dead letter with a traceback, a stale event, a conflict,
    a deferral, and reconcile runs."""
    client = WebhookTestClient(app)
    for i in range(12):
        client.send("payment_succeeded", event_id=f"evt_paid_{i:02d}", object_id=f"pay_{i:02d}",
                    metadata={"order_id": f"ord_{i:02d}"})  # fmt: skip
    client.send("payment_failed", event_id="evt_dead_1", object_id="pay_f1",
                metadata={"order_id": "ord_f1", "note": "card 4111 1111 1111 1111"})  # fmt: skip
    client.send("refund_succeeded", event_id="evt_dead_2", object_id="ref_1", amount=500)
    client.send("payment_processing", event_id="evt_stale_1", object_id="pay_01")
    first = build_event("dispute_opened", event_id="evt_conflict", object_id="dp_1")
    client.post(first)
    client.post({**first, "timestamp": "2026-11-23T10:00:00.000Z"})
    client.drain()
    from reconcile.storage.store import ReconcileStore
    from tests.support import reconcile_ready

    engine = WebhookReceiver.state(app).store.engine
    reconcile_ready(engine)
    store = ReconcileStore(engine)
    for n in range(14):
        run = store.start_run("incremental" if n % 7 else "wide", "test")
        recovered = (n * 7) % 5
        report = {
            "run_id": run,
            "status": "unresolved" if n == 9 else "ok",
            "dry_run": False,
            "duration_seconds": 0.4 + n / 10,
            "totals": {"checked": 120 + n, "unresolved": 2 if n == 9 else 0},
            "kinds": {"payments": {"recovered_total": recovered, "unresolved": 2 if n == 9 else 0}},
            "sweep": {"refunds": {"recovered_total": n % 3, "unresolved": 0}},
            "events": {"recovered": {"dispute_lost": n % 2}, "unresolved": 0},
            "dead_letter_events": 2,
        }
        store.finish_run(run, report["status"], report)  # type: ignore[arg-type]


@pytest.fixture
def console(make_app: AppFactory) -> Iterator[tuple[Flask, str]]:
    hooks = WebhookReceiver()

    @hooks.on("payment_failed", name="shop.notify_customer")
    def notify(event: Event) -> None:
        raise RuntimeError("mail server down: connection refused")

    @hooks.on("refund_succeeded", name="shop.book_refund")
    def book(event: Event) -> None:
        raise KeyError("order ord_r1 not found")

    @hooks.on("payment_succeeded", name="shop.ship_order")
    def ship(event: Event) -> None:
        pass

    app, _ = make_app(hooks, max_attempts=1)
    app.secret_key = "browser-test-secret-key"
    Console(app, password=PASSWORD)
    seed(app)
    with serve(app) as url:
        yield app, url


def _shoot(page: Any, name: str) -> None:
    """With HOOKLEDGER_CONSOLE_SCREENSHOT set, save this page beside that screenshot."""
    shot = os.environ.get("HOOKLEDGER_CONSOLE_SCREENSHOT")
    if shot:
        page.set_viewport_size({"width": 1400, "height": 900})
        page.screenshot(path=str(Path(shot).with_name(name)), full_page=False)


def _content(page: Any) -> str:
    """The page's HTML once it stopped navigating (to Chromium's error page, say)."""
    from playwright.sync_api import Error

    for _ in range(50):
        try:
            return str(page.content())
        except Error:
            page.wait_for_timeout(100)
    raise AssertionError("the page kept navigating")


def _status(app: Flask, event_id: str) -> str:
    row = WebhookReceiver.state(app).store.operations.get(event_id)
    assert row is not None
    return row.status


def test_an_unauthenticated_browser_sees_nothing(browser: Any, console: tuple[Flask, str]) -> None:
    from playwright.sync_api import Error

    app, url = console
    context = browser.new_context()
    page = context.new_page()
    for path in ("/hookledger/events", "/hookledger/events/1", "/hookledger/reconcile"):
        # Chromium gets the basic-auth challenge, has no credential, and shows nothing.
        try:
            response = page.goto(url + path)
        except Error as exc:
            assert "ERR_INVALID_AUTH_CREDENTIALS" in str(exc)
        else:
            assert response is not None and response.status == 401
        shown = _content(page)
        assert "evt_" not in shown and "pay_" not in shown
    wrong = browser.new_context(http_credentials={"username": "ops", "password": "guess"})
    guess = wrong.new_page()
    try:
        response = guess.goto(url + "/hookledger/events")
    except Error as exc:
        assert "ERR_INVALID_AUTH_CREDENTIALS" in str(exc)
    else:
        assert response is not None and response.status == 401
    assert "evt_" not in _content(guess)
    wrong.close()
    context.close()


def test_a_callable_rule_refuses_a_browser_without_the_login(
    browser: Any, make_app: AppFactory
) -> None:
    app, _ = make_app()
    app.secret_key = "k"
    Console(app, access=lambda: False)
    WebhookTestClient(app).send("payment_succeeded", event_id="evt_hidden")
    with serve(app) as url:
        context = browser.new_context()
        page = context.new_page()
        response = page.goto(url + "/hookledger/events")
        assert response is not None and response.status == 403
        assert "evt_hidden" not in page.content() and "forbidden" in page.content()
        context.close()


def test_an_operator_finds_and_requeues_a_dead_letter(
    browser: Any, console: tuple[Flask, str]
) -> None:
    app, url = console
    context = browser.new_context(http_credentials={"username": "ops", "password": PASSWORD})
    page = context.new_page()
    page.goto(url + "/hookledger/events")
    ids = page.locator("#events tbody tr").evaluate_all("rows => rows.map(r => r.dataset.eventId)")
    assert ids[0] == "evt_conflict" and ids[-1] == "evt_paid_00"  # newest first
    assert "no worker alive" in page.inner_text("#health")
    shot = os.environ.get("HOOKLEDGER_CONSOLE_SCREENSHOT")
    if shot:
        page.set_viewport_size({"width": 1400, "height": 900})
        page.screenshot(path=shot, full_page=False)

    # Filter by status in the form.
    page.select_option("select[name=status]", ["dead"])
    with page.expect_navigation():
        page.click("form.filters button[type=submit]")
    assert "status=dead" in page.url
    listed = page.locator("#events tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.eventId)"
    )
    assert sorted(listed) == ["evt_dead_1", "evt_dead_2"]

    # One event: traceback, masked card number, guard decision.
    with page.expect_navigation():
        page.click("text=evt_dead_1")
    ledger = page.inner_text("#ledger")
    assert "shop.notify_customer" in ledger and "RuntimeError: mail server down" in ledger
    assert "Traceback" in ledger
    _shoot(page, "console-event.png")
    body = page.inner_text("#body")
    assert "4111 1111 1111 1111" not in body and "•••1111" in body
    assert "_secret_" not in body
    with page.expect_navigation():
        page.click("#requeue")
    assert page.inner_text("#notice") == "requeued"
    assert _status(app, "evt_dead_1") == "pending"

    # Bulk: select the other dead letter, see the dry-run count, confirm.
    page.goto(url + "/hookledger/dead")
    page.check("input[name=pk]")
    with page.expect_navigation():
        page.click("#requeue-selected")
    assert "1 dead event(s) would be requeued" in page.inner_text("#would")
    assert _status(app, "evt_dead_2") == "dead"  # nothing changed yet
    with page.expect_navigation():
        page.click("#confirm")
    assert "1 event(s) requeued" in page.inner_text("#notice")
    assert _status(app, "evt_dead_2") == "pending"
    context.close()


def test_an_action_without_the_csrf_token_does_nothing(
    browser: Any, console: tuple[Flask, str]
) -> None:
    app, url = console
    context = browser.new_context(
        http_credentials={"username": "ops", "password": PASSWORD}, bypass_csp=True
    )
    page = context.new_page()
    page.goto(url + "/hookledger/events?event_id=evt_dead_1")
    with page.expect_navigation():
        page.click("text=evt_dead_1")
    assert page.locator("#requeue").count() == 1
    # The form, stripped of its token (what a forged form would send).
    page.evaluate("document.querySelectorAll('input[name=csrf_token]').forEach(e => e.remove())")
    with page.expect_navigation():
        page.click("#requeue")
    assert "nothing was done" in page.content()
    assert _status(app, "evt_dead_1") == "dead"

    # A page on another origin that posts to the console (the browser holds the credential).
    other = url.replace("127.0.0.1", "localhost")
    evil = Flask("evil")

    @evil.get("/")
    def attack() -> str:
        return (
            f'<form id="f" method="post" action="{url}/hookledger/dead/requeue">'
            '<input name="scope" value="matching"><input name="confirm" value="yes"></form>'
            '<button id="go" form="f">win a prize</button>'
        )

    with serve(evil) as evil_url:
        page.goto(evil_url.replace("127.0.0.1", "localhost") + "/")
        with page.expect_navigation():
            page.click("#go")
        assert "nothing was done" in page.content()
    assert _status(app, "evt_dead_1") == "dead" and _status(app, "evt_dead_2") == "dead"
    assert other  # the console itself was never served from there
    context.close()


def test_reconcile_reports_and_stale_events(browser: Any, console: tuple[Flask, str]) -> None:
    _, url = console
    context = browser.new_context(http_credentials={"username": "ops", "password": PASSWORD})
    page = context.new_page()
    page.goto(url + "/hookledger/reconcile")
    assert page.locator("#chart svg rect[data-path]").count() > 10
    assert page.locator("#chart svg rect[data-drift]").count() == 1
    assert page.locator("#runs tbody tr").count() == 14
    _shoot(page, "console-reconcile.png")
    with page.expect_navigation():
        page.click("#runs tbody tr >> nth=4 >> a")
    assert "payments" in page.inner_text("#figures")
    page.goto(url + "/hookledger/stale")
    row = page.locator("tr[data-event-id=evt_stale_1]")
    assert row.count() == 1 and row.locator(".reason").inner_text().strip()
    page.goto(url + "/hookledger/conflicts")
    with page.expect_navigation():
        page.click("#conflicts tbody tr >> nth=0 >> a")
    assert "dispute" in page.inner_text("#conflicting")
    context.close()


def test_an_operator_narrows_the_events_to_one_account(browser: Any, make_app: AppFactory) -> None:
    accounts = {
        "eu": {"secrets": "s1:whsec_eu_0123456789abcdef"},
        "us": {"secrets": "s1:whsec_us_fedcba9876543210"},
    }
    app, _ = make_app(secrets="", accounts=json.dumps(accounts))
    app.secret_key = "browser-test-secret-key"
    Console(app, password=PASSWORD)
    for account in accounts:
        client = WebhookTestClient(app, account=account)
        client.send("payment_succeeded", event_id="evt_same", object_id="pay_1")
        client.send("payment_succeeded", event_id=f"evt_{account}", object_id="pay_2")
    with serve(app) as url:
        context = browser.new_context(http_credentials={"username": "ops", "password": PASSWORD})
        page = context.new_page()
        page.goto(url + "/hookledger/events")

        def listed() -> list[tuple[str, str]]:
            return [
                tuple(row)
                for row in page.locator("#events tbody tr").evaluate_all(
                    "rows => rows.map(r => [r.querySelector('td.account').innerText,"
                    " r.dataset.eventId])"
                )
            ]

        assert sorted(listed()) == [
            ("eu", "evt_eu"),
            ("eu", "evt_same"),
            ("us", "evt_same"),
            ("us", "evt_us"),
        ]
        assert page.locator("#account-queues tr[data-account=us]").count() == 1
        page.select_option("#account-filter", "us")
        with page.expect_navigation():
            page.click("form.filters button[type=submit]")
        assert "account=us" in page.url
        assert sorted(listed()) == [("us", "evt_same"), ("us", "evt_us")]
        assert page.locator("#account-filter").input_value() == "us"
        with page.expect_navigation():
            page.click("text=evt_same")
        assert page.inner_text("#account") == "us"
        context.close()
