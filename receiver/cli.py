"""Operator commands: ``flask hookledger ...`` (added by ``init_app``) or ``hookledger --app ...``.

Every command needs the merchant's app (it holds the handlers and the settings). Errors are
one line on stderr and a non-zero exit; ``--json`` where ops will script it.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from typing import Any

import click
from flask import current_app
from flask.cli import FlaskGroup, with_appcontext
from sqlalchemy.exc import DBAPIError

from receiver import db
from receiver.datacli import register as register_data_commands
from receiver.errors import HookledgerError
from receiver.events import parse_event
from receiver.models import EventStatus, InboxEvent
from receiver.operations import EventFilter
from receiver.settings import DOCUMENTED, PREFIX
from receiver.state import ReceiverState, receiver_state

ENV_HELP = "Settings (app.config or environment): " + "; ".join(
    f"{PREFIX}{k}: {v}" for k, v in DOCUMENTED.items()
)


def _state() -> ReceiverState:
    return receiver_state(current_app)


def _fail(message: str) -> None:
    click.echo(f"hookledger: {message}", err=True)
    sys.exit(2)


@click.group("hookledger", help="hookledger webhook inbox.\n\n" + ENV_HELP)
def hookledger_group() -> None:
    pass


@hookledger_group.group("db", help="Schema migrations of hookledger's tables.")
def db_group() -> None:
    pass


@db_group.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@with_appcontext
def db_upgrade(revision: str) -> None:
    """Create or upgrade hookledger's tables."""
    engine = _state().store.engine
    db.upgrade(engine, revision)
    click.echo(f"hookledger schema at {db.current_revision(engine)}")


@db_group.command("current")
@with_appcontext
def db_current() -> None:
    """Print the schema revision."""
    click.echo(db.current_revision(_state().store.engine) or "none")


@hookledger_group.command("worker")
@click.option("--burst", is_flag=True, help="Exit when no event is due.")
@click.option("--lease-seconds", type=float, default=None)
@click.option("--poll-interval", type=float, default=None)
@click.option("--batch-size", type=click.IntRange(1, 1000), default=None)
@click.option("--name", default=None, help="Worker name shown in lease columns.")
@with_appcontext
def worker_cmd(
    burst: bool,
    lease_seconds: float | None,
    poll_interval: float | None,
    batch_size: int | None,
    name: str | None,
) -> None:
    """Process events. SIGTERM finishes the current event, then exits."""
    state = _state()
    overrides = {
        k: v
        for k, v in (
            ("lease_seconds", lease_seconds),
            ("poll_interval", poll_interval),
            ("batch_size", batch_size),
        )
        if v is not None
    }
    worker = state.worker(name=name, **overrides)

    def _stop(signum: int, _frame: Any) -> None:
        logging.getLogger("receiver.worker").info(
            "signal %d: finishing the current event", signum, extra={"action": "worker_signal"}
        )
        worker.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if not _wait_for_schema(state.store.engine, worker.stopping):
        click.echo("hookledger worker stopped before the database was reachable", err=True)
        return
    if not state.registry.handlers:
        click.echo("hookledger: warning: no handlers are registered", err=True)
    state.settings.data.warn("hookledger worker")  # no data key, a short maximum event age
    click.echo(f"hookledger worker {worker.name} started", err=True)
    count = worker.run(burst=burst)
    click.echo(f"hookledger worker {worker.name} stopped after {count} events", err=True)


def _wait_for_schema(engine: Any, stopping: threading.Event) -> bool:
    """Wait until the database answers (a worker may start during an outage), then check the
    schema: a missing migration is a configuration error and ends the command."""
    pause = 0.5
    while not stopping.is_set():
        try:
            db.check_schema(engine)
            return True
        except HookledgerError as exc:
            _fail(exc.message)
        except DBAPIError as exc:
            click.echo(
                f"hookledger: database unreachable ({type(exc.orig or exc).__name__}); "
                f"retrying in {pause:.1f} s",
                err=True,
            )
            stopping.wait(pause)
            pause = min(pause * 2, 10.0)
    return False


