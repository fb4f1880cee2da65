"""Processor accounts: who a delivery belongs to, and the secrets it is verified with (pure).

One hookledger installation may serve several processor accounts: a merchant's business
profiles, or a platform's sellers (one processor merchant account each). An :class:`Account`
is the merchant's own id for one of them (``id``, a slug that appears in URLs, rows and
metrics), its processor merchant id and profile ids, its webhook secrets (with rotation, as
:func:`receiver.core.signature.parse_secrets` reads them), its API keys and processor URL.
Keys and secrets never appear in a repr.

Every stored row belongs to one account, and an object is (account, kind, id): the same
``payment_id`` in two accounts lives two independent lives. The installation's single
account of earlier versions is :data:`DEFAULT_ACCOUNT`; its rows keep their object keys
(``kind:id``), other accounts' keys are ``<account>/kind:id`` (:func:`object_key`).

Where the accounts come from is an :class:`AccountSource`: :class:`StaticAccounts` for a few
from configuration, or any object with the same three methods (a merchant's own table, read
per request, so accounts come and go without a restart).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from receiver.core.errors import ConfigurationError, NotTheAccounts
from receiver.core.signature import Secret, parse_secrets

#: The account of an installation that configures none (today's settings), and of every
#: row written before accounts existed.
DEFAULT_ACCOUNT = "default"
#: Longest account id (stored in a 64-character column, shown in URLs).
MAX_ACCOUNT_ID_LENGTH = 64
_ACCOUNT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
#: Ids an account cannot take: they are paths of the blueprint.
RESERVED_ACCOUNT_IDS = frozenset({"health"})


def check_account_id(account_id: object) -> str:
    """``account_id`` if it is a valid account id (1-64 of ``a-z 0-9 _ -``, starting with a
    letter or digit, not a reserved path), else :class:`ConfigurationError`."""
    if not isinstance(account_id, str) or not _ACCOUNT_ID.match(account_id):
        raise ConfigurationError(
            f"invalid account id {str(account_id)[:80]!r}: 1 to {MAX_ACCOUNT_ID_LENGTH} "
            "characters of a-z, 0-9, '_' and '-', starting with a letter or a digit"
        )
    if account_id in RESERVED_ACCOUNT_IDS:
        raise ConfigurationError(f"account id {account_id!r} is reserved (a blueprint path)")
    return account_id


def is_account_id(value: object) -> bool:
    """Whether ``value`` is a valid account id (see :func:`check_account_id`)."""
    return (
        isinstance(value, str)
        and bool(_ACCOUNT_ID.match(value))
        and value not in RESERVED_ACCOUNT_IDS
    )


def object_key(account: str, kind: str, object_id: str) -> str:
    """The unit of ordering and leasing of one object: ``kind:id`` in the default account
    (as before accounts existed: an upgraded database keeps its keys), ``account/kind:id``
    in any other (an account id has no ``/``, a kind no ``/`` or ``:``)."""
    base = f"{kind}:{object_id}"
    return base if account == DEFAULT_ACCOUNT else f"{account}/{base}"


def event_key(account: str, event_id: str) -> str:
    """The ordering key of an event whose object is unknown (see :func:`object_key`)."""
    return object_key(account, "event", event_id)


@dataclass(frozen=True, kw_only=True, slots=True)
class Account:
    """One processor account, as the merchant configures it.

    ``merchant_id`` and ``profile_ids`` say which deliveries are this account's when they
    arrive at the shared URL (the body's ``merchant_id``, and the object's ``profile_id``
    when ``profile_ids`` is not empty); a delivery to the account's own URL whose body names
    another merchant is refused. ``secrets`` verify its deliveries (and only its).
    ``api_key``, ``admin_key``, ``base_url`` and ``environment`` are the reconciler's.
    """

    id: str
    merchant_id: str | None = None
    profile_ids: tuple[str, ...] = ()
    secrets: tuple[Secret, ...] = field(default=(), repr=False)
    api_key: str | None = field(default=None, repr=False)
    admin_key: str | None = field(default=None, repr=False)
    base_url: str | None = None
    environment: str | None = None
    #: ``False``: removed, keeps its history until pruned; refuses deliveries, not reconciled.
    active: bool = True

    def __post_init__(self) -> None:
        check_account_id(self.id)
        if self.merchant_id is not None and not (
            isinstance(self.merchant_id, str) and self.merchant_id.strip()
        ):
            raise ConfigurationError(f"account {self.id!r}: merchant_id must be a non-empty text")
        for profile in self.profile_ids:
            if not isinstance(profile, str) or not profile.strip():
                raise ConfigurationError(f"account {self.id!r}: a profile id is empty")

    def owns(self, merchant_id: str | None, profile_id: str | None) -> bool:
        """Whether a body naming ``merchant_id`` (and ``profile_id``) is this account's:
        the merchant id must match when the account has one; the profile id must be one of
        ``profile_ids`` when the account lists any and the body names one."""
        if self.merchant_id is not None and merchant_id != self.merchant_id:
            return False
        if self.profile_ids and profile_id is not None and profile_id not in self.profile_ids:
            return False
        return True

    @classmethod
    def from_mapping(cls, account_id: str, data: Mapping[str, Any]) -> Account:
        """An account from configuration (``merchant_id``, ``profile_ids``, ``secrets``,
        ``api_key``, ``admin_key``, ``base_url``, ``environment``, ``active``); unknown keys
        are refused (a misspelt ``secret`` must not leave an account without secrets)."""
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"account {account_id!r}: settings must be an object")
        unknown = sorted(set(data) - _ACCOUNT_KEYS)
        if unknown:
            raise ConfigurationError(
                f"account {account_id!r}: unknown setting(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(_ACCOUNT_KEYS))}"
            )
        profiles = data.get("profile_ids") or ()
        if isinstance(profiles, str):
            profiles = tuple(p.strip() for p in profiles.split(",") if p.strip())
        try:
            secrets = parse_secrets(data.get("secrets"))
        except ConfigurationError as exc:
            raise ConfigurationError(f"account {account_id!r}: {exc}") from None
        return cls(
            id=account_id,
            merchant_id=data.get("merchant_id"),
            profile_ids=tuple(profiles),
            secrets=secrets,
            api_key=data.get("api_key"),
            admin_key=data.get("admin_key"),
            base_url=data.get("base_url"),
            environment=data.get("environment"),
            active=bool(data.get("active", True)),
        )


_ACCOUNT_KEYS = frozenset(
    {
        "merchant_id",
        "profile_ids",
        "secrets",
        "api_key",
        "admin_key",
        "base_url",
        "environment",
        "active",
    }
)


@runtime_checkable
class AccountSource(Protocol):
    """Where accounts come from. hookledger asks per delivery, so a source backed by the
    merchant's own table sees accounts onboarded or removed without a restart."""

    def get(self, account_id: str) -> Account | None:
        """The account ``account_id``, or ``None`` if there is none."""

    def for_body(self, merchant_id: str | None, profile_id: str | None) -> Account | None:
        """The one account a delivery naming ``merchant_id`` (and ``profile_id``) belongs
        to, or ``None`` if none or more than one claim it. A deactivated account
        (``active=False``) may be answered: the body is still its, so hookledger refuses
        it rather than handing it to another account (:func:`only_owner`)."""

    def ids(self) -> Iterable[str]:
        """Every account's id (the reconciler's scheduler walks them)."""


