"""Two installations in one PostgreSQL database (a schema each) never hold up each other's
claims. A claim takes a non-blocking advisory lock per object before its lease row; those
locks are the database's, not a schema's, so the lock key has to name the installation's own
lease table. With the object key alone, a worker skipped an object whenever another
schema's worker was claiming an object of the same id at that moment, and a drain stopped
with work left (CI saw it as a flaky test: the test schemas share one database)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

import receiver.storage.database as db
from receiver.core.events import parse_event
from receiver.core.retry import RetryPolicy
from receiver.store import Store
from receiver.testing.factories import build_event, encode
from tests.conftest import backend, fresh_database

pytestmark = [
    pytest.mark.storage,
    pytest.mark.skipif(
        backend() != "postgresql", reason="PostgreSQL's advisory locks span its schemas"
    ),
]


def _store(directory: Path) -> Iterator[Store]:
    with fresh_database(directory) as url:
        engine = db.make_engine(url)
        db.upgrade(engine)
        try:
            yield Store(engine, retry=RetryPolicy(max_attempts=3, base_seconds=0, max_seconds=0))
        finally:
            engine.dispose()


@pytest.fixture
def ours(tmp_path: Path) -> Iterator[Store]:
    yield from _store(tmp_path)


@pytest.fixture
def theirs(tmp_path: Path) -> Iterator[Store]:
    yield from _store(tmp_path)


def test_a_claim_in_another_schema_does_not_hold_up_ours(ours: Store, theirs: Store) -> None:
    body = encode(build_event("payment_succeeded", event_id="evt_1", object_id="pay_1"))
    for store in (ours, theirs):
        store.inbox.insert(parse_event(body), body)
    with theirs.engine.connect() as conn, conn.begin():
        # The other installation is in the middle of a claim of its pay_1 (its transaction
        # holds the object's advisory lock until it commits).
        now = theirs.storage.now()
        object_key = conn.execute(sa.text("SELECT object_key FROM hookledger_event")).scalar()
        taken = theirs.storage.sql.take_object_leases(
            conn, [object_key], "their-worker", now, now + timedelta(seconds=60)
        )
        assert taken == {object_key}
        claimed = ours.queue.claim_batch("our-worker", 60)
        assert [c.event_id for c in claimed] == ["evt_1"]
        # Within one installation the lock still keeps two claimers off one object.
        assert theirs.queue.claim_batch("another-of-theirs", 60) == []
