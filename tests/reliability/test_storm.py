"""Duplicate storm: many processes deliver every event many times at once, while workers drain.

Guarantees checked (README, "store", "claim", "handlers"): the insert is race-safe across
processes and hosts (exactly one ``inserted`` answer per event, every other copy a 200
``duplicate``, never a 5xx), no event is lost, and every handler's side effect happens exactly
once per event, both for handlers that write through the ledger's session and for a handler
without the session (its runs are counted in a file), even with several worker processes (and,
on PostgreSQL, two "hosts" of web servers and workers) competing for the same events.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import sqlalchemy as sa

from receiver.testing.factories import build_event, encode
from tests.apps.relapp import HANDLERS, SESSION_HANDLERS, read_runlog
from tests.conftest import backend
from tests.reliability._procs import (
    Proc,
    Procs,
    effect_pids,
    effects,
    free_port,
    inbox_rows,
    ledger,
    migrated_engine,
    wait_healthy,
    wait_until,
    write_bodies,
)

pytestmark = [pytest.mark.storage, pytest.mark.slow]

TYPES = ("payment_succeeded", "refund_succeeded", "dispute_opened", "payout_success")


@pytest.fixture
def migrated(database_url: str) -> Iterator[sa.Engine]:
    with migrated_engine(database_url) as engine:
        yield engine


def _events(n: int) -> dict[str, bytes]:
    """``n`` events, each of its own object, of a few kinds."""
    return {
        f"evt_storm_{i:04d}": encode(
            build_event(
                TYPES[i % len(TYPES)], event_id=f"evt_storm_{i:04d}", object_id=f"obj_storm_{i}"
            )
        )
        for i in range(n)
    }


def _storm(
    procs: Procs,
    folder: Path,
    bodies: list[bytes],
    urls: list[str],
    *,
    clients: int,
    copies: int,
) -> list[tuple[int, str, int, str]]:
    """Start ``clients`` client processes, release them at once, collect every answer."""
    bodies_file = folder / "bodies.json"
    write_bodies(bodies_file, bodies)
    go = folder / "go"
    outs = [folder / f"client{k}.json" for k in range(clients)]
    started: list[Proc] = []
    for k in range(clients):
        # Spread the clients' first requests over the servers.
        rotated = urls[k % len(urls) :] + urls[: k % len(urls)]
        argv = [sys.executable, "-m", "tests.reliability._storm_client", str(bodies_file)]
        argv += [",".join(rotated), str(copies), str(go), str(outs[k])]
        started.append(procs.start(f"client{k}", argv))
    for k, proc in enumerate(started):
        ready = Path(f"{outs[k]}.ready")
        wait_until(partial(_ready, ready, proc), timeout=60, message=f"{proc.name} ready")
    go.write_text("go")
    for proc in started:
        wait_until(partial(_ended, proc), timeout=90, message=f"{proc.name} to finish")
        assert proc.popen.returncode == 0, proc.output()
    results: list[tuple[int, str, int, str]] = []
    for out in outs:
        results.extend(
            (int(i), str(u), int(c), str(r)) for i, u, c, r in json.loads(out.read_text())
        )
    return results


def _ready(flag: Path, proc: Proc) -> bool:
    return flag.exists() or not proc.alive()


def _ended(proc: Proc) -> bool:
    return not proc.alive()


def _assert_exactly_once(
    engine: sa.Engine,
    event_ids: list[str],
    results: list[tuple[int, str, int, str]],
    runlog: Path,
    expected_requests: int,
) -> None:
    # Every request got a 200; exactly one copy of each event was "inserted".
    assert len(results) == expected_requests
    codes = Counter(code for _i, _url, code, _result in results)
    failed = [r for r in results if r[2] != 200]
    assert not failed, f"non-200 answers {codes}: {failed[:5]}"
    inserted = Counter(event_ids[i] for i, _url, _code, result in results if result == "inserted")
    assert inserted == Counter(event_ids), "each event must be inserted exactly once"
    results_seen = Counter(result for *_rest, result in results)
    assert set(results_seen) == {"inserted", "duplicate"}, results_seen
    # No event lost, none invented, every one done.
    rows = inbox_rows(engine)
    assert sorted(r["event_id"] for r in rows) == sorted(event_ids)
    assert [r for r in rows if r["status"] != "done"] == []
    # Side effects: exactly one per event per handler, with and without the session.
    expected = Counter({(e, h): 1 for e in event_ids for h in SESSION_HANDLERS})
    got = effects(engine)
    assert got == expected, {k: v for k, v in (got - expected).items()} or (expected - got)
    runs = Counter(e for e, _ in read_runlog(runlog))
    assert runs == Counter(event_ids), {e: n for e, n in runs.items() if n != 1}
    # The ledger agrees: every handler succeeded at its first and only run, and no event
    # was claimed twice (no worker ever took over another's event).
    assert ledger(engine) == {(e, h): ("succeeded", 1) for e in event_ids for h in HANDLERS}
    assert [r for r in rows if r["attempts"] != 1] == []


def test_duplicate_storm_through_gunicorn_with_concurrent_workers(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    """One host: gunicorn with 3 workers, 4 client processes posting every event 3 times at
    once, 2 worker processes draining while the storm runs."""
    n, clients, copies = 80, 4, 3
    events = _events(n)
    runlog = tmp_path / "runlog.txt"
    procs = Procs(tmp_path, database_url, RELAPP_RUNLOG=str(runlog))
    try:
        port = free_port()
        procs.gunicorn(port, workers=3)
        base = f"http://127.0.0.1:{port}/webhooks/"
        wait_healthy(base, procs=procs)
        workers = [
            procs.worker("--poll-interval", "0.1", "--lease-seconds", "10", name=f"worker{k}")
            for k in range(2)
        ]
        results = _storm(
            procs, tmp_path, list(events.values()), [base], clients=clients, copies=copies
        )
        wait_until(
            lambda: set(s["status"] for s in inbox_rows(migrated)) == {"done"},
            timeout=60,
            message="every event to be done",
        )
        for w in workers:
            assert w.alive(), procs.tail()
            assert procs.stop(w) == 0, w.output()
        _assert_exactly_once(migrated, list(events), results, runlog, n * clients * copies)
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()


@pytest.mark.skipif(backend() != "postgresql", reason="two hosts share one PostgreSQL")
def test_duplicate_storm_two_hosts_sharing_one_postgresql(
    database_url: str, migrated: sa.Engine, tmp_path: Path
) -> None:
    """Two "hosts", each a gunicorn server (own port) and a group of 2 workers, share one
    PostgreSQL; 4 clients post every event 3 times, alternating between the two servers,
    while both worker groups drain."""
    n, clients, copies = 80, 4, 3
    events = _events(n)
    runlog = tmp_path / "runlog.txt"
    # Handlers take a few milliseconds and batches are small, so one worker cannot keep up
    # alone and every worker of both hosts takes part.
    procs = Procs(tmp_path, database_url, RELAPP_RUNLOG=str(runlog), RELAPP_SLEEP="0.005")
    try:
        ports = [free_port(), free_port()]
        while ports[1] == ports[0]:
            ports[1] = free_port()
        urls = [f"http://127.0.0.1:{p}/webhooks/" for p in ports]
        for host, port in zip("AB", ports, strict=True):
            procs.gunicorn(port, workers=2, name=f"web{host}")
        for url in urls:
            wait_healthy(url, procs=procs)
        groups: dict[str, list[Proc]] = {
            host: [
                procs.worker(
                    "--poll-interval",
                    "0.1",
                    "--lease-seconds",
                    "10",
                    # Small batches: one claim of the default 64 could take most of the 80
                    # events, and the test is about the four workers racing each other.
                    "--batch-size",
                    "4",
                    "--name",
                    f"host{host}-worker{k}",
                    name=f"host{host}-worker{k}",
                )
                for k in range(2)
            ]
            for host in "AB"
        }
        results = _storm(
            procs, tmp_path, list(events.values()), urls, clients=clients, copies=copies
        )
        wait_until(
            lambda: set(s["status"] for s in inbox_rows(migrated)) == {"done"},
            timeout=60,
            message="every event to be done",
        )
        for group in groups.values():
            for w in group:
                assert w.alive(), procs.tail()
                assert procs.stop(w) == 0, w.output()
        _assert_exactly_once(migrated, list(events), results, runlog, n * clients * copies)
        # Both servers took part in the storm, and both hosts' workers ran handlers.
        assert {url for _i, url, _c, _r in results} == set(urls)
        pids = effect_pids(migrated)
        for host, group in groups.items():
            assert pids & {w.pid for w in group}, f"host {host}'s workers ran no handler"
    except BaseException:
        print(procs.tail())
        raise
    finally:
        procs.close()
