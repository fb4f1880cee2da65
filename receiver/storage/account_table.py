"""Accounts kept in hookledger's own table (``hookledger_account``), sealed.

:class:`AccountTable` writes and reads the rows (``hookledger accounts add``, ``list``,
``deactivate``, ``remove``, ``set-secret``); :class:`StoredAccounts` is the
:class:`receiver.core.accounts.AccountSource` over it, read on every call, so an account
added, deactivated or removed by a command is seen by the running web processes and the
reconciler without a restart.

The webhook secrets and the API keys are sealed with the primary data key (text tokens,
purposes below, bound to the account id: a sealed secret copied to another account's row
does not open). Without a data key, storing them is refused (:func:`require_data_key`):
they are never written in the clear. The other columns stay readable: what routes a
delivery (merchant id, profile ids, active), the processor URL and environment.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, delete, func, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from receiver.core.accounts import Account, check_account_id, only_owner
from receiver.core.errors import ConfigurationError, DataUnavailable
from receiver.core.keyring import Keyring
from receiver.core.signature import Secret
from receiver.storage.context import Storage, unavailable
from receiver.storage.tables import StoredAccount

ACCOUNT: Table = StoredAccount.__table__  # type: ignore[attr-defined]

#: Purposes of the sealed columns (part of each seal's associated data).
ACCOUNT_SECRETS = "account-secrets"
ACCOUNT_API_KEY = "account-api-key"
ACCOUNT_ADMIN_KEY = "account-admin-key"
#: Sealed column -> its purpose.
SEALED_COLUMNS = {
    "secrets": ACCOUNT_SECRETS,
    "api_key": ACCOUNT_API_KEY,
    "admin_key": ACCOUNT_ADMIN_KEY,
}

NO_DATA_KEY = (
    "no data key is configured: account secrets and API keys are stored sealed, never in "
    "the clear; create one with `hookledger keys new` and set HOOKLEDGER_DATA_KEYS"
)

log = logging.getLogger("receiver.accounts")


def require_data_key(keyring: Keyring) -> None:
    """:class:`ConfigurationError` (one line, how to create a key) without a data key."""
    if not keyring.enabled:
        raise ConfigurationError(NO_DATA_KEY)


class AccountExists(ConfigurationError):
    """An account with that id is stored already."""


def secrets_text(secrets: tuple[Secret, ...]) -> str:
    """Secrets as stored before sealing: JSON ``[[id, base64 value], ...]``."""
    return json.dumps([[s.id, base64.b64encode(s.value).decode("ascii")] for s in secrets])


def secrets_of(text: str) -> tuple[Secret, ...]:
    """The secrets of :func:`secrets_text`."""
    return tuple(Secret(str(i), base64.b64decode(v)) for i, v in json.loads(text))


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredRow:
    """A stored account with when it was written (what ``accounts list`` shows)."""

    account: Account
    created_at: Any
    updated_at: Any
    key_id: str

    def describe(self) -> dict[str, Any]:
        """What may be shown: never a secret or key, only their ids or whether they are set."""
        a = self.account
        return {
            "id": a.id,
            "merchant_id": a.merchant_id,
            "profile_ids": list(a.profile_ids),
            "active": a.active,
            "secret_ids": [s.id for s in a.secrets],
            "api_key": "set" if a.api_key else None,
            "admin_key": "set" if a.admin_key else None,
            "base_url": a.base_url,
            "environment": a.environment,
            "data_key": self.key_id,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
        }


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


class AccountTable:
    """Writes and reads ``hookledger_account`` on one :class:`Storage`."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def __repr__(self) -> str:
        return f"AccountTable(dialect={self.storage.sql.name!r})"

    # -- sealing --------------------------------------------------------------------------

    def _seal(self, column: str, account_id: str, text: str | None) -> str | None:
        if text is None:
            return None
        return self.storage.keyring.seal_text(
            text, purpose=SEALED_COLUMNS[column], context=account_id
        )

    def _open(self, column: str, account_id: str, text: str | None) -> str | None:
        if text is None:
            return None
        return self.storage.keyring.open_text_strict(
            text, purpose=SEALED_COLUMNS[column], context=account_id
        )

    def account_of(self, row: Any) -> Account:
        """The :class:`Account` of a row, its sealed columns opened (raises
        :class:`DataUnavailable` when its data key is not configured)."""
        secrets = self._open("secrets", row.id, row.secrets)
        return Account(
            id=row.id,
            merchant_id=row.merchant_id,
            profile_ids=tuple(json.loads(row.profile_ids or "[]")),
            secrets=secrets_of(secrets) if secrets else (),
            api_key=self._open("api_key", row.id, row.api_key),
            admin_key=self._open("admin_key", row.id, row.admin_key),
            base_url=row.base_url,
            environment=row.environment,
            active=bool(row.active),
        )

    # -- writes ---------------------------------------------------------------------------

    def add(self, account: Account) -> None:
        """Store a new account (sealed). Raises :class:`AccountExists` for a stored id and
        :class:`ConfigurationError` without a data key, a merchant id or a secret."""
        require_data_key(self.storage.keyring)
        check_account_id(account.id)
        if not account.merchant_id:
            raise ConfigurationError(
                f"account {account.id!r}: a stored account needs a merchant id"
            )
        if not account.secrets:
            raise ConfigurationError(
                f"account {account.id!r} has no webhook secret; verification cannot be turned off"
            )
        now = self.storage.now()
        values = {
            "id": account.id,
            "merchant_id": account.merchant_id,
            "profile_ids": json.dumps(list(account.profile_ids)),
            "secrets": self._seal("secrets", account.id, secrets_text(account.secrets)),
            "api_key": self._seal("api_key", account.id, account.api_key),
            "admin_key": self._seal("admin_key", account.id, account.admin_key),
            "base_url": account.base_url,
            "environment": account.environment,
            "active": account.active,
            "key_id": self.storage.keyring.primary,
            "created_at": now,
            "updated_at": now,
        }
        try:
            with self._database(), self.storage.engine.begin() as conn:
                conn.execute(insert(ACCOUNT).values(**values))
        except IntegrityError:
            raise AccountExists(f"account {account.id!r} is stored already") from None
        finally:
            _written()

    def set_active(self, account_id: str, active: bool) -> bool:
        """Activate or deactivate; ``False`` when no such account is stored."""
        return self._update(account_id, active=active)

    def set_secrets(self, account_id: str, secrets: tuple[Secret, ...]) -> bool:
        """Replace the webhook secrets (sealed with the primary key); ``False`` when no such
        account is stored."""
        require_data_key(self.storage.keyring)
        if not secrets:
            raise ConfigurationError("an account keeps at least one webhook secret")
        return self._update(
            account_id,
            reseal=True,
            secrets=self._seal("secrets", account_id, secrets_text(secrets)),
        )

    def set_keys(self, account_id: str, keys: dict[str, str | None]) -> bool:
        """Replace the API key and/or the admin key (``None``: no admin key), sealed with the
        primary key; ``False`` when no such account is stored."""
        require_data_key(self.storage.keyring)
        unknown = set(keys) - {"api_key", "admin_key"}
        if unknown or not keys:
            raise ConfigurationError("set_keys takes api_key and/or admin_key")
        if "api_key" in keys and not keys["api_key"]:
            raise ConfigurationError("an account's API key cannot be removed, only replaced")
        sealed = {column: self._seal(column, account_id, text) for column, text in keys.items()}
        return self._update(account_id, reseal=True, **sealed)

    def _update(self, account_id: str, *, reseal: bool = False, **values: Any) -> bool:
        with self._database(), self.storage.engine.begin() as conn:
            if reseal:
                # The other sealed columns move to the primary key with the new values:
                # key_id names one key.
                others = [c for c in ("secrets", "api_key", "admin_key") if c not in values]
                row = conn.execute(
                    select(*(ACCOUNT.c[c] for c in others)).where(ACCOUNT.c.id == account_id)
                ).first()
                if row is None:
                    return False
                for column in others:
                    plain = self._open(column, account_id, getattr(row, column))
                    values[column] = self._seal(column, account_id, plain)
                values["key_id"] = self.storage.keyring.primary
            done = conn.execute(
                update(ACCOUNT)
                .where(ACCOUNT.c.id == account_id)
                .values(updated_at=self.storage.now(), **values)
            )
        _written()
        return bool(done.rowcount)

    def remove(self, account_id: str) -> bool:
        """Delete the account's row (only: its events, transitions and projections stay until
        pruned); ``False`` when no such account is stored."""
        with self._database(), self.storage.engine.begin() as conn:
            done = conn.execute(delete(ACCOUNT).where(ACCOUNT.c.id == account_id))
        _written()
        return bool(done.rowcount)

    # -- reads ----------------------------------------------------------------------------

    def row(self, account_id: str) -> StoredRow | None:
        with self._database(), self.storage.deferred.connect() as conn:
            row = conn.execute(select(ACCOUNT).where(ACCOUNT.c.id == account_id)).first()
        return self._stored(row) if row is not None else None

    def rows(self) -> list[StoredRow]:
        with self._database(), self.storage.deferred.connect() as conn:
            rows = conn.execute(select(ACCOUNT).order_by(ACCOUNT.c.id)).all()
        return [self._stored(r) for r in rows]

    def _stored(self, row: Any) -> StoredRow:
        return StoredRow(
            account=self.account_of(row),
            created_at=row.created_at,
            updated_at=row.updated_at,
            key_id=row.key_id,
        )

    def get(self, account_id: str) -> Account | None:
        with self._database(), self.storage.deferred.connect() as conn:
            row = conn.execute(select(ACCOUNT).where(ACCOUNT.c.id == account_id)).first()
        return self._usable(row)

    def of_merchant(self, merchant_id: str) -> list[Account]:
        """The accounts of ``merchant_id`` (through its index), deactivated ones too: they
        still own their merchant's and profiles' bodies (:func:`only_owner`)."""
        with self._database(), self.storage.deferred.connect() as conn:
            rows = conn.execute(select(ACCOUNT).where(ACCOUNT.c.merchant_id == merchant_id)).all()
        return [a for a in (self._usable(r) for r in rows) if a is not None]

    def version(self) -> tuple[int, Any]:
        """What changes whenever a row is added, changed or removed: the rows' count and
        their latest ``updated_at`` (one small read)."""
        with self._database(), self.storage.deferred.connect() as conn:
            row = conn.execute(select(func.count(), func.max(ACCOUNT.c.updated_at))).one()
        return int(row[0]), row[1]

    def ids(self, *, active_only: bool = True) -> list[str]:
        query = select(ACCOUNT.c.id).order_by(ACCOUNT.c.id)
        if active_only:
            query = query.where(ACCOUNT.c.active)
        with self._database(), self.storage.deferred.connect() as conn:
            return [str(i) for i in conn.execute(query).scalars()]

    def _usable(self, row: Any) -> Account | None:
        if row is None:
            return None
        try:
            return self.account_of(row)
        except DataUnavailable as exc:
            # Said without the row: the message names the key, never a value.
            log.error(
                "stored account %r cannot be opened: %s",
                row.id,
                exc.message,
                extra={"action": "account_unreadable", "account": row.id},
            )
            raise unavailable(exc) from None

    @contextmanager
    def _database(self) -> Iterator[None]:
        """A database failure is :class:`StorageUnavailable` (a delivery's 503, retried)."""
        try:
            yield
        except IntegrityError:
            raise
        except DBAPIError as exc:
            raise unavailable(exc) from None


