"""Shared helpers: databases, processes, statistics, environment facts, result rows."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

import requests
import sqlalchemy as sa

from bench.bodies import SECRETS_SPEC

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PG_URL = os.environ.get(
    "HOOKLEDGER_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)

Backend = Literal["sqlite", "postgresql"]


def log(message: str) -> None:
    """Progress on stderr (stdout is kept for the final table)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- statistics -------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, int(-(-q * len(sorted_values) // 100)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


# -- result rows ------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Row:
    """One line of the final table: a path, its yardstick, their ratio and the target."""

    bench: str
    case: str
    metric: str
    hookledger: float
    yardstick: float | None
    ratio: float | None
    target: str
    met: bool | None
    unit: str = ""
    samples_a: list[float] = field(default_factory=list)
    samples_b: list[float] = field(default_factory=list)
    note: str = ""


@dataclass(kw_only=True)
class Section:
    """What one benchmark returns: table rows, detail lines (Markdown) and profiles."""

    name: str
    rows: list[Row] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


# -- environment ------------------------------------------------------------------------------


def environment_facts(pg_url: str = PG_URL) -> dict[str, str]:
    facts = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores (nproc)": str(os.cpu_count() or "?"),
        "machine": f"{platform.machine()}, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        facts["cores (nproc)"] = subprocess.run(
            ["nproc"], capture_output=True, text=True, check=True
        ).stdout.strip()
    try:
        engine = sa.create_engine(pg_url)
        with engine.connect() as conn:
            facts["postgresql"] = str(conn.execute(sa.text("SHOW server_version")).scalar())
        engine.dispose()
    except Exception as exc:  # noqa: BLE001 - report, do not fail
        facts["postgresql"] = f"unavailable ({type(exc).__name__})"
    for name, args in (("gunicorn", ["gunicorn", "--version"]), ("wrk", ["wrk", "-v"])):
        exe = shutil.which(args[0], path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        if exe is None:
            facts[name] = "not installed"
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=10)
            text = (out.stdout or out.stderr).strip().splitlines()
            facts[name] = text[0] if text else "?"
    with contextlib.suppress(OSError, ValueError):
        load = os.getloadavg()
        facts["load average at start"] = ", ".join(f"{x:.2f}" for x in load)
    facts["durable commits/s (1-row, one client)"] = commit_probe(pg_url)
    return facts


def commit_probe(pg_url: str = PG_URL, n: int = 300) -> str:
    """How fast this machine makes single-row transactions durable (it bounds every path that
    commits per event): PostgreSQL with ``synchronous_commit=on``, SQLite WAL with
    ``synchronous=FULL``."""
    out = []
    with temp_dir() as workdir:
        for backend in ("postgresql", "sqlite"):
            try:
                with database(backend, workdir, name="probe") as db:
                    engine = sa.create_engine(db.url)
                    with engine.begin() as conn:
                        if backend == "sqlite":
                            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
                        conn.exec_driver_sql(
                            "CREATE TABLE probe (id INTEGER PRIMARY KEY, v INTEGER)"
                        )
                    lat = []
                    with engine.connect() as conn:
                        if backend == "sqlite":
                            conn.exec_driver_sql("PRAGMA synchronous=FULL")
                        for i in range(n):
                            t = time.perf_counter()
                            conn.execute(
                                sa.text("INSERT INTO probe (id, v) VALUES (:i, :i)"), {"i": i}
                            )
                            conn.commit()
                            lat.append(time.perf_counter() - t)
                    engine.dispose()
            except Exception as exc:  # noqa: BLE001 - a fact, not a failure
                out.append(f"{backend}: unavailable ({type(exc).__name__})")
                continue
            lat.sort()
            out.append(
                f"{backend} {n / sum(lat):,.0f}/s (p50 {lat[n // 2] * 1000:.2f} ms, "
                f"p99 {lat[int(n * 0.99)] * 1000:.2f} ms)"
            )
    return "; ".join(out)


def pg_commits(db: Database) -> int:
    """Committed transactions so far in ``db`` (PostgreSQL; statistics of ended sessions)."""
    if db.pg_name is None:
        return 0
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            value = conn.execute(
                sa.text("SELECT xact_commit FROM pg_stat_database WHERE datname = :d"),
                {"d": db.pg_name},
            ).scalar()
    finally:
        admin.dispose()
    return int(value or 0)


# -- databases --------------------------------------------------------------------------------


@dataclass
class Database:
    backend: Backend
    url: str
    label: str
    pg_name: str | None = None

    def engine(self, **kwargs: Any) -> sa.Engine:
        import receiver.storage.database as db

        return db.make_engine(self.url, **kwargs)

    @property
    def child_url(self) -> str:
        """The URL for measured child processes: their sessions can be told apart."""
        if self.pg_name is None:
            return self.url
        return self.url.replace(
            f"application_name={self.pg_name}", f"application_name={self.child_app}"
        )

    @property
    def child_app(self) -> str:
        return f"{self.pg_name}_m"

    def terminate_children(self) -> None:
        """End the PostgreSQL sessions of killed children (a running query outlives its client)."""
        if self.pg_name is None:
            return
        admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = :a"
                    ),
                    {"a": self.child_app},
                )
        finally:
            admin.dispose()


