"""Filling an inbox with pending deliveries in bulk: where the dispatch bench and the history
drain start (one row written by the package's own ``Store.insert`` is the template).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from bench.bodies import ChainEvent, Template, chain_bodies


def chain_events(n: int, per_object: int) -> list[ChainEvent]:
    """``n`` payment events, ``per_object`` to a payment, an hour old."""
    start = datetime.now(UTC) - timedelta(hours=1)
    return list(chain_bodies(max(1, n // per_object), per_object, start))


def _template_row(engine: sa.Engine) -> dict[str, Any]:
    """One row written by the package's own ``Store.insert``: the columns to copy."""
    from receiver.core.events import parse_event
    from receiver.store import Store

    body = Template().body("evt_" + "0" * 32, "pay_" + "0" * 20)
    Store(engine).inbox.insert(parse_event(body), body)
    from receiver.storage.sql.tables import EVENT

    with engine.begin() as conn:
        # Typed values (SQLite hands a text query's times back as strings).
        row = dict(conn.execute(sa.select(EVENT)).mappings().one())
        conn.execute(sa.text("DELETE FROM hookledger_event"))
    row.pop("id")
    return row


def fill_inbox(
    engine: sa.Engine,
    events: list[ChainEvent],
    *,
    analyze: bool = True,
    accounts: list[str] | None = None,
) -> None:
    """Insert ``events`` as pending webhook deliveries in one transaction (bulk, fast); then
    ``ANALYZE`` the inbox unless told not to (a fresh ledger has no statistics).
    ``accounts``: the processor accounts the events' objects are dealt to in turn (every
    event of one object in the same account); default: all in the default account."""
    from receiver.core.accounts import DEFAULT_ACCOUNT, object_key
    from receiver.storage.tables import InboxEvent

    table: sa.Table = InboxEvent.__table__  # type: ignore[attr-defined]
    template = _template_row(engine)
    now = datetime.now(UTC)
    rows = []
    dealt: dict[str, str] = {}
    for e in events:
        account = (
            dealt.setdefault(e.object_id, accounts[len(dealt) % len(accounts)])
            if accounts
            else DEFAULT_ACCOUNT
        )
        row = dict(template)
        row.update(
            account=account,
            event_id=e.event_id,
            event_type=e.event_type,
            object_id=e.object_id,
            object_status=e.status,
            object_key=object_key(account, "payment", e.object_id),
            event_time=e.event_time,
            body=e.body,
            body_sha256=hashlib.sha256(e.body).hexdigest(),
            received_at=now,
            next_attempt_at=now,
        )
        rows.append(row)
    with engine.begin() as conn:
        for i in range(0, len(rows), 1000):
            conn.execute(table.insert(), rows[i : i + 1000])
    if analyze:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("ANALYZE hookledger_event"))
