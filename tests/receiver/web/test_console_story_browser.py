"""The console's order search and object story in a real browser (Debian's Chromium, driven
by Playwright), with the fixtures of ``test_console_browser``: skipped without Chromium,
except under ``CI=true``. With ``HOOKLEDGER_CONSOLE_SCREENSHOT=docs/console.png`` the pages
are saved beside it (``docs/console-orders.png``, ``docs/console-object.png``)."""

from __future__ import annotations

from typing import Any

from flask import Flask

from tests.receiver.web.test_console_browser import (  # noqa: F401 - fixtures
    PASSWORD,
    _shoot,
    browser,
    console,
)


def test_support_finds_an_order_and_reads_its_story(
    browser: Any,  # noqa: F811
    console: tuple[Flask, str],  # noqa: F811
) -> None:
    _app, url = console
    context = browser.new_context(http_credentials={"username": "ops", "password": PASSWORD})
    page = context.new_page()
    page.goto(url + "/hookledger/events")
    # The header's search box, from any page.
    page.fill("form.find input[name=order]", "ord_f1")
    with page.expect_navigation():
        page.press("form.find input[name=order]", "Enter")
    assert "/hookledger/orders?order=ord_f1" in page.url
    found = page.locator("#orders tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.eventId, r.dataset.account])"
    )
    assert found == [["evt_dead_1", "default"]]
    assert page.locator("[data-note]").count() == 0
    _shoot(page, "console-orders.png")
    with page.expect_navigation():
        page.click("#orders a.story")
    assert page.inner_text("h1") == "payment:pay_f1"
    deliveries = page.inner_text("#deliveries")
    assert "evt_dead_1" in deliveries and "dead" in deliveries
    assert "shop.notify_customer" in deliveries and "mail server down" in deliveries
    assert "4111 1111 1111 1111" not in page.content()
    transitions = page.inner_text("#story-transitions")
    assert "failed" in transitions and "webhook" in transitions
    assert "dead-lettered" in transitions
    assert "processor last said" in page.inner_text("#summary")
    _shoot(page, "console-object.png")
    # From an event page to its object's story, and an order nobody placed.
    page.goto(url + "/hookledger/events?event_id=evt_paid_03")
    with page.expect_navigation():
        page.click("text=evt_paid_03")
    with page.expect_navigation():
        page.click("#object-story")
    assert page.inner_text("h1") == "payment:pay_03"
    page.goto(url + "/hookledger/orders?order=nobody")
    assert "No stored event carries this order reference" in page.inner_text("#orders")
    context.close()