@contextlib.contextmanager
def temp_dir(prefix: str = "hlbench-") -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def database(backend: Backend, workdir: Path, name: str = "bench") -> Iterator[Database]:
    """An empty database: a SQLite file in ``workdir``, or a PostgreSQL database of its own
    (dropped afterwards). A database rather than a schema: hookledger's advisory locks (the
    reconciler's run lock, the workers' object locks) are keyed by schema, but a database of
    its own also keeps the bench's tables, statistics and catalogue apart from whatever else
    runs on the same server."""
    if backend == "sqlite":
        path = workdir / f"{name}.sqlite3"
        yield Database("sqlite", f"sqlite:///{path}", "SQLite (WAL)")
        return
    dbname = f"hlbench_{name}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{dbname}"'))
    base = sa.make_url(PG_URL).set(database=dbname)
    url = base.render_as_string(hide_password=False)
    sep = "&" if "?" in url else "?"
    try:
        yield Database("postgresql", f"{url}{sep}application_name={dbname}", "PostgreSQL", dbname)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
        admin.dispose()


def migrate(db: Database) -> None:
    """hookledger's and the reconciler's migrations, and the yardstick's table."""
    import receiver.storage.database as hdb
    from bench.yardstick import create_yardstick_table, make_yardstick_engine
    from reconcile.storage.store import RECONCILE_MIGRATIONS

    engine = db.engine()
    try:
        hdb.upgrade(engine)
        hdb.upgrade(engine, tree=RECONCILE_MIGRATIONS)
    finally:
        engine.dispose()
    ystick = make_yardstick_engine(db.url)
    try:
        create_yardstick_table(ystick)
    finally:
        ystick.dispose()


# -- processes --------------------------------------------------------------------------------


