"""Storage outage: the database goes away under a running web server and worker, then returns.

Guarantees checked (README, "ack"): while the database is unreachable a signed webhook gets
503 (never a 2xx for something that was not stored, never a hang), so the processor retries;
the worker survives the outage and carries on afterwards; once the processor's retries come
in, everything is stored once and processed once.

How the outage is made:

- PostgreSQL: the web server and the worker reach the server only through a TCP proxy of the
  test's own (:mod:`tests.reliability.tcp_proxy`). ``cut`` closes every open connection and
  refuses new ones (the server is down); ``blackhole`` accepts connections and never answers
  (a network partition).
- SQLite: another process holds the database's write lock (``BEGIN EXCLUSIVE``) for longer
  than the busy timeout (``HOOKLEDGER_SQLITE_BUSY_TIMEOUT``, default 5 s). That is the
  realistic way a local SQLite file becomes unusable for writes (a long migration, a
  ``VACUUM``, a bulk import, another program's stuck transaction); a vanished file or
  directory is not realistic with a connection pool, whose open descriptors keep working.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from receiver.testing.factories import build_event, encode
from tests.apps.relapp import SESSION_HANDLERS, read_runlog
from tests.conftest import backend
from tests.reliability._procs import (
    Proc,
    Procs,
    effects,
    free_port,
    inbox_rows,
    migrated_engine,
    signed_post,
    statuses,
    wait_healthy,
    wait_until,
)
from tests.reliability.tcp_proxy import CutMode, TcpProxy

pytestmark = [pytest.mark.storage, pytest.mark.slow]

PG = backend() == "postgresql"
#: The package's default SQLite busy timeout (seconds): a request waits this long for the
#: lock before it is answered 503.
SQLITE_BUSY = 5.0


@pytest.fixture
def migrated(database_url: str) -> Iterator[sa.Engine]:
    with migrated_engine(database_url) as engine:
        yield engine


class Outage:
    """Cuts and restores the database for the app's processes (see the module docstring)."""

    def __init__(self, database_url: str, procs: Procs) -> None:
        self.database_url = database_url
        self.procs = procs
        self.proxy: TcpProxy | None = None
        self.locker: Proc | None = None
        self.app_url = database_url
        if PG:
            url = make_url(database_url)
            self.proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432).start()
            self.app_url = url.set(host="127.0.0.1", port=self.proxy.port).render_as_string(
                hide_password=False
            )
        procs.database_url = self.app_url

    def cut(self, mode: CutMode = "refuse") -> None:
        if self.proxy is not None:
            self.proxy.cut(mode)
            return
        path = make_url(self.database_url).database
        assert path
        # The database and its intake, where a webhook goes when only the database is locked.
        argv = [sys.executable, "-m", "tests.reliability._sqlite_lock", path, path + "-intake"]
        self.locker = self.procs.start("sqlite-lock", argv, stdin_pipe=True)
        locker = self.locker
        wait_until(lambda: "locked" in locker.output(), timeout=15, message="the lock")

    def restore(self) -> None:
        if self.proxy is not None:
            self.proxy.restore()
            return
        assert self.locker is not None and self.locker.popen.stdin is not None
        self.locker.popen.stdin.close()
        assert self.locker.popen.wait(timeout=10) == 0, self.locker.output()
        self.locker = None

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()


@dataclass
class Delivery:
    event_id: str
    status: int  # -1: no HTTP answer (connection error or client timeout)
    seconds: float
    code: str | None = None


def _deliver(url: str, event_id: str, body: bytes, timeout: float) -> Delivery:
    started = time.monotonic()
    with requests.Session() as session:
        try:
            response = signed_post(session, url, body, timeout=timeout)
        except requests.RequestException:
            return Delivery(event_id, -1, time.monotonic() - started)
        code = None
        if response.status_code != 200:
            try:
                code = response.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = response.text[:100]
        return Delivery(event_id, response.status_code, time.monotonic() - started, code)


def _deliver_all(
    url: str,
    events: dict[str, bytes],
    *,
    timeout: float,
    parallel: int,
    spacing: float = 0.0,
) -> list[Delivery]:
    """Post every event once from ``parallel`` threads, each pausing ``spacing`` seconds
    between its posts."""

    def send(event_id: str, body: bytes) -> Delivery:
        got = _deliver(url, event_id, body, timeout)
        time.sleep(spacing)
        return got

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [pool.submit(send, e, b) for e, b in events.items()]
        return [f.result() for f in futures]


def _retry_until_acked(url: str, events: dict[str, bytes], *, deadline: float) -> None:
    """The processor's retries: re-post each event until it is acknowledged."""
    for event_id, body in events.items():
        while True:
            got = _deliver(url, event_id, body, timeout=15)
            if got.status == 200:
                break
            assert got.status == 503, got
            assert time.monotonic() < deadline, f"{event_id} never acknowledged: {got}"
            time.sleep(0.2)


