"""In-process helpers shared by the reliability tests (no child processes, loopback only).

- :func:`strict_app`: an app whose escaping exceptions fail the test instead of becoming 500s.
- :func:`row_counts`: inbox and conflict row counts, to assert deltas per request.
- :func:`extra_database_url`: a second empty database on the backend under test.
- :func:`card_payment`: a confirmed card payment in a sandbox (the processor's truth).
- :func:`reconcile_store`: a receiver store with the reconciler's tables on a database URL.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from flask import Flask

import receiver.storage.database as db
from receiver.core.retry import RetryPolicy
from receiver.storage.tables import EventConflict, InboxEvent
from receiver.store import Store
from reconcile.sandbox import SandboxServer
from tests.conftest import PG_URL, backend
from tests.support import reconcile_ready

SANDBOX_API_KEY = "snd_reliability_0123456789abcdef"

#: Sandbox test cards (reconcile/sandbox/cards.py).
CARD_OK = "4242424242424242"
CARD_OK_MASTERCARD = "5555555555554444"
CARD_DECLINED = "4000000000009995"
CARD_PROCESSING = "4000000000000077"
FULL_CARD_NUMBERS = (
    CARD_OK,
    CARD_OK_MASTERCARD,
    CARD_DECLINED,
    CARD_PROCESSING,
    "4000000000000002",
    "4000000000000069",
)


def strict_app(app: Flask) -> Flask:
    """Make an exception escaping a view propagate to the test client (so it fails the test)."""
    app.testing = True
    app.config["PROPAGATE_EXCEPTIONS"] = True
    return app


@dataclass(frozen=True, slots=True)
class Counts:
    inbox: int
    conflicts: int


def row_counts(engine: sa.Engine) -> Counts:
    inbox: sa.Table = InboxEvent.__table__  # type: ignore[attr-defined]
    conflicts: sa.Table = EventConflict.__table__  # type: ignore[attr-defined]
    with engine.connect() as conn:
        n_inbox = conn.execute(sa.select(sa.func.count()).select_from(inbox)).scalar_one()
        n_conflicts = conn.execute(sa.select(sa.func.count()).select_from(conflicts)).scalar_one()
    return Counts(int(n_inbox), int(n_conflicts))


@contextmanager
def extra_database_url(tmp_path: Path, name: str) -> Iterator[str]:
    """Another empty database on the backend under test (SQLite file or PostgreSQL schema)."""
    if backend() != "postgresql":
        yield f"sqlite:///{tmp_path / f'{name}.sqlite3'}"
        return
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    schema = f"hl_rel_{name}_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        pytest.skip(f"PostgreSQL not reachable: {exc}")
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@contextmanager
def reconcile_store(database_url: str) -> Iterator[Store]:
    """A receiver :class:`Store` on ``database_url`` with every hookledger table migrated."""
    engine = db.make_engine(database_url)
    try:
        db.upgrade(engine)
        reconcile_ready(engine)
        yield Store(engine, retry=RetryPolicy(max_attempts=3, base_seconds=0.0, max_seconds=0.0))
    finally:
        engine.dispose()


def card_payment_body(
    payment_id: str,
    card: str = CARD_OK,
    *,
    amount: int = 2500,
    capture_method: str = "automatic",
    order_id: str | None = None,
) -> dict[str, Any]:
    return {
        "amount": amount,
        "currency": "USD",
        "payment_id": payment_id,
        "confirm": True,
        "capture_method": capture_method,
        "payment_method": "card",
        "payment_method_type": "credit",
        "payment_method_data": {
            "card": {
                "card_number": card,
                "card_exp_month": "12",
                "card_exp_year": "2030",
                "card_cvc": "123",
                "card_holder_name": "Rel Iability",
            }
        },
        "metadata": {"order_id": order_id or payment_id},
    }


def card_payment(
    server: SandboxServer,
    payment_id: str,
    card: str = CARD_OK,
    *,
    amount: int = 2500,
    capture_method: str = "automatic",
    order_id: str | None = None,
) -> dict[str, Any]:
    """Create and confirm a card payment directly in the sandbox's state."""
    return server.sandbox.create_payment(
        card_payment_body(
            payment_id, card, amount=amount, capture_method=capture_method, order_id=order_id
        )
    )
