"""Guarantees about processes: gunicorn web workers, worker processes, SIGKILL and SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

import receiver.storage.database as db
from receiver.core.signature import sign
from receiver.testing.factories import build_event, encode
from tests.apps.procapp import EFFECT_TABLE, create_effect_table
from tests.conftest import SECRETS, SECRETS_SPEC

pytestmark = [pytest.mark.storage, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def _env(database_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HOOKLEDGER_DATABASE_URL=database_url,
        HOOKLEDGER_SECRETS=SECRETS_SPEC,
        HOOKLEDGER_BACKOFF_BASE="0",
        HOOKLEDGER_BACKOFF_MAX="0",
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def migrated(database_url: str) -> Iterator[sa.Engine]:
    engine = db.make_engine(database_url)
    db.upgrade(engine)
    create_effect_table(engine)
    yield engine
    engine.dispose()


def _worker(database_url: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(BIN / "hookledger"), "--app", "tests.apps.procapp:create_app", "worker", *args],
        env=_env(database_url, **env),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _effects(engine: sa.Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT event_id, handler FROM {EFFECT_TABLE}")).all()
    return [(r[0], r[1]) for r in rows]


def _statuses(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT event_id, status FROM hookledger_event")).all()
    return {r[0]: r[1] for r in rows}


def _post_all(args: tuple[str, list[bytes]]) -> list[int]:
    url, bodies = args
    codes = []
    with requests.Session() as session:
        for body in bodies:
            headers = {
                "X-Webhook-Signature-512": sign(body, SECRETS["primary"]),
                "Content-Type": "application/json",
            }
            codes.append(session.post(url, data=body, headers=headers, timeout=30).status_code)
    return codes


def test_concurrent_duplicates_from_many_processes_store_and_run_once(
    database_url: str, migrated: sa.Engine
) -> None:
    port = _free_port()
    web = subprocess.Popen(
        [
            str(BIN / "gunicorn"),
            "-w",
            "4",
            "-b",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
            "tests.apps.procapp:create_app()",
        ],
        env=_env(database_url),
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}/webhooks/"
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(base + "health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.1)
        events = [
            encode(build_event("payment_succeeded", object_id=f"pay_dup_{i}")) for i in range(20)
        ]
        # 6 client processes each deliver every event twice, in different orders, at once.
        jobs = [(base, (events if k % 2 else events[::-1]) * 2) for k in range(6)]
        with ProcessPoolExecutor(max_workers=6) as pool:
            codes = [c for result in pool.map(_post_all, jobs) for c in result]
        assert set(codes) == {200}, codes
        assert len(_statuses(migrated)) == 20
    finally:
        web.terminate()
        web.wait(timeout=30)
    workers = [_worker(database_url, "--burst") for _ in range(2)]
    for w in workers:
        assert w.wait(timeout=120) == 0, w.stderr.read().decode() if w.stderr else ""
    effects = _effects(migrated)
    assert sorted(effects) == sorted(
        (f, h) for f in _statuses(migrated) for h in ("first", "second")
    )
    assert set(_statuses(migrated).values()) == {"done"}


def test_killed_workers_event_is_finished_by_another(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    hold.write_text("blocking")
    body = encode(
        build_event("payment_succeeded", event_id="evt_kill", metadata={"hold_file": str(hold)})
    )
    from receiver.core.events import parse_event
    from receiver.store import Store

    Store(migrated).inbox.insert(parse_event(body), body)
    victim = _worker(database_url, "--lease-seconds", "2", "--poll-interval", "0.05")
    started = Path(str(hold) + ".started")
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline, "the handler never started"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    hold.unlink()
    assert _statuses(migrated)["evt_kill"] == "processing"
    assert _effects(migrated) == []

    rescuer = _worker(database_url, "--lease-seconds", "2", "--poll-interval", "0.05")
    try:
        deadline = time.monotonic() + 30
        while _statuses(migrated)["evt_kill"] != "done":
            assert time.monotonic() < deadline, "the event was never finished"
            time.sleep(0.1)
    finally:
        rescuer.send_signal(signal.SIGTERM)
        assert rescuer.wait(timeout=30) == 0
    assert sorted(_effects(migrated)) == [("evt_kill", "first"), ("evt_kill", "second")]


def test_sigterm_finishes_the_current_event_then_exits(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    hold.write_text("blocking")
    body = encode(
        build_event("refund_succeeded", event_id="evt_term", metadata={"hold_file": str(hold)})
    )
    # refunds carry metadata on the refund object too
    from receiver.core.events import parse_event
    from receiver.store import Store

    Store(migrated).inbox.insert(parse_event(body), body)
    worker = _worker(database_url, "--poll-interval", "0.05")
    started = Path(str(hold) + ".started")
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline, "the handler never started"
        time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert worker.poll() is None, "the worker must finish its event before exiting"
    hold.unlink()
    assert worker.wait(timeout=30) == 0
    assert _statuses(migrated)["evt_term"] == "done"
    assert sorted(_effects(migrated)) == [("evt_term", "first"), ("evt_term", "second")]


def test_worker_started_while_the_database_is_down_waits_instead_of_crashing(
    tmp_path: Path,
) -> None:
    # Regression: the start-up schema check let the driver's error end the worker.
    down = "postgresql+psycopg://postgres@127.0.0.1:1/none"
    worker = _worker(down, "--poll-interval", "0.05")
    try:
        assert worker.stderr is not None
        first = worker.stderr.readline().decode()  # blocks until the worker reports the outage
        while "no data key" in first:  # the start-up warning of a worker without a data key
            first = worker.stderr.readline().decode()
        assert "database unreachable" in first, first
        time.sleep(1.0)
        assert worker.poll() is None, "the worker must wait for the database"
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if worker.stderr:
            worker.stderr.close()


def test_a_worker_burst_with_a_committing_handler_ends_and_ships_as_the_ledger_says(
    database_url: str, migrated: sa.Engine
) -> None:
    """Issue 28, hole 1, in a real process: a handler that calls ``session.commit()`` used to
    end the worker's transaction; the worker took the next error for an outage and claimed
    the event again for ever (``--burst`` never ended), the shipment committed on each loop
    without its ledger row. Now ``worker --burst`` ends; the event is dead-lettered after its
    attempts with the refusal as its error, nothing was shipped, and the rollback-pattern
    handler beside it reserved each object once."""
    from receiver.core.events import parse_event
    from receiver.store import Store
    from tests.apps.commitapp import RESERVATION_TABLE, SHIPMENT_TABLE, create_shop_tables

    create_shop_tables(migrated)
    store = Store(migrated)
    for event_type, object_id, event_id in (
        ("payment_succeeded", "pay_1", "evt_pay"),
        ("refund_succeeded", "pay_1", "evt_refund"),  # reserves pay_1 again: rolled back
    ):
        body = encode(build_event(event_type, object_id=object_id, event_id=event_id))
        store.inbox.insert(parse_event(body), body)
    with migrated.begin() as conn:  # pay_1 was reserved before, by the shop itself
        conn.execute(sa.text(f"INSERT INTO {RESERVATION_TABLE} (object_id) VALUES ('pay_1')"))

    worker = subprocess.Popen(
        [
            str(BIN / "hookledger"),
            "--app",
            "tests.apps.commitapp:create_app",
            "worker",
            "--burst",
            "--poll-interval",
            "0.05",
        ],
        env=_env(database_url, HOOKLEDGER_MAX_ATTEMPTS="3"),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _, stderr = worker.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()
        _, stderr = worker.communicate()
        pytest.fail("worker --burst never ended: " + stderr.decode(errors="replace")[-2000:])
    assert worker.returncode == 0, stderr.decode(errors="replace")[-2000:]
    assert b"storage unavailable" not in stderr

    with migrated.connect() as conn:
        events = {
            r.event_id: r
            for r in conn.execute(
                sa.text("SELECT id, event_id, status, attempts, last_error FROM hookledger_event")
            )
        }
        ledger = {
            (r.event_pk, r.handler): r
            for r in conn.execute(
                sa.text("SELECT event_pk, handler, status, attempts FROM hookledger_handler_run")
            )
        }
        shipped = conn.execute(sa.text(f"SELECT event_id FROM {SHIPMENT_TABLE}")).all()
        reserved = conn.execute(sa.text(f"SELECT object_id FROM {RESERVATION_TABLE}")).all()
    pay, refund = events["evt_pay"], events["evt_refund"]
    assert (pay.status, pay.attempts) == ("dead", 3)
    assert "HandlerTransactionError" in (pay.last_error or "")
    ship = ledger[(pay.id, "ship")]
    assert (ship.status, ship.attempts) == ("failed", 3)
    assert shipped == []  # shipped exactly as often as the ledger says it succeeded: never
    assert ledger[(pay.id, "reserve")].status == "succeeded"
    assert refund.status == "done" and ledger[(refund.id, "reserve")].status == "succeeded"
    assert [r[0] for r in reserved] == ["pay_1"]
