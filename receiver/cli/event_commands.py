"""The event commands of ``hookledger`` (registered by :mod:`receiver.cli.commands`):
``events`` and ``show`` (read-only), ``conflicts``, ``requeue`` and ``replay``, with the filters
they share.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click
from flask.cli import with_appcontext

import receiver.cli.story_commands as story_commands
import receiver.storage.operator_reads as queries
from receiver.cli.common import (
    EXIT_PROBLEM,
    EXIT_USAGE,
    read_only,
)
from receiver.cli.context import account_option, app_state, checked_engine, fail, utc_option
from receiver.core.accounts import is_account_id
from receiver.core.errors import HookledgerError
from receiver.core.events import parse_event
from receiver.core.masking import mask_body, mask_headers
from receiver.storage.operator_actions import EventFilter
from receiver.storage.tables import EventStatus, InboxEvent, Source


def _filter_options(func: Any) -> Any:
    options = [
        click.option("--id", "pks", type=int, multiple=True, help="Inbox row id (repeatable)."),
        click.option("--event-id", "event_ids", multiple=True, help="Event id (repeatable)."),
        click.option("--type", "event_types", multiple=True, help="Event type (repeatable)."),
        account_option(),
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
        "account": e.account,
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
        accounts=options["accounts"],
    )


@click.command("requeue")
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
    checked_engine()
    try:
        chosen = app_state().store.operations.requeue(_event_filter(options), dry_run=dry_run)
    except HookledgerError as exc:  # redacted events are refused
        fail(exc.message)
        return
    _print([_row(e) for e in chosen], as_json, "requeued", dry_run)


@click.command("replay")
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
        fail("replay needs a filter (--id, --event-id, --type, --since/--until or --status)")
    checked_engine()
    try:
        pairs = app_state().store.operations.replay(flt, dry_run=dry_run, parse=parse_event)
    except HookledgerError as exc:  # redacted events are refused; a body sealed with a key
        fail(exc.message)  # that is not configured names its row
        return
    rows = [{**_row(orig), "replay_event_id": new_id} for orig, new_id in pairs]
    _print(rows, as_json, "replayed", dry_run)


@click.command("events")
@click.option(
    "--status",
    "statuses",
    type=click.Choice(EventStatus.ALL),
    multiple=True,
    help="Only events in these statuses (repeatable).",
)
@click.option("--type", "event_types", multiple=True, help="Only events of these types.")
@account_option("Only events of these processor accounts (repeatable).")
@click.option(
    "--source",
    "sources",
    type=click.Choice(Source.ALL),
    multiple=True,
    help="Only events from these sources (repeatable).",
)
@click.option(
    "--object",
    "object_",
    default=None,
    help="Only events of this object: kind:id (in every account unless --account), "
    "account/kind:id, or an id alone.",
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
@click.option(
    "--order",
    default=None,
    metavar="REF",
    help="Only events of this order: the shop's reference, exactly as its fields hold it "
    "(HOOKLEDGER_ORDER_FIELDS), in every account unless --account.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def events_cmd(
    statuses: tuple[str, ...],
    event_types: tuple[str, ...],
    accounts: tuple[str, ...],
    sources: tuple[str, ...],
    object_: str | None,
    since: datetime | None,
    deferred: bool,
    limit: int,
    offset: int,
    order: str | None,
    as_json: bool,
) -> None:
    """List stored events, newest first, with the reason of stale, duplicate, deferred and
    failed ones."""
    if order is not None:
        order = story_commands.order_reference(order)
    engine = checked_engine()
    page = queries.list_events(
        engine,
        keyring=app_state().store.keyring,
        q=queries.EventQuery(
            statuses=statuses,
            event_types=event_types,
            sources=sources,
            accounts=accounts,
            object=object_,
            since=utc_option(since),
            deferred=deferred,
            limit=limit,
            offset=offset,
            order=order,
        ),
    )
    # An order search says what the index could not have found (its account is on each line).
    notes = story_commands.order_notes(accounts) if order is not None else []
    if as_json:
        listed: dict[str, Any] = {
            "offset": offset,
            "has_more": page.has_more,
            "listed": [r.as_dict() for r in page.rows],
        }
        if order is not None:
            listed["notes"] = notes
        click.echo(json.dumps(listed, default=str))
        return
    for note in notes:
        click.echo(f"hookledger: note: {note}", err=True)
    for r in page.rows:
        when = r.received_at.strftime("%Y-%m-%d %H:%M:%S")
        # An order's or an object's events may be in several accounts: each line names its.
        named = order is not None or object_ is not None
        shown = f"{r.account} {r.event_id}" if named else r.event_id
        line = f"#{r.id} {when} {shown} {r.event_type} {r.status} {r.source} {r.object_key}"
        if r.reason and (deferred or r.status != EventStatus.DONE):
            line += f" ({r.reason[:200]})"
        click.echo(line)
    more = f"; more with --offset {offset + limit}" if page.has_more else ""
    click.echo(f"{len(page.rows)} event(s) listed{more}")


@click.command("show")
@click.argument("event")
@click.option(
    "--account",
    "account",
    default=None,
    metavar="ID",
    help="The processor account whose event it is (needed when the event id is in several).",
)
@click.option("--body", "with_body", is_flag=True, help="Also print the body (secrets masked).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def show_cmd(event: str, account: str | None, with_body: bool, as_json: bool) -> None:
    """One event (EVENT: its inbox id, #id, or event id): its headers, the guard's decision,
    its object's transitions and projection, and each handler's ledger row with the
    traceback of its last failure. An event id is unique per account: when several
    accounts have it, name one with --account (exit 2 otherwise, listing them)."""
    if account is not None and not is_account_id(account):
        fail(f"{account[:80]!r} is not an account id", EXIT_USAGE)
    engine = checked_engine()
    try:
        detail = queries.find_event(
            engine, event, keyring=app_state().store.keyring, account=account
        )
    except queries.AmbiguousEvent as exc:
        fail(
            f"event {event!r} is in {len(exc.accounts)} accounts ({', '.join(exc.accounts)}): "
            "pass --account to choose one",
            EXIT_USAGE,
        )
        return
    if detail is None:
        where = f" in account {account!r}" if account is not None else ""
        fail(f"no event {event!r}{where}", EXIT_PROBLEM)
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
        f"  account    {r.account}",
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


@click.command("conflicts")
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
@account_option("Only conflicts of this processor account (repeatable; default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def conflicts_cmd(limit: int, offset: int, accounts: tuple[str, ...], as_json: bool) -> None:
    """Deliveries whose event id was stored before with a different body, newest first."""
    page = queries.list_conflicts(checked_engine(), limit=limit, offset=offset, accounts=accounts)
    rows = [
        {
            "id": c.id,
            "account": c.account,
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


def register(group: click.Group) -> None:
    """Add the event commands to ``group``."""
    for command in (requeue_cmd, replay_cmd, events_cmd, show_cmd, conflicts_cmd):
        group.add_command(command)
