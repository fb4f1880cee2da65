"""The web apps the receive and dispatch benchmarks serve with gunicorn (the one app module).

``create_app()`` is the **yardstick**: a minimal hand-written Flask view that reads the raw
body, verifies the same ``X-Webhook-Signature-512`` (HMAC-SHA512, constant-time compare),
reads ``event_id`` from the JSON and inserts ``(event_id, body)`` into one table with a unique
``event_id`` (``ON CONFLICT DO NOTHING``), then commits and answers 200. It uses the same
driver, connection pool and SQLite durability settings (WAL, ``synchronous=FULL``) as
hookledger, so the ratio measures what hookledger adds on top of "verify + one insert".

``create_hookledger_app()`` is the package under test: a plain merchant app with
``WebhookReceiver`` and one trivial catch-all handler (for the dispatch benchmark).

Both also answer ``GET /ping`` with no work at all (the load generators' floor).

Both are configured from the environment: ``HOOKLEDGER_DATABASE_URL`` and
``HOOKLEDGER_SECRETS`` (the first secret is the yardstick's).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

import sqlalchemy as sa
from flask import Flask, Response, request

from receiver import Event, WebhookReceiver

YARDSTICK_TABLE = "bench_yardstick_event"
SIGNATURE_HEADER = "X-Webhook-Signature-512"

hooks = WebhookReceiver()


@hooks.on_any(name="bench_noop")
def noop(event: Event) -> None:
    """A trivial handler: the dispatch benchmark measures hookledger's own work."""


def _ping() -> Response:
    return Response(b"pong", mimetype="text/plain")


def create_hookledger_app() -> Flask:
    app = Flask("bench_hookledger")
    hooks.init_app(app)
    app.add_url_rule("/ping", "ping", _ping)
    count_to = os.environ.get("HLBENCH_SQL_COUNT")
    if count_to:
        _count_statements(WebhookReceiver.state(app).store.engine, count_to)
    return app


def _count_statements(engine: sa.Engine, directory: str) -> None:
    """Count the statements this process sends (an ``executemany`` is one round trip) and
    write the count to ``<directory>/<pid>`` at exit: the dispatch bench's round trips."""
    import atexit
    from pathlib import Path

    count = [0]

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _count(*_args: Any) -> None:
        count[0] += 1

    atexit.register(lambda: (Path(directory) / str(os.getpid())).write_text(str(count[0])))


def make_yardstick_engine(url: str) -> sa.Engine:
    """The yardstick's engine: the same driver and pool; on SQLite the same durability."""
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_size=5, max_overflow=10, pool_pre_ping=True)
    engine = sa.create_engine(url, connect_args={"timeout": 30.0, "check_same_thread": False})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    return engine


def create_yardstick_table(engine: sa.Engine) -> None:
    blob = "BLOB" if engine.dialect.name == "sqlite" else "BYTEA"
    pk = "INTEGER PRIMARY KEY" if engine.dialect.name == "sqlite" else "BIGSERIAL PRIMARY KEY"
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE TABLE IF NOT EXISTS {YARDSTICK_TABLE} "
                f"(id {pk}, event_id VARCHAR(255) NOT NULL UNIQUE, body {blob} NOT NULL)"
            )
        )


def create_app() -> Flask:
    """The yardstick app."""
    url = os.environ["HOOKLEDGER_DATABASE_URL"]
    spec = os.environ["HOOKLEDGER_SECRETS"].split(",")[0]
    secret = spec.partition(":")[2].encode("utf-8")
    engine = make_yardstick_engine(url)
    insert = sa.text(
        f"INSERT INTO {YARDSTICK_TABLE} (event_id, body) VALUES (:e, :b) "
        "ON CONFLICT (event_id) DO NOTHING"
    )
    app = Flask("bench_yardstick")

    @app.post("/webhooks/")
    def receive() -> tuple[Response, int] | Response:
        body = request.get_data(cache=False)
        given = (request.headers.get(SIGNATURE_HEADER) or "").lower().encode("ascii", "replace")
        expected = hmac.new(secret, body, hashlib.sha512).hexdigest().encode("ascii")
        if not hmac.compare_digest(expected, given):
            return Response(b'{"error":"signature"}', mimetype="application/json"), 401
        try:
            event_id = json.loads(body)["event_id"]
        except (ValueError, KeyError, TypeError):
            return Response(b'{"error":"body"}', mimetype="application/json"), 400
        with engine.begin() as conn:
            conn.execute(insert, {"e": event_id, "b": body})
        return Response(b'{"status":"ok"}', mimetype="application/json")

    app.add_url_rule("/ping", "ping", _ping)
    return app
