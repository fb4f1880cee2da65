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
import signal
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from flask import current_app
from flask.cli import FlaskGroup, with_appcontext
from sqlalchemy.exc import DBAPIError

import receiver.storage.database as db
import receiver.storage.operator_reads as queries
import receiver.worker.heartbeat as heartbeat
from receiver.cli.common import (
    EXIT_PROBLEM,
    EXIT_USAGE,
    add_log_options,
    describe_error,
    long_running,
    read_only,
    run_main,
)
from receiver.cli.data_commands import register as register_data_commands
from receiver.config.settings import DOCUMENTED, PREFIX
from receiver.core.errors import HookledgerError
from receiver.core.events import parse_event
from receiver.core.masking import mask_body, mask_headers
from receiver.core.version import __version__
from receiver.storage.operator_actions import EventFilter
from receiver.storage.tables import EventStatus, InboxEvent, Source
from receiver.web.state import ReceiverState, receiver_state

ENV_HELP = "Settings (app.config or environment): " + "; ".join(
    f"{PREFIX}{k}: {v}" for k, v in DOCUMENTED.items()
)
EXIT_HELP = (
    "Exit codes: 0 ok, 1 a problem found (status) or no such event (show), 2 usage or "
    "configuration error (missing secret, bad database URL, missing driver, schema missing: "
    "run `hookledger db upgrade`), 5 database unreachable."
)

F = TypeVar("F", bound=Callable[..., Any])


def _state() -> ReceiverState:
    return receiver_state(current_app)


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    click.echo(f"hookledger: {message}", err=True)
    sys.exit(code)


def _engine(*, schema: bool = True) -> Any:
    """The receiver's engine; with ``schema``, first check it is migrated (one line and exit
    2 when it is not, exit 5 when the database cannot be reached)."""
    engine = _state().store.engine
    if schema:
        try:
            db.check_schema(engine)
        except (HookledgerError, DBAPIError) as exc:
            message, code = describe_error(exc)
            _fail(message, code)
    return engine


