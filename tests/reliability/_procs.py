"""Process and database helpers of the process-level reliability tests (storm, crash, outage).

Every subprocess is started through a :class:`Procs` group, whose ``close()`` (call it in a
``finally``) terminates, then kills, whatever is still running. Output goes to files in the
test's temporary folder, never to pipes that could fill up; :meth:`Procs.tail` shows it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
import requests
import sqlalchemy as sa

import receiver.storage.database as db
from receiver.core.signature import sign
from tests.apps.relapp import EFFECT_TABLE, create_effect_table
from tests.conftest import SECRETS, SECRETS_SPEC

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
APP = "tests.apps.relapp"
PRIMARY_SECRET = SECRETS["primary"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(database_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HOOKLEDGER_DATABASE_URL=database_url,
        HOOKLEDGER_SECRETS=SECRETS_SPEC,
        HOOKLEDGER_BACKOFF_BASE="0",
        HOOKLEDGER_BACKOFF_MAX="0",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, message: str, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s: {message}")
        time.sleep(interval)


def signed_post(
    session: requests.Session, url: str, body: bytes, *, timeout: float = 30
) -> requests.Response:
    headers = {
        "X-Webhook-Signature-512": sign(body, PRIMARY_SECRET),
        "Content-Type": "application/json",
    }
    return session.post(url, data=body, headers=headers, timeout=timeout)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    _file: IO[bytes]
    #: A pattern the process prints once it handles SIGTERM gracefully (``None``: at once).
    ready: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def output(self) -> str:
        self._file.flush()
        return self.log.read_text(errors="replace")


class Procs:
    """A group of subprocesses that are all gone after :meth:`close`."""

    def __init__(self, folder: Path, database_url: str, **env: str) -> None:
        self.folder = folder
        self.database_url = database_url
        self.env = env
        self.started: list[Proc] = []

    def start(
        self, name: str, argv: Sequence[str], *, stdin_pipe: bool = False, **env: str
    ) -> Proc:
        return self._start_env(name, argv, env, stdin_pipe=stdin_pipe)

    def _start_env(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str],
        *,
        stdin_pipe: bool = False,
    ) -> Proc:
        log = self.folder / f"{name}.{len(self.started)}.log"
        handle = log.open("wb")
        popen = subprocess.Popen(
            list(argv),
            env=child_env(self.database_url, **{**self.env, **env}),
            cwd=ROOT,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        proc = Proc(name, popen, log, handle)
        self.started.append(proc)
        return proc

    def gunicorn(
        self,
        port: int,
        *,
        workers: int,
        name: str = "web",
        app: str = APP,
        threads: int = 1,
        **env: str,
    ) -> Proc:
        """``app``: the module with ``create_app``; ``threads`` above 1: gthread workers."""
        threaded = ["-k", "gthread", "--threads", str(threads)] if threads > 1 else []
        return self._start_env(
            name,
            [
                str(BIN / "gunicorn"),
                "-w",
                str(workers),
                *threaded,
                "-b",
                f"127.0.0.1:{port}",
                "--log-level",
                "warning",
                f"{app}:create_app()",
            ],
            env,
        )

    def worker(self, *args: str, name: str = "worker", app: str = APP, **env: str) -> Proc:
        argv = [str(BIN / "hookledger"), "--app", f"{app}:create_app", "worker", *args]
        proc = self._start_env(name, argv, env)
        proc.ready = r"hookledger worker \S+ started"  # printed after its SIGTERM handler is set
        return proc

    def stop(self, proc: Proc, *, timeout: float = 20) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; return the exit code. A process still
        starting up is given ``timeout`` to get ready first: a SIGTERM before the worker
        installed its handler ends it by the signal (-15), which says nothing about its
        graceful stop (a loaded machine once took that long to start a worker whose
        peers had already drained the queue)."""
        if (ready := proc.ready) is not None:
            wait_until(
                lambda: not proc.alive() or re.search(ready, proc.output()) is not None,
                timeout=timeout,
                message=f"{proc.name} to start",
            )
        if proc.alive():
            proc.popen.send_signal(signal.SIGTERM)
        try:
            return proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            return proc.popen.wait(timeout=10)

    def tail(self, lines: int = 30) -> str:
        out = []
        for proc in self.started:
            text = proc.output().splitlines()[-lines:]
            if text:
                out.append(f"--- {proc.name} pid {proc.pid} rc {proc.popen.poll()}")
                out.extend(text)
        return "\n".join(out)

    def close(self) -> None:
        for proc in self.started:
            if proc.popen.stdin is not None and not proc.popen.stdin.closed:
                with contextlib.suppress(OSError):
                    proc.popen.stdin.close()
            if proc.alive():
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.started:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=10)
            if proc.popen.stdin is not None:
                proc.popen.stdin.close()
            proc._file.close()


def wait_healthy(base_url: str, *, timeout: float = 30, procs: Procs | None = None) -> None:
    def ok() -> bool:
        try:
            return requests.get(base_url + "health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            pytest.fail(f"{base_url} never became healthy\n{procs.tail() if procs else ''}")
        time.sleep(0.1)


@contextmanager
def migrated_engine(database_url: str) -> Iterator[sa.Engine]:
    """Migrate the test database (hookledger's schema and the app's side-effect table), then
    yield a plain engine for the test's own reads.

    The reads do not use ``db.make_engine``: on SQLite that engine opens every transaction,
    even a read, with ``BEGIN IMMEDIATE``, and a worker that runs handlers back to back keeps
    the write lock nearly all the time, so the test's polling would fail with "database is
    locked". A plain engine reads the WAL snapshot without taking the lock.
    """
    engine = db.make_engine(database_url)
    try:
        db.upgrade(engine)
        create_effect_table(engine)
    finally:
        engine.dispose()
    reader = sa.create_engine(database_url)
    try:
        yield reader
    finally:
        reader.dispose()


# -- reading the outcome -----------------------------------------------------------------


def statuses(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT event_id, status FROM hookledger_event")).all()
    return {str(r[0]): str(r[1]) for r in rows}


def inbox_rows(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT id, event_id, status, attempts, last_error FROM hookledger_event")
        ).all()
    return [dict(r._mapping) for r in rows]


def effects(engine: sa.Engine) -> Counter[tuple[str, str]]:
    """(event_id, handler) -> number of committed side-effect rows."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT event_id, handler FROM {EFFECT_TABLE}")).all()
    return Counter((str(r[0]), str(r[1])) for r in rows)


def effect_pids(engine: sa.Engine) -> set[int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT DISTINCT pid FROM {EFFECT_TABLE}")).all()
    return {int(r[0]) for r in rows}


def ledger(engine: sa.Engine) -> dict[tuple[str, str], tuple[str, int]]:
    """(event_id, handler) -> (status, attempts) from hookledger_handler_run."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT e.event_id, h.handler, h.status, h.attempts "
                "FROM hookledger_handler_run h JOIN hookledger_event e ON e.id = h.event_pk"
            )
        ).all()
    return {(str(r[0]), str(r[1])): (str(r[2]), int(r[3])) for r in rows}


def write_bodies(path: Path, bodies: Sequence[bytes]) -> None:
    path.write_text(json.dumps([b.decode("utf-8") for b in bodies]))