#: How often a process asks whether ``hookledger_account`` changed (what it read of it is
#: kept until it does): a change made by another process (``hookledger accounts ...``)
#: counts within this many seconds; one made in this process, at once.
CACHE_SECONDS = 1.0

#: Bumped by every write through an :class:`AccountTable` of this process: what a
#: :class:`StoredAccounts` read before it is read again.
_writes = itertools.count(1)
_generation = [0]


def _written() -> None:
    _generation[0] = next(_writes)


class StoredAccounts:
    """The :class:`receiver.core.accounts.AccountSource` of ``hookledger_account``, read per
    delivery through a cache: what a process read of the table (an account, or that there is
    none) is kept while the table is unchanged, and whether it changed is asked at most
    every :data:`CACHE_SECONDS` (one small query: the rows' count and latest change). A
    receive path that read the table, and opened the sealed secrets, for every delivery spent
    a fifth of its time there with 1,000 accounts. An account added, changed or deactivated
    by a command counts within that second in every process, at once in the process that
    made the change. An inactive account is never returned, so deliveries to it are refused
    (404 ``HL_07``) and the reconciler leaves it alone."""

    def __init__(
        self,
        table: AccountTable,
        *,
        cache_seconds: float = CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table
        self.cache_seconds = cache_seconds
        self._clock = clock
        #: The table's state the entries were read in: (its version, this process's writes).
        self._state: tuple[Any, int] | None = None
        self._checked = float("-inf")
        self._read: dict[tuple[str, str, str | None], tuple[tuple[Any, int], Account | None]] = {}

    def __repr__(self) -> str:
        return "StoredAccounts(hookledger_account)"

    def _current(self) -> tuple[Any, int]:
        """The table's state, asked again when the last answer is older than the cache's
        time or this process wrote to the table since."""
        now = self._clock()
        known = self._state
        if (
            known is not None
            and known[1] == _generation[0]
            and now - self._checked < self.cache_seconds
        ):
            return known
        generation = _generation[0]
        state: tuple[Any, int] = (self.table.version(), generation)
        if state != known:
            self._read = {}
        self._state, self._checked = state, now
        return state

    def _cached(
        self, key: tuple[str, str, str | None], read: Callable[[], Account | None]
    ) -> Account | None:
        state = self._current()
        hit = self._read.get(key)
        if hit is not None and hit[0] == state:
            return hit[1]
        found = read()
        if len(self._read) >= 100_000:  # bounded: a flood of unknown merchants
            self._read = {}
        self._read[key] = (state, found)
        return found

    def get(self, account_id: str) -> Account | None:
        def read() -> Account | None:
            found = self.table.get(account_id)
            return found if found is not None and found.active else None

        return self._cached(("id", account_id, None), read)

    def for_body(self, merchant_id: str | None, profile_id: str | None) -> Account | None:
        if not merchant_id:
            return None  # a stored account always names its merchant
        return self._cached(
            ("body", merchant_id, profile_id),
            lambda: only_owner(self.table.of_merchant(merchant_id), merchant_id, profile_id),
        )

    def ids(self) -> list[str]:
        return self.table.ids()


__all__ = [
    "ACCOUNT",
    "NO_DATA_KEY",
    "SEALED_COLUMNS",
    "AccountExists",
    "AccountTable",
    "StoredAccounts",
    "StoredRow",
    "require_data_key",
    "secrets_of",
    "secrets_text",
]
