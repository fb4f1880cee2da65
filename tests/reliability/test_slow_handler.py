"""Receiving never waits on a handler (issue 29, items 1 and 2), with real processes.

The README's kind of app (``bench.slowapp``) under gunicorn gthread (2 x 4) and one
``hookledger worker``: one event's handler takes longer than the busy timeout, without the
session or writing through it while it sleeps; meanwhile 4 clients each post a signed event
every 0.2 s. Every webhook is answered 2xx, stored, and dispatched exactly once afterwards. On
SQLite the webhooks wait in the intake (``<database>-intake``) while the worker holds the
database's lock; killing the web processes before the move, or the worker in the middle of
one, loses and doubles nothing. On PostgreSQL the same load never waited (row locks).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

from bench.slow_handler import Round, check_exactly_once
from bench.slowapp import create_effect_table
from receiver.storage.filelock import WritersLock
from receiver.storage.inbox import WRITERS_LOCK_SUFFIX
from receiver.testing.factories import build_event, encode
from tests.conftest import backend
from tests.reliability._procs import (
    Proc,
    Procs,
    free_port,
    migrated_engine,
    signed_post,
    wait_healthy,
    wait_until,
)

pytestmark = [pytest.mark.storage, pytest.mark.slow]

APP = "bench.slowapp"
#: Longer than the busy timeout below: a webhook that waited for the handler would get 503.
HANDLER_SECONDS = 4.0
BUSY_TIMEOUT = "2"
CLIENTS, INTERVAL = 4, 0.2


@pytest.fixture
def migrated(database_url: str) -> Iterator[sa.Engine]:
    with migrated_engine(database_url) as engine:
        create_effect_table(engine)
        yield engine


def _settled(engine: sa.Engine, stored: int) -> bool:
    with engine.connect() as conn:
        total, open_ = conn.execute(
            sa.text(
                "SELECT count(*), coalesce(sum(CASE WHEN status IN ('pending', 'processing')"
                " THEN 1 ELSE 0 END), 0) FROM hookledger_event"
            )
        ).one()
    return int(total) >= stored and int(open_) == 0


def _client(url: str, start: float, until: float, out: Round, lock: threading.Lock) -> None:
    with requests.Session() as http:
        k = 0
        while (due := start + k * INTERVAL) < until:
            k += 1
            time.sleep(max(0.0, due - time.monotonic()))
            body = encode(build_event("payment_succeeded"))
            try:
                status = signed_post(http, url, body, timeout=30).status_code
            except requests.RequestException:
                with lock:
                    out.errors += 1
                continue
            with lock:
                out.posted += 1
                out.statuses[str(status)] = out.statuses.get(str(status), 0) + 1
                out.non_2xx += not 200 <= status < 300


@pytest.mark.parametrize("variant", ["sleep", "write"])
def test_webhooks_posted_while_a_slow_handler_runs_are_all_answered_and_run_once(
    database_url: str, migrated: sa.Engine, tmp_path: Path, variant: str
) -> None:
    runlog, started = tmp_path / "runlog", tmp_path / "started"
    procs = Procs(
        tmp_path,
        database_url,
        HLBENCH_RUNLOG=str(runlog),
        HLBENCH_STARTED=str(started),
        HOOKLEDGER_SQLITE_BUSY_TIMEOUT=BUSY_TIMEOUT,
    )
    port = free_port()
    try:
        procs.gunicorn(port, workers=2, threads=4, app=APP)
        base = f"http://127.0.0.1:{port}/webhooks/"
        wait_healthy(base, procs=procs)
        procs.worker("--poll-interval", "0.1", app=APP)
        key = "hlbench_sleep" if variant == "sleep" else "hlbench_write_sleep"
        slow = encode(build_event("payment_succeeded", metadata={key: HANDLER_SECONDS}))
        with requests.Session() as http:
            assert signed_post(http, base, slow).status_code == 200
        wait_until(started.exists, timeout=60, message="the slow handler to start")
        out, lock = Round(), threading.Lock()
        start = time.monotonic()
        until = start + HANDLER_SECONDS - 0.5
        clients = [
            threading.Thread(
                target=_client, args=(base, start + i * INTERVAL / CLIENTS, until, out, lock)
            )
            for i in range(CLIENTS)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        assert out.posted >= 3 * CLIENTS and out.errors == 0, procs.tail()
        assert out.statuses == {"200": out.posted}, procs.tail()
        assert started.read_text().count("\n") == 1  # the slow handler ran once
        acknowledged = out.posted + 1
        wait_until(
            lambda: _settled(migrated, acknowledged),
            timeout=120,
            message="every acknowledged event in the inbox, dispatched",
        )
        assert check_exactly_once(migrated, runlog, acknowledged) is None
        if variant == "write":
            with migrated.connect() as conn:
                assert conn.execute(sa.text("SELECT count(*) FROM hlbench_effect")).scalar() == 1
    finally:
        procs.close()


# -- crashes around the move (SQLite) -----------------------------------------------------------

sqlite_only = pytest.mark.skipif(backend() != "sqlite", reason="SQLite's intake")


@contextmanager
def _lock_held(database: str) -> Iterator[None]:
    """This process holds the database's writers' lock (as a worker running a long handler
    does) for the block."""
    ready, release = threading.Event(), threading.Event()

    def hold() -> None:
        with WritersLock(database + WRITERS_LOCK_SUFFIX).hold(timeout=30):
            ready.set()
            release.wait(120)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert ready.wait(30)
        yield
    finally:
        release.set()
        holder.join(30)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _kill_web(web: Proc) -> None:
    """SIGKILL gunicorn's worker processes, then its master: no process is left to move."""
    for child in _children(web.pid):
        os.kill(child, signal.SIGKILL)
    web.kill9()