def child_env(db: Database | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HOOKLEDGER_SECRETS=SECRETS_SPEC,
        PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    if db is not None:
        env["HOOKLEDGER_DATABASE_URL"] = db.child_url
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process in its own process group; stopped (TERM, then KILL) by its pid only."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: dict[str, str],
        stdout: int | IO[Any] | None = None,
        cwd: Path = ROOT,
    ):
        self.args = list(args)
        self._err = tempfile.TemporaryFile()
        self.popen = subprocess.Popen(
            self.args,
            env=env,
            cwd=cwd,
            stdout=subprocess.DEVNULL if stdout is None else stdout,
            stderr=self._err,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stderr_text(self, limit: int = 4000) -> str:
        self._err.seek(0)
        return self._err.read().decode("utf-8", "replace")[-limit:]

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        else:
            # The leader is gone; make sure nothing of its group survives it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self._err.close()
        return self.popen.returncode

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class GunicornConfig:
    workers: int = 2
    worker_class: str = "gthread"
    threads: int = 4
    #: gthread: the keep-alive connections one worker holds at most (``None``: gunicorn's
    #: default, 1,000). See :meth:`balanced`.
    worker_connections: int | None = None

    def describe(self) -> str:
        text = f"gunicorn -w {self.workers} -k {self.worker_class} --threads {self.threads}"
        if self.worker_connections is not None:
            text += f" --worker-connections {self.worker_connections}"
        return text

    def balanced(self, connections: int) -> GunicornConfig:
        """This configuration with each gthread worker holding at most its share of a
        load's ``connections`` keep-alive connections, so the load is spread evenly.

        The workers share one listening socket, and a gthread worker accepts every
        connection it can: when a client opens its connections at once (``wrk -c16``), one
        worker took 10 to 15 of the 16 (``ss`` by process, six runs in a row), and the app
        then ran on about one core (its Python holds the GIL) while the other worker idled:
        a third of the machine idle and the rate halved in those rounds, for the yardstick
        and hookledger alike, at random. Sync workers hold no keep-alive connection."""
        if self.worker_class != "gthread":
            return self
        return replace(self, worker_connections=-(-connections // self.workers))


class Gunicorn(Proc):
    """``gunicorn`` serving ``app`` on a free loopback port."""

    def __init__(
        self,
        app: str,
        *,
        db: Database,
        config: GunicornConfig,
        tree: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``tree``: serve the code of another checkout (``--chdir`` and ``PYTHONPATH``: it
        is imported before this one's editable install), e.g. a baseline to compare with.
        ``env``: more environment for the app."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = child_env(db, **(env or {}))
        chdir: list[str] = []
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
            chdir = ["--chdir", str(tree)]
            _check_imports_from(tree, env)
        super().__init__(
            [
                str(BIN / "gunicorn"),
                *chdir,
                "-w",
                str(config.workers),
                "-k",
                config.worker_class,
                "--threads",
                str(config.threads),
                *(
                    ["--worker-connections", str(config.worker_connections)]
                    if config.worker_connections is not None
                    else []
                ),
                "-b",
                f"127.0.0.1:{self.port}",
                "--backlog",
                "2048",
                "--log-level",
                "warning",
                app,
            ],
            env=env,
            # gunicorn puts its working directory first on ``sys.path``: started here, a
            # baseline would import this checkout's code, not ``tree``'s.
            cwd=tree or ROOT,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"gunicorn exited: {self.stderr_text()}")
            try:
                if requests.get(self.base + "/ping", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gunicorn did not start: {self.stderr_text()}")


def _check_imports_from(tree: Path, env: dict[str, str]) -> None:
    """Refuse to serve a baseline ``tree`` whose processes would import another checkout's
    ``receiver`` (the editable install, or this one's)."""
    found = subprocess.run(
        [sys.executable, "-c", "import receiver; print(receiver.__file__)"],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"a baseline in {tree} would import {found}")


class TimedOut(Exception):
    """A measured child ran past its time limit (it was killed); ``stdout``: what it printed."""

    def __init__(self, message: str, stdout: str = "") -> None:
        super().__init__(message)
        self.stdout = stdout


def run_json(args: Sequence[str], *, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run a child to completion and parse the JSON object it prints last on stdout.

    Raises :class:`TimedOut` after killing the child (its whole process group) at ``timeout``.
    """
    child = subprocess.Popen(
        list(args),
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        partial, _ = child.communicate()
        raise TimedOut(f"{args[:4]} ran past {timeout:g} s", partial or "") from None
    proc = subprocess.CompletedProcess(list(args), child.returncode, stdout, stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{args[:4]} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(
            f"{args[:4]} printed no JSON: {proc.stdout[-500:]} {proc.stderr[-2000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return result