def _utc(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


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
    engine = _state().store.engine
    db.upgrade(engine, revision)
    click.echo(f"hookledger schema at {db.current_revision(engine)}")


@db_group.command("current")
@read_only
@with_appcontext
def db_current() -> None:
    """Print the schema revision (and the latest one this version ships)."""
    engine = _state().store.engine
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
    worker.heartbeat = not burst

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
    if metrics_port is not None:
        from receiver.web.metrics import serve_worker_metrics

        serve_worker_metrics(metrics_port, metrics_host, engine=state.store.engine)
    click.echo(f"hookledger worker {worker.name} started", err=True)
    count = worker.run(burst=burst)
    click.echo(f"hookledger worker {worker.name} stopped after {count} events", err=True)


long_running(worker_cmd)


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
        click.option(
            "--limit", type=click.IntRange(min=1), default=None, help="At most this many events."
        ),
        click.option("--dry-run", is_flag=True, help="Show what would be done; change nothing."),
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
    _engine()
    try:
        chosen = _state().store.operations.requeue(_event_filter(options), dry_run=dry_run)
    except HookledgerError as exc:  # redacted events are refused
        _fail(exc.message)
        return
    _print([_row(e) for e in chosen], as_json, "requeued", dry_run)


@hookledger_group.command("replay")
@_filter_options
@click.option(
    "--status",
    "statuses",
    type=click.Choice(EventStatus.ALL),
    multiple=True,
    help="Only events in these statuses (repeatable).",
)
@with_appcontext
def replay_cmd(dry_run: bool, as_json: bool, **options: Any) -> None:
    """Replay stored events: every handler runs again for a copy (source=replay)."""
    flt = _event_filter(options)
    if flt == EventFilter():
        _fail("replay needs a filter (--id, --event-id, --type, --since/--until or --status)")
    _engine()
    try:
        pairs = _state().store.operations.replay(flt, dry_run=dry_run, parse=parse_event)
    except HookledgerError as exc:  # redacted events are refused; a body sealed with a key
        _fail(exc.message)  # that is not configured names its row
        return
    rows = [{**_row(orig), "replay_event_id": new_id} for orig, new_id in pairs]
    _print(rows, as_json, "replayed", dry_run)


@hookledger_group.command("events")
@click.option(
    "--status",
    "statuses",
    type=click.Choice(EventStatus.ALL),
    multiple=True,
    help="Only events in these statuses (repeatable).",
)
@click.option("--type", "event_types", multiple=True, help="Only events of these types.")
@click.option(
    "--source",
    "sources",
    type=click.Choice(Source.ALL),
    multiple=True,
    help="Only events from these sources (repeatable).",
)
@click.option(
    "--object", "object_", default=None, help="Only events of this object (kind:id or id)."
)
@click.option("--since", type=click.DateTime(), default=None, help="Received at or after (UTC).")
@click.option(
    "--deferred", is_flag=True, help="Only events a handler deferred, with the reason why."
)
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=50,
    show_default=True,
    help="At most this many events.",
)
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Skip this many of the newest events first (paging).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def events_cmd(
    statuses: tuple[str, ...],
    event_types: tuple[str, ...],
    sources: tuple[str, ...],
    object_: str | None,
    since: datetime | None,
    deferred: bool,
    limit: int,
    offset: int,
    as_json: bool,
) -> None:
    """List stored events, newest first, with the reason of stale, duplicate, deferred and
    failed ones."""
    engine = _engine()
    page = queries.list_events(
        engine,
        keyring=_state().store.keyring,
        q=queries.EventQuery(
            statuses=statuses,
            event_types=event_types,
            sources=sources,
            object=object_,
            since=_utc(since),
            deferred=deferred,
            limit=limit,
            offset=offset,
        ),
    )
    if as_json:
        click.echo(
            json.dumps(
                {
                    "offset": offset,
                    "has_more": page.has_more,
                    "listed": [r.as_dict() for r in page.rows],
                },
                default=str,
            )
        )
        return
    for r in page.rows:
        when = r.received_at.strftime("%Y-%m-%d %H:%M:%S")
        line = f"#{r.id} {when} {r.event_id} {r.event_type} {r.status} {r.source} {r.object_key}"
        if r.reason and (deferred or r.status != EventStatus.DONE):
            line += f" ({r.reason[:200]})"
        click.echo(line)
    more = f"; more with --offset {offset + limit}" if page.has_more else ""
    click.echo(f"{len(page.rows)} event(s) listed{more}")


