"""Issue 29, item 2, design (b) measured: run a handler outside any write transaction and
flush its writes with the ledger row in one short transaction at the end. What does that
do, on SQLite, to a handler written the usual way while webhooks keep arriving?

``python -m bench.deferred_handler``: one SQLite file (WAL, ``synchronous=FULL``), a thread
storing a webhook every 50 ms (4 clients every 0.2 s) and a "handler" of each shape below
run in a loop for a few seconds each, as (b) would run it (a deferred ``BEGIN``, the handler,
then its writes and ``COMMIT``):

- ``read, call, write``: reads its order, calls a carrier (sleeps), updates the order
  (the ORM's unit of work flushed at the end, or a raw ``UPDATE``): its read pins a WAL
  snapshot, and a write after another connection committed fails at once with
  ``SQLITE_BUSY_SNAPSHOT`` (SQLite's busy handler is not even called): counted as failed;
- ``write, call``: writes first (a raw ``session.execute(update(...))``, or a query that
  autoflushes a pending change), then calls the carrier: its write takes the write lock,
  held to the end: the webhooks wait for it, as today (their worst wait is printed).

Design (a), the intake, changes neither: the handler runs in a ``BEGIN IMMEDIATE``
transaction as today, and webhooks do not need its lock.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import threading
import time
from pathlib import Path


def _connect(path: Path, busy: float = 5.0) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=busy, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _webhooks(path: Path, stop: threading.Event, waits: list[float]) -> None:
    conn = _connect(path)
    n = 0
    while not stop.wait(0.05):
        n += 1
        started = time.monotonic()
        try:
            conn.execute("INSERT INTO inbox (event_id) VALUES (?)", (f"evt_{n}",))
        except sqlite3.OperationalError:
            waits.append(float("inf"))
            continue
        waits.append(time.monotonic() - started)
    conn.close()


def measure(shape: str, call: float, seconds: float) -> tuple[int, int, float]:
    """(runs, failed, the webhooks' worst wait in ms) for a handler of ``shape`` whose
    carrier call takes ``call`` seconds."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "shop.sqlite3"
        setup = _connect(path)
        setup.execute("CREATE TABLE inbox (id INTEGER PRIMARY KEY, event_id TEXT)")
        setup.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT)")
        setup.execute("INSERT INTO orders (id, status) VALUES (1, 'paid')")
        setup.close()
        stop, waits = threading.Event(), list[float]()
        thread = threading.Thread(target=_webhooks, args=(path, stop, waits))
        thread.start()
        handler = _connect(path)
        runs = failed = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            runs += 1
            handler.execute("BEGIN")
            try:
                if shape == "read, call, write":
                    handler.execute("SELECT status FROM orders WHERE id = 1").fetchone()
                    time.sleep(call)
                    handler.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
                else:
                    handler.execute("UPDATE orders SET status = 'shipped' WHERE id = 1")
                    time.sleep(call)
                handler.execute("COMMIT")
            except sqlite3.OperationalError:
                failed += 1
                handler.execute("ROLLBACK")
            time.sleep(0.11)  # a gap, as the worker leaves one (longer than a busy sleep)
        stop.set()
        thread.join()
        handler.close()
    return runs, failed, max(waits, default=0.0) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.deferred_handler")
    parser.add_argument("--seconds", type=float, default=6.0, help="per shape and call length")
    args = parser.parse_args(argv)
    print("| handler (design b) | carrier call | runs | failed | webhooks' worst wait |")
    print("|---|---:|---:|---:|---:|")
    for shape in ("read, call, write", "write, call"):
        for call in (0.1, 1.0):
            runs, failed, worst = measure(shape, call, args.seconds)
            print(f"| {shape} | {call:g} s | {runs} | {failed} | {worst:.0f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
