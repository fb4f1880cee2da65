"""Configuration: read when ``init_app`` runs (or a command starts), never at import time.

Every key can be set in ``app.config`` with the ``HOOKLEDGER_`` prefix or in the environment
under the same name; ``app.config`` wins, explicit keyword arguments win over both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from receiver.config.data_at_rest import DOCUMENTED as DATA_AT_REST_DOCUMENTED
from receiver.config.data_at_rest import DataAtRest
from receiver.core.accounts import DEFAULT_ACCOUNT, Account, parse_accounts
from receiver.core.bounds import Bounds
from receiver.core.errors import ConfigurationError
from receiver.core.headers import DEFAULT_STORED_HEADERS, parse_header_names
from receiver.core.signature import Secret, parse_secrets

PREFIX = "HOOKLEDGER_"

#: Set by the read-only commands (``hookledger events``, ``show``, ``status``...), which never
#: verify a signature: there a missing HOOKLEDGER_SECRETS is no error.
SECRETS_OPTIONAL: ContextVar[bool] = ContextVar("hookledger_secrets_optional", default=False)

#: Setting name -> (environment variable, help) for ``--help`` texts and the README.
DOCUMENTED: Mapping[str, str] = {
    "DATABASE_URL": "SQLAlchemy URL (default: SQLite hookledger.sqlite3 in the instance folder)",
    "SECRETS": "webhook signing secrets of the default account, 'id:secret,id2:secret2' "
    "(required unless ACCOUNTS configures every account)",
    "MERCHANT_ID": "the default account's processor merchant id (optional for receiving: "
    "with several accounts, a delivery to the shared URL naming it is the default account's)",
    "ACCOUNTS": 'further processor accounts, a JSON object {"<account>": {"merchant_id": '
    '..., "profile_ids": [...], "secrets": "id:secret,...", "api_key": ...}} '
    "(see the README, 'Several accounts')",
    "ACCOUNTS_IN_TABLE": "1/true: the accounts may all be in hookledger's own table "
    "('hookledger accounts'), so the web and worker processes start with no account "
    "configured (default: a configured account with secrets is required)",
    "MAX_BODY_BYTES": "largest accepted webhook body in bytes (default 1048576)",
    "URL_PREFIX": "where the blueprint is mounted (default /webhooks)",
    "LEASE_SECONDS": "worker lease on an event, renewed while handlers run (default 60)",
    "POLL_INTERVAL": "worker sleep when idle, seconds (default 0.5)",
    "BATCH_SIZE": "events a worker claims and commits together (default 64)",
    "MAX_ATTEMPTS": "attempts before an event is dead-lettered (default 8)",
    "BACKOFF_BASE": "first retry delay in seconds, doubled each attempt (default 2)",
    "BACKOFF_MAX": "largest retry delay in seconds (default 3600)",
    "SQLITE_BUSY_TIMEOUT": "seconds a SQLite writer waits for the lock before a 503 (default 5)",
    "STATEMENT_TIMEOUT": "PostgreSQL, worker and reconciler: seconds a statement may run "
    "(default: a sixth of the lease, at least 5; 10 for the default lease); no answer at "
    "all for half as long again (at least 2 s more) cuts the connection; 0: off",
    "LOCK_TIMEOUT": "PostgreSQL, worker and reconciler: seconds a statement may wait for a "
    "lock (default: half the statement timeout); 0: off",
    "IDLE_IN_TRANSACTION_TIMEOUT": "PostgreSQL, worker and reconciler: seconds a transaction "
    "may sit idle, as while a handler runs without the session (default: ten leases, at "
    "least 60); a handler that takes longer fails; 0: off",
    "SQLITE_INTAKE_PATH": "SQLite: the file where webhooks are stored while the database's "
    "write lock is held for long, by a handler say (default: the database's path + '-intake'; "
    "'off': they wait for the lock)",
    "DEFER_LIMIT": "seconds after receipt an event may still be deferred by a handler "
    "(default 86400), then it is dead-lettered",
    "AUTO_MIGRATE": "apply hookledger's migrations in init_app (default off; for development)",
    "METRICS_ACCOUNT_LABEL": "add an 'account' label to the receive and dispatch metrics "
    "(default off: names and labels as with one account)",
    "METRICS_ACCOUNT_LABEL_MAX": "accounts that get their own 'account' label value, at most "
    "(default 100; any further one is 'other')",
    "STORED_HEADERS": "request headers stored with each webhook besides "
    + ", ".join(sorted(DEFAULT_STORED_HEADERS))
    + " (comma-separated names; all others are dropped before storage)",
    **DATA_AT_REST_DOCUMENTED,
}


#: The reconciler's default statement timeout (seconds): it holds no lease, and a run reads
#: whole windows of history, so longer than the worker's.
RECONCILER_STATEMENT_TIMEOUT = 60.0


def reconciler_bounds(environ: Mapping[str, str] | None = None) -> Bounds:
    """The reconciler's bounds on its waits for PostgreSQL: ``HOOKLEDGER_STATEMENT_TIMEOUT``,
    ``_LOCK_TIMEOUT`` and ``_IDLE_IN_TRANSACTION_TIMEOUT`` when set, else a statement
    timeout of 60 s and the worker's defaults for the rest (for the default lease)."""
    env = os.environ if environ is None else environ
    try:
        statement = _seconds(env.get(PREFIX + "STATEMENT_TIMEOUT"))
        return Bounds.for_lease(
            float(env.get(PREFIX + "LEASE_SECONDS") or 60.0),
            statement_timeout=RECONCILER_STATEMENT_TIMEOUT if statement is None else statement,
            lock_timeout=_seconds(env.get(PREFIX + "LOCK_TIMEOUT")),
            idle_in_transaction_timeout=_seconds(env.get(PREFIX + "IDLE_IN_TRANSACTION_TIMEOUT")),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"invalid hookledger setting: {exc}") from exc


