"""End to end on SQLite: receive and dispatch at once, hookledger against what users build
instead (a Flask view enqueueing to RQ, and an ``rq`` SimpleWorker).

Each round, for each system (the order alternates from round to round):

* hookledger: a fresh SQLite database (WAL, ``synchronous=FULL``), gunicorn serving
  :func:`bench.yardstick.create_hookledger_app` and one ``hookledger worker`` (its default
  settings), running at the same time;
* RQ: gunicorn serving :func:`bench.rqapp.create_app` (verify the signature, enqueue the body
  to a fresh queue on the local Redis) and one ``rq worker --worker-class rq.SimpleWorker``
  running the same no-op handler after parsing the event.

The same load generator posts the same number of signed, unique events through the same
gunicorn configuration: ``wrk -t1 -c<connections>`` with :file:`bench/post_once.lua` (every
body exactly once; wrk is interrupted once every event is stored or enqueued). The clock
runs from the moment the load starts to the last event done
(hookledger: the last ``processed_at``; RQ: the last job's ``ended_at``); events/s = events
over that time. Every event must end done (hookledger) or finished (RQ).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench import profiling
from bench.bodies import write_pool
from bench.common import (
    BIN,
    ROOT,
    Database,
    Gunicorn,
    GunicornConfig,
    Proc,
    Row,
    Section,
    child_env,
    database,
    fmt,
    log,
    median,
    migrate,
)

LUA = Path(__file__).with_name("post_once.lua")
HOOKLEDGER_APP = "bench.yardstick:create_hookledger_app()"
WORKER_APP = "bench.yardstick:create_hookledger_app"
RQ_APP = "bench.rqapp:create_app()"
REDIS_URL = os.environ.get("HLBENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


@dataclass(frozen=True, kw_only=True)
class EndToEndConfig:
    events: int = 20_000
    rounds: int = 3
    connections: int = 8
    gunicorn: GunicornConfig = GunicornConfig(workers=2, worker_class="gthread", threads=4)
    timeout: float = 600.0
    profile: bool | None = None
    profile_seconds: float = 8.0


@dataclass
class Run:
    """One system's round: events/s from the first post to the last event done."""

    rate: float
    seconds: float
    post_seconds: float
    errors: int  # HTTP errors (wrk)
    events: int  # events done (every acknowledged one)


def _post_all(url: str, pool: Path, connections: int, stored: Any, n: int) -> dict[str, Any]:
    """Post the pool once with wrk; return its summary once ``stored()`` reaches ``n`` (wrk
    runs for a fixed duration: it is interrupted then, and prints its summary)."""
    args = ["wrk", "-t1", f"-c{connections}", "-d3600s", "--timeout", "30s"]
    args += ["-s", str(LUA), url, "--", str(pool)]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        deadline = time.monotonic() + 900
        while stored() < n and proc.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the events were not all stored in 900 s")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    for line in out.splitlines():
        if line.startswith("BENCH_JSON "):
            result: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
            return result
    raise RuntimeError(f"wrk failed ({proc.returncode}): {out[-800:]} {err[-800:]}")


def _errors(result: dict[str, Any]) -> int:
    keys = ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")
    return sum(int(result[k]) for k in keys)


