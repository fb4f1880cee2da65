"""Receiving beside a slow handler: does a webhook wait for a handler that takes 10 s?

Issue 29's set-up, as a new user runs it: the README's kind of app (:mod:`bench.slowapp`),
gunicorn gthread (2 x 4) and one ``hookledger worker``. One event's handler sleeps
``handler_seconds`` without touching the session (a carrier or e-mail call); as soon as it
has started, ``clients`` clients each post a signed, unique event every ``interval`` seconds
for as long as the handler runs. Each request's latency is measured from its due time (an
open loop: a request held up delays the next ones of its client, and they count that wait).

The row: receive p99 and the non-2xx answers (target: none, p99 under 100 ms), on SQLite and
on PostgreSQL. Every acknowledged event must then be dispatched, each handler exactly once
(the ledger and the handlers' run log say so), or the round fails.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
import sqlalchemy as sa

from bench.bodies import SECRET, sign
from bench.common import (
    BIN,
    Backend,
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
    percentile,
)
from receiver.testing.factories import build_event, encode

APP = "bench.slowapp:create_app"
#: The handlers of :mod:`bench.slowapp`.
HANDLERS = ("slow_call", "slow_write")


@dataclass(frozen=True, kw_only=True)
class SlowHandlerConfig:
    backends: tuple[Backend, ...] = ("sqlite", "postgresql")
    rounds: int = 2
    handler_seconds: float = 10.0
    clients: int = 4
    interval: float = 0.2
    #: ``sleep``: the slow handler does not take the session; ``write``: it writes through the
    #: session, then sleeps inside the dispatch's transaction.
    variant: str = "sleep"
    gunicorn: GunicornConfig = GunicornConfig(workers=2, worker_class="gthread", threads=4)
    p99_target_ms: float = 100.0


@dataclass
class Round:
    latencies_ms: list[float] = field(default_factory=list)
    non_2xx: int = 0
    errors: int = 0
    posted: int = 0
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def p50(self) -> float:
        return percentile(sorted(self.latencies_ms), 50)

    @property
    def p99(self) -> float:
        return percentile(sorted(self.latencies_ms), 99)

    @property
    def max(self) -> float:
        return max(self.latencies_ms, default=float("nan"))


def _body(metadata: dict[str, object] | None = None) -> bytes:
    return encode(build_event("payment_succeeded", metadata=metadata or {"order_id": "o"}))


def _post(http: requests.Session, url: str, body: bytes, timeout: float = 30) -> int:
    headers = {"X-Webhook-Signature-512": sign(body, SECRET), "Content-Type": "application/json"}
    return http.post(url, data=body, headers=headers, timeout=timeout).status_code


def _client(url: str, start: float, until: float, interval: float, out: Round) -> None:
    lock = threading.Lock()
    with requests.Session() as http:
        k = 0
        while True:
            due = start + k * interval
            if due >= until:
                return
            k += 1
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            body = _body()
            try:
                status = _post(http, url, body)
            except requests.RequestException:
                with lock:
                    out.errors += 1
                continue
            took = (time.monotonic() - due) * 1000
            with lock:
                out.posted += 1
                out.latencies_ms.append(took)
                out.statuses[str(status)] = out.statuses.get(str(status), 0) + 1
                if not 200 <= status < 300:
                    out.non_2xx += 1


def _wait(what: str, check: object, timeout: float, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(poll)


def _settled(engine: sa.Engine, acknowledged: int) -> bool:
    """Every acknowledged event is in the inbox (not still in SQLite's intake), none open."""
    with engine.connect() as conn:
        stored, open_ = conn.execute(
            sa.text(
                "SELECT count(*), coalesce(sum(CASE WHEN status IN ('pending', 'processing')"
                " THEN 1 ELSE 0 END), 0) FROM hookledger_event"
            )
        ).one()
    return int(stored) >= acknowledged and int(open_) == 0


def check_exactly_once(engine: sa.Engine, runlog: Path, acknowledged: int) -> str | None:
    """What is wrong with the round's dispatch (``None``: every event stored, done, and each
    handler run once: one ledger row, one attempt, one run in the log)."""
    with engine.connect() as conn:
        events = conn.execute(sa.text("SELECT id, event_id, status FROM hookledger_event")).all()
        ledger = conn.execute(
            sa.text("SELECT event_pk, handler, status, attempts FROM hookledger_handler_run")
        ).all()
    if len(events) < acknowledged:
        return f"{len(events)} events stored of {acknowledged} acknowledged"
    not_done = [r[1] for r in events if r[2] != "done"]
    if not_done:
        return f"{len(not_done)} events not done: {not_done[:3]}"
    runs: dict[tuple[str, str], int] = {}
    for line in runlog.read_text().splitlines() if runlog.exists() else []:
        event_id, handler = line.split()
        runs[(event_id, handler)] = runs.get((event_id, handler), 0) + 1
    by_pk = {int(r[0]): str(r[1]) for r in events}
    rows = {(by_pk[int(r[0])], str(r[1])): (str(r[2]), int(r[3])) for r in ledger}
    for _pk, event_id, _status in events:
        for handler in HANDLERS:
            if rows.get((event_id, handler)) != ("succeeded", 1):
                return f"{event_id} {handler}: ledger {rows.get((event_id, handler))}"
            if runs.get((event_id, handler)) != 1:
                return f"{event_id} {handler}: ran {runs.get((event_id, handler), 0)} times"
    return None


def one_round(cfg: SlowHandlerConfig, backend: Backend, workdir: Path, index: int) -> Round:
    with database(backend, workdir, name=f"slow{index}") as db:
        return _round(cfg, db, workdir / f"slow{index}")


def _round(cfg: SlowHandlerConfig, db: Database, folder: Path) -> Round:
    from bench.slowapp import create_effect_table

    folder.mkdir(parents=True, exist_ok=True)
    migrate(db)
    engine = db.engine()
    create_effect_table(engine)
    runlog, started = folder / "runlog", folder / "started"
    env = {"HLBENCH_RUNLOG": str(runlog), "HLBENCH_STARTED": str(started)}
    web = Gunicorn(f"{APP}()", db=db, config=cfg.gunicorn.balanced(cfg.clients), env=env)
    worker = Proc(
        [str(BIN / "hookledger"), "--app", APP, "worker"],
        env=child_env(db, **env),
    )
    out = Round()
    try:
        web.wait_ready()
        _wait("the worker", lambda: "started" in worker.stderr_text(), 60)
        url = web.base + "/webhooks/"
        key = "hlbench_sleep" if cfg.variant == "sleep" else "hlbench_write_sleep"
        with requests.Session() as http:
            status = _post(http, url, _body({key: cfg.handler_seconds}))
        if status != 200:
            raise RuntimeError(f"the slow event was answered {status}")
        _wait("the slow handler to start", started.exists, 60, 0.01)
        start = time.monotonic()
        until = start + cfg.handler_seconds - 0.5
        threads = [
            threading.Thread(
                target=_client,
                args=(url, start + i * cfg.interval / cfg.clients, until, cfg.interval, out),
            )
            for i in range(cfg.clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        acknowledged = out.posted - out.non_2xx + 1
        _wait("every event dispatched", lambda: _settled(engine, acknowledged), 120, 0.1)
        problem = check_exactly_once(engine, runlog, acknowledged)
        if problem is not None:
            raise RuntimeError(f"{db.label}: {problem}")
    finally:
        worker.stop()
        web.stop()
        engine.dispose()
    return out


def run(cfg: SlowHandlerConfig, workdir: Path) -> Section:
    section = Section(name="slow handler")
    t0 = time.monotonic()
    what = (
        "sleeps without the session"
        if cfg.variant == "sleep"
        else "writes through the session, then sleeps"
    )
    section.details.append(
        f"One event's handler {what} for {cfg.handler_seconds:g} s in one `hookledger worker`; "
        f"meanwhile {cfg.clients} clients each post a signed unique event every "
        f"{cfg.interval:g} s (latency from each request's due time); "
        f"{cfg.gunicorn.describe()}; every acknowledged event is then checked dispatched, "
        f"each handler once. {cfg.rounds} rounds per database."
    )
    for backend in cfg.backends:
        rounds: list[Round] = []
        for index in range(cfg.rounds):
            rounds.append(one_round(cfg, backend, workdir, index))
            r = rounds[-1]
            log(
                f"  slow handler {backend} round {index + 1}: {r.posted} posted, "
                f"{r.non_2xx} non-2xx, p50 {r.p50:.1f} ms, p99 {r.p99:.1f} ms, "
                f"max {r.max:.1f} ms"
            )
        label = "SQLite (WAL)" if backend == "sqlite" else "PostgreSQL"
        p99 = median([r.p99 for r in rounds])
        non_2xx = sum(r.non_2xx + r.errors for r in rounds)
        section.rows.append(
            Row(
                bench="receive",
                case=(
                    f"{label}, beside a {cfg.handler_seconds:g} s handler, {cfg.clients} clients "
                    f"every {cfg.interval:g} s, p99 ({non_2xx} non-2xx)"
                ),
                metric="p99",
                unit="ms",
                hookledger=p99,
                yardstick=None,
                ratio=None,
                target=f"< {cfg.p99_target_ms:g} ms, 0 non-2xx",
                met=p99 < cfg.p99_target_ms and non_2xx == 0,
                samples_a=[r.p99 for r in rounds],
            )
        )
        section.details.append(f"**{label}**")
        section.details.append("")
        section.details.append("| round | posted | non-2xx | p50 / p99 / max ms | answers |")
        section.details.append("|---|---:|---:|---|---|")
        for n, r in enumerate(rounds, 1):
            section.details.append(
                f"| {n} | {r.posted} | {r.non_2xx + r.errors} | {fmt(r.p50)} / {fmt(r.p99)} / "
                f"{fmt(r.max)} | {json.dumps(r.statuses, sort_keys=True)} |"
            )
        section.details.append("")
    section.seconds = time.monotonic() - t0
    return section


__all__ = ["SlowHandlerConfig", "check_exactly_once", "run"]
