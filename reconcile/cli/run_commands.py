"""The run commands of ``reconcile`` (registered by :mod:`reconcile.cli.commands`): ``run``,
one reconcile run now (also what ``reconcile`` alone does), with the check of the API key
before it and the progress on a terminal; and ``report``, the latest stored run reports.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click

from reconcile.cli.context import (
    EXIT_DATABASE,
    EXIT_HELP,
    EXIT_LOCKED,
    EXIT_NOT_ADOPTED,
    EXIT_PROCESSOR,
    EXIT_UNRESOLVED,
    Context,
    emit,
    exit_code,
    exit_on_error,
    fail,
    utc_option,
)
from reconcile.cli.run_options import options_from_env
from reconcile.client.processor import ProcessorClient
from reconcile.core.report import Report, render
from reconcile.runtime.runner import DEFAULT_KINDS, KIND_NAMES, Reconciler
from reconcile.storage.store import ReconcileStore


def _probe_key(client: ProcessorClient) -> None:
    """One request that needs the key, before a run: a refused key is one line and exit 4
    (the processor could not be read), not a report with an error per kind. An unknown
    payment id answers 404 to a good key."""
    from reconcile.core.errors import AuthenticationError, ProcessorError

    refused: str | None = None
    try:
        client.get_payment("pay_hookledger_key_check")
    except AuthenticationError as exc:
        refused = f" ({exc.code})" if getattr(exc, "code", None) else ""
    except ProcessorError:
        pass  # a good key (not found), or a problem the run itself will report
    if refused is not None:
        client.close()
        fail(
            f"the processor refused the API key{refused}: check HOOKLEDGER_API_KEY (and that "
            "it belongs to this processor and environment)",
            EXIT_PROCESSOR,
        )


def _progress() -> Callable[[str, int], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(kind: str, checked: int) -> None:
        sys.stderr.write(f"\r  {kind}: {checked} checked")
        sys.stderr.flush()

    return show


@click.command("run", help="One reconcile run (the default command).\n\n" + EXIT_HELP)
@click.option(
    "--mode",
    type=click.Choice(["incremental", "wide"]),
    default="incremental",
    show_default=True,
    help="incremental: from each watermark; wide: the last --wide-hours.",
)
@click.option("--since", type=click.DateTime(), default=None, help="Window start (UTC).")
@click.option(
    "--until",
    type=click.DateTime(),
    default=None,
    help="Window end (UTC; a time in the future is clamped to now).",
)
@click.option(
    "--kind",
    "kinds",
    type=click.Choice(sorted(KIND_NAMES)),
    multiple=True,
    help="Kinds to reconcile (default: all).",
)
@click.option(
    "--sweep-budget",
    type=click.IntRange(min=0),
    default=None,
    help="Requests the open-object sweep may spend (0: no sweep).",
)
@click.option("--no-events", is_flag=True, help="Skip the events-API path.")
@click.option("--dry-run", is_flag=True, help="Show what would be recovered; insert nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait for a running run.")
@click.option(
    "--all-accounts",
    is_flag=True,
    help="Reconcile every account in turn (the default one if HOOKLEDGER_API_KEY is set, and "
    "each of HOOKLEDGER_ACCOUNTS and of the stored accounts (hookledger accounts) with an "
    "api_key), each with its own lock, watermarks and "
    "budget; one failing never stops the others. The exit code is the worst account's.",
)
@click.pass_obj
def run_cmd(
    obj: Context,
    mode: str = "incremental",
    since: datetime | None = None,
    until: datetime | None = None,
    kinds: tuple[str, ...] = (),
    sweep_budget: int | None = None,
    no_events: bool = False,
    dry_run: bool = False,
    as_json: bool = False,
    wait: float = 0.0,
    all_accounts: bool = False,
) -> None:
    window: dict[str, Any] = {"mode": mode, "until": utc_option(until)}
    if since is not None:
        window = {
            "mode": "window",
            "since": utc_option(since),
            "until": utc_option(until) or datetime.now(UTC),
        }
    extra: dict[str, Any] = {}
    if sweep_budget is not None:
        extra["sweep_budget"] = sweep_budget
    options = options_from_env(
        kinds=kinds or DEFAULT_KINDS,
        dry_run=dry_run,
        lock_wait=wait,
        events=not no_events,
        **window,
        **extra,
    )
    obj.check_schema()
    if all_accounts:
        _run_all(obj, options, as_json)
    report = _run_one(obj, options)
    data = report.as_dict()
    emit(data, as_json, render(data))
    sys.exit(exit_code(report))


def _run_one(obj: Context, options: Any) -> Report:
    """One account's run (its failures are one line and the documented exit code)."""
    client = obj.client()
    _probe_key(client)
    try:
        with exit_on_error():
            reconciler = Reconciler(
                client,
                obj.inbox(),
                progress=_progress(),
                events=obj.events_path(),
                account=obj.account,
                accounts=obj.accounts(),
            )
            report = reconciler.run(options)
    finally:
        client.close()
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    return report


