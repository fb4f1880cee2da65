"""A delivery the database cannot store in time because another writer holds a lock is
refused as *busy* (503 ``HL_09``, ``Retry-After``, counted as ``storage_busy``), never as
``storage_unavailable``: that reason means the database is down, and the shipped alert on it
pages someone (issue 29, item 3)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from flask import Flask
from sqlalchemy.engine import make_url

import receiver.core.signals as signals
from receiver.extension import WebhookReceiver
from receiver.testing import signed_headers
from receiver.testing.factories import build_event, encode
from receiver.web.metrics import Metrics
from tests.conftest import SECRETS, backend, build_app
from tests.receiver.web.test_metrics import TOKEN, scrape, value

pytestmark = pytest.mark.storage

PG = backend() == "postgresql"


@contextmanager
def _write_lock_held(database_url: str) -> Iterator[None]:
    """Another session holds what a delivery's insert needs: SQLite's write lock, or on
    PostgreSQL the inbox table (as an operator's migration would)."""
    if not PG:
        path = make_url(database_url).database
        assert path
        conn = sqlite3.connect(path, timeout=5, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            yield
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        return
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("LOCK TABLE hookledger_event IN ACCESS EXCLUSIVE MODE"))
            yield
            conn.rollback()
    finally:
        engine.dispose()


@pytest.fixture
def short_waits(database_url: str) -> Iterator[Flask]:
    """An app whose deliveries give up on a held lock within a fraction of a second: the
    busy timeout on SQLite, a lock timeout on PostgreSQL. (On SQLite without the intake: with
    it a webhook meeting the database's lock is stored there instead, see
    receiver/storage/test_intake.py, which also meets a held intake.)"""
    if PG:
        app, _ = build_app(database_url + quote(" -clock_timeout=300", safe="="))
    else:
        app, _ = build_app(database_url, sqlite_busy_timeout=0.3, sqlite_intake_path="off")
    yield app
    WebhookReceiver.state(app).store.engine.dispose()


def test_a_delivery_waiting_on_a_held_lock_is_busy_not_unavailable(
    short_waits: Flask, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = short_waits
    Metrics(app, token=TOKEN)
    http = app.test_client()
    before = scrape(http)
    seen: list[dict[str, Any]] = []

    def on_rejected(_sender: Any, **info: Any) -> None:
        seen.append(info)

    body = encode(build_event("payment_succeeded", event_id="evt_busy_1"))
    headers = signed_headers(body, SECRETS["primary"])
    signals.event_rejected.connect(on_rejected)
    caplog.set_level(logging.INFO, logger="receiver")
    try:
        with _write_lock_held(database_url):
            refused = http.post("/webhooks/", data=body, headers=headers)
    finally:
        signals.event_rejected.disconnect(on_rejected)
    assert refused.status_code == 503
    assert refused.get_json()["error"]["code"] == "HL_09"
    assert refused.get_json()["error"]["type"] == "api_error"
    assert refused.headers["Retry-After"] == "5"
    assert [(i["reason"], i["status"], i["code"]) for i in seen] == [("storage_busy", 503, "HL_09")]
    after = scrape(http)

    def delta(reason: str) -> float:
        return value(after, "hookledger_rejections_total", reason=reason) - value(
            before, "hookledger_rejections_total", reason=reason
        )

    assert delta("storage_busy") == 1
    assert delta("storage_unavailable") == 0
    # Logged as a warning that says busy, not as the error of an outage.
    lines = [r for r in caplog.records if getattr(r, "action", None) == "rejected"]
    assert [(r.levelno, r.reason) for r in lines] == [(logging.WARNING, "HL_09")]  # type: ignore[attr-defined]
    assert "busy" in lines[0].getMessage()

    # The lock released, the processor's retry is stored.
    stored = http.post("/webhooks/", data=body, headers=headers)
    assert stored.status_code == 200
    assert stored.get_json()["status"] == "inserted"


def test_an_unreachable_database_is_still_unavailable_with_retry_after(tmp_path: Any) -> None:
    """The other 503: nothing there to store into (a missing directory)."""
    down = Flask("down")
    down.config.update(
        HOOKLEDGER_DATABASE_URL=f"sqlite:///{tmp_path / 'no' / 'such' / 'x.sqlite3'}",
        HOOKLEDGER_SECRETS="primary:" + SECRETS["primary"],
    )
    WebhookReceiver(down)
    body = encode(build_event("payment_succeeded"))
    refused = down.test_client().post(
        "/webhooks/", data=body, headers=signed_headers(body, SECRETS["primary"])
    )
    assert refused.status_code == 503
    assert refused.get_json()["error"]["code"] == "HL_03"
    assert refused.headers["Retry-After"] == "30"
    WebhookReceiver.state(down).store.engine.dispose()
