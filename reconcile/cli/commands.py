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
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NoReturn, cast

import click
from sqlalchemy.exc import OperationalError

import receiver.storage.database as db
from receiver.cli.common import add_log_options, long_running, run_main, running_as_program
from receiver.config.data_at_rest import from_environment
from receiver.core.errors import ConfigurationError, HookledgerError, StorageUnavailable
from receiver.core.signature import parse_secrets
from receiver.store import Store
from reconcile.client.processor import ProcessorClient
from reconcile.core.errors import AdoptionInProgress, NotAdopted, ReconcileLocked
from reconcile.core.report import STATUS_INCOMPLETE, STATUS_UNRESOLVED, Report, render, summary
from reconcile.recovery.sweep import DEFAULT_HORIZONS, SweepPolicy
from reconcile.runtime.runner import (
    DEFAULT_KINDS,
    KIND_NAMES,
    LISTED_KINDS,
    ReconcileOptions,
    Reconciler,
)
from reconcile.storage.store import RECONCILE_MIGRATIONS, ReconcileStore

EXIT_OK, EXIT_UNRESOLVED, EXIT_USAGE, EXIT_LOCKED = 0, 1, 2, 3
EXIT_PROCESSOR, EXIT_DATABASE, EXIT_NOT_ADOPTED = 4, 5, 6

EXIT_HELP = (
    "Exit codes: 0 reconciled, 1 drift found, 2 usage or configuration error, 3 another run "
    "holds the lock, 4 the processor could not be read completely, 5 database unreachable, "
    "6 no adoption record (run `reconcile adopt`)."
)
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
    "HOOKLEDGER_SWEEP_HORIZON_DAYS (e.g. 'payment=30,dispute=180'), "
    "HOOKLEDGER_SWEEP_MIN_INTERVAL_SECONDS (600: the least time between two checks of an "
    "object), HOOKLEDGER_DATA_KEYS (the data keys what it stores is sealed with, as the "
    "receiver's), HOOKLEDGER_RETENTION_DAYS (the scheduler's nightly retention)."
)

log = logging.getLogger("reconcile.cli")


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    click.echo(f"reconcile: {message}", err=True)
    sys.exit(code)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        _fail(f"{name} must be a number, not {raw!r}")
    if value < 0:
        _fail(f"{name} must not be negative")
    return value


def _horizons() -> dict[str, timedelta]:
    horizons = dict(DEFAULT_HORIZONS)
    raw = os.environ.get("HOOKLEDGER_SWEEP_HORIZON_DAYS", "")
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        kind, sep, days = part.partition("=")
        kind = kind.strip().rstrip("s")
        try:
            value = float(days)
        except ValueError:
            value = -1.0
        if not sep or kind not in horizons or value <= 0:
            _fail(
                "HOOKLEDGER_SWEEP_HORIZON_DAYS takes kind=days pairs, e.g. "
                f"'payment=30,dispute=180' (kinds: {', '.join(horizons)})"
            )
        horizons[kind] = timedelta(days=value)
    return horizons


def _sweep_policy() -> SweepPolicy:
    minimum = _env_float("HOOKLEDGER_SWEEP_MIN_INTERVAL_SECONDS", 600.0)
    if minimum <= 0:
        _fail("HOOKLEDGER_SWEEP_MIN_INTERVAL_SECONDS must be positive")
    return SweepPolicy(horizons=_horizons(), min_interval=timedelta(seconds=minimum))


