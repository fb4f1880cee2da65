"""Where a delivery's CPU goes under load: ``python -m bench.cpu_per_request``.

For the yardstick and hookledger (and, with ``--baseline DIR``, another checkout's hookledger
served from that checkout; with ``--accounts N``, hookledger with N sellers on the shared URL,
each delivery a seller's), each behind gunicorn ``-w 2 -k gthread --threads 4`` (``--sync``:
``-w 4 -k sync``) on one database: ``wrk -c16`` posts signed unique deliveries for
``--seconds``, and the CPU time of the gunicorn workers and of every PostgreSQL server process
(``/proc/<pid>/stat``) and of the whole machine (``/proc/stat``) is read before and after, then
divided by the requests served. Rounds alternate the apps. The machine is shared and CPU-bound
under this load, so throughput follows the CPU per request: this tells which side of the
connection (the web process or the database) a difference is on. With ``--duplicates`` every
request re-posts a delivery already stored. Linux only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

from bench.bodies import write_pool
from bench.common import Gunicorn, GunicornConfig, database, migrate, temp_dir
from bench.receive import ACCOUNTS_APP, post_whole_pool, run_wrk

APPS = {
    "yardstick": "bench.yardstick:create_app()",
    "hookledger": "bench.yardstick:create_hookledger_app()",
}
_HZ = os.sysconf("SC_CLK_TCK")
#: wrk -c16 against each app, its connections spread evenly over the workers.
_CONNECTIONS = 16
_CONFIG = GunicornConfig().balanced(_CONNECTIONS)
#: ``--sync``: the receive bench's sync-worker row.
SYNC_CONFIG = GunicornConfig(workers=4, worker_class="sync", threads=1)


def _ticks(pid: int) -> int:
    """User and system CPU ticks of ``pid`` and its waited-for children (0 once gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0
    return sum(int(value) for value in fields[11:15])


def _switches(pid: int) -> int:
    """Context switches (voluntary and not) of every thread of ``pid`` so far."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    if line.endswith("ctxt_switches:\t" + line.rsplit("\t", 1)[-1]):
                        total += int(line.rsplit("\t", 1)[-1])
        except FileNotFoundError:
            continue
    return total


def _system_ticks(pid: int) -> int:
    """System CPU ticks of ``pid`` (its own, not its children's)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[12])
    except FileNotFoundError:
        return 0


def _pids(*args: str) -> list[int]:
    out = subprocess.run(["pgrep", *args], capture_output=True, text=True, check=False).stdout
    return [int(pid) for pid in out.split()]


def _machine() -> tuple[int, int]:
    """All ticks and idle (with I/O wait) ticks of the machine."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return sum(values), values[3] + values[4]


def measure(
    backend: Literal["sqlite", "postgresql"],
    rounds: int,
    seconds: float,
    baseline: Path | None,
    accounts: int = 0,
    duplicates: bool = False,
    config: GunicornConfig = _CONFIG,
) -> None:
    with temp_dir() as work, database(backend, work, name="cpureq") as db:
        migrate(db)
        servers = {name: Gunicorn(app, db=db, config=config) for name, app in APPS.items()}
        if baseline is not None:
            servers["baseline"] = Gunicorn(APPS["hookledger"], db=db, config=config, tree=baseline)
        if accounts:
            os.environ["HLBENCH_ACCOUNTS"] = str(accounts)  # read by create_accounts_app
            servers["accounts"] = Gunicorn(ACCOUNTS_APP[1], db=db, config=config)
        try:
            for server in servers.values():
                server.wait_ready()
            stored: dict[str, Path] = {}
            if duplicates:  # each app's pool posted once: every later request a duplicate
                for name, server in servers.items():
                    stored[name] = write_pool(work / f"stored-{name}.txt", 3000)
                    post_whole_pool(server.base + "/webhooks/", stored[name], _CONNECTIONS)
            for index in range(rounds):
                order = list(servers.items())
                for name, server in order if index % 2 == 0 else order[::-1]:
                    sellers = accounts if name == "accounts" else 0
                    pool = stored.get(name) or write_pool(
                        work / f"pool-{name}-{index}.txt", 40_000, accounts=sellers
                    )
                    workers = _pids("-P", str(server.pid))
                    postgres = _pids("-u", "postgres")
                    web0, db0, (all0, idle0) = _ticks_of(workers), _ticks_of(postgres), _machine()
                    sys0 = sum(_system_ticks(pid) for pid in workers)
                    cs0 = sum(_switches(pid) for pid in workers)
                    out = run_wrk(server.base + "/webhooks/", pool, seconds, _CONNECTIONS)
                    postgres += [p for p in _pids("-u", "postgres") if p not in postgres]
                    web1, db1, (all1, idle1) = _ticks_of(workers), _ticks_of(postgres), _machine()
                    sys1 = sum(_system_ticks(pid) for pid in workers)
                    cs1 = sum(_switches(pid) for pid in workers)
                    n = max(1, int(out["requests"]))
                    busy = (all1 - all0) - (idle1 - idle0)

                    def us(ticks: int, n: int = n) -> float:
                        return 1e6 * ticks / _HZ / n

                    print(
                        f"{backend} round {index + 1} {name:10s} {n / seconds:7,.0f}/s  "
                        f"gunicorn {us(web1 - web0):5.0f} us/req "
                        f"(system {us(sys1 - sys0):4.0f}, {(cs1 - cs0) / n:4.1f} switches)  "
                        f"postgres {us(db1 - db0):4.0f} us/req  "
                        f"machine busy {us(busy):5.0f} us/req  "
                        f"idle {100 * (idle1 - idle0) / max(1, all1 - all0):.0f} %",
                        flush=True,
                    )
        finally:
            for server in servers.values():
                server.stop()


def _ticks_of(pids: list[int]) -> int:
    return sum(_ticks(pid) for pid in pids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_per_request", description=__doc__)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], action="append")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--baseline", type=Path, help="another checkout's hookledger, too")
    parser.add_argument(
        "--accounts", type=int, default=0, help="also hookledger with this many sellers"
    )
    parser.add_argument(
        "--duplicates",
        action="store_true",
        help="every request a duplicate (each app's pool of 3,000 posted once first)",
    )
    parser.add_argument(
        "--sync", action="store_true", help="gunicorn -w 4 -k sync (the receive bench's sync row)"
    )
    args = parser.parse_args(argv)
    config = SYNC_CONFIG if args.sync else _CONFIG
    for backend in args.backend or ["postgresql", "sqlite"]:
        measure(
            backend,
            args.rounds,
            args.seconds,
            args.baseline,
            args.accounts,
            args.duplicates,
            config,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