class StaticAccounts:
    """A fixed set of accounts (from configuration), indexed by id and by merchant id: a
    delivery to the shared URL looks at the accounts of its merchant (and those that name
    none), not at every account."""

    def __init__(self, accounts: Iterable[Account]) -> None:
        self._by_id: dict[str, Account] = {}
        self._by_merchant: dict[str | None, list[Account]] = {}
        for account in accounts:
            if account.id in self._by_id:
                raise ConfigurationError(f"account {account.id!r} is configured twice")
            self._by_id[account.id] = account
            self._by_merchant.setdefault(account.merchant_id, []).append(account)

    def __repr__(self) -> str:
        return f"StaticAccounts({sorted(self._by_id)!r})"

    def __iter__(self) -> Iterator[Account]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, account_id: str) -> Account | None:
        return self._by_id.get(account_id)

    def for_body(self, merchant_id: str | None, profile_id: str | None) -> Account | None:
        # An account owns only its own merchant's bodies, or any merchant's if it names none.
        candidates = self._by_merchant.get(None, [])
        if merchant_id is not None:
            candidates = [*self._by_merchant.get(merchant_id, []), *candidates]
        return only_owner(candidates, merchant_id, profile_id)

    def ids(self) -> list[str]:
        return list(self._by_id)


class ChainedAccounts:
    """The accounts from configuration first, then the merchant's own source: an id
    configured in both is the configuration's; a body both claim goes to the more specific
    owner (:func:`only_owner`'s preference), and is nobody's when neither is."""

    def __init__(self, first: AccountSource, then: AccountSource) -> None:
        self.first = first
        self.then = then

    def __repr__(self) -> str:
        return f"ChainedAccounts({self.first!r}, {self.then!r})"

    def get(self, account_id: str) -> Account | None:
        found = self.first.get(account_id)
        return found if found is not None else self.then.get(account_id)

    def for_body(self, merchant_id: str | None, profile_id: str | None) -> Account | None:
        # Each source's owner, then the same preference as within one source: an account
        # naming the profile, then one naming the merchant, over one that names neither
        # (a default account without a merchant id does not hide the merchant's sellers).
        one = self.first.for_body(merchant_id, profile_id)
        other = self.then.for_body(merchant_id, profile_id)
        if one is None or other is None or one.id == other.id:
            return one if one is not None else other
        return only_owner((one, other), merchant_id, profile_id)

    def ids(self) -> list[str]:
        return list(dict.fromkeys([*self.first.ids(), *self.then.ids()]))