class Context:
    """Lazily built from options and environment when a command runs."""

    def __init__(
        self, database_url: str | None, processor_url: str | None, environment: str | None
    ) -> None:
        self.database_url = database_url
        self.processor_url = processor_url
        self.environment = environment
        self._inbox: Store | None = None

    def inbox(self) -> Store:
        if self._inbox is None:
            if not self.database_url:
                _fail("set HOOKLEDGER_DATABASE_URL (or --database-url)")
            try:
                data = from_environment()  # HOOKLEDGER_DATA_KEYS: what it stores is sealed too
                self._inbox = Store(
                    db.make_engine(self.database_url),
                    keyring=data.keyring,
                    rejections=data.rejections,
                )
            except ConfigurationError as exc:
                _fail(exc.message)
        return self._inbox

    def client(self) -> ProcessorClient:
        key = os.environ.get("HOOKLEDGER_API_KEY")
        if not self.processor_url:
            _fail("set HOOKLEDGER_PROCESSOR_URL (or --processor-url)")
        if not key:
            _fail("set HOOKLEDGER_API_KEY (the processor's secret API key)")
        try:
            return ProcessorClient(
                self.processor_url,
                key,
                environment=cast(Literal["sandbox", "production"] | None, self.environment),
            )
        except (ConfigurationError, ValueError) as exc:
            _fail(exc.message if isinstance(exc, HookledgerError) else str(exc))

    def events_path(self) -> Any:
        """The events-API path, when an admin key is configured (else ``None``)."""
        admin_key = os.environ.get("HOOKLEDGER_ADMIN_API_KEY")
        if not admin_key:
            return None
        from reconcile.client.events_api import EventsClient
        from reconcile.recovery.undelivered import UndeliveredEvents

        merchant_id = os.environ.get("HOOKLEDGER_MERCHANT_ID")
        if not merchant_id:
            _fail("the events-API path (HOOKLEDGER_ADMIN_API_KEY) needs HOOKLEDGER_MERCHANT_ID")
        try:
            secrets = parse_secrets(os.environ.get("HOOKLEDGER_SECRETS"))
        except ConfigurationError as exc:
            _fail(exc.message)
        if not secrets:
            _fail(
                "the events-API path verifies what it recovers: set HOOKLEDGER_SECRETS "
                "(the webhook signing secrets)"
            )
        environment = self.environment or self.client().environment
        try:
            api = EventsClient(
                str(self.processor_url),
                admin_key,
                environment=cast(Literal["sandbox", "production"], environment),
            )
        except (ConfigurationError, ValueError) as exc:
            _fail(exc.message if isinstance(exc, HookledgerError) else str(exc))
        resend = os.environ.get("HOOKLEDGER_EVENTS_RESEND", "").lower() in ("1", "true", "yes")
        return UndeliveredEvents(api, self.inbox(), secrets, merchant_id, resend=resend)

    def check_schema(self) -> None:
        engine = self.inbox().engine
        try:
            db.check_schema(engine)
            db.check_schema(engine, RECONCILE_MIGRATIONS)
        except ConfigurationError as exc:
            _fail(exc.message.replace("hookledger db upgrade", "reconcile db upgrade"))
        except OperationalError:
            _fail("the database is unreachable", EXIT_DATABASE)


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
        _fail(
            f"the processor refused the API key{refused}: check HOOKLEDGER_API_KEY (and that "
            "it belongs to this processor and environment)",
            EXIT_PROCESSOR,
        )


def _options_from_env(**kwargs: Any) -> ReconcileOptions:
    env = os.environ
    try:
        return ReconcileOptions(
            overlap=timedelta(minutes=_env_float("HOOKLEDGER_RECONCILE_OVERLAP_MINUTES", 60)),
            lookback=timedelta(hours=_env_float("HOOKLEDGER_RECONCILE_LOOKBACK_HOURS", 48)),
            payments_dialect=env.get("HOOKLEDGER_PAYMENTS_LIST", "hyperswitch"),  # type: ignore[arg-type]
            payouts_dialect=env.get("HOOKLEDGER_PAYOUTS_LIST", "get"),  # type: ignore[arg-type]
            merchant_id=env.get("HOOKLEDGER_MERCHANT_ID") or None,
            max_requests=int(_env_float("HOOKLEDGER_RECONCILE_MAX_REQUESTS", 2000)) or 1,
            sweep_budget=int(_env_float("HOOKLEDGER_SWEEP_BUDGET", 500)),
            sweep_policy=_sweep_policy(),
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


def exit_code(report: Report) -> int:
    """The documented exit code of a finished run's report."""
    if report.status == STATUS_INCOMPLETE:
        return EXIT_PROCESSOR
    if report.status == STATUS_UNRESOLVED:
        return EXIT_UNRESOLVED
    return EXIT_OK


@contextmanager
def _errors() -> Iterator[None]:
    """Turn the run's errors into one line on stderr and a documented exit code."""
    try:
        yield
    except ReconcileLocked as exc:
        _fail(exc.message, EXIT_LOCKED)
    except (NotAdopted, AdoptionInProgress) as exc:
        _fail(exc.message, EXIT_NOT_ADOPTED)
    except (StorageUnavailable, OperationalError):
        _fail("the database is unreachable", EXIT_DATABASE)
    except ConfigurationError as exc:
        _fail(exc.message)
    except ValueError as exc:
        _fail(str(exc))


def _emit(data: Mapping[str, Any], as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else text)


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
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug).")
@click.pass_context
def cli(
    ctx: click.Context,
    database_url: str | None,
    processor_url: str | None,
    environment: str | None,
    verbose: int,
) -> None:
    if verbose and running_as_program():  # -v/-vv: as --log-level info/debug
        logging.getLogger().setLevel([logging.INFO, logging.DEBUG][min(verbose, 2) - 1])
    ctx.obj = Context(database_url, processor_url, environment)
    if ctx.invoked_subcommand is None:
        ctx.invoke(run_cmd)


