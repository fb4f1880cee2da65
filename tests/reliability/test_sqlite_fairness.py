"""SQLite: a worker busy with slow handlers must not starve the receiver into 503s."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from receiver.store import Store
from receiver.testing.factories import build_event, encode
from tests.conftest import backend
from tests.reliability._procs import (
    Procs,
    free_port,
    migrated_engine,
    signed_post,
    wait_healthy,
    wait_until,
)

pytestmark = [pytest.mark.storage, pytest.mark.slow]


@pytest.mark.skipif(backend() != "sqlite", reason="SQLite's single-writer lock only")
def test_webhooks_are_stored_while_a_worker_runs_slow_handlers(
    database_url: str, tmp_path: Path
) -> None:
    """Regression: a worker committing batch after batch held SQLite's write lock nearly all
    the time; webhooks waited out the busy timeout and got 503."""
    import receiver.storage.database as db
    from receiver.core.events import parse_event

    with migrated_engine(database_url):
        engine = db.make_engine(database_url)
        store = Store(engine)
        for i in range(40):
            body = encode(build_event("payment_succeeded", object_id=f"pay_backlog_{i}"))
            store.inbox.insert(parse_event(body), body)
        engine.dispose()
        procs = Procs(
            tmp_path, database_url, RELAPP_SLEEP="0.1", RELAPP_RUNLOG=str(tmp_path / "runlog")
        )
        port = free_port()
        try:
            procs.gunicorn(port, workers=2)
            base = f"http://127.0.0.1:{port}/webhooks/"
            wait_healthy(base, procs=procs)
            procs.worker("--poll-interval", "0.05")
            runlog = tmp_path / "runlog"
            wait_until(
                lambda: runlog.exists() and runlog.stat().st_size > 0,
                timeout=30,
                message="the worker to start on the backlog",
            )
            codes = []
            with requests.Session() as http:
                for i in range(15):
                    body = encode(build_event("refund_succeeded", object_id=f"ref_live_{i}"))
                    codes.append(signed_post(http, base, body, timeout=30).status_code)
            assert codes == [200] * 15, procs.tail()
        finally:
            procs.close()
