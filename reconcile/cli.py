"""``reconcile``: recover missed events from the processor's list endpoints.

Exit codes: 0 everything reconciled, 1 something is unresolved (see the report), 2 bad usage
or configuration, 3 another run holds the lock.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import click

from receiver import db
from receiver.errors import ConfigurationError, HookledgerError
from receiver.store import Store
from reconcile.client import ProcessorClient
from reconcile.errors import ReconcileLocked
from reconcile.runner import DEFAULT_KINDS, KIND_NAMES, ReconcileOptions, Reconciler, Report
from reconcile.store import RECONCILE_MIGRATIONS, ReconcileStore

ENV_HELP = (
    "Environment: HOOKLEDGER_DATABASE_URL (the receiver's database), HOOKLEDGER_PROCESSOR_URL "
    "(API base URL), HOOKLEDGER_API_KEY (secret key, snd_... or prd_...; never a flag), "
    "HOOKLEDGER_MERCHANT_ID (optional), HOOKLEDGER_PAYMENTS_LIST (hyperswitch|seed), "
    "HOOKLEDGER_PAYOUTS_LIST (get|post), HOOKLEDGER_RECONCILE_OVERLAP_MINUTES (60), "
    "HOOKLEDGER_RECONCILE_LOOKBACK_HOURS (48)."
)

EXIT_UNRESOLVED, EXIT_USAGE, EXIT_LOCKED = 1, 2, 3


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    click.echo(f"reconcile: {message}", err=True)
    sys.exit(code)


class Context:
    """Lazily built from options and environment when a command runs."""

    def __init__(self, database_url: str | None, processor_url: str | None) -> None:
        self.database_url = database_url
        self.processor_url = processor_url
        self._inbox: Store | None = None

    def inbox(self) -> Store:
        if self._inbox is None:
            if not self.database_url:
                _fail("set HOOKLEDGER_DATABASE_URL (or --database-url)")
            self._inbox = Store(db.make_engine(self.database_url))
        return self._inbox

    def client(self) -> ProcessorClient:
        import os

        key = os.environ.get("HOOKLEDGER_API_KEY")
        if not self.processor_url:
            _fail("set HOOKLEDGER_PROCESSOR_URL (or --processor-url)")
        if not key:
            _fail("set HOOKLEDGER_API_KEY (the processor's secret API key)")
        return ProcessorClient(self.processor_url, key)

    def check_schema(self) -> None:
        engine = self.inbox().engine
        try:
            db.check_schema(engine)
            db.check_schema(engine, RECONCILE_MIGRATIONS)
        except ConfigurationError as exc:
            _fail(exc.message.replace("hookledger db upgrade", "reconcile db upgrade"))


def _options_from_env(**kwargs: Any) -> ReconcileOptions:
    import os

    env = os.environ
    try:
        return ReconcileOptions(
            overlap=timedelta(minutes=float(env.get("HOOKLEDGER_RECONCILE_OVERLAP_MINUTES", 60))),
            lookback=timedelta(hours=float(env.get("HOOKLEDGER_RECONCILE_LOOKBACK_HOURS", 48))),
            payments_dialect=env.get("HOOKLEDGER_PAYMENTS_LIST", "hyperswitch"),  # type: ignore[arg-type]
            payouts_dialect=env.get("HOOKLEDGER_PAYOUTS_LIST", "get"),  # type: ignore[arg-type]
            merchant_id=env.get("HOOKLEDGER_MERCHANT_ID") or None,
            **kwargs,
        )
    except ValueError as exc:
        _fail(str(exc))


def _progress() -> Callable[[str, int], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(kind: str, checked: int) -> None:
        sys.stderr.write(f"\r  {kind}: {checked} checked")
        sys.stderr.flush()

    return show


def render(report: dict[str, Any]) -> str:
    """The report as a table for people."""
    lines = [
        f"reconcile run #{report['run_id']} ({report['mode']}"
        f"{', dry run' if report['dry_run'] else ''}): {report['status']} "
        f"in {report['duration_seconds']:.2f} s",
        f"{'kind':<9} {'checked':>7} {'in_sync':>7} {'recovered':>9} {'queued':>6} "
        f"{'no_event':>8} {'local_only':>10} {'unresolved':>10}  window",
    ]
    for name, k in report["kinds"].items():
        start, end = (w[:19] for w in k["window"])
        lines.append(
            f"{name:<9} {k['checked']:>7} {k['in_sync']:>7} {k['recovered_total']:>9} "
            f"{k['already_queued']:>6} {k['no_event']:>8} {k['local_only']:>10} "
            f"{k['unresolved']:>10}  {start}..{end}"
        )
        for event_type, n in k["recovered"].items():
            lines.append(f"{'':<9} recovered {n} x {event_type}")
        for label in (
            "remote_errors",
            "incomplete",
            "local_ahead_sample",
            "mismatched_sample",
            "local_only_sample",
        ):
            for item in k[label]:
                lines.append(f"{'':<9} {label.replace('_sample', '')}: {item}")
    totals = report["totals"]
    lines.append(
        f"total: checked {totals.get('checked', 0)}, recovered {totals.get('recovered', 0)}, "
        f"unresolved {totals.get('unresolved', 0)}, dead-lettered events in the inbox "
        f"{report['dead_letter_events']}"
    )
    return "\n".join(lines)


def _emit(report: Report, as_json: bool) -> None:
    data = report.as_dict()
    click.echo(json.dumps(data, indent=2) if as_json else render(data))


@click.group(
    "reconcile",
    invoke_without_command=True,
    help="Recover missed webhook events from the processor's list endpoints.\n\n" + ENV_HELP,
)
@click.option("--database-url", envvar="HOOKLEDGER_DATABASE_URL", default=None)
@click.option("--processor-url", envvar="HOOKLEDGER_PROCESSOR_URL", default=None)
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug).")
@click.pass_context
def cli(
    ctx: click.Context, database_url: str | None, processor_url: str | None, verbose: int
) -> None:
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    ctx.obj = Context(database_url, processor_url)
    if ctx.invoked_subcommand is None:
        ctx.invoke(run_cmd)


@cli.command("run")
@click.option(
    "--mode", type=click.Choice(["incremental", "wide"]), default="incremental", show_default=True
)
@click.option("--since", type=click.DateTime(), default=None, help="Window start (UTC).")
@click.option("--until", type=click.DateTime(), default=None, help="Window end (UTC).")
@click.option(
    "--kind",
    "kinds",
    type=click.Choice(sorted(KIND_NAMES)),
    multiple=True,
    help="Kinds to reconcile (default: all).",
)
@click.option("--dry-run", is_flag=True, help="Show what would be recovered; insert nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait for a running run.")
@click.pass_obj
def run_cmd(
    obj: Context,
    mode: str = "incremental",
    since: datetime | None = None,
    until: datetime | None = None,
    kinds: tuple[str, ...] = (),
    dry_run: bool = False,
    as_json: bool = False,
    wait: float = 0.0,
) -> None:
    """One reconcile run (the default command)."""
    window: dict[str, Any] = {}
    if since is not None:
        window = {
            "mode": "window",
            "since": since.replace(tzinfo=UTC),
            "until": (until or datetime.now(UTC)).replace(tzinfo=UTC),
        }
    elif until is not None:
        window = {"mode": mode, "until": until.replace(tzinfo=UTC)}
    else:
        window = {"mode": mode}
    options = _options_from_env(
        kinds=kinds or DEFAULT_KINDS, dry_run=dry_run, lock_wait=wait, **window
    )
    obj.check_schema()
    client = obj.client()
    try:
        report = Reconciler(client, obj.inbox(), progress=_progress()).run(options)
    except ReconcileLocked as exc:
        _fail(exc.message, EXIT_LOCKED)
    except HookledgerError as exc:
        _fail(exc.message)
    finally:
        client.close()
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    _emit(report, as_json)
    if report.unresolved and not dry_run:
        sys.exit(EXIT_UNRESOLVED)


@cli.command("report")
@click.option("--limit", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def report_cmd(obj: Context, limit: int, as_json: bool) -> None:
    """Show the latest stored run reports."""
    obj.check_schema()
    runs = ReconcileStore(obj.inbox().engine).runs(limit)
    if as_json:
        click.echo(json.dumps([json.loads(r.report) for r in runs], indent=2))
        return
    for r in runs:
        data = json.loads(r.report)
        if "kinds" in data:
            click.echo(render(data))
        else:
            click.echo(f"reconcile run #{r.id} ({r.mode}): {r.status} {data}")


@cli.command("schedule")
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
    help="How far back the nightly run looks.",
)
@click.option("--misfire-grace", type=int, default=300, show_default=True)
@click.pass_obj
def schedule_cmd(
    obj: Context, every_minutes: float, nightly_at: str, nightly_hours: float, misfire_grace: int
) -> None:
    """Run the reconcile schedule in this process until SIGTERM."""
    from reconcile import scheduler as sched

    obj.check_schema()
    log = logging.getLogger("reconcile.scheduler")

    def run(mode: str) -> None:
        options = _options_from_env(
            mode=mode, wide_window=timedelta(hours=nightly_hours), lock_wait=0.0
        )
        client = obj.client()
        try:
            report = Reconciler(client, obj.inbox()).run(options)
            log.warning("%s", render(report.as_dict()))
        except ReconcileLocked as exc:
            log.warning("skipped: %s", exc.message)
        except Exception:
            log.exception("reconcile run failed")
        finally:
            client.close()

    try:
        scheduler = sched.configure(
            sched.blocking_scheduler(),
            run,
            every_minutes=every_minutes,
            nightly_at=nightly_at,
            misfire_grace=misfire_grace,
        )
    except ValueError as exc:
        _fail(str(exc))

    def stop(signum: int, _frame: Any) -> None:
        log.warning("signal %d: stopping after the current run", signum)
        scheduler.shutdown(wait=True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    click.echo(
        f"reconcile schedule: incremental every {every_minutes:g} min, "
        f"wide at {nightly_at} UTC over {nightly_hours:g} h",
        err=True,
    )
    scheduler.start()


@cli.group("db")
def db_group() -> None:
    """Schema migrations (the receiver's and the reconciler's tables)."""


@db_group.command("upgrade")
@click.pass_obj
def db_upgrade(obj: Context) -> None:
    """Create or upgrade every hookledger table."""
    engine = obj.inbox().engine
    db.upgrade(engine)
    db.upgrade(engine, tree=RECONCILE_MIGRATIONS)
    click.echo("hookledger schema up to date")


def main() -> None:
    cli.main(prog_name="reconcile")
