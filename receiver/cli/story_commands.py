"""Finding an order and telling one object's story (registered by :mod:`receiver.cli.commands`):

- ``object KIND:ID [--account A] [--json]``: every delivery of the object with its answer,
  every transition with its source, every handler run, the reconcile runs that touched it
  and what the processor last said (read-only);
- ``order-index backfill [--account A] [--dry-run] [--json]``: index the events stored before
  the order index existed (resumable), and ``order-index status``;
- what ``events --order REF`` prints besides the events (:func:`order_notes`).
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import click
from flask.cli import with_appcontext

import receiver.storage.object_story as stories
from receiver.atrest.order_index import OrderIndex
from receiver.cli.common import EXIT_PROBLEM, EXIT_USAGE, read_only, stopped_by_signals
from receiver.cli.context import account_option, app_state, checked_engine, fail
from receiver.core.accounts import is_account_id
from receiver.core.order_refs import normalise
from receiver.storage.order_search import search_notes

#: ``order-index backfill``: some events are left (stopped, or unreadable).
EXIT_INCOMPLETE = 1


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def order_reference(order: str) -> str:
    """The reference of ``--order`` as it is searched (surrounding white space dropped);
    exits 2 when nothing is left."""
    value = normalise(order)
    if value is None:
        fail("--order needs an order reference (the shop's, as its fields hold it)", EXIT_USAGE)
        raise AssertionError  # (fail exits)
    return value


def order_notes(accounts: tuple[str, ...]) -> list[str]:
    """What a search of the order index in ``accounts`` may miss (see
    :func:`receiver.storage.order_search.search_notes`)."""
    store = app_state().store
    return search_notes(store.engine, store.keyring, store.storage.order_fields, accounts=accounts)


# -- object ---------------------------------------------------------------------------------


@click.command("object")
@click.argument("ref", metavar="KIND:ID")
@click.option(
    "--account",
    "account",
    default=None,
    metavar="ID",
    help="The processor account whose object it is (needed when several have it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@read_only
@with_appcontext
def object_cmd(ref: str, account: str | None, as_json: bool) -> None:
    """One object's whole story (KIND:ID, e.g. payment:pay_123, or ACCOUNT/KIND:ID as the
    event listings show it): every delivery with its answer, every transition with its
    source, every handler run (errors masked), the reconcile runs that touched it and what
    the processor last said. An object is (account, kind, id): when several accounts have
    it, name one with --account (exit 2 otherwise, listing them); exit 1 when none has it."""
    try:
        prefix, kind, object_id = stories.parse_object(ref)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
        return
    if account is not None and not is_account_id(account):
        fail(f"{account[:80]!r} is not an account id", EXIT_USAGE)
    if prefix is not None and account is not None and prefix != account:
        fail(f"{ref!r} names account {prefix!r}, --account {account!r}", EXIT_USAGE)
    account = account or prefix
    engine = checked_engine()
    try:
        story = stories.object_story(
            engine, kind, object_id, account=account, keyring=app_state().store.keyring
        )
    except stories.AmbiguousObject as exc:
        fail(
            f"{kind}:{object_id} is in {len(exc.accounts)} accounts ({', '.join(exc.accounts)}):"
            " pass --account to choose one",
            EXIT_USAGE,
        )
        return
    if story is None:
        where = f" in account {account!r}" if account is not None else ""
        fail(f"no object {kind}:{object_id}{where}", EXIT_PROBLEM)
        return
    if as_json:
        click.echo(json.dumps(story_dict(story), default=str, indent=2))
        return
    click.echo("\n".join(story_lines(story)))


def story_dict(story: stories.ObjectStory) -> dict[str, Any]:
    """The story as JSON."""
    p, f, w, rej = story.projection, story.followed, story.last_word, story.rejections
    return {
        "account": story.account,
        "object": story.ref,
        "object_key": story.object_key,
        "last_word": None
        if w is None
        else {
            "status": w.status,
            "stage": w.stage,
            "at": _iso(w.at),
            "source": w.source,
            "event_pk": w.event_pk,
        },
        "last_recovered": None
        if story.last_recovered is None
        else {
            "status": story.last_recovered.object_status,
            "stage": story.last_recovered.object_stage,
            "at": _iso(story.last_recovered.received_at),
            "source": story.last_recovered.source,
            "event_pk": story.last_recovered.id,
        },
        "projection": None
        if p is None
        else {
            "status": p.status,
            "stage": p.stage,
            "event_pk": p.event_pk,
            "updated_at": _iso(p.updated_at),
        },
        "sweep": None
        if f is None
        else {
            "status": f.status,
            "stage": f.stage,
            "first_seen_at": _iso(f.first_seen_at),
            "last_checked_at": _iso(f.last_checked_at),
            "next_check_at": _iso(f.next_check_at),
            "checks": f.checks,
        },
        "deliveries": [
            {
                **d.row.as_dict(),
                "object_status": d.row.object_status,
                "object_stage": d.row.object_stage,
                "last_error": d.row.last_error,
                "replay_of": d.row.replay_of,
                "conflicting_deliveries": d.conflicts,
                "reconcile_run": d.run_id,
                "ledger": [
                    {
                        "handler": h.handler,
                        "status": h.status,
                        "attempts": h.attempts,
                        "updated_at": _iso(h.updated_at),
                        "last_error": h.last_error,
                    }
                    for h in d.ledger
                ],
            }
            for d in story.deliveries
        ],
        "deliveries_truncated": story.truncated,
        "transitions": [
            {
                "state": t.state,
                "at": _iso(t.at),
                "event_pk": t.event_pk,
                "source": t.source,
                "event_id": t.event_id,
                "event_status": t.event_status,
            }
            for t in story.transitions
        ],
        "reconcile_runs": [
            {
                "id": r.id,
                "mode": r.mode,
                "status": r.status,
                "started_at": _iso(r.started_at),
                "finished_at": _iso(r.finished_at),
                "why": r.why,
            }
            for r in story.runs
        ],
        "rejected_deliveries": None
        if rej is None
        else {
            "count": rej.count,
            "reasons": rej.reasons,
            "since": _iso(rej.since),
            "until": _iso(rej.until),
            "note": "the rejected-deliveries log names no object: these are the account's",
        },
    }


def _state(status: str | None, stage: str | None) -> str:
    return (status or "-") + (f" / {stage}" if stage else "")


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def story_lines(story: stories.ObjectStory) -> list[str]:
    """The story as text."""
    out = [f"{story.ref} (account {story.account})"]
    w = story.last_word
    if w is not None:
        by = f"#{w.event_pk}, {w.source}" if w.event_pk is not None else "the sweep's check"
        out.append(f"  processor said  {_state(w.status, w.stage)} ({by}, {_when(w.at)} UTC)")
    else:
        out.append("  processor said  nothing stored")
    lr = story.last_recovered
    if lr is not None:
        out.append(
            f"  last recovered  {_state(lr.object_status, lr.object_stage)} (#{lr.id}, "
            f"{lr.source}, {_when(lr.received_at)} UTC)"
        )
    p = story.projection
    if p is not None:
        by = f"#{p.event_pk}" if p.event_pk else "adoption"
        out.append(
            f"  projection      {_state(p.status, p.stage)} (by {by}, {_when(p.updated_at)})"
        )
    else:
        out.append("  projection      none (no event of it was dispatched yet)")
    f = story.followed
    if f is not None:
        out.append(
            f"  sweep           follows it: {_state(f.status, f.stage)} at its last check "
            f"{_when(f.last_checked_at)} ({f.checks} check(s)); next {_when(f.next_check_at)}"
        )
    elif story.reconciler:
        out.append(
            "  sweep           does not follow it (settled, past its horizon, or never seen)"
        )
    out.append(
        f"deliveries ({len(story.deliveries)}{'+, the newest cut' if story.truncated else ''})"
    )
    for d in story.deliveries:
        r = d.row
        line = (
            f"  #{r.id} {_when(r.received_at)} {r.source:<9} {r.event_type or '-'} "
            f"{r.event_id} -> {r.status} (attempts {r.attempts})"
            f", reported {_state(r.object_status, r.object_stage)}"
        )
        out.append(line)
        if r.reason and r.status != "done":
            out.append(f"      {r.reason[:300]}")
        if r.replay_of:
            out.append(f"      replay of #{r.replay_of}")
        if d.conflicts:
            out.append(f"      {d.conflicts} delivery(ies) of its event id with another body")
        if d.run_id is not None:
            out.append(f"      stored by reconcile run #{d.run_id}")
        for h in d.ledger:
            out.append(f"      handler {h.handler}: {h.status} (attempts {h.attempts})")
            if h.last_error:
                out += [f"          {line}" for line in h.last_error.rstrip().splitlines()[-6:]]
    out.append("transitions")
    if not story.transitions:
        out.append("  none dispatched")
    for t in story.transitions:
        by = "adoption (nothing dispatched)" if t.event_pk == 0 else f"#{t.event_pk} ({t.source})"
        if t.event_status == "dead":
            by += ", dead-lettered: its handlers did not all succeed"
        out.append(f"  {t.state:<28} by {by} at {_when(t.at)}")
    if story.reconciler:
        out.append("reconcile runs")
        for run in story.runs:
            out.append(
                f"  #{run.id} {run.mode} {run.status} {_when(run.started_at)} .. "
                f"{_when(run.finished_at)}: {run.why}"
            )
        out.append(
            "  (runs are linked by the events they stored and the ids their reports sample; a "
            "run that found the object in sync leaves no trace of it)"
        )
    rej = story.rejections
    if rej is not None and rej.count:
        reasons = ", ".join(f"{k} {n}" for k, n in sorted(rej.reasons.items()))
        out.append(
            f"rejected deliveries: {rej.count} refused for account {story.account} (or no "
            f"account) between {_when(rej.since)} and {_when(rej.until)} ({reasons}); the log "
            f"names no object: hookledger rejections --since {rej.since:%Y-%m-%dT%H:%M:%S}"
        )
    return out


# -- order-index ----------------------------------------------------------------------------


@click.group("order-index")
def order_index_group() -> None:
    """The order index: the shop's order references (HOOKLEDGER_ORDER_FIELDS) of every
    stored event, as keyed digests, for `events --order` and the console's search."""