def _filter_options(func: Any) -> Any:
    options = [
        click.option("--id", "pks", type=int, multiple=True, help="Inbox row id (repeatable)."),
        click.option("--event-id", "event_ids", multiple=True, help="Event id (repeatable)."),
        click.option("--type", "event_types", multiple=True, help="Event type (repeatable)."),
        click.option(
            "--since", type=click.DateTime(), default=None, help="Received at or after (UTC)."
        ),
        click.option(
            "--until", type=click.DateTime(), default=None, help="Received at or before (UTC)."
        ),
        click.option("--limit", type=int, default=None),
        click.option("--dry-run", is_flag=True, help="Show what would be done."),
        click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _row(e: InboxEvent) -> dict[str, Any]:
    return {
        "id": e.id,
        "event_id": e.event_id,
        "event_type": e.event_type,
        "object": e.object_key,
        "status": e.status,
        "attempts": e.attempts,
        "source": e.source,
        "received_at": e.received_at.isoformat() if e.received_at else None,
        "last_error": (e.last_error or "").splitlines()[-1:] or None,
    }


def _print(
    rows: list[dict[str, Any]], as_json: bool, verb: str, dry_run: bool, *, reasons: bool = False
) -> None:
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, verb: rows}, default=str))
        return
    prefix = "would be " if dry_run else ""
    for r in rows:
        line = f"#{r['id']} {r['event_id']} {r['event_type']} {r['status']} {r['object']}"
        if reasons and r["last_error"]:
            line += f" ({r['last_error'][0]})"
        click.echo(line)
    click.echo(f"{len(rows)} event(s) {prefix}{verb}")


def _event_filter(options: dict[str, Any]) -> EventFilter:
    """The operator filter from the options of :func:`_filter_options` (plus ``statuses``)."""
    return EventFilter(
        pks=options["pks"],
        event_ids=options["event_ids"],
        event_types=options["event_types"],
        statuses=options["statuses"],
        since=options["since"],
        until=options["until"],
        limit=options["limit"],
    )


@hookledger_group.command("requeue")
@_filter_options
@click.option(
    "--status",
    "statuses",
    type=click.Choice([EventStatus.DEAD, EventStatus.PENDING]),
    multiple=True,
    help="Which events (default dead). pending: retry now instead of waiting for backoff.",
)
@with_appcontext
def requeue_cmd(dry_run: bool, as_json: bool, **options: Any) -> None:
    """Requeue dead (or waiting) events; handlers that succeeded are not run again."""
    try:
        chosen = _state().store.requeue(_event_filter(options), dry_run=dry_run)
    except HookledgerError as exc:  # redacted events are refused
        _fail(exc.message)
    _print([_row(e) for e in chosen], as_json, "requeued", dry_run)


@hookledger_group.command("replay")
@_filter_options
@click.option("--status", "statuses", multiple=True, help="Only events in these statuses.")
@with_appcontext
def replay_cmd(dry_run: bool, as_json: bool, **options: Any) -> None:
    """Replay stored events: every handler runs again for a copy (source=replay)."""
    flt = _event_filter(options)
    if flt == EventFilter():
        _fail("replay needs a filter (--id, --event-id, --type, --since/--until or --status)")
    try:
        pairs = _state().store.replay(flt, dry_run=dry_run, parse=parse_event)
    except HookledgerError as exc:  # redacted events are refused; a body sealed with a key
        _fail(exc.message)  # that is not configured names its row
    rows = [{**_row(orig), "replay_event_id": new_id} for orig, new_id in pairs]
    _print(rows, as_json, "replayed", dry_run)


@hookledger_group.command("events")
@click.option("--status", "statuses", multiple=True, help="Only events in these statuses.")
@click.option("--type", "event_types", multiple=True, help="Only events of these types.")
@click.option(
    "--deferred", is_flag=True, help="Only events a handler deferred, with the reason why."
)
@click.option("--limit", type=int, default=50, show_default=True, help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@with_appcontext
def events_cmd(
    statuses: tuple[str, ...],
    event_types: tuple[str, ...],
    deferred: bool,
    limit: int,
    as_json: bool,
) -> None:
    """List stored events."""
    rows = _state().store.select_events(
        EventFilter(statuses=statuses, event_types=event_types, limit=limit, deferred=deferred)
    )
    _print([_row(e) for e in rows], as_json, "listed", False, reasons=deferred)


@hookledger_group.command("stats")
@click.option("--json", "as_json", is_flag=True)
@with_appcontext
def stats_cmd(as_json: bool) -> None:
    """Counts by status and the age of the oldest open event."""
    counts, age = _state().store.stats()
    payload = {"events": counts, "oldest_open_age_seconds": age}
    if as_json:
        click.echo(json.dumps(payload))
    else:
        for status, n in sorted(counts.items()):
            click.echo(f"{status:>10} {n}")
        click.echo(f"oldest open event: {age} s")


# keys, rotate-keys, redact, prune, retention, rejections (receiver/datacli.py)
register_data_commands(hookledger_group)


def main() -> None:
    """``hookledger --app module:create_app <command>``."""
    cli = FlaskGroup(
        name="hookledger", help="hookledger (needs --app or FLASK_APP).\n\n" + ENV_HELP
    )
    for name, command in hookledger_group.commands.items():
        cli.add_command(command, name)
    try:
        cli.main(prog_name="hookledger")
    except HookledgerError as exc:  # a misconfigured app (init_app refused it): one line
        _fail(exc.message)


if __name__ == "__main__":
    main()
