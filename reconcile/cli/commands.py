"""``reconcile``: recover missed transitions from the processor (lists, sweep, events API).

Exit codes (also in ``--help`` and the README):

- 0: reconciled; nothing is wrong;
- 1: drift found that the run could not mend (see the report's unresolved items);
- 2: usage or configuration error;
- 3: another run holds the lock;
- 4: the processor could not be read completely (an API or transport failure, a listing
  that was stuck or ran out of budget, sweep objects left overdue); the report says where;
- 5: the database is unreachable;
- 6: this database has no adoption record (run ``reconcile adopt`` or
  ``reconcile adopt --new-account`` first).

The program (its options, the default command) and ``db`` are here; the commands are
registered from :mod:`reconcile.cli.run_commands` (``run``, ``report``),
:mod:`reconcile.cli.adoption_commands` (``adopt``, ``backfill``) and
:mod:`reconcile.cli.schedule_command` (``schedule``); what they share is in
:mod:`reconcile.cli.context`, a run's tuning from the environment in
:mod:`reconcile.cli.run_options`.
"""

from __future__ import annotations

import logging

import click
from sqlalchemy.exc import OperationalError

import receiver.storage.database as db
from receiver.cli.common import add_log_options, run_main, running_as_program
from receiver.core.accounts import DEFAULT_ACCOUNT
from reconcile.cli.adoption_commands import register as register_adoption_commands
from reconcile.cli.context import EXIT_DATABASE, EXIT_HELP, Context, fail
from reconcile.cli.run_commands import register as register_run_commands
from reconcile.cli.run_commands import run_cmd
from reconcile.cli.schedule_command import register as register_schedule_command
from reconcile.storage.store import RECONCILE_MIGRATIONS

ENV_HELP = (
    "Environment: HOOKLEDGER_DATABASE_URL (the receiver's database), HOOKLEDGER_PROCESSOR_URL "
    "(API base URL), HOOKLEDGER_API_KEY (secret key, snd_... or prd_...; never a flag), "
    "HOOKLEDGER_ENVIRONMENT (sandbox|production; required for a key without that prefix), "
    "HOOKLEDGER_MERCHANT_ID, HOOKLEDGER_ADMIN_API_KEY (optional: turns on the events-API "
    "path, with HOOKLEDGER_MERCHANT_ID and HOOKLEDGER_SECRETS to verify what it recovers), "
    "HOOKLEDGER_EVENTS_RESEND (ask the processor to re-send what the events path recovers), "
    "HOOKLEDGER_PAYMENTS_LIST (hyperswitch|seed; seed also picks the seed's refund filters), "
    "HOOKLEDGER_PAYOUTS_LIST (get|post), HOOKLEDGER_RECONCILE_OVERLAP_MINUTES (60), "
    "HOOKLEDGER_RECONCILE_LOOKBACK_HOURS (48), HOOKLEDGER_RECONCILE_MAX_REQUESTS (per listed "
    "window, 2000), HOOKLEDGER_SWEEP_BUDGET (requests per run, 500), "
    "HOOKLEDGER_SWEEP_HORIZON_DAYS (e.g. 'payment=30,dispute=180,payment.succeeded=7'), "
    "HOOKLEDGER_SWEEP_MIN_INTERVAL_SECONDS (600: the least time between two checks of an "
    "object), HOOKLEDGER_DATA_KEYS (the data keys what it stores is sealed with, as the "
    "receiver's), HOOKLEDGER_RETENTION_DAYS (the scheduler's nightly retention)."
)

log = logging.getLogger("reconcile.cli")


@click.group(
    "reconcile",
    invoke_without_command=True,
    help="Recover missed webhook events from the processor (lists, open-object sweep, "
    "events API).\n\n" + ENV_HELP + "\n\n" + EXIT_HELP,
)
@click.option(
    "--database-url",
    envvar="HOOKLEDGER_DATABASE_URL",
    default=None,
    help="The receiver's database (HOOKLEDGER_DATABASE_URL).",
)
@click.option(
    "--processor-url",
    envvar="HOOKLEDGER_PROCESSOR_URL",
    default=None,
    help="The processor's API base URL (HOOKLEDGER_PROCESSOR_URL).",
)
@click.option(
    "--environment",
    envvar="HOOKLEDGER_ENVIRONMENT",
    type=click.Choice(["sandbox", "production"]),
    default=None,
    help="Pin sandbox or production (HOOKLEDGER_ENVIRONMENT); needed for keys without a "
    "snd_/prd_ prefix, and checked against the key otherwise.",
)
@click.option(
    "--account",
    envvar="HOOKLEDGER_ACCOUNT",
    default=DEFAULT_ACCOUNT,
    show_default=True,
    help="The processor account (HOOKLEDGER_ACCOUNT): 'default' reads HOOKLEDGER_API_KEY and "
    "the other variables above, another its entry of HOOKLEDGER_ACCOUNTS or its stored row "
    "(hookledger accounts add; its keys opened with HOOKLEDGER_DATA_KEYS).",
)
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug).")
@click.pass_context
def cli(
    ctx: click.Context,
    database_url: str | None,
    processor_url: str | None,
    environment: str | None,
    account: str,
    verbose: int,
) -> None:
    if verbose and running_as_program():  # -v/-vv: as --log-level info/debug
        logging.getLogger().setLevel([logging.INFO, logging.DEBUG][min(verbose, 2) - 1])
    ctx.obj = Context(database_url, processor_url, environment, account)
    if ctx.invoked_subcommand is None:
        ctx.invoke(run_cmd)


@click.group("db", help="Schema migrations (the receiver's and the reconciler's tables).")
def db_group() -> None:
    pass


@db_group.command("upgrade", help="Create or upgrade every hookledger table.")
@click.pass_obj
def db_upgrade(obj: Context) -> None:
    engine = obj.migration_engine()
    try:
        db.upgrade(engine)
        db.upgrade(engine, tree=RECONCILE_MIGRATIONS)
    except OperationalError:
        fail("the database is unreachable", EXIT_DATABASE)
    click.echo("hookledger schema up to date")


@db_group.command("current", help="Show the schema revisions of both migration trees.")
@click.pass_obj
def db_current(obj: Context) -> None:
    engine = obj.inbox().engine
    try:
        receiver_rev = db.current_revision(engine)
        reconcile_rev = db.current_revision(engine, RECONCILE_MIGRATIONS)
    except OperationalError:
        fail("the database is unreachable", EXIT_DATABASE)
    click.echo(
        f"receiver {receiver_rev or 'none'} (head {db.head_revision()}), reconcile "
        f"{reconcile_rev or 'none'} (head {db.head_revision(RECONCILE_MIGRATIONS)})"
    )


register_run_commands(cli)
register_adoption_commands(cli)
register_schedule_command(cli)
cli.add_command(db_group)
add_log_options(cli)


def main() -> None:
    run_main("reconcile", cli, upgrade="reconcile db upgrade")
