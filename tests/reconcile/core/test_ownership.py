"""Which of a merchant's objects an account reconciles: the receive path's rule at the shared
URL (``for_body``), over every account of the installation (pure)."""

from __future__ import annotations

import pytest

from receiver.core.accounts import Account, ChainedAccounts, StaticAccounts
from reconcile.core.ownership import NO_PROFILE, Ownership

M = "merchant_1"


def _source(*accounts: Account) -> StaticAccounts:
    return StaticAccounts(accounts)


def _owners(source: StaticAccounts | ChainedAccounts, obj: dict[str, str]) -> set[str]:
    return {a for a in source.ids() if Ownership(a, source).owns_object(obj)}


EU = Account(id="eu", merchant_id=M, profile_ids=("pro_eu",))
US = Account(id="us", merchant_id=M, profile_ids=("pro_us",))
CATCH_ALL = Account(id="rest", merchant_id=M)
LEGACY = Account(id="default")  # no merchant id, no profiles


@pytest.mark.parametrize(
    ("accounts", "obj", "owners"),
    [
        # Each account names its profile.
        ((EU, US), {"merchant_id": M, "profile_id": "pro_eu"}, {"eu"}),
        ((EU, US), {"merchant_id": M, "profile_id": "pro_us"}, {"us"}),
        # A refund or dispute shows no merchant: the account's own merchant.
        ((EU, US), {"profile_id": "pro_us"}, {"us"}),
        # A profile nobody names, with no catch-all: nobody's.
        ((EU, US), {"merchant_id": M, "profile_id": "pro_uk"}, set()),
        # The account naming none takes the merchant's other profiles, not those named.
        ((CATCH_ALL, US), {"merchant_id": M, "profile_id": "pro_uk"}, {"rest"}),
        ((CATCH_ALL, US), {"merchant_id": M, "profile_id": "pro_us"}, {"us"}),
        ((CATCH_ALL, US), {"profile_id": "pro_us"}, {"us"}),
        # One naming no merchant either: its merchant is the one naming the profile's.
        ((LEGACY, US), {"profile_id": "pro_us"}, {"us"}),
        ((LEGACY, US), {"merchant_id": M, "profile_id": "pro_us"}, {"us"}),
        ((LEGACY, US), {"profile_id": "pro_other"}, {"default"}),
        # A deactivated brand's profile is still its: not the catch-all's (review of
        # issue 28: the catch-all recovered and dispatched the brand's objects again).
        (
            (CATCH_ALL, Account(id="us", merchant_id=M, profile_ids=("pro_us",), active=False)),
            {"merchant_id": M, "profile_id": "pro_us"},
            set(),
        ),
        (
            (CATCH_ALL, Account(id="us", merchant_id=M, profile_ids=("pro_us",), active=False)),
            {"profile_id": "pro_us"},
            set(),
        ),
        # Another merchant's object: not an account of merchant_1's.
        ((EU, CATCH_ALL), {"merchant_id": "m_2", "profile_id": "pro_eu"}, set()),
        # Two accounts naming the same profile, alike: neither's (the shared URL refuses it).
        (
            (EU, Account(id="eu2", merchant_id=M, profile_ids=("pro_eu",))),
            {"merchant_id": M, "profile_id": "pro_eu"},
            set(),
        ),
        # An account naming two profiles owns both.
        (
            (Account(id="both", merchant_id=M, profile_ids=("pro_eu", "pro_us")), CATCH_ALL),
            {"merchant_id": M, "profile_id": "pro_us"},
            {"both"},
        ),
        # An object that shows no profile (a mandate) is each of its merchant's accounts'.
        ((EU, US), {"mandate_id": "man_1"}, {"eu", "us"}),
    ],
)
def test_the_owner_of_an_object(
    accounts: tuple[Account, ...], obj: dict[str, str], owners: set[str]
) -> None:
    assert _owners(_source(*accounts), obj) == owners


def test_the_rule_over_chained_sources_is_the_receive_paths() -> None:
    """Configuration first, then another source: the more specific owner wins, as
    :class:`ChainedAccounts` routes a delivery."""
    source = ChainedAccounts(_source(CATCH_ALL), _source(US))
    for obj in ({"merchant_id": M, "profile_id": "pro_us"}, {"profile_id": "pro_us"}):
        assert _owners(source, obj) == {"us"}
        assert source.for_body(M, "pro_us") is not None
    assert _owners(source, {"merchant_id": M, "profile_id": "pro_uk"}) == {"rest"}


def test_an_account_alone_or_unknown() -> None:
    """No source: the account is alone and owns what its key reads. An account the source
    does not know (a library caller's default) owns what no known account claims."""
    alone = Ownership("default")
    assert alone.owns(M, "pro_anything") and alone.profile_filter is None
    unknown = Ownership("default", _source(US))
    assert not unknown.owns(M, "pro_us")
    assert not unknown.owns(None, "pro_us")
    assert unknown.owns(M, "pro_eu")
    assert unknown.owns(None, None)


def test_the_profile_the_processor_is_asked_for() -> None:
    assert Ownership("eu", _source(EU, US)).profile_filter == "pro_eu"
    assert Ownership("rest", _source(CATCH_ALL, US)).profile_filter is None
    two = Account(id="two", merchant_id=M, profile_ids=("pro_a", "pro_b"))
    assert Ownership("two", _source(two)).profile_filter is None
    assert Ownership.profile_of({"profile_id": "pro_a"}) == "pro_a"
    assert Ownership.profile_of({"mandate_id": "man_1"}) == NO_PROFILE