def _events(prefix: str, n: int) -> dict[str, bytes]:
    types = ("payment_succeeded", "refund_succeeded", "dispute_opened")
    return {
        f"evt_{prefix}_{i:03d}": encode(
            build_event(types[i % len(types)], event_id=f"evt_{prefix}_{i:03d}")
        )
        for i in range(n)
    }


def _assert_processed_once(engine: sa.Engine, event_ids: list[str], runlog: Path) -> None:
    rows = inbox_rows(engine)
    assert sorted(r["event_id"] for r in rows) == sorted(event_ids)
    assert {r["status"] for r in rows} == {"done"}, [r for r in rows if r["status"] != "done"]
    expected = Counter({(e, h): 1 for e in event_ids for h in SESSION_HANDLERS})
    got = effects(engine)
    assert got == expected, (got - expected) or (expected - got)
    assert set(e for e, _ in read_runlog(runlog)) == set(event_ids)


def _has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (Linux ``/proc``)."""
    try:
        links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:
        return False
    return str(path) in links


def _all_done(engine: sa.Engine, event_ids: list[str]) -> bool:
    current = statuses(engine)
    return all(current.get(e) == "done" for e in event_ids)


def test_outage_answers_503_acks_only_stored_events_and_the_worker_recovers(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    runlog = tmp_path / "runlog.txt"
    procs = Procs(tmp_path, database_url, RELAPP_RUNLOG=str(runlog))
    outage = Outage(database_url, procs)
    try:
        port = free_port()
        procs.gunicorn(port, workers=4)
        base = f"http://127.0.0.1:{port}/webhooks/"
        wait_healthy(base, procs=procs)
        worker = procs.worker("--poll-interval", "0.1", "--lease-seconds", "5")

        before = _events("before", 4)
        assert {d.status for d in _deliver_all(base, before, timeout=15, parallel=2)} == {200}
        wait_until(lambda: _all_done(migrated, list(before)), timeout=30, message="before done")

        outage.cut()
        cut_at = time.monotonic()
        during = _events("during", 3)
        with ThreadPoolExecutor(max_workers=1) as pool:  # one request per gunicorn worker
            health = pool.submit(requests.get, base + "health", timeout=25)
            answers = _deliver_all(base, during, timeout=25, parallel=len(during))
            # PostgreSQL unreachable: not ready. SQLite's write lock held by another process:
            # still ready (readiness reads without the lock, so a health check never waits
            # on nor holds up the writers); the deliveries themselves get 503.
            assert health.result().status_code == (503 if PG else 200)
            assert requests.get(base + "health/live", timeout=5).status_code == 200
        # Every delivery during the outage was refused with 503, in bounded time: HL_03 when
        # PostgreSQL is unreachable; HL_09 (busy, not an outage) when another process holds
        # SQLite's write lock past the busy timeout.
        code = "HL_03" if PG else "HL_09"
        assert [d for d in answers if d.status != 503 or d.code != code] == [], answers
        # Bounded: the connect timeout (PostgreSQL) or the busy timeout (SQLite), plus room
        # for a loaded, shared machine; far below the client's own 25 s (no hang).
        bound = 10.0 if PG else SQLITE_BUSY + 10.0
        assert max(d.seconds for d in answers) < bound, answers
        # The worker keeps running through the outage (its claims fail meanwhile).
        time.sleep(max(0.0, (2.0 if PG else SQLITE_BUSY + 1.0) - (time.monotonic() - cut_at)))
        assert worker.alive(), worker.output()
        outage.restore()

        # Nothing that got a 503 is required to be stored; everything acked must be.
        stored = set(statuses(migrated))
        assert set(before) <= stored
        # The processor retries what got 503; new events keep coming.
        _retry_until_acked(base, during, deadline=time.monotonic() + 30)
        after = _events("after", 4)
        assert {d.status for d in _deliver_all(base, after, timeout=15, parallel=2)} == {200}
        everything = [*before, *during, *after]
        wait_until(
            lambda: _all_done(migrated, everything) or not worker.alive(),
            timeout=45,
            message="all done",
        )
        # The very worker that lived through the outage processed the later events.
        assert worker.alive(), worker.output()
        with migrated.connect() as conn:
            pids = set(conn.execute(sa.text("SELECT DISTINCT pid FROM rel_effect")).scalars())
        assert pids == {worker.pid}
        assert procs.stop(worker) == 0, worker.output()
        _assert_processed_once(migrated, everything, runlog)
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()
        outage.close()


@pytest.mark.skipif(not PG, reason="connection cuts mid-request need a network link")
def test_connection_cuts_mid_request_never_ack_an_unstored_event(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    """The link to PostgreSQL flaps while events stream in and a worker drains them: every
    answer is 200 or 503 (no 500), an event that got 200 is stored, and after the retries
    every event is processed exactly once by the worker that lived through it."""
    runlog = tmp_path / "runlog.txt"
    procs = Procs(tmp_path, database_url, RELAPP_RUNLOG=str(runlog))
    outage = Outage(database_url, procs)
    assert outage.proxy is not None
    try:
        port = free_port()
        procs.gunicorn(port, workers=3)
        base = f"http://127.0.0.1:{port}/webhooks/"
        wait_healthy(base, procs=procs)
        worker = procs.worker("--poll-interval", "0.05", "--lease-seconds", "3")
        events = _events("flap", 60)
        answers: list[Delivery] = []
        stop = threading.Event()

        def flap() -> None:
            rng = random.Random(7)
            while not stop.wait(rng.uniform(0.15, 0.4)):
                outage.cut()
                if stop.wait(rng.uniform(0.1, 0.3)):
                    break
                outage.restore()

        flapper = threading.Thread(target=flap, name="flapper", daemon=True)
        flapper.start()
        try:
            # 3 senders, one event every 0.2 s each: about 4 s of traffic through the flaps.
            answers = _deliver_all(base, events, timeout=15, parallel=3, spacing=0.2)
        finally:
            stop.set()
            flapper.join(timeout=10)
            if outage.proxy.is_cut:
                outage.restore()
        acked = {d.event_id for d in answers if d.status == 200}
        missing = acked - set(statuses(migrated))
        assert not missing, f"acknowledged but not stored: {sorted(missing)}"
        codes = Counter(d.status for d in answers)
        assert set(codes) <= {200, 503}, [d for d in answers if d.status not in (200, 503)]
        assert codes[503] > 0 and codes[200] > 0, codes  # the faults did hit requests
        _retry_until_acked(
            base,
            {e: b for e, b in events.items() if e not in acked},
            deadline=time.monotonic() + 30,
        )
        wait_until(
            lambda: _all_done(migrated, list(events)) or not worker.alive(),
            timeout=45,
            message="all done",
        )
        assert worker.alive(), worker.output()
        assert procs.stop(worker) == 0, worker.output()
        _assert_processed_once(migrated, list(events), runlog)
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()
        outage.close()


def test_a_worker_started_during_the_outage_waits_for_the_database(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    """A worker (re)started while the database is unreachable (a deploy, a crash-restart by
    the supervisor) must wait for it, not exit, and process events once it is back."""
    runlog = tmp_path / "runlog.txt"
    procs = Procs(tmp_path, database_url, RELAPP_RUNLOG=str(runlog))
    outage = Outage(database_url, procs)
    try:
        outage.cut("reset")
        worker = procs.worker("--poll-interval", "0.1", "--lease-seconds", "5")
        # Wait until the worker has met the outage: it tried to connect (PostgreSQL), or it
        # opened the database file and then waited out its busy timeout (SQLite).
        if outage.proxy is not None:
            proxy = outage.proxy
            wait_until(
                lambda: proxy.reset > 0 or not worker.alive(), timeout=30, message="a connect"
            )
            met_at = time.monotonic()
        else:
            db_file = Path(make_url(database_url).database or "")
            wait_until(
                lambda: _has_open(worker.pid, db_file) or not worker.alive(),
                timeout=30,
                message="the worker to open the database",
            )
            met_at = time.monotonic() + SQLITE_BUSY
        while time.monotonic() < met_at + 2.0 and worker.alive():
            time.sleep(0.1)
        alive_during_outage = worker.alive()
        outage.restore()
        assert alive_during_outage, f"the worker exited during the outage:\n{worker.output()}"
        port = free_port()
        procs.gunicorn(port, workers=1)
        base = f"http://127.0.0.1:{port}/webhooks/"
        wait_healthy(base, procs=procs)
        events = _events("late", 3)
        assert {d.status for d in _deliver_all(base, events, timeout=15, parallel=1)} == {200}
        wait_until(lambda: _all_done(migrated, list(events)), timeout=30, message="all done")
        assert procs.stop(worker) == 0, worker.output()
        _assert_processed_once(migrated, list(events), runlog)
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()
        outage.close()


@pytest.mark.skipif(not PG, reason="a network partition needs a network link")
def test_network_partition_answers_503_in_bounded_time(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    """A partition (connections to the database are accepted by nobody and never answered)
    must not hang webhook requests: the processor needs a 503 in time to retry."""
    procs = Procs(tmp_path, database_url)
    outage = Outage(database_url, procs)
    assert outage.proxy is not None
    try:
        port = free_port()
        procs.gunicorn(port, workers=2)
        base = f"http://127.0.0.1:{port}/webhooks/"
        wait_healthy(base, procs=procs)
        outage.proxy.cut("blackhole")
        events = _events("partition", 2)
        answers = _deliver_all(base, events, timeout=12, parallel=2)
        outage.proxy.restore()
        assert [d for d in answers if d.status != 503] == [], answers
        assert max(d.seconds for d in answers) < 8, answers
        # Once the partition heals, the same server stores events again.
        _retry_until_acked(base, events, deadline=time.monotonic() + 20)
        assert set(events) <= set(statuses(migrated))
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()
        outage.close()