#: Which of two accounts' exit codes the run of all accounts ends with: the database, then
#: a missing adoption, the processor, a held lock, configuration, drift; 0 only if all are.
_SEVERITY = (EXIT_DATABASE, EXIT_NOT_ADOPTED, EXIT_PROCESSOR, EXIT_LOCKED, 2, EXIT_UNRESOLVED)


def _run_all(obj: Context, options: Any, as_json: bool) -> None:
    ids = obj.account_ids()
    if not ids:
        fail(
            "no account to reconcile: set HOOKLEDGER_API_KEY or api_key in HOOKLEDGER_ACCOUNTS, "
            "or store one (hookledger accounts add)"
        )
    codes: dict[str, int] = {}
    reports: dict[str, Any] = {}
    for account in ids:
        try:
            report = _run_one(obj.for_account(account), options)
        except SystemExit as stop:  # that account's failure, said on stderr: go on
            codes[account] = stop.code if isinstance(stop.code, int) else 2
            reports[account] = {"status": "failed", "exit_code": codes[account]}
            continue
        codes[account] = exit_code(report)
        reports[account] = report.as_dict()
    worst = next((c for c in _SEVERITY if c in codes.values()), 0)
    not_ok = sorted(a for a, c in codes.items() if c != 0)
    if as_json:
        click.echo(json.dumps({"accounts": reports, "not_ok": not_ok}, default=str))
    else:
        for account in ids:
            data = reports[account]
            shown = render(data) if "kinds" in data else f"failed (exit {codes[account]})"
            click.echo(f"== account {account}: exit {codes[account]}\n{shown}")
        summary = f"{len(ids)} account(s), not ok: {', '.join(not_ok)}" if not_ok else ""
        click.echo(summary or f"{len(ids)} account(s), all ok")
    sys.exit(worst)


@click.command("report", help="Show the latest stored run reports.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="How many runs, newest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
@click.pass_obj
def report_cmd(obj: Context, limit: int, as_json: bool) -> None:
    obj.check_schema()
    runs = ReconcileStore(obj.inbox().engine, account=obj.account).runs(limit)
    if not runs:
        if not obj.is_known():
            fail(
                f"unknown account {obj.account!r}: it is neither in HOOKLEDGER_ACCOUNTS nor "
                "stored (hookledger accounts list)"
            )
        # Nothing printed would read as "nothing to report"; say that no run ever finished.
        click.echo(
            f"reconcile: no run is recorded for account {obj.account!r} yet "
            f"(reconcile --account {obj.account} run)",
            err=True,
        )
    if as_json:
        click.echo(json.dumps([json.loads(r.report) for r in runs], indent=2))
        return
    for r in runs:
        data = json.loads(r.report)
        if "kinds" in data:
            click.echo(render(data))
        else:
            click.echo(f"reconcile run #{r.id} ({r.mode}): {r.status} {data}")


def register(group: click.Group) -> None:
    """Add the run commands to ``group``."""
    for command in (run_cmd, report_cmd):
        group.add_command(command)