@hookledger_group.command("show")
@click.argument("event")
@click.option("--body", "with_body", is_flag=True, help="Also print the body (secrets masked).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def show_cmd(event: str, with_body: bool, as_json: bool) -> None:
    """One event (EVENT: its inbox id, #id, or event id): its headers, the guard's decision,
    its object's transitions and projection, and each handler's ledger row with the
    traceback of its last failure."""
    engine = _engine()
    detail = queries.find_event(engine, event, keyring=_state().store.keyring)
    if detail is None:
        _fail(f"no event {event!r}", EXIT_PROBLEM)
        return
    r = detail.row
    data: dict[str, Any] = {
        **r.as_dict(),
        "object_status": r.object_status,
        "object_stage": r.object_stage,
        "next_attempt_at": r.next_attempt_at.isoformat() if r.next_attempt_at else None,
        "lease_owner": r.lease_owner,
        "replay_of": r.replay_of,
        "replays": list(detail.replays),
        "last_error": r.last_error,
        "secret_id": detail.secret_id,
        "body_sha256": detail.body_sha256,
        "conflicting_deliveries": detail.conflicts,
        "headers": mask_headers(detail.headers),
        "projection": None
        if detail.projection is None
        else {
            "status": detail.projection.status,
            "stage": detail.projection.stage,
            "event_pk": detail.projection.event_pk,
        },
        "transitions": [
            {"state": t.state, "event_pk": t.event_pk, "at": t.created_at.isoformat()}
            for t in detail.transitions
        ],
        "ledger": [
            {
                "handler": h.handler,
                "status": h.status,
                "attempts": h.attempts,
                "updated_at": h.updated_at.isoformat(),
                "last_error": h.last_error,
            }
            for h in detail.ledger
        ],
    }
    if with_body:
        data["body"] = mask_body(detail.body)
    if as_json:
        click.echo(json.dumps(data, default=str, indent=2))
        return
    out = [
        f"#{r.id} {r.event_id} {r.event_type}",
        f"  status     {r.status} (attempts {r.attempts}, source {r.source})",
        f"  object     {r.object_key} reported {r.object_status or '-'}"
        + (f" / {r.object_stage}" if r.object_stage else ""),
        f"  received   {r.received_at.isoformat()}",
        f"  event time {r.event_time.isoformat() if r.event_time else '-'}",
    ]
    if r.processed_at:
        out.append(f"  processed  {r.processed_at.isoformat()}")
    if r.status in EventStatus.OPEN:
        due = r.next_attempt_at.isoformat() if r.next_attempt_at else "-"
        out.append(
            f"  next try   {due}" + (f" (leased by {r.lease_owner})" if r.lease_owner else "")
        )
    if r.last_error:
        label = "guard" if r.status in (EventStatus.STALE, EventStatus.DUPLICATE) else "reason"
        out.append(f"  {label:<10} {r.last_error.strip().splitlines()[-1]}")
    out.append(f"  secret id  {detail.secret_id or '-'}  body sha256 {detail.body_sha256}")
    if detail.conflicts:
        out.append(f"  conflicts  {detail.conflicts} delivery(ies) with another body")
    if r.replay_of:
        out.append(f"  replay of  #{r.replay_of}")
    if detail.projection is not None:
        p = detail.projection
        out.append(
            f"  projection {p.status}"
            + (f" / {p.stage}" if p.stage else "")
            + f" (by #{p.event_pk})"
        )
    for t in detail.transitions:
        by = "adoption" if t.event_pk == 0 else f"#{t.event_pk}"
        out.append(f"  transition {t.state} dispatched by {by} at {t.created_at.isoformat()}")
    out.append("  headers")
    out += [f"    {k}: {v}" for k, v in sorted(data["headers"].items())]
    if not detail.ledger:
        out.append("  ledger     (no handler ran)")
    for h in detail.ledger:
        out.append(f"  handler    {h.handler}: {h.status} (attempts {h.attempts})")
        if h.last_error:
            out += [f"      {line}" for line in h.last_error.rstrip().splitlines()]
    if with_body:
        out.append("  body (secrets and card numbers masked)")
        out += [f"    {line}" for line in data["body"].splitlines()]
    click.echo("\n".join(out))


@hookledger_group.command("conflicts")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=50,
    show_default=True,
    help="At most this many.",
)
@click.option(
    "--offset", type=click.IntRange(min=0), default=0, help="Skip this many of the newest."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def conflicts_cmd(limit: int, offset: int, as_json: bool) -> None:
    """Deliveries whose event id was stored before with a different body, newest first."""
    page = queries.list_conflicts(_engine(), limit=limit, offset=offset)
    rows = [
        {
            "id": c.id,
            "event_id": c.event_id,
            "event_type": c.event_type,
            "event_pk": c.event_pk,
            "source": c.source,
            "received_at": c.received_at.isoformat(),
            "body_sha256": c.body_sha256,
            "secret_id": c.secret_id,
        }
        for c in page.rows
    ]
    if as_json:
        click.echo(json.dumps({"has_more": page.has_more, "conflicts": rows}))
        return
    for c in rows:
        click.echo(
            f"conflict {c['id']} {c['received_at'][:19]} {c['event_id']} {c['event_type']} "
            f"(stored as #{c['event_pk']}) body {c['body_sha256'][:12]} source {c['source']}"
        )
    click.echo(f"{len(rows)} conflict(s) listed")


@hookledger_group.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def stats_cmd(as_json: bool) -> None:
    """Counts by status and the age of the oldest open event."""
    _engine()
    counts, age = _state().store.operations.stats()
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
        _engine(),
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
            f"processing {found.open_events['processing']}); oldest open "
            f"{'-' if age is None else f'{age:.0f} s'}; dead letters {found.dead_events}"
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


# keys, rotate-keys, redact, prune, retention, rejections (receiver/datacli.py)
register_data_commands(hookledger_group)
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
            _fail(exc.format_message().splitlines()[0])


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
