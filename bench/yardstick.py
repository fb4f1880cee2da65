"""The web apps the receive and dispatch benchmarks serve with gunicorn (the one app module).

``create_app()`` is the **yardstick**: the fastest honest way to do the same job, by hand,
on the raw driver (``psycopg`` 3 or ``sqlite3``, no SQLAlchemy, no pool pre-ping): read the raw
body, verify the same ``X-Webhook-Signature-512`` (HMAC-SHA512, constant-time compare), read
``event_id`` from the JSON, then one ``INSERT (event_id, body) ... ON CONFLICT (event_id) DO
NOTHING`` into a table with a unique ``event_id``, as a transaction of its own (autocommit: the
statement is its commit, one round trip), and answer 200. Each server thread keeps one
connection of its own (reopened after a failure, that request answered 503). On SQLite the
same durability as hookledger (WAL, ``synchronous=FULL``). So the ratio measures what
hookledger adds on top of "verify + one durable insert".

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
import sqlite3
import threading
from typing import Any

import sqlalchemy as sa
from flask import Flask, Response, abort, request

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


def create_accounts_app() -> Flask:
    """The package under test with ``HLBENCH_ACCOUNTS`` sellers besides the default account
    (:func:`bench.bodies.seller_accounts`, given as the merchant's own account source: their
    configuration would not fit in one environment variable), all on the shared URL."""
    from bench.bodies import seller_accounts
    from receiver.core.accounts import StaticAccounts, parse_accounts

    sellers = StaticAccounts(parse_accounts(seller_accounts(int(os.environ["HLBENCH_ACCOUNTS"]))))
    app = Flask("bench_accounts")
    WebhookReceiver(accounts=sellers).init_app(app)
    app.add_url_rule("/ping", "ping", _ping)
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
    """An engine on the yardstick's database, only to create its table (the yardstick app
    itself uses the raw driver)."""
    return sa.create_engine(url)


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


class RawInserter:
    """One durable ``INSERT ... ON CONFLICT DO NOTHING`` per call on the raw driver, with one
    connection per thread (autocommit: the statement is its own transaction and commit)."""

    def __init__(self, url: str) -> None:
        parsed = sa.make_url(url)
        self._sqlite = parsed.get_backend_name() == "sqlite"
        if self._sqlite:
            self._target = parsed.database or ":memory:"
            self._sql = (
                f"INSERT INTO {YARDSTICK_TABLE} (event_id, body) VALUES (?, ?) "
                "ON CONFLICT (event_id) DO NOTHING"
            )
        else:
            self._target = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
            self._sql = (
                f"INSERT INTO {YARDSTICK_TABLE} (event_id, body) VALUES (%s, %s) "
                "ON CONFLICT (event_id) DO NOTHING"
            )
        self._local = threading.local()

    def _connect(self) -> Any:
        if self._sqlite:
            conn = sqlite3.connect(
                self._target, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=30000")
            return conn
        import psycopg

        return psycopg.connect(self._target, autocommit=True)

    def insert(self, event_id: str, body: bytes) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        try:
            conn.execute(self._sql, (event_id, body))
        except Exception:
            self._local.conn = None
            try:
                conn.close()
            finally:
                raise


def first_secret() -> bytes:
    """The first webhook secret of ``HOOKLEDGER_SECRETS`` (``id:secret,...``)."""
    spec = os.environ["HOOKLEDGER_SECRETS"].split(",")[0]
    return spec.partition(":")[2].encode("utf-8")


def verified_delivery(secret: bytes) -> tuple[bytes, str]:
    """The request's raw body and its ``event_id``, the least a receiver must check: the
    HMAC-SHA512 signature over the raw bytes (else 401) and a JSON body with an
    ``event_id`` (else 400); either error ends the request (``abort``)."""
    body = request.get_data(cache=False)
    given = (request.headers.get(SIGNATURE_HEADER) or "").lower().encode("ascii", "replace")
    expected = hmac.new(secret, body, hashlib.sha512).hexdigest().encode("ascii")
    if not hmac.compare_digest(expected, given):
        abort(Response(b'{"error":"signature"}', status=401, mimetype="application/json"))
    try:
        event_id = json.loads(body)["event_id"]
    except (ValueError, KeyError, TypeError):
        abort(Response(b'{"error":"body"}', status=400, mimetype="application/json"))
    return body, event_id


def create_app() -> Flask:
    """The yardstick app."""
    url = os.environ["HOOKLEDGER_DATABASE_URL"]
    secret = first_secret()
    inserter = RawInserter(url)
    app = Flask("bench_yardstick")

    @app.post("/webhooks/")
    def receive() -> tuple[Response, int] | Response:
        body, event_id = verified_delivery(secret)
        try:
            inserter.insert(event_id, body)
        except Exception:  # noqa: BLE001 - not stored: the sender retries
            return Response(b'{"error":"storage"}', mimetype="application/json"), 503
        return Response(b'{"status":"ok"}', mimetype="application/json")

    app.add_url_rule("/ping", "ping", _ping)
    return app