def _utc(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None else None


@cli.command("run", help="One reconcile run (the default command).\n\n" + EXIT_HELP)
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
) -> None:
    window: dict[str, Any] = {"mode": mode, "until": _utc(until)}
    if since is not None:
        window = {
            "mode": "window",
            "since": _utc(since),
            "until": _utc(until) or datetime.now(UTC),
        }
    extra: dict[str, Any] = {}
    if sweep_budget is not None:
        extra["sweep_budget"] = sweep_budget
    options = _options_from_env(
        kinds=kinds or DEFAULT_KINDS,
        dry_run=dry_run,
        lock_wait=wait,
        events=not no_events,
        **window,
        **extra,
    )
    obj.check_schema()
    client = obj.client()
    _probe_key(client)
    try:
        with _errors():
            reconciler = Reconciler(
                client, obj.inbox(), progress=_progress(), events=obj.events_path()
            )
            report = reconciler.run(options)
    finally:
        client.close()
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    data = report.as_dict()
    _emit(data, as_json, render(data))
    sys.exit(exit_code(report))


@cli.command("report", help="Show the latest stored run reports.")
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


@cli.command(
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
@click.option("--dry-run", is_flag=True, help="Count what would be recorded; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def adopt_cmd(
    obj: Context,
    new_account: bool,
    since: datetime | None,
    kinds: tuple[str, ...],
    max_requests: int,
    dry_run: bool,
    as_json: bool,
) -> None:
    from reconcile.runtime.adoption import Adopter, AdoptOptions, render_adoption

    obj.check_schema()
    client = obj.client()
    try:
        with _errors():
            adopter = Adopter(client, obj.inbox())
            if new_account:
                report = adopter.declare_new_account()
            else:
                env = os.environ
                report = adopter.adopt(
                    AdoptOptions(
                        kinds=kinds or LISTED_KINDS,
                        since=_utc(since),
                        max_requests=max_requests,
                        dry_run=dry_run,
                        payments_dialect=env.get("HOOKLEDGER_PAYMENTS_LIST", "hyperswitch"),  # type: ignore[arg-type]
                        payouts_dialect=env.get("HOOKLEDGER_PAYOUTS_LIST", "get"),  # type: ignore[arg-type]
                        sweep_policy=_sweep_policy(),
                    )
                )
    finally:
        client.close()
    data = report.as_dict()
    _emit(data, as_json, render_adoption(data))
    incomplete = any(k.incomplete for k in report.kinds.values())
    sys.exit(EXIT_PROCESSOR if incomplete or not report.finished else EXIT_OK)


@cli.command(
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
    from reconcile.runtime.adoption import Backfill

    obj.check_schema()
    client = obj.client()
    try:
        with _errors():
            reconciler = Reconciler(client, obj.inbox())
            reconciler.check_adopted()
            report = Backfill(reconciler).run(
                cast(datetime, _utc(since)),
                _utc(until) or datetime.now(UTC),
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
    _emit(data, as_json, "\n".join(lines))


@cli.command(
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
) -> None:
    import reconcile.runtime.scheduler as sched

    obj.check_schema()
    logger = logging.getLogger("reconcile.scheduler")
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # APScheduler logs two INFO lines per job; a run is one line (ours) at INFO.
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
    probe = obj.client()
    try:
        with _errors():
            Reconciler(probe, obj.inbox()).check_adopted()
    finally:
        probe.close()

    def run(mode: str) -> None:
        extra: dict[str, Any] = {}
        if mode == "wide":
            extra = {
                "wide_window": timedelta(hours=nightly_hours),
                "sweep_budget": nightly_sweep_budget,
            }
        options = _options_from_env(mode=mode, lock_wait=0.0, **extra)
        client = obj.client()
        try:
            report = Reconciler(client, obj.inbox(), events=obj.events_path()).run(options)
            level = logging.INFO if report.status == "ok" else logging.WARNING
            logger.log(level, "%s", summary(report.as_dict()), extra=summary_fields(report))
        except ReconcileLocked as exc:
            logger.warning("skipped: %s", exc.message)
        except Exception:
            logger.exception("reconcile run failed")
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
        _fail(str(exc))

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


@cli.group("db", help="Schema migrations (the receiver's and the reconciler's tables).")
def db_group() -> None:
    pass


@db_group.command("upgrade", help="Create or upgrade every hookledger table.")
@click.pass_obj
def db_upgrade(obj: Context) -> None:
    engine = obj.inbox().engine
    try:
        db.upgrade(engine)
        db.upgrade(engine, tree=RECONCILE_MIGRATIONS)
    except OperationalError:
        _fail("the database is unreachable", EXIT_DATABASE)
    click.echo("hookledger schema up to date")


@db_group.command("current", help="Show the schema revisions of both migration trees.")
@click.pass_obj
def db_current(obj: Context) -> None:
    engine = obj.inbox().engine
    try:
        receiver_rev = db.current_revision(engine)
        reconcile_rev = db.current_revision(engine, RECONCILE_MIGRATIONS)
    except OperationalError:
        _fail("the database is unreachable", EXIT_DATABASE)
    click.echo(
        f"receiver {receiver_rev or 'none'} (head {db.head_revision()}), reconcile "
        f"{reconcile_rev or 'none'} (head {db.head_revision(RECONCILE_MIGRATIONS)})"
    )


add_log_options(cli)
long_running(schedule_cmd)


def main() -> None:
    run_main("reconcile", cli, upgrade="reconcile db upgrade")
