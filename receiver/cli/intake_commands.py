"""SQLite's intake (registered by :mod:`receiver.cli.commands`): the webhooks stored in
``<database>-intake`` while the database's write lock was held for long, which event
listings, the order search, an object's story and replay show only once they are in the
inbox (:mod:`receiver.storage.intake`).

- ``intake list [--limit N] [--json]``: each delivery waiting, oldest first (the order they
  are moved in): its account, event id, type, object, source, age and answer; never its
  body or headers (read-only);
- ``intake move [--json]``: move them into the inbox now, as a worker does before each claim.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from flask.cli import with_appcontext

from receiver.cli.common import EXIT_DATABASE, EXIT_PROBLEM, describe_error, read_only
from receiver.cli.context import app_state, checked_engine, fail
from receiver.core.clock import utcnow
from receiver.core.errors import StorageUnavailable
from receiver.storage.intake import IntakeUnreadable, path_of, read_figures, read_waiting


@click.group("intake")
def intake_group() -> None:
    """SQLite: the webhooks waiting in the intake (<database>-intake), stored while the
    database's lock was held for long; counted as pending by status and stats, shown by
    events, object and the order search only once moved into the inbox (by a worker before
    each claim, by the next webhook, or by `intake move`)."""


def _summary(count: int, oldest: float | None, path: str) -> str:
    age = "" if oldest is None else f", oldest {oldest:.0f} s"
    return f"{count} webhook(s) in the intake {path}{age}"


@intake_group.command("list")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="At most this many deliveries, oldest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@read_only
@with_appcontext
def list_cmd(limit: int, as_json: bool) -> None:
    """The webhooks waiting in the intake, oldest first: account, event id, type, object,
    source, age and answer (inserted, or conflict: stored before with another body); never
    a body or a header. Exit 1 when the intake cannot be read."""
    engine = checked_engine()
    path = path_of(engine)
    if path is None:
        payload: dict[str, Any] = {"intake": None, "count": 0, "deliveries": []}
        click.echo(json.dumps(payload) if as_json else "no intake (PostgreSQL, or it is off)")
        return
    waiting, problem = read_figures(engine)
    listed, problem = (read_waiting(engine, limit=limit)) if problem is None else ([], problem)
    if problem is not None:
        fail(f"the intake {path} cannot be read ({problem})", EXIT_PROBLEM)
    now = utcnow()
    count = sum(found.count for found in waiting.values())
    oldest = (
        max(0.0, (now - min(found.oldest for found in waiting.values())).total_seconds())
        if waiting
        else None
    )
    rows = [
        {
            "intake_id": d.id,
            "account": d.account,
            "event_id": d.event_id,
            "event_type": d.event_type,
            "object": d.object_key,
            "source": d.source,
            "received_at": d.received_at.isoformat(),
            "age_seconds": round(max(0.0, (now - d.received_at).total_seconds()), 1),
            "answer": d.answer,
        }
        for d in listed
    ]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "intake": path,
                    "count": count,
                    "oldest_age_seconds": None if oldest is None else round(oldest, 1),
                    "deliveries": rows,
                }
            )
        )
        return
    for r in rows:
        # The object key names its account outside the default one (``eu/payment:pay_1``).
        note = " (conflict: stored before with another body)" if r["answer"] == "conflict" else ""
        click.echo(
            f"@{r['intake_id']} {r['event_id']} {r['event_type']} {r['object']} "
            f"{r['source']} {r['age_seconds']:.0f} s ago{note}"
        )
    shown = f" (the first {len(rows)} shown)" if len(rows) < count else ""
    click.echo(_summary(count, oldest, path) + shown)


@intake_group.command("move")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@read_only
@with_appcontext
def move_cmd(as_json: bool) -> None:
    """Move the webhooks waiting in the intake into the inbox now (a worker does it before
    each claim): then events, object, the order search and replay show them. Exit 5 when
    the database's lock stays held past the busy timeout, 1 when the intake cannot be read
    or webhooks received before the move are left in it (refused by the inbox), ``--json``
    too; webhooks that arrived meanwhile are left for the next move (or a worker's)."""
    engine = checked_engine()
    store = app_state().store
    path = path_of(engine)
    if store.inbox.intake is None or path is None:
        payload: dict[str, Any] = {"intake": None, "moved": 0, "left": 0}
        click.echo(json.dumps(payload) if as_json else "no intake (PostgreSQL, or it is off)")
        return
    started = utcnow()
    try:
        moved = store.inbox.move_intake()
    except TimeoutError:
        fail(
            "the database's writers' lock stayed taken past the busy timeout (another "
            "writer: a worker's handler running, say); nothing moved",
            EXIT_DATABASE,
        )
        return
    except IntakeUnreadable as exc:
        cause = exc.__cause__
        why = f" ({type(cause).__name__})" if cause is not None else ""
        fail(f"the intake {path} cannot be read{why}", EXIT_PROBLEM)
        return
    except StorageUnavailable as exc:
        message, code = describe_error(exc)
        fail(f"{message}; nothing more moved", code)
        return
    waiting, _ = read_figures(engine)
    left = sum(found.count for found in waiting.values())
    # Webhooks that arrived while it moved are the next move's, not a failure of this one:
    # only those received before it started and still there are (refused by the inbox).
    listed, _ = read_waiting(engine, limit=left) if left else ([], None)
    stuck = sum(1 for row in listed if row.received_at < started)
    if as_json:
        click.echo(json.dumps({"intake": path, "moved": moved, "left": left, "stuck": stuck}))
        if stuck:
            sys.exit(EXIT_PROBLEM)
        return
    click.echo(
        f"{moved} webhook(s) moved from the intake into the inbox; {left} left"
        + (f" ({left - stuck} arrived meanwhile)" if left - stuck else "")
    )
    if stuck:
        click.echo(
            f"hookledger: {stuck} webhook(s) received before the move are still in the intake "
            "(refused by the inbox: see the log's intake_stuck); `hookledger intake list` "
            "shows them",
            err=True,
        )
        sys.exit(EXIT_PROBLEM)


COMMANDS = (intake_group,)


def register(group: click.Group) -> None:
    """Add the intake commands to ``group``."""
    for command in COMMANDS:
        group.add_command(command)