@order_index_group.command("backfill")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 5000),
    default=500,
    show_default=True,
    help="Events per transaction.",
)
@account_option("Only events of this processor account (repeatable; default: all).")
@click.option("--dry-run", is_flag=True, help="Only count what would be indexed.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@read_only
@with_appcontext
def backfill_cmd(batch_size: int, accounts: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Index the events stored before the order index existed (migration 0009) or before the
    configured fields named a field: their bodies are opened, their references digested with
    the primary data key. Runs while the system runs, in short batches; stop it any time
    (SIGINT or SIGTERM finish the batch) and run it again to go on. Exit 0 when complete, 1
    when events are left (stopped, or sealed with a key that is not configured)."""
    checked_engine()
    index = OrderIndex(app_state().store.storage, batch_size=batch_size)
    if dry_run:
        report = index.backfill(accounts=accounts, dry_run=True)
        click.echo(json.dumps(report.as_dict()) if as_json else report.render())
        return
    stop = threading.Event()

    def _stop(signum: int) -> None:
        click.echo(f"signal {signum}: stopping after this batch", err=True)
        stop.set()

    with stopped_by_signals(_stop):
        report = index.backfill(accounts=accounts, stop=stop)
    click.echo(json.dumps(report.as_dict()) if as_json else report.render())
    if not report.complete:
        sys.exit(EXIT_INCOMPLETE)


@order_index_group.command("status")
@account_option("Only rows of this processor account (repeatable; default: all).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@read_only
@with_appcontext
def status_cmd(accounts: tuple[str, ...], as_json: bool) -> None:
    """The fields indexed, the backfill's progress, and the index rows by data key."""
    checked_engine()
    status = OrderIndex(app_state().store.storage).status(accounts=accounts)
    status["notes"] = order_notes(accounts)
    if as_json:
        click.echo(json.dumps(status, default=str))
        return
    click.echo(f"fields {status['fields']}")
    b = status["backfill"]
    if b is None:
        click.echo("backfill: never run")
    else:
        state = f"finished {_when(b['finished_at'])}" if b["finished_at"] else "not finished"
        click.echo(f"backfill: through #{b['after_pk']} (fields {b['fields']}), {state}")
    click.echo(f"events left for the backfill: {status['events_left']}")
    shown = ", ".join(
        f"{'plain sha256' if k == 'null' else repr(k)}: {n}"
        for k, n in sorted(status["rows_by_key"].items())
    )
    click.echo(f"index rows by key: {shown or 'none'}")
    for note in status["notes"]:
        click.echo(f"note: {note}")


COMMANDS = (object_cmd, order_index_group)


def register(group: click.Group) -> None:
    """Add the order and object commands to ``group``."""
    for command in COMMANDS:
        group.add_command(command)
