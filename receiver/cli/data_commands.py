"""The data-at-rest commands of ``hookledger`` (registered by :mod:`receiver.cli.commands`):

- ``keys new`` prints a new data key; ``keys status`` shows rows by data key;
- ``rotate-keys`` seals again, with the primary key, whatever is not under it;
- ``redact`` drops old payloads; ``prune`` deletes old rows, each kind at its own age;
  ``retention`` does both, as the scheduler does every night;
- ``rejections`` lists the rejected deliveries and sums them up.

``rotate-keys``, ``redact``, ``prune``, ``retention`` and ``keys status`` take ``--account ID``
(repeatable): only those accounts' rows (default: every account). A removed account's
history stays until it is pruned for it.

Errors are one line on stderr and a non-zero exit; ``--json`` where ops will script it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, TypeVar

import click
from flask import current_app
from flask.cli import with_appcontext
from sqlalchemy.exc import DBAPIError

import receiver.storage.database as db
from receiver.cli.common import describe_error, read_only, stopped_by_signals
from receiver.cli.context import account_option
from receiver.config.data_at_rest import RetentionPolicy
from receiver.core.errors import HookledgerError, StorageUnavailable
from receiver.core.keyring import KEY_ID, generate_key
from receiver.storage.intake import figures_of
from receiver.store import Store
from receiver.web.state import ReceiverState, receiver_state

EXIT_INCOMPLETE = 1

F = TypeVar("F", bound=Callable[..., Any])


def _state() -> ReceiverState:
    return receiver_state(current_app)


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"hookledger: {message}", err=True)
    sys.exit(code)


def _store() -> Store:
    """The store, its schema checked first (one line and exit 2 when it is missing or behind,
    exit 5 when the database cannot be reached)."""
    store = _state().store
    try:
        db.check_schema(store.engine)
    except (HookledgerError, DBAPIError) as exc:
        message, code = describe_error(exc)
        _fail(message, code)
    return store


def _scope(accounts: tuple[str, ...]) -> str:
    """`` in account(s) eu, us`` when the command was limited to accounts, else nothing."""
    return f" in account(s) {', '.join(accounts)}" if accounts else ""


# -- keys ---------------------------------------------------------------------------------


@click.group("keys", help="Data keys (HOOKLEDGER_DATA_KEYS): new keys, rows by key.")
def keys_group() -> None:
    pass


@keys_group.command("new")
@click.option(
    "--id",
    "key_id",
    default=None,
    help="The key's id (default: 'k' and today's date, e.g. k20261123).",
)
def keys_new(key_id: str | None) -> None:
    """Print a new random data key as 'id:base64' (add it to HOOKLEDGER_DATA_KEYS)."""
    key_id = key_id or "k" + datetime.now(UTC).strftime("%Y%m%d")
    if not KEY_ID.match(key_id):
        _fail("a key id is 1 to 32 letters, digits, '_', '.' or '-'")
    click.echo(f"{key_id}:{generate_key()}")
    click.echo(
        "To rotate: add it at the END of HOOKLEDGER_DATA_KEYS on every process, deploy; then "
        "move it to the FRONT (the primary), deploy; then run `hookledger rotate-keys`; remove "
        "the old key only once that reports complete.",
        err=True,
    )


@keys_group.command("status")
@account_option("Only rows of this processor account (repeatable; default: all).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@read_only
@with_appcontext
def keys_status(accounts: tuple[str, ...], as_json: bool) -> None:
    """Rows by data key, and what `rotate-keys` has left to do."""
    try:
        status = _store().rotation.status(accounts=accounts)
    except HookledgerError as exc:
        _fail(exc.message)
    if as_json:
        click.echo(json.dumps(status))
        return
    click.echo(f"primary {status['primary']!r}; configured {', '.join(status['keys'])}")
    for table, counts in status["by_key"].items():
        shown = ", ".join(
            f"{'in the clear' if k == 'null' else repr(k)}: {n}" for k, n in sorted(counts.items())
        )
        click.echo(f"{table}: {shown or 'none'}")
    left = {t: n for t, n in status["remaining"].items() if n}
    click.echo(
        "left for rotate-keys: "
        + (", ".join(f"{n} {t}" for t, n in left.items()) if left else "nothing")
    )
    if status["redacted_elsewhere"]:
        click.echo(
            "redacted rows with their body hash under another key: "
            + ", ".join(f"{k} ({n})" for k, n in status["redacted_elsewhere"].items())
        )


# -- rotate-keys ----------------------------------------------------------------------------


@click.command("rotate-keys")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 5000),
    default=200,
    show_default=True,
    help="Rows per transaction.",
)
@account_option("Only rows of this processor account (repeatable; default: all).")
@click.option("--dry-run", is_flag=True, help="Only count what would be sealed again.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@read_only
@with_appcontext
def rotate_keys_cmd(
    batch_size: int, accounts: tuple[str, ...], dry_run: bool, as_json: bool
) -> None:
    """Seal again, with the primary data key, everything sealed with another key or stored
    in the clear. Runs while the system runs, in short batches; stop it any time (SIGINT or
    SIGTERM finish the batch) and run it again to go on. Exit 0 when complete, 1 when rows
    are left (unreadable, or written meanwhile under another key), 2 on a usage error."""
    store = _store()
    rotation = store.rotation
    rotation.batch_size = batch_size
    try:
        status = rotation.status(accounts=accounts)
    except HookledgerError as exc:
        _fail(exc.message)
    if dry_run:
        if as_json:
            click.echo(json.dumps({"dry_run": True, **status}))
        else:
            left = {t: n for t, n in status["remaining"].items() if n}
            click.echo(
                f"rotate-keys{_scope(accounts)}: primary {status['primary']!r}; would seal again: "
                + (", ".join(f"{n} {t}" for t, n in left.items()) if left else "nothing")
            )
        return
    stop = threading.Event()

    def _stop(signum: int) -> None:
        click.echo(f"signal {signum}: stopping after this batch", err=True)
        stop.set()

    with stopped_by_signals(_stop):
        # SQLite: webhooks waiting in the intake are sealed too; into the inbox with them first.
        waiting = _intake_left(store)
        total = sum(status["remaining"].values())
        if sys.stderr.isatty() and not as_json and total:
            with click.progressbar(length=total, label="sealing again", file=sys.stderr) as bar:
                report = rotation.run(stop=stop, progress=bar.update, accounts=accounts)
        else:
            report = rotation.run(stop=stop, accounts=accounts)
        if as_json:
            click.echo(json.dumps({**report.as_dict(), **({"intake": waiting} if waiting else {})}))
        else:
            click.echo(report.render())
            if waiting:
                click.echo(
                    f"{waiting} webhook(s) still in the intake (the database stayed locked): "
                    "run rotate-keys again once a worker has moved them",
                    err=True,
                )
    if not report.complete or waiting:
        sys.exit(EXIT_INCOMPLETE)


def _intake_left(store: Store) -> int:
    """Move the webhooks waiting in a SQLite file's intake into the inbox; how many are
    still there (the database's lock stayed taken meanwhile)."""
    intake = store.inbox.intake
    try:
        if intake is None or not intake.any():
            return 0
        store.inbox.move_intake()
    except (TimeoutError, StorageUnavailable):
        pass
    return sum(found.count for found in figures_of(store.engine).values())


# -- retention ------------------------------------------------------------------------------


def _days_option(name: str, what: str) -> Callable[[F], F]:
    return click.option(
        f"--{name}-days",
        f"{name.replace('-', '_')}_days",
        type=float,
        default=None,
        help=f"Days {what} are kept (default: HOOKLEDGER_RETENTION_DAYS; 0 = never deleted).",
    )


def _policy(**overrides: float | None) -> RetentionPolicy:
    base = _state().settings.data.retention
    given = {k: (None if v == 0 else v) for k, v in overrides.items() if v is not None}
    try:
        return dataclasses.replace(base, **given)
    except HookledgerError as exc:
        _fail(exc.message)


@click.command("prune")
@_days_option("done", "finished events (done, stale, duplicate)")
@_days_option("dead", "dead letters")
@_days_option("conflict", "conflict records")
@_days_option("rejected", "rejected-delivery records")
@click.option(
    "--older-than-days",
    type=float,
    default=None,
    help="Former option: the same as --done-days and --conflict-days.",
)
@click.option(
    "--include-dead",
    is_flag=True,
    help="Former option: dead letters at the --older-than-days age too.",
)
@click.option("--keep-dead", is_flag=True, help="Never delete dead letters this time.")
@account_option("Only rows of this processor account (repeatable; default: all).")
@click.option("--dry-run", is_flag=True, help="Only count.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@read_only
@with_appcontext
def prune_cmd(
    done_days: float | None,
    dead_days: float | None,
    conflict_days: float | None,
    rejected_days: float | None,
    older_than_days: float | None,
    include_dead: bool,
    keep_dead: bool,
    accounts: tuple[str, ...],
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete finished events, dead letters, conflicts and rejected deliveries past their
    ages (HOOKLEDGER_RETENTION_DAYS: done=90, dead=180, conflicts=90, rejected=14 by default).
    Open events are never deleted; transitions and projections are kept, so the guard still
    holds for pruned history. With --account, only those accounts' rows (a removed
    account's history stays until it is pruned for it)."""
    if older_than_days is not None:
        done_days = done_days if done_days is not None else older_than_days
        conflict_days = conflict_days if conflict_days is not None else older_than_days
        if include_dead and dead_days is None:
            dead_days = older_than_days
    policy = _policy(
        done=done_days, dead=dead_days, conflicts=conflict_days, rejected=rejected_days
    )
    if keep_dead:
        policy = dataclasses.replace(policy, dead=None)
    counts = _store().retention.prune(policy, dry_run=dry_run, accounts=accounts)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "policy": policy.describe(),
                    "accounts": list(accounts) or None,
                    **counts,
                }
            )
        )
        return
    verb = "would be pruned" if dry_run else "pruned"
    shown = ", ".join(f"{n} {k}" for k, n in counts.items()) or "nothing (every age is never)"
    click.echo(f"{shown} {verb}{_scope(accounts)} ({policy.describe()})")


