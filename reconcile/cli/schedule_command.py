"""The ``schedule`` command of ``reconcile`` (registered by :mod:`reconcile.cli.commands`):
the reconcile schedule in this process until SIGTERM (incremental runs, a nightly wide run,
the daily retention), each run one log line with structured fields.
"""

from __future__ import annotations

import logging
import signal
from datetime import timedelta
from typing import Any

import click

from receiver.cli.common import long_running
from receiver.config.data_at_rest import from_environment
from reconcile.cli.context import Context, exit_code, exit_on_error, fail
from reconcile.cli.run_options import options_from_env
from reconcile.core.errors import AdoptionInProgress, NotAdopted, ReconcileLocked
from reconcile.core.report import Report, summary
from reconcile.runtime.runner import Reconciler


def summary_fields(report: Report) -> dict[str, Any]:
    """The structured fields of a scheduled run's log line."""
    return {
        "action": "reconcile_run",
        "run_id": report.run_id,
        "mode": report.mode,
        "status": report.status,
        "exit_code": exit_code(report),
        "recovered": report.recovered,
        "unresolved": report.unresolved,
        "duration_seconds": round(report.duration_seconds, 3),
    }


@click.command(
    "schedule",
    help="Run the reconcile schedule in this process until SIGTERM: an incremental run "
    "(lists from the watermarks, the sweep, the events API) every --every minutes and a wide "
    "run nightly. Refuses to start (exit 6) on a database without an adoption record.",
)
@click.option(
    "--every",
    "every_minutes",
    type=float,
    default=10.0,
    show_default=True,
    help="Minutes between incremental runs.",
)
@click.option("--nightly-at", default="02:00", show_default=True, help="UTC time of the wide run.")
@click.option(
    "--nightly-hours",
    type=float,
    default=48.0,
    show_default=True,
    help="How far back the nightly run's lists look.",
)
@click.option(
    "--nightly-sweep-budget",
    type=click.IntRange(min=0),
    default=5000,
    show_default=True,
    help="Requests the nightly run's sweep may spend.",
)
@click.option(
    "--misfire-grace",
    type=int,
    default=300,
    show_default=True,
    help="Seconds a late run may still start.",
)
@click.option(
    "--retention-at",
    default="03:30",
    show_default=True,
    help="UTC time of the daily retention (prune, then redact, as HOOKLEDGER_RETENTION_DAYS says).",
)
@click.option("--no-retention", is_flag=True, help="Do not run the retention job here.")
@click.option(
    "--all-accounts",
    is_flag=True,
    help="Each run reconciles every account in turn (read again at each run: accounts stored "
    "with `hookledger accounts add` are picked up at once, those added to HOOKLEDGER_ACCOUNTS "
    "at a restart of the configuration source), "
    "each isolated: one failing, locked or not yet adopted is logged and the others run.",
)
@click.pass_obj
def schedule_cmd(
    obj: Context,
    every_minutes: float,
    nightly_at: str,
    nightly_hours: float,
    nightly_sweep_budget: int,
    misfire_grace: int,
    retention_at: str,
    no_retention: bool,
    all_accounts: bool = False,
) -> None:
    import reconcile.runtime.scheduler as sched

    obj.check_schema()
    logger = logging.getLogger("reconcile.scheduler")
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # APScheduler logs two INFO lines per job; a run is one line (ours) at INFO.
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
    if all_accounts:
        if not obj.account_ids():
            fail(
                "no account to reconcile: set HOOKLEDGER_API_KEY or api_key in "
                "HOOKLEDGER_ACCOUNTS, or store one (hookledger accounts add)"
            )
    else:
        probe = obj.client()
        try:
            with exit_on_error():
                Reconciler(probe, obj.inbox(), account=obj.account).check_adopted()
        finally:
            probe.close()

    def run(mode: str) -> None:
        try:
            ids = obj.account_ids() if all_accounts else [obj.account]
        except SystemExit:  # the account table could not be read, said on stderr: next run
            logger.error("no run: the accounts could not be read", extra={"action": "skipped"})
            return
        for account in ids:
            run_account(obj.for_account(account), mode)

    def run_account(ctx: Context, mode: str) -> None:
        extra: dict[str, Any] = {}
        if mode == "wide":
            extra = {
                "wide_window": timedelta(hours=nightly_hours),
                "sweep_budget": nightly_sweep_budget,
            }
        options = options_from_env(mode=mode, lock_wait=0.0, **extra)
        where = {"account": ctx.account}
        try:
            client = ctx.client()
        except SystemExit:  # the account's configuration, said on stderr
            logger.error("account %s skipped: not configured", ctx.account, extra=where)
            return
        try:
            report = Reconciler(
                client,
                ctx.inbox(),
                events=ctx.events_path(),
                account=ctx.account,
                accounts=ctx.accounts(),
            ).run(options)
            level = logging.INFO if report.status == "ok" else logging.WARNING
            logger.log(
                level,
                "%s",
                summary(report.as_dict()),
                extra={**summary_fields(report), **where},
            )
        except (ReconcileLocked, NotAdopted, AdoptionInProgress) as exc:
            logger.warning("account %s skipped: %s", ctx.account, exc.message, extra=where)
        except SystemExit:
            logger.error("account %s skipped: not configured", ctx.account, extra=where)
        except Exception:
            logger.exception("reconcile run failed (account %s)", ctx.account, extra=where)
        finally:
            client.close()

    from_environment().warn("reconcile schedule")

    def retain() -> None:
        try:
            policy = from_environment().retention
            report = obj.inbox().retention.run(policy)
            logger.info("%s", report.render(), extra={"action": "retention"})
        except Exception:
            logger.exception("retention run failed")

    try:
        scheduler = sched.configure(
            sched.blocking_scheduler(),
            run,
            every_minutes=every_minutes,
            nightly_at=nightly_at,
            misfire_grace=misfire_grace,
            retention=None if no_retention else retain,
            retention_at=retention_at,
        )
    except ValueError as exc:
        fail(str(exc))

    def stop(signum: int, _frame: Any) -> None:
        logger.warning("signal %d: stopping after the current run", signum)
        scheduler.shutdown(wait=True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    click.echo(
        f"reconcile schedule: incremental every {every_minutes:g} min, "
        f"wide at {nightly_at} UTC over {nightly_hours:g} h"
        + ("" if no_retention else f", retention at {retention_at} UTC"),
        err=True,
    )
    scheduler.start()


long_running(schedule_cmd)


def register(group: click.Group) -> None:
    """Add the ``schedule`` command to ``group``."""
    group.add_command(schedule_cmd)