def only_owner(
    accounts: Iterable[Account], merchant_id: str | None, profile_id: str | None
) -> Account | None:
    """The one account that owns a body naming ``merchant_id`` and ``profile_id``,
    preferring an account that names the profile over one that names only the merchant;
    ``None`` when none does or the choice is ambiguous (never "any account").

    A deactivated account still owns what it owned: among the most specific owners an
    active one is chosen, and when there is none the deactivated one is answered (its
    ``active`` is ``False``), so that callers refuse the body instead of handing a
    deactivated brand's or seller's objects to a less specific account (a merchant's
    catch-all account, the platform's default one)."""
    owners = [a for a in accounts if a.owns(merchant_id, profile_id)]
    if len(owners) > 1 and profile_id is not None:
        specific = [a for a in owners if profile_id in a.profile_ids]
        if specific:
            owners = specific
    if len(owners) > 1:
        specific = [a for a in owners if a.merchant_id is not None]
        if specific:
            owners = specific
    active = [a for a in owners if a.active]
    if active:
        return active[0] if len(active) == 1 else None
    return owners[0] if owners else None


def merchant_naming(accounts: AccountSource, profile_id: str) -> str | None:
    """The merchant of the account that names ``profile_id`` (a profile id is the
    processor's, unique across merchants; a deactivated account still names it), or
    ``None`` when none does. Reads every account:
    for objects that do not name their merchant (a refund, a dispute)."""
    found = None
    for account_id in accounts.ids():
        account = accounts.get(account_id)
        if account is not None and profile_id in account.profile_ids:
            found = account.merchant_id
            if found is not None:
                break
    return found


