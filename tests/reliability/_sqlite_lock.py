"""Hold SQLite's write lock from another process: ``python -m tests.reliability._sqlite_lock DB``.

Takes ``BEGIN EXCLUSIVE`` on the database file, prints ``locked``, keeps the lock until its
stdin is closed (or it is killed), then rolls back. This is what a long write transaction of
another process does to hookledger (a migration, a ``VACUUM``, a bulk import, a stuck
script): writers wait for the busy timeout, then fail with "database is locked".
"""

from __future__ import annotations

import sqlite3
import sys


def main(path: str) -> int:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        print("locked", flush=True)
        sys.stdin.read()  # until the test closes our stdin
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    print("released", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
