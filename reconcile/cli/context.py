"""What the ``reconcile`` commands share: the exit codes (and the help line that lists them),
a failure said in one line, the :class:`Context` (the receiver's inbox, the processor client
and the events-API path, built lazily from the options and the environment), a run's errors
and a finished run's report turned into exit codes, the output as JSON or text, and UTC for
the time options.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal, NoReturn, cast

import click
from sqlalchemy.exc import OperationalError

import receiver.storage.database as db
from receiver.config.data_at_rest import from_environment
from receiver.config.settings import reconciler_bounds
from receiver.core.accounts import (
    DEFAULT_ACCOUNT,
    Account,
    AccountSource,
    ChainedAccounts,
    StaticAccounts,
    parse_accounts,
)
from receiver.core.errors import (
    ConfigurationError,
    DataUnavailable,
    HookledgerError,
    StorageUnavailable,
)
from receiver.core.signature import parse_secrets
from receiver.storage.account_table import StoredAccounts
from receiver.store import Store
from reconcile.client.processor import ProcessorClient
from reconcile.core.errors import AdoptionInProgress, NotAdopted, ReconcileLocked
from reconcile.core.report import STATUS_INCOMPLETE, STATUS_UNRESOLVED, Report
from reconcile.storage.store import RECONCILE_MIGRATIONS

EXIT_OK, EXIT_UNRESOLVED, EXIT_USAGE, EXIT_LOCKED = 0, 1, 2, 3
EXIT_PROCESSOR, EXIT_DATABASE, EXIT_NOT_ADOPTED = 4, 5, 6

EXIT_HELP = (
    "Exit codes: 0 reconciled, 1 drift found, 2 usage or configuration error, 3 another run "
    "holds the lock, 4 the processor could not be read completely, 5 database unreachable, "
    "6 no adoption record (run `reconcile adopt`)."
)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    click.echo(f"reconcile: {message}", err=True)
    sys.exit(code)


class Context:
    """Lazily built from options and environment when a command runs, for one processor
    account: the default one reads today's variables (``HOOKLEDGER_API_KEY``,
    ``HOOKLEDGER_MERCHANT_ID`` ...), another one its entry of ``HOOKLEDGER_ACCOUNTS``."""

    def __init__(
        self,
        database_url: str | None,
        processor_url: str | None,
        environment: str | None,
        account: str = DEFAULT_ACCOUNT,
    ) -> None:
        self.database_url = database_url
        self.processor_url = processor_url
        self.environment = environment
        self.account = account
        self._inbox: Store | None = None
        self._stored: Account | None = None

    def for_account(self, account: str) -> Context:
        """The same context for another account (sharing the inbox and its engine)."""
        other = Context(self.database_url, self.processor_url, self.environment, account)
        other._inbox = self._inbox
        return other

    def configured(self) -> Account | None:
        """The account's entry of ``HOOKLEDGER_ACCOUNTS``, else its row of hookledger's
        account table (``hookledger accounts add``; ``None`` for the default account
        configured by today's variables); an unknown or inactive account is one line and
        exit 2."""
        try:
            accounts = parse_accounts(os.environ.get("HOOKLEDGER_ACCOUNTS"))
        except ConfigurationError as exc:
            fail(exc.message)
        for account in accounts:
            if account.id == self.account:
                return account
        if self.account == DEFAULT_ACCOUNT:
            return None
        if self._stored is None:
            self._stored = self._stored_account(self.account)
        if self._stored is None:
            fail(
                f"unknown account {self.account!r}: it is neither in HOOKLEDGER_ACCOUNTS nor "
                "stored (hookledger accounts list)"
            )
        if not self._stored.active:
            fail(f"account {self.account!r} is inactive (hookledger accounts activate)")
        return self._stored

    def is_known(self) -> bool:
        """Whether the account is the default one, an entry of ``HOOKLEDGER_ACCOUNTS`` or a
        row of hookledger's account table, active or not (its past runs stay readable)."""
        if self.account == DEFAULT_ACCOUNT:
            return True
        try:
            accounts = parse_accounts(os.environ.get("HOOKLEDGER_ACCOUNTS"))
        except ConfigurationError as exc:
            fail(exc.message)
        if any(account.id == self.account for account in accounts):
            return True
        if self._stored is None:
            self._stored = self._stored_account(self.account)
        return self._stored is not None

    def _stored_account(self, account_id: str) -> Account | None:
        """An account of hookledger's own table (its secrets and keys opened with
        HOOKLEDGER_DATA_KEYS); a database or key failure is one line and its exit code."""
        if not self.database_url:
            return None
        try:
            return self.inbox().accounts.get(account_id)
        except StorageUnavailable:
            fail(
                f"cannot read stored account {account_id!r}: the database is unreachable or "
                "behind (reconcile db upgrade), or its data key is not in HOOKLEDGER_DATA_KEYS",
                EXIT_DATABASE,
            )

    def account_ids(self) -> list[str]:
        """Every account this installation reconciles: the default one when
        ``HOOKLEDGER_API_KEY`` is set, then each active one of ``HOOKLEDGER_ACCOUNTS`` that
        has an API key, then each active stored one (``hookledger accounts``) that has one."""
        try:
            accounts = parse_accounts(os.environ.get("HOOKLEDGER_ACCOUNTS"))
        except ConfigurationError as exc:
            fail(exc.message)
        ids = [DEFAULT_ACCOUNT] if os.environ.get("HOOKLEDGER_API_KEY") else []
        ids += [a.id for a in accounts if a.active and a.api_key and a.id not in ids]
        configured = {DEFAULT_ACCOUNT, *(a.id for a in accounts)}
        if self.database_url:
            try:
                rows = self.inbox().accounts.rows()
            except StorageUnavailable:
                fail(
                    "cannot read hookledger's account table: the database is unreachable or "
                    "behind (reconcile db upgrade)",
                    EXIT_DATABASE,
                )
            except DataUnavailable as exc:
                fail(f"a stored account cannot be opened: {exc.message}")
            ids += [
                r.account.id
                for r in rows
                if r.account.active and r.account.api_key and r.account.id not in configured
            ]
        return ids

    def accounts(self) -> AccountSource:
        """The installation's accounts, as the receive path routes deliveries by them:
        those of ``HOOKLEDGER_ACCOUNTS`` (and the default account of today's variables,
        when ``HOOKLEDGER_API_KEY``, ``HOOKLEDGER_MERCHANT_ID`` or ``HOOKLEDGER_SECRETS`` is
        set), then those stored in hookledger's table. They tell which of the objects an
        account's key reads are that account's (:mod:`reconcile.core.ownership`)."""
        env = os.environ
        try:
            configured = list(parse_accounts(env.get("HOOKLEDGER_ACCOUNTS")))
        except ConfigurationError as exc:
            fail(exc.message)
        named = any(env.get(f"HOOKLEDGER_{n}") for n in ("API_KEY", "MERCHANT_ID", "SECRETS"))
        if named and not any(a.id == DEFAULT_ACCOUNT for a in configured):
            merchant_id = env.get("HOOKLEDGER_MERCHANT_ID") or None
            configured.insert(0, Account(id=DEFAULT_ACCOUNT, merchant_id=merchant_id))
        source: AccountSource = StaticAccounts(configured)
        if self.database_url:
            source = ChainedAccounts(source, StoredAccounts(self.inbox().accounts))
        return source

    def _setting(self, name: str, field: str) -> str | None:
        """``HOOKLEDGER_<name>`` for the default account, else the account's ``field``."""
        account = self.configured()
        if account is None:
            return os.environ.get(f"HOOKLEDGER_{name}") or None
        value = getattr(account, field)
        return str(value) if value else None

    def inbox(self) -> Store:
        """The store, on an engine whose every wait for PostgreSQL is bounded
        (``HOOKLEDGER_STATEMENT_TIMEOUT``... see :func:`reconciler_bounds`)."""
        if self._inbox is None:
            if not self.database_url:
                fail("set HOOKLEDGER_DATABASE_URL (or --database-url)")
            try:
                data = from_environment()  # HOOKLEDGER_DATA_KEYS: what it stores is sealed too
                self._inbox = Store(
                    db.make_engine(self.database_url, bounds=reconciler_bounds()),
                    keyring=data.keyring,
                    rejections=data.rejections,
                    order_fields=data.order_fields,
                )
            except ConfigurationError as exc:
                fail(exc.message)
        return self._inbox

    def _processor_url(self) -> str | None:
        account = self.configured()
        return (account.base_url if account is not None else None) or self.processor_url

    def _environment(self) -> str | None:
        account = self.configured()
        return (account.environment if account is not None else None) or self.environment

    def client(self) -> ProcessorClient:
        key = self._setting("API_KEY", "api_key")
        url = self._processor_url()
        if not url:
            fail("set HOOKLEDGER_PROCESSOR_URL (or --processor-url)")
        if not key:
            if self.account == DEFAULT_ACCOUNT:
                fail("set HOOKLEDGER_API_KEY (the processor's secret API key)")
            fail(f"account {self.account!r} has no api_key")
        try:
            return ProcessorClient(
                url,
                key,
                environment=cast(Literal["sandbox", "production"] | None, self._environment()),
            )
        except (ConfigurationError, ValueError) as exc:
            fail(exc.message if isinstance(exc, HookledgerError) else str(exc))

    def events_path(self) -> Any:
        """The events-API path, when an admin key is configured (else ``None``)."""
        admin_key = self._setting("ADMIN_API_KEY", "admin_key")
        if not admin_key:
            return None
        from reconcile.client.events_api import EventsClient
        from reconcile.recovery.undelivered import UndeliveredEvents

        merchant_id = self._setting("MERCHANT_ID", "merchant_id")
        if not merchant_id:
            fail("the events-API path (HOOKLEDGER_ADMIN_API_KEY) needs HOOKLEDGER_MERCHANT_ID")
        account = self.configured()
        if account is not None:
            secrets = account.secrets
        else:
            try:
                secrets = parse_secrets(os.environ.get("HOOKLEDGER_SECRETS"))
            except ConfigurationError as exc:
                fail(exc.message)
        if not secrets:
            fail(
                "the events-API path verifies what it recovers: set HOOKLEDGER_SECRETS "
                "(the webhook signing secrets)"
            )
        environment = self._environment() or self.client().environment
        try:
            api = EventsClient(
                str(self._processor_url()),
                admin_key,
                environment=cast(Literal["sandbox", "production"], environment),
            )
        except (ConfigurationError, ValueError) as exc:
            fail(exc.message if isinstance(exc, HookledgerError) else str(exc))
        resend = os.environ.get("HOOKLEDGER_EVENTS_RESEND", "").lower() in ("1", "true", "yes")
        return UndeliveredEvents(
            api,
            self.inbox(),
            secrets,
            merchant_id,
            resend=resend,
            account=self.account,
            accounts=self.accounts(),
        )

    def migration_engine(self) -> Any:
        """An engine for ``reconcile db upgrade``: no statement timeout (a migration may
        run long)."""
        if not self.database_url:
            fail("set HOOKLEDGER_DATABASE_URL (or --database-url)")
        try:
            return db.make_engine(self.database_url)
        except ConfigurationError as exc:
            fail(exc.message)

    def check_schema(self) -> None:
        engine = self.inbox().engine
        try:
            db.check_schema(engine)
            db.check_schema(engine, RECONCILE_MIGRATIONS)
        except ConfigurationError as exc:
            fail(exc.message.replace("hookledger db upgrade", "reconcile db upgrade"))
        except OperationalError:
            fail("the database is unreachable", EXIT_DATABASE)


def exit_code(report: Report) -> int:
    """The documented exit code of a finished run's report; a dry run's is the one a real
    run reading the same would exit with (its outcome: exit 4 when the processor could not
    be read, never 0)."""
    if report.outcome == STATUS_INCOMPLETE:
        return EXIT_PROCESSOR
    if report.outcome == STATUS_UNRESOLVED:
        return EXIT_UNRESOLVED
    return EXIT_OK


@contextmanager
def exit_on_error() -> Iterator[None]:
    """Turn the run's errors into one line on stderr and a documented exit code."""
    try:
        yield
    except ReconcileLocked as exc:
        fail(exc.message, EXIT_LOCKED)
    except (NotAdopted, AdoptionInProgress) as exc:
        fail(exc.message, EXIT_NOT_ADOPTED)
    except (StorageUnavailable, OperationalError):
        fail("the database is unreachable", EXIT_DATABASE)
    except ConfigurationError as exc:
        fail(exc.message)
    except ValueError as exc:
        fail(str(exc))


def emit(data: Mapping[str, Any], as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else text)


def utc_option(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None else None
