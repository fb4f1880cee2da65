"""The reconciler's "is something already waiting for this object?" check is one index probe
per object, whatever the number of open events of other objects (it used to filter every
open event: a reconcile run grew quadratic with the backlog of recovered events)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from receiver.core.events import parse_event
from receiver.store import Store
from receiver.testing.factories import build_event, encode

pytestmark = pytest.mark.storage


def test_waiting_objects_probe_the_object_index(store: Store) -> None:
    for n in range(300):
        body = encode(build_event("payment_succeeded", object_id=f"pay_{n}"))
        store.inbox.insert(parse_event(body), body)
    assert store.inbox.waiting(["payment:pay_7", "payment:pay_none"]) == {"payment:pay_7"}
    keys = [f"payment:pay_{n}" for n in range(25)]
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "postgresql":
            from receiver.storage.sql.postgresql import WAITING_OBJECTS

            conn.exec_driver_sql("ANALYZE hookledger_event")
            plan = "\n".join(
                r[0]
                for r in conn.execute(sa.text("EXPLAIN " + WAITING_OBJECTS.text), {"keys": keys})
            )
        else:
            from receiver.storage.sql.sqlite import waiting_sql

            names = {f"k{i}": k for i, k in enumerate(keys)}
            explain = sa.text("EXPLAIN QUERY PLAN " + waiting_sql(len(keys)))
            plan = "\n".join(str(r) for r in conn.execute(explain, names))
    assert "ix_hookledger_event_object" in plan, plan
