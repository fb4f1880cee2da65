"""Operator commands: ``flask hookledger ...`` (added by ``init_app``) or ``hookledger --app ...``.

Every command needs the merchant's app (it holds the handlers and the settings). Errors are
one line on stderr and a documented exit code, never a traceback; ``--json`` where ops will
script it; ``--log-level`` and ``--log-format`` on every command.

Exit codes: 0 ok; 1 a problem found (``status``) or no such event (``show``); 2 usage or
configuration error (a missing secret, a bad database URL, a missing driver, the schema
missing or behind); 5 the database is unreachable.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

import click
from flask.cli import FlaskGroup, with_appcontext
from sqlalchemy.exc import DBAPIError

import receiver.storage.database as db
import receiver.worker.heartbeat as heartbeat
from receiver.cli.account_commands import register as register_account_commands
from receiver.cli.common import (
    EXIT_DATABASE,
    EXIT_PROBLEM,
    add_log_options,
    long_running,
    read_only,
    run_main,
    stopped_by_signals,
)
from receiver.cli.context import app_state, checked_engine, fail
from receiver.cli.data_commands import register as register_data_commands
from receiver.cli.event_commands import register as register_event_commands
from receiver.cli.intake_commands import register as register_intake_commands
from receiver.cli.story_commands import register as register_story_commands
from receiver.config.settings import DOCUMENTED, PREFIX
from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.core.errors import HookledgerError
from receiver.core.version import __version__

ENV_HELP = "Settings (app.config or environment): " + "; ".join(
    f"{PREFIX}{k}: {v}" for k, v in DOCUMENTED.items()
)
EXIT_HELP = (
    "Exit codes: 0 ok, 1 a problem found (status) or no such event (show), 2 usage or "
    "configuration error (missing secret, bad database URL, missing driver, schema missing: "
    "run `hookledger db upgrade`), 5 database unreachable or busy."
)


@click.group("hookledger", help="hookledger webhook inbox.\n\n" + ENV_HELP + "\n\n" + EXIT_HELP)
def hookledger_group() -> None:
    pass


@hookledger_group.group("db", help="Schema migrations of hookledger's tables.")
def db_group() -> None:
    pass


@db_group.command("upgrade")
@click.option(
    "--revision",
    default="head",
    show_default=True,
    help="Migrate up (or down) to this Alembic revision of the receiver's tree.",
)
@read_only
@with_appcontext
def db_upgrade(revision: str) -> None:
    """Create or upgrade hookledger's tables."""
    engine = app_state().store.engine
    db.upgrade(engine, revision)
    click.echo(f"hookledger schema at {db.current_revision(engine)}")


@db_group.command("current")
@read_only
@with_appcontext
def db_current() -> None:
    """Print the schema revision (and the latest one this version ships)."""
    engine = app_state().store.engine
    current = db.current_revision(engine)
    head = db.head_revision()
    note = "" if current == head else " (behind: run `hookledger db upgrade`)"
    click.echo(f"{current or 'none'} (head {head}){note}")