def _intake_count(database: str) -> int:
    conn = sqlite3.connect(database + "-intake")
    try:
        return int(conn.execute("SELECT count(*) FROM hookledger_intake").fetchone()[0])
    finally:
        conn.close()


def _inbox_count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM hookledger_event")).scalar_one())


def _stage_through_the_web(procs: Procs, database: str, n: int) -> Proc:
    """Post ``n`` webhooks while the database's lock is held: each answered 200 from the
    intake. Returns the web server (still running)."""
    port = free_port()
    web = procs.gunicorn(port, workers=2, threads=4, app=APP)
    base = f"http://127.0.0.1:{port}/webhooks/"
    wait_healthy(base, procs=procs)
    with _lock_held(database), requests.Session() as http:
        for _ in range(n):
            response = signed_post(http, base, encode(build_event("payment_succeeded")))
            assert response.status_code == 200, procs.tail()
        assert _intake_count(database) == n
    return web


@sqlite_only
def test_web_processes_killed_before_the_move_lose_nothing(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    database = sa.make_url(database_url).database
    assert database is not None
    runlog = tmp_path / "runlog"
    procs = Procs(tmp_path, database_url, HLBENCH_RUNLOG=str(runlog))
    try:
        web = _stage_through_the_web(procs, database, 12)
        _kill_web(web)
        assert _inbox_count(migrated) == 0 and _intake_count(database) == 12
        procs.worker("--poll-interval", "0.1", app=APP)
        wait_until(lambda: _settled(migrated, 12), timeout=120, message="all 12 dispatched")
        assert check_exactly_once(migrated, runlog, 12) is None
        assert _intake_count(database) == 0
    finally:
        procs.close()


@sqlite_only
def test_a_worker_killed_between_the_moves_two_commits_loses_and_doubles_nothing(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    database = sa.make_url(database_url).database
    assert database is not None
    runlog = tmp_path / "runlog"
    # The worker's delete from the intake waits for SQLite's lock that long.
    procs = Procs(
        tmp_path, database_url, HLBENCH_RUNLOG=str(runlog), HOOKLEDGER_SQLITE_BUSY_TIMEOUT="60"
    )
    try:
        web = _stage_through_the_web(procs, database, 12)
        procs.stop(web)
        # Hold the intake's SQLite write lock: a move commits into the inbox, then waits.
        blocker = sqlite3.connect(database + "-intake", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            worker = procs.worker("--poll-interval", "0.1", app=APP)
            wait_until(
                lambda: _inbox_count(migrated) == 12,
                timeout=60,
                message="the move's commit into the inbox",
            )
            worker.kill9()  # before it could delete the moved rows from the intake
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert _intake_count(database) == 12
        procs.worker("--poll-interval", "0.1", app=APP, name="worker2")
        wait_until(lambda: _settled(migrated, 12), timeout=120, message="all 12 dispatched")
        wait_until(lambda: _intake_count(database) == 0, timeout=30, message="intake emptied")
        assert _inbox_count(migrated) == 12
        assert check_exactly_once(migrated, runlog, 12) is None
    finally:
        procs.close()


@sqlite_only
def test_duplicates_racing_across_the_inbox_and_the_intake_are_answered_exactly(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    """While another writer takes the database's lock for 0.3 s, lets go for 0.05 s, again
    and again, 4 clients deliver the same 20 events twice each, in different orders: some
    deliveries go to the inbox, some to the intake. Each event is stored once and answered
    ``inserted`` exactly once, every other delivery of it ``duplicate``."""
    database = sa.make_url(database_url).database
    assert database is not None
    procs = Procs(tmp_path, database_url)
    stop = threading.Event()

    def toggle() -> None:
        lock = WritersLock(database + WRITERS_LOCK_SUFFIX)
        while not stop.is_set():
            with lock.hold(timeout=30):
                stop.wait(0.3)
            time.sleep(0.05)

    bodies = [encode(build_event("payment_succeeded")) for _ in range(20)]
    answers: list[tuple[str, str]] = []
    guard = threading.Lock()

    def client(k: int, base: str) -> None:
        order = bodies if k % 2 else bodies[::-1]
        with requests.Session() as http:
            for body in order * 2:
                response = signed_post(http, base, body)
                assert response.status_code == 200, response.text
                got = response.json()
                with guard:
                    answers.append((got["event_id"], got["status"]))

    try:
        port = free_port()
        procs.gunicorn(port, workers=2, threads=4, app=APP)
        base = f"http://127.0.0.1:{port}/webhooks/"
        wait_healthy(base, procs=procs)
        toggler = threading.Thread(target=toggle)
        toggler.start()
        try:
            clients = [threading.Thread(target=client, args=(k, base)) for k in range(4)]
            for each in clients:
                each.start()
            for each in clients:
                each.join()
        finally:
            stop.set()
            toggler.join(30)
        assert len(answers) == 4 * 2 * 20, procs.tail()
        assert Path(database + "-intake").exists()  # some went there (made when first needed)
        inserted = [event_id for event_id, status in answers if status == "inserted"]
        assert sorted(inserted) == sorted({event_id for event_id, _ in answers})
        assert {status for _, status in answers} == {"inserted", "duplicate"}
        procs.worker("--poll-interval", "0.1", app=APP)
        wait_until(lambda: _settled(migrated, 20), timeout=120, message="all 20 dispatched")
        assert _inbox_count(migrated) == 20
        wait_until(lambda: _intake_count(database) == 0, timeout=30, message="intake emptied")
    finally:
        procs.close()