@click.command("redact")
@click.option(
    "--older-than-days",
    type=float,
    default=None,
    help="Redact what was received more than N days ago (default: the policy's redact age).",
)
@account_option("Only rows of this processor account (repeatable; default: all).")
@click.option("--dry-run", is_flag=True, help="Only count.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@read_only
@with_appcontext
def redact_cmd(
    older_than_days: float | None, accounts: tuple[str, ...], dry_run: bool, as_json: bool
) -> None:
    """Drop the bodies, headers and error texts of finished events and conflict records (and
    kept rejected bodies) older than N days. The rows, ledger, transitions and projections
    stay: a retry of a redacted event is still a duplicate, a stale one still stale. Dead
    letters keep their bodies (an operator may requeue them) until `prune` deletes them."""
    days = older_than_days
    if days is None:
        days = _state().settings.data.retention.redact
        if days is None:
            _fail("redaction is off (redact=never in HOOKLEDGER_RETENTION_DAYS)")
    if days < 1:
        _fail("--older-than-days must be at least 1 (the processor retries for about 24 h)")
    counts = _store().retention.redact(timedelta(days=days), dry_run=dry_run, accounts=accounts)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "older_than_days": days,
                    "accounts": list(accounts) or None,
                    **counts,
                }
            )
        )
        return
    verb = "would be redacted" if dry_run else "redacted"
    click.echo(
        f"{counts['events']} event(s), {counts['conflicts']} conflict(s) and "
        f"{counts['rejections']} rejected body(ies) older than {days:g} days {verb}"
        f"{_scope(accounts)}"
    )


