"""The operator CLI: one line and a documented exit code for every mistake, never a
traceback; read-only commands without the signing secret; events, show, conflicts, status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import click
import pytest

from receiver import Event, __version__
from receiver.cli.commands import hookledger_group, make_program
from receiver.cli.common import walk
from receiver.extension import WebhookReceiver
from receiver.storage.database import head_revision
from receiver.testing import WebhookTestClient
from receiver.testing.factories import build_event
from receiver.worker.heartbeat import check
from reconcile.cli.commands import cli as reconcile_cli
from tests.conftest import PG_URL, SECRETS_SPEC, AppFactory, backend

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
APP = "tests.apps.procapp:create_app"


def run(
    *args: str, program: str = "hookledger", **env: str | None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    environ["PYTHONPATH"] = str(ROOT)
    for key, value in env.items():
        if value is not None:
            environ[key] = value
    return subprocess.run(
        [str(BIN / program), *args], env=environ, cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def one_line(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"hookledger {__version__}"


def test_every_option_of_every_command_has_help() -> None:
    for program in (make_program(), hookledger_group, reconcile_cli):
        for name, command in walk(program):
            for param in command.params:
                if isinstance(param, click.Option):
                    assert param.help, f"{program.name} {name} {param.opts}"
            if name and not isinstance(command, click.Group):
                assert command.help or command.callback.__doc__, f"{program.name} {name}"  # type: ignore[union-attr]
                names = {p.name for p in command.params}
                assert {"log_level", "log_format"} <= names, f"{program.name} {name}"


def test_configuration_mistakes_are_one_line(tmp_path: Path) -> None:
    sqlite = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    # No secret: a command that would need it (the worker).
    one_line(run("--app", APP, "worker", "--burst", HOOKLEDGER_DATABASE_URL=sqlite), 2,
             "HOOKLEDGER_SECRETS")  # fmt: skip
    # Read-only commands do not need it; the schema is missing.
    one_line(run("--app", APP, "events", HOOKLEDGER_DATABASE_URL=sqlite), 2,
             "hookledger db upgrade")  # fmt: skip
    assert run("--app", APP, "db", "upgrade", HOOKLEDGER_DATABASE_URL=sqlite).returncode == 0
    listed = run("--app", APP, "events", HOOKLEDGER_DATABASE_URL=sqlite)
    assert listed.returncode == 0 and "0 event(s) listed" in listed.stdout
    # Unreachable databases, a postgres:// URL (accepted, then unreachable), a bad URL.
    for url in ("postgres://nobody@127.0.0.1:1/none", "postgresql://nobody@127.0.0.1:1/none"):
        one_line(run("--app", APP, "events", HOOKLEDGER_DATABASE_URL=url), 5,
                 "database is unreachable")  # fmt: skip
    one_line(run("--app", APP, "events", HOOKLEDGER_DATABASE_URL="mysql://x@y/z"), 2, "mysql")
    one_line(run("--app", APP, "events", HOOKLEDGER_DATABASE_URL="::nonsense"), 2, "URL")
    one_line(run("--app", "nosuchmodule:create_app", "events"), 2, "nosuchmodule")
    one_line(run("--app", APP, "show", "evt_none", HOOKLEDGER_DATABASE_URL=sqlite), 1,
             "no event")  # fmt: skip
    bad = run("--app", APP, "events", "--status", "bogus", HOOKLEDGER_DATABASE_URL=sqlite)
    assert bad.returncode == 2 and "bogus" in bad.stderr and "Traceback" not in bad.stderr


def test_reconcile_mistakes_are_one_line(tmp_path: Path) -> None:
    sqlite = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    one_line(run("report", program="reconcile", HOOKLEDGER_DATABASE_URL=sqlite), 2,
             "reconcile db upgrade")  # fmt: skip
    one_line(run("db", "current", program="reconcile",
                 HOOKLEDGER_DATABASE_URL="postgres://nobody@127.0.0.1:1/none"), 5)  # fmt: skip
    assert run("db", "upgrade", program="reconcile", HOOKLEDGER_DATABASE_URL=sqlite).returncode == 0
    current = run("db", "current", program="reconcile", HOOKLEDGER_DATABASE_URL=sqlite)
    assert current.returncode == 0 and f"receiver {head_revision()}" in current.stdout
    assert run("adopt", "--new-account", program="reconcile", HOOKLEDGER_DATABASE_URL=sqlite,
               HOOKLEDGER_PROCESSOR_URL="http://127.0.0.1:1",
               HOOKLEDGER_API_KEY="snd_sandbox_key").returncode == 0  # fmt: skip
    from reconcile.sandbox import SandboxServer

    with SandboxServer("snd_sandbox_key") as sandbox:
        # A key the processor refuses, and a key that is not one.
        refused = run("run", program="reconcile", HOOKLEDGER_DATABASE_URL=sqlite,
                      HOOKLEDGER_PROCESSOR_URL=sandbox.base_url,
                      HOOKLEDGER_API_KEY="snd_wrong_key_0000000000")  # fmt: skip
        one_line(refused, 4, "API key")
        assert "snd_wrong_key" not in refused.stderr
        one_line(run("run", program="reconcile", HOOKLEDGER_DATABASE_URL=sqlite,
                     HOOKLEDGER_PROCESSOR_URL=sandbox.base_url,
                     HOOKLEDGER_API_KEY="not-a-key"), 2, "prefix")  # fmt: skip
        ok = run("run", program="reconcile", HOOKLEDGER_DATABASE_URL=sqlite,
                 HOOKLEDGER_PROCESSOR_URL=sandbox.base_url,
                 HOOKLEDGER_API_KEY="snd_sandbox_key")  # fmt: skip
        assert ok.returncode == 0, ok


def test_a_missing_postgres_driver_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    import receiver.storage.database as db
    from receiver.cli.common import describe_error
    from receiver.core.errors import ConfigurationError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "psycopg" else real(name, *a)
    )
    with pytest.raises(ConfigurationError, match=r"pip install 'hookledger\[postgres\]'") as info:
        db.make_engine("postgres://u@h/d")
    assert describe_error(info.value)[1] == 2
    assert db.normalise_url("postgres://u:p@h/d") == "postgresql+psycopg://u:p@h/d"
    assert db.normalise_url("postgresql+psycopg://h/d") == "postgresql+psycopg://h/d"


pytest_storage = pytest.mark.storage


@pytest_storage
def test_events_show_conflicts(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()

    @hooks.on("payment_failed", name="notify")
    def notify(event: Event) -> None:
        raise RuntimeError("mail server down")

    app, _ = make_app(hooks, max_attempts=1)
    client = WebhookTestClient(app)
    for i in range(5):
        client.send("payment_succeeded", event_id=f"evt_{i}", object_id=f"pay_{i}")
    client.send(
        "payment_failed", event_id="evt_f", object_id="pay_f", metadata={"pan": "4111111111111111"}
    )
    client.send("refund_succeeded", event_id="evt_c", object_id="ref_1", amount=1)
    client.send("refund_succeeded", event_id="evt_c", object_id="ref_1", amount=2)
    client.drain()
    cli = app.test_cli_runner()

    listed = cli.invoke(args=["hookledger", "events", "--limit", "3"])
    assert listed.exit_code == 0, listed.output
    lines = listed.output.strip().splitlines()
    assert ["evt_c", "evt_f", "evt_4"] == [line.split()[3] for line in lines[:3]]
    assert "more with --offset 3" in lines[-1]
    page2 = cli.invoke(args=["hookledger", "events", "--limit", "3", "--offset", "3", "--json"])
    data = json.loads(page2.output)
    assert [r["event_id"] for r in data["listed"]] == ["evt_3", "evt_2", "evt_1"]
    assert data["has_more"] is True
    dead = json.loads(
        cli.invoke(args=["hookledger", "events", "--status", "dead", "--json"]).output
    )
    assert [r["event_id"] for r in dead["listed"]] == ["evt_f"]
    assert "mail server down" in dead["listed"][0]["reason"]
    future = cli.invoke(args=["hookledger", "events", "--since", "2999-01-01"])
    assert "0 event(s) listed" in future.output
    by_object = json.loads(
        cli.invoke(args=["hookledger", "events", "--object", "payment:pay_2", "--json"]).output
    )
    assert [r["event_id"] for r in by_object["listed"]] == ["evt_2"]

    shown = cli.invoke(args=["hookledger", "show", "evt_f", "--body"])
    assert shown.exit_code == 0, shown.output
    assert "handler    notify: failed (attempts 1)" in shown.output
    assert "Traceback (most recent call last)" in shown.output
    assert "RuntimeError: mail server down" in shown.output
    assert "4111111111111111" not in shown.output and "1111" in shown.output
    ok = json.loads(cli.invoke(args=["hookledger", "show", "evt_1", "--json"]).output)
    assert (
        ok["transitions"][0]["state"] == "succeeded" and ok["projection"]["status"] == "succeeded"
    )

    conflicts = cli.invoke(args=["hookledger", "conflicts"])
    assert conflicts.exit_code == 0 and "evt_c refund_succeeded" in conflicts.output


@pytest_storage
def test_status_reads_worker_heartbeats(make_app: AppFactory) -> None:
    app, hooks = make_app()
    cli = app.test_cli_runner()
    WebhookTestClient(app).send("payment_succeeded", event_id="evt_s")
    result = cli.invoke(args=["hookledger", "status", "--max-open-age", "0", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["problems"][0].startswith("no worker alive")
    assert data["problems"][1].startswith("oldest open event is")

    worker = WebhookReceiver.state(app).worker(name="w-test")
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        engine = WebhookReceiver.state(app).store.engine
        deadline = time.monotonic() + 10
        while check(engine).workers_alive == 0 or check(engine).open_events["pending"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status = cli.invoke(args=["hookledger", "status"])
        assert status.exit_code == 0, status.output
        assert "workers alive 1" in status.output and "worker w-test alive" in status.output
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert check(engine).workers == ()  # a clean stop removes the heartbeat


def test_status_with_a_dead_worker_row(tmp_path: Path) -> None:
    from datetime import timedelta

    import receiver.storage.database as db
    from receiver.core.clock import utcnow
    from receiver.worker.heartbeat import record

    engine = db.make_engine(f"sqlite:///{tmp_path / 'h.sqlite3'}")
    db.upgrade(engine)
    record(engine, "gone", started_at=utcnow(), processed=3, now=utcnow() - timedelta(minutes=5))
    found = check(engine, worker_timeout=30)
    assert found.workers_alive == 0 and found.workers[0].name == "gone"
    assert "last seen 300 s ago" in found.problems[0]
    engine.dispose()


_ = (build_event, PG_URL, SECRETS_SPEC, backend)


def test_worker_burst_ends_with_code_1_when_the_intake_cannot_be_read(tmp_path: Path) -> None:
    """A review's finding (issue 29): ``worker --burst`` over a SQLite intake that cannot be
    read (a bad restore, a stray file at its path) exited 0, as if every due webhook had been
    dispatched, while the webhooks refused into it or left in it wait."""
    env = {
        "HOOKLEDGER_DATABASE_URL": f"sqlite:///{tmp_path / 'shop.db'}",
        "HOOKLEDGER_SECRETS": "primary:whsec_cli_intake",
    }
    assert run("--app", APP, "db", "upgrade", **env).returncode == 0
    (tmp_path / "shop.db-intake").write_bytes(b"not a database " * 500)
    burst = run("--app", APP, "worker", "--burst", **env)
    assert burst.returncode == 1, (burst.stdout, burst.stderr)
    assert "worker --burst: the intake cannot be read" in burst.stderr
    assert "Traceback" not in burst.stderr


def test_an_in_process_worker_run_gives_the_signals_back(make_app: AppFactory) -> None:
    """`hookledger worker --burst` (and the other long commands) run in-process, as a shop's
    test suite runs them through Flask's CLI runner, put SIGINT and SIGTERM's handlers back
    when they end: Ctrl-C in the test session went to the stopped worker (review)."""
    app, _ = make_app()
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    cli = app.test_cli_runner()  # type: ignore[attr-defined]
    result = cli.invoke(args=["hookledger", "worker", "--burst"])
    assert result.exit_code == 0, result.output
    assert {s: signal.getsignal(s) for s in before} == before