def _seconds(value: Any) -> float | None:
    """A number of seconds, or ``None`` when unset (empty)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return float(value)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    database_url: str
    #: The default account's secrets (``SECRETS``); empty when only ``ACCOUNTS`` are set.
    secrets: tuple[Secret, ...] = field(repr=False)
    #: Every account from configuration: the default one (``SECRETS``, ``MERCHANT_ID``) when
    #: it has secrets, then those of ``ACCOUNTS`` (see :mod:`receiver.core.accounts`).
    accounts: tuple[Account, ...] = ()
    max_body_bytes: int = 1_048_576
    url_prefix: str = "/webhooks"
    lease_seconds: float = 60.0
    poll_interval: float = 0.5
    batch_size: int = 64
    max_attempts: int = 8
    backoff_base: float = 2.0
    backoff_max: float = 3600.0
    sqlite_busy_timeout: float = 5.0
    #: PostgreSQL, the worker's and the reconciler's statements (seconds; ``None``: from
    #: the lease, see :meth:`bounds`).
    statement_timeout: float | None = None
    lock_timeout: float | None = None
    idle_in_transaction_timeout: float | None = None
    #: SQLite: where webhooks wait while the database's lock is held for long
    #: (:mod:`receiver.storage.intake`): ``""`` beside the database, ``"off"`` nowhere.
    sqlite_intake_path: str = ""
    defer_limit: float = 86_400.0
    auto_migrate: bool = False
    #: Header names (lower case) stored besides
    #: :data:`receiver.core.headers.DEFAULT_STORED_HEADERS`.
    stored_headers: tuple[str, ...] = ()
    #: An ``account`` label on the receive and dispatch metrics (:mod:`receiver.web.metrics`),
    #: for at most ``metrics_account_label_max`` accounts (any further one is ``other``).
    metrics_account_label: bool = False
    metrics_account_label_max: int = 100
    #: Data keys, retention, the rejected-deliveries log, the maximum event age.
    data: DataAtRest = field(default_factory=DataAtRest)

    @classmethod
    def resolve(
        cls,
        config: Mapping[str, Any],
        overrides: Mapping[str, Any],
        *,
        default_database_url: str,
        environ: Mapping[str, str] | None = None,
        external_accounts: bool = False,
    ) -> Settings:
        """Merge ``overrides`` > ``config`` (``HOOKLEDGER_*`` keys) > environment > defaults.

        ``external_accounts``: the merchant supplies an account source of its own, so
        configuration may name no secret at all."""
        env = os.environ if environ is None else environ

        def get(key: str, default: Any = None) -> Any:
            lower = key.lower()
            if overrides.get(lower) is not None:
                return overrides[lower]
            if config.get(PREFIX + key) is not None:
                return config[PREFIX + key]
            return env.get(PREFIX + key, default)

        secrets = parse_secrets(get("SECRETS"))
        accounts = list(parse_accounts(get("ACCOUNTS")))
        # Every account may be in hookledger's own table (``hookledger accounts``): then the
        # configuration need not name one, as with a source of the merchant's own.
        external_accounts = external_accounts or _bool(get("ACCOUNTS_IN_TABLE", ""))
        merchant_id = get("MERCHANT_ID") or None
        if any(a.id == DEFAULT_ACCOUNT for a in accounts):
            if secrets or merchant_id:
                raise ConfigurationError(
                    "the default account is configured twice: in HOOKLEDGER_ACCOUNTS and by "
                    "HOOKLEDGER_SECRETS / HOOKLEDGER_MERCHANT_ID; keep one"
                )
        elif (
            secrets
            or (merchant_id and SECRETS_OPTIONAL.get())
            or not (accounts or external_accounts)
        ):
            accounts.insert(
                0, Account(id=DEFAULT_ACCOUNT, merchant_id=merchant_id, secrets=secrets)
            )
        if not SECRETS_OPTIONAL.get():
            if not any(a.secrets for a in accounts) and not external_accounts:
                raise ConfigurationError(
                    "no webhook secret configured: set HOOKLEDGER_SECRETS (for example "
                    "'primary:<payment_response_hash_key>'); verification cannot be turned off"
                )
            for account in accounts:
                if not account.secrets:
                    raise ConfigurationError(
                        f"account {account.id!r} has no webhook secret; verification cannot "
                        "be turned off"
                    )
        try:
            settings = cls(
                database_url=str(get("DATABASE_URL", default_database_url)),
                secrets=secrets,
                accounts=tuple(accounts),
                max_body_bytes=int(get("MAX_BODY_BYTES", 1_048_576)),
                url_prefix=str(get("URL_PREFIX", "/webhooks")),
                lease_seconds=float(get("LEASE_SECONDS", 60.0)),
                poll_interval=float(get("POLL_INTERVAL", 0.5)),
                batch_size=int(get("BATCH_SIZE", 64)),
                max_attempts=int(get("MAX_ATTEMPTS", 8)),
                backoff_base=float(get("BACKOFF_BASE", 2.0)),
                backoff_max=float(get("BACKOFF_MAX", 3600.0)),
                sqlite_busy_timeout=float(get("SQLITE_BUSY_TIMEOUT", 5.0)),
                statement_timeout=_seconds(get("STATEMENT_TIMEOUT")),
                lock_timeout=_seconds(get("LOCK_TIMEOUT")),
                idle_in_transaction_timeout=_seconds(get("IDLE_IN_TRANSACTION_TIMEOUT")),
                sqlite_intake_path=str(get("SQLITE_INTAKE_PATH", "") or ""),
                defer_limit=float(get("DEFER_LIMIT", 86_400.0)),
                auto_migrate=_bool(get("AUTO_MIGRATE", False)),
                stored_headers=parse_header_names(get("STORED_HEADERS")),
                metrics_account_label=_bool(get("METRICS_ACCOUNT_LABEL", False)),
                metrics_account_label_max=int(get("METRICS_ACCOUNT_LABEL_MAX", 100)),
                data=DataAtRest.resolve(get),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"invalid hookledger setting: {exc}") from exc
        if settings.max_body_bytes <= 0 or settings.lease_seconds <= 0:
            raise ConfigurationError("MAX_BODY_BYTES and LEASE_SECONDS must be positive")
        if not 1 <= settings.batch_size <= 1000:
            raise ConfigurationError("BATCH_SIZE must be between 1 and 1000")
        if settings.defer_limit < 0:
            raise ConfigurationError("DEFER_LIMIT must not be negative")
        if settings.metrics_account_label_max < 0:
            raise ConfigurationError("METRICS_ACCOUNT_LABEL_MAX must not be negative")
        if settings.max_attempts < 1:
            raise ConfigurationError("MAX_ATTEMPTS must be at least 1")
        settings.bounds()  # a negative timeout is a configuration error
        return settings

    def bounds(self, lease_seconds: float | None = None) -> Bounds:
        """The worker's bounds on its waits for PostgreSQL, for its lease (see
        :meth:`receiver.storage.bounds.Bounds.for_lease`)."""
        return Bounds.for_lease(
            self.lease_seconds if lease_seconds is None else lease_seconds,
            statement_timeout=self.statement_timeout,
            lock_timeout=self.lock_timeout,
            idle_in_transaction_timeout=self.idle_in_transaction_timeout,
        )