@click.command("retention")
@account_option("Only rows of this processor account (repeatable; default: all).")
@click.option("--dry-run", is_flag=True, help="Only count.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@read_only
@with_appcontext
def retention_cmd(accounts: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Prune, then redact, as HOOKLEDGER_RETENTION_DAYS says (what the scheduler process
    runs every night)."""
    state = _state()
    report = _store().retention.run(
        state.settings.data.retention, dry_run=dry_run, accounts=accounts
    )
    click.echo(json.dumps(report.as_dict()) if as_json else report.render())


# -- rejections -----------------------------------------------------------------------------


@click.command("rejections")
@click.option(
    "--since",
    type=click.DateTime(),
    default=None,
    help="Received at or after (UTC; default: the last 24 hours).",
)
@click.option("--reason", "reasons", multiple=True, help="Only this reason (repeatable).")
@click.option("--limit", type=int, default=50, show_default=True, help="At most this many rows.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@read_only
@with_appcontext
def rejections_cmd(
    since: datetime | None, reasons: tuple[str, ...], limit: int, as_json: bool
) -> None:
    """Rejected deliveries, newest first, and a summary: why (signature_mismatch, ...), the
    secret ids each signature was checked against, and how many were not recorded (rate
    limit). A key rotation that broke shows as signature_mismatch against the new ids."""
    store = _store()
    start = since.replace(tzinfo=UTC) if since else store.now() - timedelta(hours=24)
    rows = store.rejections.rows(since=start, reasons=reasons, limit=limit)
    summary = store.rejections.summary(since=start)
    if as_json:
        click.echo(
            json.dumps({"since": start.isoformat(), "rows": [r.as_dict() for r in rows], **summary})
        )
        return
    for r in rows:
        if r.reason == "rate_limited":
            click.echo(f"#{r.id} {r.received_at:%Y-%m-%dT%H:%M:%SZ} {r.suppressed} not recorded")
            continue
        line = (
            f"#{r.id} {r.received_at:%Y-%m-%dT%H:%M:%SZ} {r.reason} {r.http_status} "
            f"from {r.remote_addr or '?'} {r.size if r.size is not None else '?'} B "
            f"tried [{','.join(r.secret_ids)}] headers {','.join(r.header_names) or '-'}"
        )
        if r.suppressed:
            line += f" (+{r.suppressed} not recorded before it)"
        click.echo(line)
        if r.body is not None:
            click.echo(f"    body: {r.body[:200].decode('utf-8', 'replace')!r}")
    hidden = summary["not_recorded"]
    by_reason = ", ".join(f"{k} {n}" for k, n in sorted(summary["by_reason"].items()))
    by_ids = ", ".join(f"[{k}] {n}" for k, n in sorted(summary["by_secret_ids"].items()))
    click.echo(
        f"since {start:%Y-%m-%dT%H:%M:%SZ}: {summary['rows']} recorded"
        + (f" ({by_reason})" if by_reason else "")
        + (f", {hidden} more not recorded (rate limit)" if hidden else "")
        + (f"; secrets tried: {by_ids}" if by_ids else "")
    )


COMMANDS = (keys_group, rotate_keys_cmd, redact_cmd, prune_cmd, retention_cmd, rejections_cmd)


def register(group: click.Group) -> None:
    """Add the data-at-rest commands to the ``hookledger`` group."""
    for command in COMMANDS:
        group.add_command(command)
