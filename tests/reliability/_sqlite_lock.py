"""Hold SQLite's write lock from another process: ``python -m tests.reliability._sqlite_lock DB
[DB ...]``.

Takes ``BEGIN EXCLUSIVE`` on each database file (say, hookledger's database and its intake,
``<database>-intake``), prints ``locked``, keeps the locks until its stdin is closed (or it is
killed), then rolls back. This is what a long write transaction of
another process does to hookledger (a migration, a ``VACUUM``, a bulk import, a stuck
script): writers wait for the busy timeout, then fail with "database is locked".
"""

from __future__ import annotations

import sqlite3
import sys


def main(*paths: str) -> int:
    conns = [sqlite3.connect(path, timeout=30, isolation_level=None) for path in paths]
    try:
        for conn in conns:
            conn.execute("BEGIN EXCLUSIVE")
        print("locked", flush=True)
        sys.stdin.read()  # until the test closes our stdin
        for conn in conns:
            conn.execute("ROLLBACK")
    finally:
        for conn in conns:
            conn.close()
    print("released", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
