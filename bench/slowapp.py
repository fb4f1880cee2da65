"""The app of the slow-handler bench (:mod:`bench.slow_handler`) and of its process tests: the
README's kind of merchant app, with two catch-all handlers that do nothing for an ordinary
event and are slow for an event that asks them to (its payment's ``metadata``):

- ``slow_call`` (no session, like a carrier or e-mail call): ``hlbench_sleep`` seconds;
- ``slow_write`` (takes the session): inserts a row into ``hlbench_effect`` through the
  session, then sleeps ``hlbench_write_sleep`` seconds inside the dispatch's transaction.

Every run of either handler is appended to ``HLBENCH_RUNLOG`` (``<event_id> <handler>``, one
``O_APPEND`` write) when that is set; a slow handler touches ``HLBENCH_STARTED`` when it starts,
so the load begins while it runs. Configured from the environment, like ``bench.yardstick``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa
from flask import Flask, Response
from sqlalchemy.orm import Session

from receiver import Event, WebhookReceiver

EFFECT_TABLE = "hlbench_effect"

hooks = WebhookReceiver()


def _metadata(event: Event) -> dict[str, Any]:
    found = (event.raw.get("content") or {}).get("object", {}).get("metadata") or {}
    return found if isinstance(found, dict) else {}


def _ran(event: Event, handler: str) -> None:
    path = os.environ.get("HLBENCH_RUNLOG")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{event.event_id} {handler}\n".encode())
    finally:
        os.close(fd)


def _started() -> None:
    path = os.environ.get("HLBENCH_STARTED")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()}\n")


@hooks.on_any(name="slow_call")
def slow_call(event: Event) -> None:
    seconds = float(_metadata(event).get("hlbench_sleep") or 0)
    if seconds > 0:
        _started()
        time.sleep(seconds)
    _ran(event, "slow_call")


@hooks.on_any(name="slow_write")
def slow_write(event: Event, session: Session) -> None:
    seconds = float(_metadata(event).get("hlbench_write_sleep") or 0)
    if seconds > 0:
        session.execute(
            sa.text(f"INSERT INTO {EFFECT_TABLE} (event_id) VALUES (:e)"), {"e": event.event_id}
        )
        session.flush()
        _started()
        time.sleep(seconds)
    _ran(event, "slow_write")


def _ping() -> Response:
    return Response(b"pong", mimetype="text/plain")


def create_app() -> Flask:
    app = Flask("bench_slowapp")
    hooks.init_app(app)
    app.add_url_rule("/ping", "ping", _ping)
    return app


def create_effect_table(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE IF NOT EXISTS {EFFECT_TABLE} (event_id VARCHAR(255))"))
