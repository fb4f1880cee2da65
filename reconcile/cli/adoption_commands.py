"""The adoption commands of ``reconcile`` (registered by :mod:`reconcile.cli.commands`):
``adopt``, going live on an account with history (or, with ``--new-account``, declaring one
without), and ``backfill``, dispatching on request what adoption recorded as already seen.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from typing import cast

import click

from reconcile.cli.context import (
    EXIT_HELP,
    EXIT_OK,
    EXIT_PROCESSOR,
    Context,
    emit,
    exit_on_error,
    utc_option,
)
from reconcile.cli.run_options import sweep_policy
from reconcile.runtime.runner import LISTED_KINDS, Reconciler


@click.command(
    "adopt",
    help="Go live on an account with history: record the processor's current state as "
    "already seen (dispatching nothing) and a cut-over, so no path ever dispatches what "
    "happened before it. Resumable: run it again until it says finished. With "
    "--new-account: declare an account with nothing before hookledger.\n\n" + EXIT_HELP,
)
@click.option(
    "--new-account",
    is_flag=True,
    help="The account has no history before hookledger: dispatch everything found.",
)
@click.option(
    "--since",
    type=click.DateTime(),
    default=None,
    help="Read history from here (UTC; default: as far back as the sweep follows each kind).",
)
@click.option(
    "--kind",
    "kinds",
    type=click.Choice(sorted(LISTED_KINDS)),
    multiple=True,
    help="Kinds to adopt (default: every listed kind).",
)
@click.option(
    "--max-requests",
    type=click.IntRange(min=1),
    default=5000,
    show_default=True,
    help="Requests this run may spend; run adopt again to go on.",
)
@click.option(
    "--deployed-at",
    type=click.DateTime(
        formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S.%f"]
    ),
    default=None,
    help="When the deploy pointed the processor's webhooks at hookledger (UTC): the earlier "
    "system's history ends there; every change since is dispatched once. Recorded by the "
    "first run. Required when no webhook has reached hookledger for the account yet.",
)
@click.option("--dry-run", is_flag=True, help="Count what would be recorded; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def adopt_cmd(
    obj: Context,
    new_account: bool,
    since: datetime | None,
    kinds: tuple[str, ...],
    max_requests: int,
    deployed_at: datetime | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    from reconcile.runtime.adoption import Adopter, AdoptOptions
    from reconcile.runtime.adoption_report import render_adoption

    obj.check_schema()
    client = obj.client()
    try:
        with exit_on_error():
            adopter = Adopter(client, obj.inbox(), account=obj.account, accounts=obj.accounts())
            if new_account:
                report = adopter.declare_new_account()
            else:
                env = os.environ
                report = adopter.adopt(
                    AdoptOptions(
                        kinds=kinds or LISTED_KINDS,
                        since=utc_option(since),
                        max_requests=max_requests,
                        dry_run=dry_run,
                        payments_dialect=env.get("HOOKLEDGER_PAYMENTS_LIST", "hyperswitch"),  # type: ignore[arg-type]
                        payouts_dialect=env.get("HOOKLEDGER_PAYOUTS_LIST", "get"),  # type: ignore[arg-type]
                        sweep_policy=sweep_policy(),
                        deployed_at=utc_option(deployed_at),
                    )
                )
    finally:
        client.close()
    data = report.as_dict()
    emit(data, as_json, render_adoption(data))
    incomplete = any(k.incomplete for k in report.kinds.values())
    sys.exit(EXIT_PROCESSOR if incomplete or not report.finished else EXIT_OK)


@click.command(
    "backfill",
    help="Dispatch transitions adoption recorded as already seen, for objects created in "
    "--since..--until. Without --yes it only counts them (a dry run).",
)
@click.option("--since", type=click.DateTime(), required=True, help="Window start (UTC).")
@click.option("--until", type=click.DateTime(), default=None, help="Window end (UTC; now).")
@click.option(
    "--kind",
    "kinds",
    type=click.Choice(sorted(LISTED_KINDS)),
    multiple=True,
    help="Kinds (default: every listed kind).",
)
@click.option("--yes", is_flag=True, help="Dispatch them (after looking at the dry-run count).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def backfill_cmd(
    obj: Context,
    since: datetime,
    until: datetime | None,
    kinds: tuple[str, ...],
    yes: bool,
    as_json: bool,
) -> None:
    from reconcile.runtime.backfill import Backfill

    obj.check_schema()
    client = obj.client()
    try:
        with exit_on_error():
            reconciler = Reconciler(
                client, obj.inbox(), account=obj.account, accounts=obj.accounts()
            )
            reconciler.check_adopted()
            report = Backfill(reconciler).run(
                cast(datetime, utc_option(since)),
                utc_option(until) or datetime.now(UTC),
                kinds=kinds or LISTED_KINDS,
                dry_run=not yes,
            )
    finally:
        client.close()
    data = report.as_dict()
    verb = "would dispatch" if report.dry_run else "dispatched"
    lines = [f"backfill {data['window'][0]}..{data['window'][1]}: {verb} {data['total']}"]
    for name, k in data["kinds"].items():
        for event_type, n in k["recovered"].items():
            lines.append(f"  {name}: {n} x {event_type}")
    if report.dry_run:
        lines.append("  (dry run: add --yes to dispatch them)")
    emit(data, as_json, "\n".join(lines))


def register(group: click.Group) -> None:
    """Add the adoption commands to ``group``."""
    for command in (adopt_cmd, backfill_cmd):
        group.add_command(command)