def owner_of_object(
    accounts: AccountSource,
    merchant_id: str | None,
    profile_id: str | None,
    *,
    account_id: str | None = None,
    single: Account | None = None,
    about: str = "the object",
) -> Account:
    """The account an API object the shop observed is filed under: its ``merchant_id`` (a
    refund, a dispute: the merchant of the account naming its ``profile_id``) and its
    ``profile_id`` route it by the rule the shared URL routes a delivery by
    (:meth:`AccountSource.for_body`). An object that names no merchant, neither directly
    nor through a profile an account names (a mandate), is the installation's only active
    account's, if it has one.

    ``single``: the installation's one configured account, when it is the only one there
    can be besides stored ones (the receive path's ``single``): it takes an object no
    account owns only when it owns it itself (it names no merchant, or the object's).

    ``account_id`` (the caller's ``account=``): that account (:class:`ConfigurationError` if
    there is none), refused with :class:`NotTheAccounts` unless it owns the object, and when
    the object names its merchant, unless no other account is the one the shared URL would
    route it to. Without it, :class:`NotTheAccounts` when no single account owns the object.
    """
    merchant = merchant_id
    if merchant is None and profile_id is not None:
        merchant = merchant_naming(accounts, profile_id)
    named = f"{about} (merchant_id {merchant_id!r}, profile_id {profile_id!r})"
    routed = accounts.for_body(merchant, profile_id) if merchant is not None else None
    if account_id is not None:
        account = accounts.get(account_id) if is_account_id(account_id) else None
        if account is None:
            raise ConfigurationError(f"unknown account {str(account_id)[:80]!r}")
        if not account.active:
            raise NotTheAccounts(
                f"account {account.id!r} is deactivated: nothing is filed under it"
            )
        if routed is not None and not routed.active:
            raise _deactivated(named, routed)
        if routed is not None and routed.id != account.id:
            raise NotTheAccounts(
                f"{named} is account {routed.id!r}'s, not {account.id!r}'s: observe it "
                f"with account={routed.id!r}"
            )
        own = merchant if merchant is not None else account.merchant_id
        if not account.owns(own, profile_id):
            raise NotTheAccounts(
                f"{named} is not account {account.id!r}'s: its merchant or profile is another's"
            )
        return account
    if merchant is not None:
        if routed is not None and not routed.active:
            raise _deactivated(named, routed)
        if (
            routed is None
            and single is not None
            and single.active
            and single.owns(merchant, profile_id)
        ):
            # The one account naming no merchant takes every object. One naming its merchant
            # never takes another merchant's: at the shared URL such a delivery must still
            # verify with its secrets, an observation shows nothing of the sort, and the
            # merchant may be a seller not added yet, whose own webhook would then dispatch
            # it again under the seller.
            return single
        if routed is None:
            raise NotTheAccounts(
                f"no single account owns {named}: add its account, or pass account="
            )
        return routed
    only = _only_active(accounts)
    if only is None or not only.owns(only.merchant_id, profile_id):
        raise NotTheAccounts(
            f"{named} does not name its merchant and no profile an account names: with "
            "several accounts, pass account="
        )
    return only


def _deactivated(named: str, owner: Account) -> NotTheAccounts:
    return NotTheAccounts(
        f"{named} is account {owner.id!r}'s, which is deactivated: activate it to observe "
        "its objects (no other account takes them)"
    )


def _only_active(accounts: AccountSource) -> Account | None:
    """The installation's one active account, or ``None`` when it has none or several."""
    found: Account | None = None
    for account_id in accounts.ids():
        account = accounts.get(account_id)
        if account is None or not account.active:
            continue
        if found is not None and found.id != account.id:
            return None
        found = account
    return found


def parse_accounts(spec: str | Mapping[str, Any] | Sequence[Account] | None) -> tuple[Account, ...]:
    """Accounts from configuration: a JSON object ``{"<id>": {"merchant_id": ..., "secrets":
    "id:secret,...", "api_key": ...}}`` (text or an already parsed mapping) or a sequence
    of :class:`Account`. Errors never show a secret."""
    if spec is None or spec == "":
        return ()
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError as exc:
            raise ConfigurationError(
                f"HOOKLEDGER_ACCOUNTS is not valid JSON (line {getattr(exc, 'lineno', '?')})"
            ) from None
    if isinstance(spec, Mapping):
        return tuple(Account.from_mapping(check_account_id(k), v) for k, v in spec.items())
    accounts = tuple(spec)
    for account in accounts:
        if not isinstance(account, Account):
            raise ConfigurationError("accounts must be a JSON object, a mapping or Account objects")
    return accounts


__all__ = [
    "DEFAULT_ACCOUNT",
    "MAX_ACCOUNT_ID_LENGTH",
    "RESERVED_ACCOUNT_IDS",
    "Account",
    "AccountSource",
    "ChainedAccounts",
    "StaticAccounts",
    "check_account_id",
    "event_key",
    "is_account_id",
    "merchant_naming",
    "object_key",
    "only_owner",
    "owner_of_object",
    "parse_accounts",
]
