"""A database that stops answering never silently stalls a worker (issue 29, item 4).

Measured before: a proxy that swallowed the worker's queries for 20 s, then answered new
connections again: 90 s after the database came back, 5 of 10 stored events were still not
dispatched, the worker had written no log line, and ``worker --burst`` never returned.

Here a real ``hookledger worker`` process reaches PostgreSQL only through the test's own
proxy (:mod:`tests.reliability.tcp_proxy`), which is switched to ``stall``: every open link
stays open and swallows every byte, new connections are accepted and swallowed too, and after
``restore`` the stalled links stay stalled (only new connections are answered). The web
process stores webhooks directly meanwhile. Short bounds through the environment
(``HOOKLEDGER_STATEMENT_TIMEOUT=1``: a stall is logged after 1 s and cut after 3 s) keep the
test's wall clock small.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from tests.apps.relapp import SESSION_HANDLERS, read_runlog
from tests.conftest import backend
from tests.reliability._procs import (
    Procs,
    effect_pids,
    effects,
    free_port,
    inbox_rows,
    migrated_engine,
    statuses,
    wait_healthy,
    wait_until,
)
from tests.reliability.tcp_proxy import TcpProxy
from tests.reliability.test_outage import _deliver_all, _events

pytestmark = [
    pytest.mark.storage,
    pytest.mark.slow,
    pytest.mark.skipif(backend() != "postgresql", reason="a stalled network link"),
]

#: The worker's bounds for the test (seconds): stalled after 1 s, cut after 3 s.
BOUNDS = {
    "HOOKLEDGER_STATEMENT_TIMEOUT": "1",
    "HOOKLEDGER_LOCK_TIMEOUT": "0.5",
    "HOOKLEDGER_LOG_FORMAT": "json",
}
#: What the worker logs, as JSON lines.
ACTIONS = ("stalled", "stall_cut", "worker_storage_error", "resumed", "worker_gave_up")


@pytest.fixture
def migrated(database_url: str) -> Iterator[sa.Engine]:
    with migrated_engine(database_url) as engine:
        yield engine


def _actions(output: str) -> list[dict[str, object]]:
    lines = []
    for line in output.splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("action") in ACTIONS:
            lines.append(record)
    return lines


def _done(engine: sa.Engine, event_ids: list[str]) -> bool:
    current = statuses(engine)
    return all(current.get(e) == "done" for e in event_ids)


def test_a_stalled_database_is_logged_the_worker_resumes_by_itself_and_burst_exits_5(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    runlog = tmp_path / "runlog.txt"
    procs = Procs(tmp_path, database_url, RELAPP_RUNLOG=str(runlog))
    url = make_url(database_url)
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432).start()
    through = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    try:
        port = free_port()
        procs.gunicorn(port, workers=2)  # straight to the database: it keeps storing
        base = f"http://127.0.0.1:{port}/webhooks/"
        wait_healthy(base, procs=procs)
        procs.database_url = through
        worker = procs.worker("--poll-interval", "0.1", "--lease-seconds", "10", **BOUNDS)

        before = _events("warm", 3)
        assert {d.status for d in _deliver_all(base, before, timeout=15, parallel=2)} == {200}
        wait_until(lambda: _done(migrated, list(before)), timeout=60, message="warm-up done")

        proxy.cut("stall")
        stalled_at = time.monotonic()
        during = _events("stalled", 10)
        assert {d.status for d in _deliver_all(base, during, timeout=15, parallel=2)} == {200}
        # The worker says that it waits, and on what, then cuts the connection.
        wait_until(
            lambda: {"stalled", "stall_cut"} <= {a["action"] for a in _actions(worker.output())},
            timeout=60,
            message="the stall logged",
        )
        logged_after = time.monotonic() - stalled_at
        stalled = next(a for a in _actions(worker.output()) if a["action"] == "stalled")
        assert stalled["phase"] and stalled["waiting_on"], stalled

        # worker --burst meanwhile: exit 5, in bounded time (the old code: never).
        started = time.monotonic()
        burst = procs.worker("--burst", "--lease-seconds", "10", name="burst", **BOUNDS)
        wait_until(lambda: not burst.alive(), timeout=90, message="worker --burst to end")
        burst_seconds = time.monotonic() - started
        assert burst.popen.returncode == 5, burst.output()
        assert "did not answer" in burst.output()

        assert worker.alive(), worker.output()
        assert not _done(migrated, list(during))
        proxy.restore()  # new connections are answered; the stalled ones stay stalled
        restored = time.monotonic()
        everything = [*before, *during]
        wait_until(
            lambda: _done(migrated, everything) or not worker.alive(),
            timeout=90,
            message="everything dispatched after the stall",
        )
        drained_after = time.monotonic() - restored
        assert worker.alive(), worker.output()
        wait_until(
            lambda: "resumed" in {a["action"] for a in _actions(worker.output())},
            timeout=30,
            message="resumed logged",
        )
        # The same worker process, never restarted, ran every handler once.
        assert effect_pids(migrated) == {worker.pid}
        assert procs.stop(worker) == 0, worker.output()
        rows = inbox_rows(migrated)
        assert sorted(r["event_id"] for r in rows) == sorted(everything)
        assert effects(migrated) == {(e, h): 1 for e in everything for h in SESSION_HANDLERS}
        assert set(e for e, _ in read_runlog(runlog)) == set(everything)
        print(
            f"stall logged after {logged_after:.1f} s; worker --burst exited 5 after "
            f"{burst_seconds:.1f} s; all {len(everything)} events done {drained_after:.1f} s "
            "after the database answered again"
        )
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()
        proxy.close()


def test_a_connect_that_is_never_answered_is_logged_as_a_stall_and_the_worker_resumes(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    """PostgreSQL accepts the TCP connection and never answers the startup (a hung server or
    pooler; the proxy's ``blackhole``): the worker's reconnect is bounded by the connect
    timeout and logged ``action=stalled`` with what it waits on (host, port and database,
    never the URL's password), and the worker carries on by itself once connections are
    answered again. Before: only ``storage unavailable`` lines, no ``stalled``."""
    runlog = tmp_path / "runlog.txt"
    procs = Procs(tmp_path, database_url, RELAPP_RUNLOG=str(runlog))
    url = make_url(database_url)
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432).start()
    secret = "conn-stall-pw-4711"  # trust auth ignores it; it must never reach the log
    through = url.set(host="127.0.0.1", port=proxy.port, password=secret)
    try:
        port = free_port()
        procs.gunicorn(port, workers=2)  # straight to the database: it keeps storing
        base = f"http://127.0.0.1:{port}/webhooks/"
        wait_healthy(base, procs=procs)
        procs.database_url = through.render_as_string(hide_password=False)
        worker = procs.worker("--poll-interval", "0.1", "--lease-seconds", "10", **BOUNDS)

        before = _events("warm", 3)
        assert {d.status for d in _deliver_all(base, before, timeout=15, parallel=2)} == {200}
        wait_until(lambda: _done(migrated, list(before)), timeout=60, message="warm-up done")

        # Every open link closes; new connections are accepted and never answered.
        proxy.cut("blackhole")
        cut_at = time.monotonic()
        during = _events("connect", 5)
        assert {d.status for d in _deliver_all(base, during, timeout=15, parallel=2)} == {200}

        def connect_stalls() -> list[dict[str, object]]:
            return [
                a
                for a in _actions(worker.output())
                if a["action"] == "stalled" and str(a.get("waiting_on", "")).startswith("connect")
            ]

        wait_until(lambda: bool(connect_stalls()), timeout=40, message="the connect stall logged")
        logged_after = time.monotonic() - cut_at
        stalled = connect_stalls()[0]
        assert f"127.0.0.1:{proxy.port}" in str(stalled["waiting_on"]), stalled
        assert str(url.database) in str(stalled["waiting_on"]), stalled
        assert stalled["phase"], stalled
        # The connect is bounded: it ends (a storage error) and the worker tries again.
        wait_until(
            lambda: "worker_storage_error" in {a["action"] for a in _actions(worker.output())},
            timeout=30,
            message="the hung connect ended by its timeout",
        )
        assert proxy.accepted >= 2  # a new connect after the bounded one
        assert worker.alive(), worker.output()
        assert not _done(migrated, list(during))

        proxy.restore()
        restored = time.monotonic()
        everything = [*before, *during]
        wait_until(
            lambda: _done(migrated, everything) or not worker.alive(),
            timeout=60,
            message="everything dispatched after the connects were answered again",
        )
        drained_after = time.monotonic() - restored
        assert worker.alive(), worker.output()
        wait_until(
            lambda: "resumed" in {a["action"] for a in _actions(worker.output())},
            timeout=30,
            message="resumed logged",
        )
        assert effect_pids(migrated) == {worker.pid}
        assert procs.stop(worker) == 0, worker.output()
        assert secret not in worker.output()
        assert effects(migrated) == {(e, h): 1 for e in everything for h in SESSION_HANDLERS}
        print(
            f"connect stall logged after {logged_after:.1f} s; all {len(everything)} events "
            f"done {drained_after:.1f} s after connections were answered again"
        )
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()
        proxy.close()
