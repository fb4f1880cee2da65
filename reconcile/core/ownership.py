"""Which of the processor's objects an account reconciles (pure, no I/O of its own).

A processor API key reads every object of its *merchant*; a merchant may have several
business profiles (brands, shops), and the installation may keep them as separate accounts,
each with its own URL, secrets and handlers. An object is one account's by **the rule the
receive path routes a delivery to the shared URL by**:
:meth:`receiver.core.accounts.AccountSource.for_body` over the installation's accounts, with the
object's merchant and its ``profile_id``. The merchant is the object's ``merchant_id``; a
refund or a dispute shows none, so it is the account's (the key reads its own merchant), or,
for an account that names no merchant, the merchant of the account that names the profile
(a profile id is the processor's, unique across merchants). So an account that names its
profiles owns those; an account that names none owns the merchant's other profiles, except
those another account names, even one that was deactivated (its objects are then
nobody's, never the catch-all's); an object two accounts claim alike is neither's. An object
that shows no profile (a mandate: ``MandateResponse`` has none) is the account's when it is
of the account's merchant.

An account the source does not know (a library caller's default account with no
configuration) owns what no single known account claims, as the one account of an
installation takes every delivery at the shared URL.

Every path that reads objects applies it (the lists, the sweep, adoption, a backfill, the
events API): another profile's object is neither recovered nor drift of this account; the
reports count it as ``other_profiles``. Where the processor's list takes a profile filter,
:attr:`Ownership.profile_filter` is the one profile to ask it for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from receiver.core.accounts import Account, AccountSource, merchant_naming

__all__ = ["NO_PROFILE", "Ownership"]

#: How a report names objects that show no profile.
NO_PROFILE = "(no profile)"


class Ownership:
    """The rule of one account (``account_id``) over the installation's ``accounts``
    (``None``: the account is alone, it owns every object its key reads).

    The account is read from ``accounts`` once; ``for_body`` answers are kept per
    (merchant, profile) for the life of this object (one run).
    """

    def __init__(self, account_id: str, accounts: AccountSource | None = None) -> None:
        self.account_id = account_id
        self.accounts = accounts
        self.account: Account | None = accounts.get(account_id) if accounts is not None else None
        self._owners: dict[tuple[str | None, str], bool] = {}
        self._merchants: dict[str, str | None] = {}

    def __repr__(self) -> str:
        return f"Ownership(account={self.account_id!r}, accounts={self.accounts!r})"

    @property
    def profile_filter(self) -> str | None:
        """The one profile the processor may be asked to list for this account (the lists
        that take ``profile_id``), or ``None`` when it names none or several (then its
        merchant's lists are read whole and filtered here)."""
        account = self.account
        if account is not None and len(account.profile_ids) == 1:
            return account.profile_ids[0]
        return None

    @property
    def merchant_id(self) -> str | None:
        """The account's merchant id, when it is known."""
        return self.account.merchant_id if self.account is not None else None

    def owns(self, merchant_id: str | None, profile_id: str | None) -> bool:
        """Whether an object of ``merchant_id`` (``None``: the account's own merchant) and
        ``profile_id`` is this account's (see the module docstring)."""
        if self.accounts is None:
            return True
        merchant = merchant_id if merchant_id is not None else self.merchant_id
        if profile_id is None:
            return self.account is None or self.account.owns(merchant, None)
        if merchant is None:
            merchant = self._merchant_naming(profile_id)
        key = (merchant, profile_id)
        found = self._owners.get(key)
        if found is None:
            owner = self.accounts.for_body(merchant, profile_id)
            if owner is not None:  # a deactivated owner: nobody's (never reconciled)
                found = owner.active and owner.id == self.account_id
            else:
                # Nobody claims it, or two accounts alike: a known account does not take
                # it; one the source does not know takes what no known account claims.
                found = self.account is None
            self._owners[key] = found
        return found

    def _merchant_naming(self, profile_id: str) -> str | None:
        """The merchant of an account that names ``profile_id`` (``None``: none does)."""
        if profile_id not in self._merchants:
            assert self.accounts is not None
            self._merchants[profile_id] = merchant_naming(self.accounts, profile_id)
        return self._merchants[profile_id]

    def owns_object(self, obj: Mapping[str, Any]) -> bool:
        """:meth:`owns` for one API object (its ``merchant_id`` and ``profile_id``)."""
        return self.owns(_text(obj.get("merchant_id")), _text(obj.get("profile_id")))

    @staticmethod
    def profile_of(obj: Mapping[str, Any]) -> str:
        """How a report names an object's profile."""
        return _text(obj.get("profile_id")) or NO_PROFILE


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