@hookledger_group.command("worker")
@click.option("--burst", is_flag=True, help="Exit when no event is due.")
@click.option(
    "--lease-seconds",
    type=click.FloatRange(min=1),
    default=None,
    help="Lease on an event while its handlers run (HOOKLEDGER_LEASE_SECONDS).",
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds to sleep when no event is due (HOOKLEDGER_POLL_INTERVAL).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 1000),
    default=None,
    help="Events claimed and committed together (HOOKLEDGER_BATCH_SIZE).",
)
@click.option("--name", default=None, help="Worker name shown in lease columns.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    envvar="HOOKLEDGER_WORKER_METRICS_PORT",
    help="Serve this worker's Prometheus metrics on this port "
    "(HOOKLEDGER_WORKER_METRICS_PORT; needs hookledger.metrics enabled in the app).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address for --metrics-port.",
)
@with_appcontext
def worker_cmd(
    burst: bool,
    lease_seconds: float | None,
    poll_interval: float | None,
    batch_size: int | None,
    name: str | None,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Process events. SIGTERM finishes the current event, then exits."""
    state = app_state()
    worker = state.worker(
        name=name,
        bounded=True,
        lease_seconds=lease_seconds,
        poll_interval=poll_interval,
        batch_size=batch_size,
    )
    worker.heartbeat = not burst

    def _stop(signum: int) -> None:
        logging.getLogger("receiver.worker").info(
            "signal %d: finishing the current event", signum, extra={"action": "worker_signal"}
        )
        worker.stop()

    try:
        with stopped_by_signals(_stop):
            give_up = worker.config.give_up_after if burst else None
            started = time.monotonic()
            reached = _wait_for_schema(worker.store.engine, worker.stopping, give_up_after=give_up)
            if reached is None:  # each attempt may outlast the bound (a connect timeout)
                fail(
                    "worker --burst: the database did not answer for"
                    f" {time.monotonic() - started:.1f} s (it gives up after {give_up:g} s)",
                    EXIT_DATABASE,
                )
            if not reached:
                click.echo("hookledger worker stopped before the database was reachable", err=True)
                return
            if not state.registry.handlers:
                click.echo("hookledger: warning: no handlers are registered", err=True)
            state.settings.data.warn("hookledger worker")  # no data key, a short maximum event age
            if metrics_port is not None:
                from receiver.web.metrics import serve_worker_metrics

                serve_worker_metrics(
                    metrics_port,
                    metrics_host,
                    engine=state.store.engine,
                    account_label=state.settings.metrics_account_label,
                    account_label_max=state.settings.metrics_account_label_max,
                    known_accounts=[a.id for a in state.settings.accounts],
                    accounts=state.accounts.ids,
                )
            click.echo(f"hookledger worker {worker.name} started", err=True)
            count = worker.run(burst=burst)
            click.echo(f"hookledger worker {worker.name} stopped after {count} events", err=True)
            if worker.gave_up:
                fail(f"worker --burst: {worker.gave_up_because}", EXIT_DATABASE)
            if worker.intake_left:
                fail(f"worker --burst: {worker.intake_left}", EXIT_PROBLEM)
    finally:
        if worker.store is not state.store:  # its own engine (PostgreSQL): nothing left open
            worker.store.engine.dispose()


long_running(worker_cmd)


def _wait_for_schema(
    engine: Any, stopping: threading.Event, *, give_up_after: float | None = None
) -> bool | None:
    """Wait until the database answers (a worker may start during an outage), then check the
    schema: a missing migration is a configuration error and ends the command. ``False``:
    stopped meanwhile; ``None``: no answer within ``give_up_after`` seconds (``--burst``)."""
    pause = 0.5
    started = time.monotonic()
    while not stopping.is_set():
        if give_up_after is not None and time.monotonic() - started >= give_up_after:
            return None
        try:
            db.check_schema(engine)
            return True
        except HookledgerError as exc:
            fail(exc.message)
        except DBAPIError as exc:
            click.echo(
                f"hookledger: database unreachable ({type(exc.orig or exc).__name__}); "
                f"retrying in {pause:.1f} s",
                err=True,
            )
            stopping.wait(pause)
            pause = min(pause * 2, 10.0)
    return False


@hookledger_group.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def stats_cmd(as_json: bool) -> None:
    """Counts by status and the age of the oldest open event."""
    checked_engine()
    counts, age = app_state().store.operations.stats()
    payload = {"events": counts, "oldest_open_age_seconds": age}
    if as_json:
        click.echo(json.dumps(payload))
    else:
        for status, n in sorted(counts.items()):
            click.echo(f"{status:>10} {n}")
        click.echo(f"oldest open event: {age} s")


@hookledger_group.command("status")
@click.option(
    "--max-open-age",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    help="A problem when the oldest open (pending or processing) event is older, seconds.",
)
@click.option(
    "--worker-timeout",
    type=click.FloatRange(min=1),
    default=heartbeat.DEFAULT_WORKER_TIMEOUT,
    show_default=True,
    help="A worker not seen for this long, seconds, is not alive.",
)
@click.option(
    "--no-worker-ok",
    is_flag=True,
    help="Do not count 'no worker alive' as a problem (a deployment without workers yet).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def status_cmd(
    max_open_age: float, worker_timeout: float, no_worker_ok: bool, as_json: bool
) -> None:
    """Is anything wrong: workers alive (their heartbeats), the oldest open event's age, dead
    letters. Exit 1 with one line per problem (for cron, systemd timers, Kubernetes)."""
    found = heartbeat.check(
        checked_engine(),
        worker_timeout=worker_timeout,
        max_open_age=max_open_age,
        require_worker=not no_worker_ok,
    )
    if as_json:
        click.echo(json.dumps(found.as_dict()))
    else:
        age = found.oldest_open_age_seconds
        click.echo(
            f"workers alive {found.workers_alive}; open events "
            f"{sum(found.open_events.values())} (pending {found.open_events['pending']}, "
            f"processing {found.open_events['processing']}"
            + (
                f"; {found.intake} in the intake, oldest {found.intake_oldest_age_seconds:.0f} s"
                if found.intake and found.intake_oldest_age_seconds is not None
                else ""
            )
            + "); oldest open "
            f"{'-' if age is None else f'{age:.0f} s'}; dead letters {found.dead_events}"
        )
        if set(found.accounts) - {DEFAULT_ACCOUNT}:
            for account, figures in found.accounts.items():
                oldest = figures["oldest_open_age_seconds"]
                click.echo(
                    f"  account {account}: open {figures['open']}, oldest open "
                    f"{'-' if oldest is None else f'{oldest:.0f} s'}, dead {figures['dead']}"
                )
        for w in found.workers:
            state = "alive" if w.alive else "not seen"
            click.echo(
                f"  worker {w.name} {state}, last beat {w.age_seconds:.0f} s ago, "
                f"{w.processed} event(s) processed"
            )
        for problem in found.problems:
            click.echo(f"hookledger: {problem}", err=True)
    sys.exit(EXIT_PROBLEM if found.problems else 0)


# events, show, conflicts, requeue, replay (receiver/cli/event_commands.py); keys,
# rotate-keys, redact, prune, retention, rejections (receiver/cli/data_commands.py);
# accounts (receiver/cli/account_commands.py); object, order-index
# (receiver/cli/story_commands.py); intake list|move (receiver/cli/intake_commands.py)
register_event_commands(hookledger_group)
register_data_commands(hookledger_group)
register_account_commands(hookledger_group)
register_story_commands(hookledger_group)
register_intake_commands(hookledger_group)
add_log_options(hookledger_group)


class _Programs(FlaskGroup):
    """``hookledger``: only hookledger's commands (the app is loaded when one runs, never to
    list them, so ``--help`` works with a broken configuration)."""

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return self.commands.get(name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.commands)

    def invoke(self, ctx: click.Context) -> Any:
        from flask.cli import NoAppException

        try:
            return super().invoke(ctx)
        except NoAppException as exc:  # a usage error, said in one line (not with the usage)
            fail(exc.format_message().splitlines()[0])


def make_program() -> click.Group:
    """The ``hookledger`` program: hookledger's commands, ``--app``, ``--version``."""
    cli = _Programs(
        name="hookledger",
        add_default_commands=False,
        add_version_option=False,
        help="hookledger (needs --app or FLASK_APP).\n\n" + ENV_HELP + "\n\n" + EXIT_HELP,
    )
    click.version_option(
        __version__, "--version", prog_name="hookledger", message="%(prog)s %(version)s"
    )(cli)
    for name, command in hookledger_group.commands.items():
        cli.add_command(command, name)
    add_log_options(cli)
    return cli


def main() -> None:
    """``hookledger --app module:create_app <command>``."""
    run_main("hookledger", make_program())


if __name__ == "__main__":
    main()
