"""Crash: worker processes are SIGKILLed in the middle of handlers, round after round.

Guarantees checked (README, "claim", "handlers"): a killed worker's lease expires and another
worker finishes its event; a handler that writes through the session has committed its side
effect exactly once (its writes commit with its ledger row); a handler that had succeeded
before the kill is not run again (the ledger's ``attempts`` stays 1 and the at-least-once
handler without the session re-runs only where a kill interrupted *that* handler); nothing is
dead-lettered.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

import receiver.storage.database as db
from receiver.core.events import parse_event
from receiver.store import Store
from receiver.testing.factories import build_event, encode
from tests.apps.relapp import HANDLERS, SESSION_HANDLERS, read_runlog
from tests.reliability._procs import (
    Proc,
    Procs,
    effects,
    inbox_rows,
    ledger,
    migrated_engine,
    wait_until,
)

pytestmark = [pytest.mark.storage, pytest.mark.slow]

LEASE = "1.5"
#: Workers alive at any time; each kill is followed at once by a replacement.
WORKERS = 2
#: SIGKILLs: each handler is the target twice.
KILLS = 6


@pytest.fixture
def migrated(database_url: str) -> Iterator[sa.Engine]:
    with migrated_engine(database_url) as engine:
        yield engine


def _bodies() -> dict[str, bytes]:
    """30 events: 8 payments that go processing -> succeeded (two events of one object, run
    in order under the object lease) and 14 single events of other kinds; every fifth event
    fails in ``effect_b`` at its first run, so its retry finds ``effect_a`` and ``runlog``
    already succeeded."""
    t0 = datetime.now(UTC) - timedelta(minutes=5)
    specs: list[tuple[str, str | None, datetime | None]] = []
    for i in range(8):
        for step, event_type in enumerate(("payment_processing", "payment_succeeded")):
            specs.append((event_type, f"pay_crash_{i}", t0 + timedelta(seconds=i + step / 2)))
    for i in range(14):
        specs.append((("refund_succeeded", "dispute_opened", "payout_success")[i % 3], None, None))
    events: dict[str, bytes] = {}
    for n, (event_type, object_id, at) in enumerate(specs):
        event_id = f"evt_crash_{n:02d}_{event_type}" + ("_failfirst" if n % 5 == 4 else "")
        events[event_id] = encode(
            build_event(event_type, event_id=event_id, object_id=object_id, timestamp=at)
        )
    return events


def _last_line(progress: Path, pid: int) -> str:
    path = progress / f"{pid}.log"
    if not path.exists():
        return ""
    lines = path.read_text().splitlines()
    return lines[-1] if lines else ""


def test_sigkilled_workers_mid_handler_lose_nothing_and_rerun_nothing(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    bodies = _bodies()
    writer = db.make_engine(database_url)
    try:
        store = Store(writer)
        for body in bodies.values():
            store.inbox.insert(parse_event(body), body)
    finally:
        writer.dispose()
    progress, fail_dir = tmp_path / "progress", tmp_path / "fail"
    progress.mkdir()
    fail_dir.mkdir()
    runlog = tmp_path / "runlog.txt"
    procs = Procs(
        tmp_path,
        database_url,
        RELAPP_SLEEP="0.05",
        RELAPP_PROGRESS_DIR=str(progress),
        RELAPP_RUNLOG=str(runlog),
        RELAPP_FAIL_DIR=str(fail_dir),
        HOOKLEDGER_MAX_ATTEMPTS="50",
        # SQLite serialises writers, and a worker running handlers back to back keeps the
        # write lock nearly all the time: the other worker waits for it instead of failing.
        HOOKLEDGER_SQLITE_BUSY_TIMEOUT="30",
    )
    rng = random.Random(1234)
    started = 0

    def start() -> Proc:
        nonlocal started
        started += 1
        argv = ("--lease-seconds", LEASE, "--poll-interval", "0.05")
        return procs.worker(*argv, name=f"worker{started}")

    # The last progress line of every killed worker: where exactly it died.
    died_at: list[str] = []
    try:
        live = [start() for _ in range(WORKERS)]
        for kill in range(KILLS):
            # Kill a worker inside a chosen handler (over the kills, every handler), then
            # start a replacement at once, as a supervisor would.
            target = HANDLERS[kill % len(HANDLERS)]
            found: list[Proc] = []

            def inside(t: str = target, found: list[Proc] = found) -> bool:
                for w in live:
                    assert w.alive(), w.output()
                    line = _last_line(progress, w.pid)
                    if line.startswith("start ") and line.endswith(" " + t):
                        found.append(w)
                        return True
                return False

            wait_until(inside, timeout=30, message=f"a worker to be inside {target}")
            victim = found[0]
            victim.kill9()
            died_at.append(_last_line(progress, victim.pid))
            live.remove(victim)
            live.append(start())
            time.sleep(rng.uniform(0.0, 0.5))

        # Events of the killed workers wait for their leases to expire. Drain.
        def all_closed() -> bool:
            return {r["status"] for r in inbox_rows(migrated)} <= {"done", "dead"}

        wait_until(all_closed, timeout=60, message="every event to be finished")
        for w in live:
            assert w.alive(), procs.tail()
            assert procs.stop(w) == 0, w.output()
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()

    event_ids = list(bodies)
    fail_first = {e for e in event_ids if e.endswith("_failfirst")}
    # The kills did land inside handlers (after a session handler had written its side
    # effect, or inside the handler without the session).
    mid_handler = [line for line in died_at if line.startswith("start ")]
    assert len(mid_handler) >= KILLS // 2, died_at
    rows = {r["event_id"]: r for r in inbox_rows(migrated)}
    assert sorted(rows) == sorted(event_ids)
    assert [r for r in rows.values() if r["status"] != "done"] == [], "none dead or left open"
    # The killed workers' events were taken over after their lease expired.
    assert sum(r["attempts"] - 1 for r in rows.values()) >= len(mid_handler)
    # Session handlers: exactly one committed side effect per event.
    expected = Counter({(e, h): 1 for e in event_ids for h in SESSION_HANDLERS})
    got = effects(migrated)
    assert got == expected, (got - expected) or (expected - got)
    # The ledger: every handler succeeded, and a handler that had succeeded never ran again
    # (a second success would have counted a second attempt). Only effect_b of a fail-first
    # event ran twice: once failing, once succeeding (or once, if the failure itself was
    # rolled back by a kill).
    runs_ledger = ledger(migrated)
    assert set(runs_ledger) == {(e, h) for e in event_ids for h in HANDLERS}
    for (event_id, handler), (status, attempts) in runs_ledger.items():
        assert status == "succeeded", (event_id, handler)
        allowed = {1, 2} if (handler == "effect_b" and event_id in fail_first) else {1}
        assert attempts in allowed, (event_id, handler, attempts)
    retried = [e for e in fail_first if runs_ledger[(e, "effect_b")][1] == 2]
    assert retried, "no event was retried after a committed handler failure"
    # The handler without the session is at least once: it ran for every event (again
    # wherever a kill or a lost lease rolled its event back), but never again once its
    # success was committed: for the fail-first events retried above, no run of it saw the
    # failure of effect_b that was committed together with its own success.
    runlog_runs = read_runlog(runlog)
    assert {e for e, _failed_before in runlog_runs} == set(event_ids)
    rerun = [e for e, failed_before in runlog_runs if failed_before and e in retried]
    assert rerun == [], "runlog ran again after its success was committed"