def _wait_for(what: str, check: Any, timeout: float, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(poll)


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class _EndToEnd:
    def __init__(self, cfg: EndToEndConfig, workdir: Path, pool: Path) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.pool = pool

    def hookledger(self, round_index: int, spy: Path | None = None) -> Run:
        n = self.cfg.events
        with database("sqlite", self.workdir, name=f"e2e{round_index}") as db:
            migrate(db)
            engine = db.engine()
            web = Gunicorn(
                HOOKLEDGER_APP, db=db, config=self.cfg.gunicorn.balanced(self.cfg.connections)
            )
            worker = Proc(
                [str(BIN / "hookledger"), "--app", WORKER_APP, "worker"], env=child_env(db)
            )
            try:
                web.wait_ready()
                _wait_for("the worker", lambda: "started" in worker.stderr_text(), 60)
                attach = (
                    profiling.Attach(
                        worker.pid, spy, self.cfg.profile_seconds, subprocesses=False, idle=True
                    )
                    if spy is not None
                    else None
                )
                started = time.time()
                result = _post_all(
                    web.base + "/webhooks/",
                    self.pool,
                    self.cfg.connections,
                    lambda: _stored(engine),
                    n,
                )
                posted = time.time() - started
                _wait_for("no open event", lambda: _open(engine) == 0, self.cfg.timeout, 0.1)
                if attach is not None:
                    attach.wait()
                with engine.connect() as conn:
                    row = conn.execute(
                        sa.text(
                            "SELECT count(*), max(processed_at) FROM hookledger_event"
                            " WHERE status = 'done'"
                        )
                    ).one()
            finally:
                worker.stop()
                web.stop()
                engine.dispose()
        done = int(row[0])
        if done < n - _errors(result):
            raise RuntimeError(f"{done} events done of {n} posted ({_errors(result)} errors)")
        last = row[1] if isinstance(row[1], datetime) else datetime.fromisoformat(str(row[1]))
        seconds = _utc(last).timestamp() - started
        return Run(done / seconds, seconds, posted, _errors(result), done)

    def rq(self) -> Run:
        from redis import Redis
        from rq import Queue, Worker
        from rq.job import Job
        from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry

        n = self.cfg.events
        name = f"hlbench-{uuid.uuid4().hex[:8]}"
        redis = Redis.from_url(REDIS_URL)
        queue = Queue(name, connection=redis)
        finished = FinishedJobRegistry(queue=queue)
        failed = FailedJobRegistry(queue=queue)
        running = StartedJobRegistry(queue=queue)
        os.environ["HLBENCH_RQ_QUEUE"] = name  # the web processes' environment
        env = child_env(None, HLBENCH_RQ_QUEUE=name, HLBENCH_REDIS_URL=REDIS_URL)
        placeholder = Database("sqlite", f"sqlite:///{self.workdir / 'rq-unused.sqlite3'}", "-")
        web = Gunicorn(
            RQ_APP, db=placeholder, config=self.cfg.gunicorn.balanced(self.cfg.connections)
        )
        worker = Proc(
            [
                str(BIN / "rq"),
                "worker",
                "--worker-class",
                "rq.SimpleWorker",
                "--url",
                REDIS_URL,
                name,
            ],
            env=env,
        )
        try:
            web.wait_ready()
            _wait_for("the rq worker", lambda: Worker.count(queue=queue) >= 1, 60)
            started = time.time()
            result = _post_all(
                web.base + "/webhooks/",
                self.pool,
                self.cfg.connections,
                lambda: queue.count + running.count + finished.count + failed.count,
                n,
            )
            posted = time.time() - started
            _wait_for(
                "every job finished",
                lambda: queue.count == 0 and running.count == 0,
                self.cfg.timeout,
                0.1,
            )
            done = finished.count
            if failed.count:
                raise RuntimeError(f"{failed.count} RQ jobs failed")
            # The registry is ordered by expiry (end + result TTL): the last is the latest.
            newest: list[bytes] = redis.zrange(finished.key, -1, -1)  # type: ignore[assignment]
            last_id = newest[0].decode()
            ended = Job.fetch(last_id, connection=redis).ended_at
            if ended is None:
                raise RuntimeError("the last RQ job has no end time")
        finally:
            worker.stop()
            web.stop()
            for key in redis.scan_iter(f"*{name}*"):
                redis.delete(key)
            os.environ.pop("HLBENCH_RQ_QUEUE", None)
        if done < n - _errors(result):
            raise RuntimeError(f"{done} jobs finished of {n} posted ({_errors(result)} errors)")
        seconds = _utc(ended).timestamp() - started
        return Run(done / seconds, seconds, posted, _errors(result), done)


def _stored(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM hookledger_event")).scalar_one())


def _open(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM hookledger_event"
                    " WHERE status IN ('pending', 'processing')"
                )
            ).scalar_one()
        )


def run(cfg: EndToEndConfig, workdir: Path) -> Section:
    section = Section(name="endtoend")
    t0 = time.monotonic()
    pool = write_pool(workdir / "e2e-pool.txt", cfg.events)
    bench = _EndToEnd(cfg, workdir, pool)
    hl: list[Run] = []
    rq: list[Run] = []
    for r in range(cfg.rounds):
        order = ("hookledger", "rq") if r % 2 == 0 else ("rq", "hookledger")
        for system in order:
            if system == "hookledger":
                hl.append(bench.hookledger(r))
            else:
                rq.append(bench.rq())
        log(
            f"  endtoend round {r + 1}: hookledger {hl[-1].rate:.0f}/s ({hl[-1].seconds:.1f} s), "
            f"RQ {rq[-1].rate:.0f}/s ({rq[-1].seconds:.1f} s)"
        )
    value = median([x.rate for x in hl])
    yard = median([x.rate for x in rq])
    section.rows.append(
        Row(
            bench="endtoend",
            case=f"SQLite, receive + 1 worker, {cfg.events:,} events",
            metric="events/s",
            hookledger=value,
            yardstick=yard,
            ratio=value / yard if yard else None,
            target=">= RQ SimpleWorker",
            met=value >= yard,
            samples_a=[x.rate for x in hl],
            samples_b=[x.rate for x in rq],
        )
    )

    def runs(xs: list[Run]) -> str:
        return ", ".join(
            f"{fmt(x.rate)}/s ({x.seconds:.1f} s; posting took {x.post_seconds:.1f} s"
            + (f"; {x.errors} HTTP errors, {x.events} events" if x.errors else "")
            + ")"
            for x in xs
        )

    server = cfg.gunicorn.balanced(cfg.connections)
    section.details.append(
        f"SQLite (WAL, synchronous=FULL) against Redis + RQ; {server.describe()} for "
        f"both; load `wrk -t1 -c{cfg.connections}` posting {cfg.events:,} signed unique "
        "events once each; one `hookledger worker` (default settings) against one "
        "`rq worker --worker-class rq.SimpleWorker`, running while the events arrive; from "
        "the first post to the last event done. "
        f"{cfg.rounds} rounds, order alternating."
    )
    section.details.append(f"- hookledger: {runs(hl)}")
    section.details.append(f"- RQ: {runs(rq)}")
    if cfg.profile or (cfg.profile is None and value < yard):
        _profile(cfg, bench, section)
    section.seconds = time.monotonic() - t0
    return section


def _profile(cfg: EndToEndConfig, bench: _EndToEnd, section: Section) -> None:
    if profiling.py_spy() is None:
        section.profiles.append("(py-spy not installed: no end-to-end profile)")
        return
    out = bench.workdir / "endtoend.txt"
    log(f"  profiling the hookledger worker for {cfg.profile_seconds:g} s (py-spy)")
    bench.hookledger(99, spy=out)
    section.profiles.append(
        profiling.summarize_worker(
            out,
            title="end to end, SQLite: the `hookledger worker` while events arrive",
        )
    )
    out.unlink(missing_ok=True)


__all__ = ["EndToEndConfig", "run"]
