"""``worker --burst`` on SQLite gives up on a database that stays locked (issue 29 review).

On PostgreSQL ``--burst`` exits 5 when the database does not answer within its bound
(:mod:`tests.reliability.test_stall`). On SQLite the wait is for the write lock: here another
process holds ``BEGIN IMMEDIATE`` on the database file (a migration, a ``VACUUM``, a stuck
script) for longer than the bound while events are due. ``worker --burst`` must end with the
documented exit code (5) in bounded time, having run no handler and left no lease behind;
once the lock is free the next ``--burst`` dispatches everything, each handler once.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from tests.apps.relapp import SESSION_HANDLERS
from tests.conftest import backend
from tests.reliability._procs import (
    Proc,
    Procs,
    effects,
    free_port,
    inbox_rows,
    migrated_engine,
    statuses,
    wait_healthy,
    wait_until,
)
from tests.reliability.test_outage import _deliver_all, _events

pytestmark = [
    pytest.mark.storage,
    pytest.mark.slow,
    pytest.mark.skipif(backend() != "sqlite", reason="SQLite's write lock"),
]

#: Holds ``BEGIN IMMEDIATE`` on the file until its stdin closes.
HOLD_IMMEDIATE = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
conn.close()
"""

#: A lock wait of 1 s (with ``--lease-seconds 3``: the bound of ``--burst`` on SQLite).
BOUNDS = {"HOOKLEDGER_SQLITE_BUSY_TIMEOUT": "1", "HOOKLEDGER_LOG_FORMAT": "json"}


@pytest.fixture
def migrated(database_url: str) -> Iterator[sa.Engine]:
    with migrated_engine(database_url) as engine:
        yield engine


#: Holds ``flock`` on the writers' lock file beside the database (what another hookledger
#: process does while it writes: a worker's turn whose handler runs long) until stdin closes.
HOLD_WRITERS = """
import fcntl, os, sys
fd = os.open(sys.argv[1] + "-hookledger-writers", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
fcntl.flock(fd, fcntl.LOCK_UN)
"""


class Shop:
    """A web process, a holder of a lock, and ``worker --burst`` runs, on one SQLite file."""

    def __init__(self, procs: Procs, database_url: str) -> None:
        self.procs = procs
        path = make_url(database_url).database
        assert path
        self.path = path
        self.locker: Proc | None = None
        port = free_port()
        self.web = procs.gunicorn(port, workers=1)
        self.base = f"http://127.0.0.1:{port}/webhooks/"
        wait_healthy(self.base, procs=procs)

    def deliver(self, events: dict[str, bytes]) -> None:
        assert {d.status for d in _deliver_all(self.base, events, timeout=15, parallel=2)} == {200}

    def stop_web(self) -> None:
        self.procs.stop(self.web)  # nothing else writes meanwhile

    def hold(self, script: str) -> None:
        self.locker = locker = self.procs.start(
            "lock", [sys.executable, "-c", script, self.path], stdin_pipe=True
        )
        wait_until(lambda: "locked" in locker.output(), timeout=15, message="the lock")

    def release(self) -> None:
        assert self.locker is not None and self.locker.popen.stdin is not None
        self.locker.popen.stdin.close()
        assert self.locker.popen.wait(timeout=10) == 0, self.locker.output()

    def burst(self, name: str) -> tuple[int, str, float]:
        started = time.monotonic()
        proc = self.procs.worker("--burst", "--lease-seconds", "3", name=name, **BOUNDS)
        wait_until(lambda: not proc.alive(), timeout=60, message=f"{name} to end")
        assert proc.popen.returncode is not None
        return proc.popen.returncode, proc.output(), time.monotonic() - started


def _gives_up_then_drains(shop: Shop, migrated: sa.Engine, due: dict[str, bytes]) -> float:
    """``worker --burst`` under the held lock exits 5 in bounded time having run nothing and
    leased nothing; after the release the next one exits 0 with everything done once."""
    code, output, seconds = shop.burst("burst")
    assert code == 5, output
    assert "locked" in output, output
    assert seconds < 30, output
    assert set(statuses(migrated).values()) <= {"pending"}, inbox_rows(migrated)
    assert effects(migrated) == {}
    shop.release()
    code, output, _ = shop.burst("burst-again")
    assert code == 0, output
    assert statuses(migrated) == {e: "done" for e in due}
    assert effects(migrated) == {(e, h): 1 for e in due for h in SESSION_HANDLERS}
    return seconds


def test_burst_exits_5_when_another_process_holds_the_databases_write_lock(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    """Another process's ``BEGIN IMMEDIATE`` on the file (a migration, a ``VACUUM``, a stuck
    script), events due in the inbox."""
    procs = Procs(tmp_path, database_url)
    try:
        shop = Shop(procs, database_url)
        due = _events("burst", 4)
        shop.deliver(due)
        shop.stop_web()
        shop.hold(HOLD_IMMEDIATE)
        seconds = _gives_up_then_drains(shop, migrated, due)
        print(f"worker --burst exited 5 after {seconds:.1f} s under BEGIN IMMEDIATE")
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()


def test_burst_exits_5_when_the_webhooks_wait_in_the_intake_of_a_locked_database(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    """The webhooks stored while the lock was held are in the intake, and the lock is still
    held when ``--burst`` runs: it cannot move them; it gives up as on the inbox's."""
    procs = Procs(tmp_path, database_url)
    try:
        shop = Shop(procs, database_url)
        shop.hold(HOLD_IMMEDIATE)
        due = _events("intake", 4)
        shop.deliver(due)  # stored in the intake
        shop.stop_web()
        assert statuses(migrated) == {}
        seconds = _gives_up_then_drains(shop, migrated, due)
        print(f"worker --burst exited 5 after {seconds:.1f} s with the intake unmoved")
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()


def test_burst_exits_5_when_another_writer_keeps_the_writers_lock(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    """Another hookledger process keeps the writers' lock beside the file (a worker's turn
    whose handler runs long): ``--burst`` cannot claim. Before: it took that for "no event is
    due" and exited 0 at once, every event still pending."""
    procs = Procs(tmp_path, database_url)
    try:
        shop = Shop(procs, database_url)
        due = _events("writers", 4)
        shop.deliver(due)
        shop.stop_web()
        shop.hold(HOLD_WRITERS)
        seconds = _gives_up_then_drains(shop, migrated, due)
        print(f"worker --burst exited 5 after {seconds:.1f} s behind the writers' lock")
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()
