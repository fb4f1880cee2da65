"""Shared fixtures: a fresh database per test, SQLite by default or PostgreSQL on demand.

``HOOKLEDGER_TEST_DATABASE=postgresql`` runs the storage tests on PostgreSQL
(``HOOKLEDGER_TEST_PG_URL``, default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``),
each test in a schema of its own that is dropped afterwards. Without a reachable server the
tests skip with the reason, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from flask import Flask

import receiver.storage.database as db
from receiver.core.retry import RetryPolicy
from receiver.extension import WebhookReceiver
from receiver.store import Store
from tests.support import unavailable

SECRETS = {"primary": "whsec_primary_0123456789", "previous": "whsec_previous_9876543210"}
SECRETS_SPEC = ",".join(f"{k}:{v}" for k, v in SECRETS.items())
PG_URL = os.environ.get(
    "HOOKLEDGER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def backend() -> str:
    return os.environ.get("HOOKLEDGER_TEST_DATABASE", "sqlite")


def _pg_unavailable(reason: str) -> NoReturn:
    unavailable(
        fail=f"PostgreSQL is required under CI=true: {reason}",
        skip=f"PostgreSQL not reachable ({reason}); storage tests ran on SQLite only",
    )


@contextmanager
def fresh_database(directory: Path) -> Iterator[str]:
    """The URL of a new, empty database: a SQLite file in ``directory``, or on PostgreSQL a
    schema of its own, dropped afterwards."""
    if backend() != "postgresql":
        yield f"sqlite:///{directory / f'hookledger-{uuid.uuid4().hex[:8]}.sqlite3'}"
        return
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    schema = f"hl_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        _pg_unavailable(str(exc.orig).splitlines()[0] if exc.orig else str(exc))
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def database_url(tmp_path: Path) -> Iterator[str]:
    """A URL of an empty database reachable by this process and by child processes."""
    with fresh_database(tmp_path) as url:
        yield url


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    eng = db.make_engine(database_url)
    db.upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def store(engine: sa.Engine) -> Store:
    return Store(engine, retry=RetryPolicy(max_attempts=3, base_seconds=0.0, max_seconds=0.0))


AppFactory = Callable[..., tuple[Flask, WebhookReceiver]]


def build_app(
    database_url: str, hooks: WebhookReceiver | None = None, **config: Any
) -> tuple[Flask, WebhookReceiver]:
    """A Flask app with a receiver on ``database_url`` (schema migrated, no retry delays)."""
    app = Flask("hookledger_test")
    app.config.update(
        {
            "HOOKLEDGER_DATABASE_URL": database_url,
            "HOOKLEDGER_SECRETS": SECRETS_SPEC,
            "HOOKLEDGER_AUTO_MIGRATE": True,
            "HOOKLEDGER_BACKOFF_BASE": 0,
            "HOOKLEDGER_BACKOFF_MAX": 0,
            **{f"HOOKLEDGER_{k.upper()}": v for k, v in config.items()},
        }
    )
    receiver = hooks or WebhookReceiver()
    receiver.init_app(app)
    return app, receiver


@pytest.fixture
def make_app(database_url: str) -> Iterator[AppFactory]:
    """Build a Flask app with a receiver on the test database (schema migrated)."""
    made: list[Flask] = []

    def factory(
        hooks: WebhookReceiver | None = None, **config: Any
    ) -> tuple[Flask, WebhookReceiver]:
        app, receiver = build_app(database_url, hooks, **config)
        made.append(app)
        return app, receiver

    yield factory
    for app in made:
        WebhookReceiver.state(app).store.engine.dispose()
