"""Finding the account of a delivery to the shared URL (pure): the merchant-id index of
:class:`StaticAccounts` answers exactly as a look at every account would."""

from __future__ import annotations

import random

import pytest

from receiver.core.accounts import Account, ChainedAccounts, StaticAccounts, only_owner

MERCHANTS = [None, "mer_a", "mer_b", "mer_c"]
PROFILES = ["pro_1", "pro_2", "pro_3"]


def _random_accounts(rng: random.Random) -> list[Account]:
    return [
        Account(
            id=f"acct{i}",
            merchant_id=rng.choice(MERCHANTS),
            profile_ids=tuple(rng.sample(PROFILES, rng.randint(0, 2))),
            active=rng.random() > 0.2,
        )
        for i in range(rng.randint(0, 8))
    ]


@pytest.mark.parametrize("seed", range(300))
def test_the_merchant_index_answers_as_every_account_would(seed: int) -> None:
    rng = random.Random(seed)
    accounts = _random_accounts(rng)
    source = StaticAccounts(accounts)
    for merchant in [*MERCHANTS, "mer_unknown"]:
        for profile in [None, *PROFILES]:
            expected = only_owner(accounts, merchant, profile)
            assert source.for_body(merchant, profile) == expected, (merchant, profile)


def test_a_thousand_sellers_each_found_by_its_merchant_id() -> None:
    sellers = [Account(id=f"seller{i:04d}", merchant_id=f"mer_{i:04d}") for i in range(1000)]
    source = StaticAccounts([Account(id="default"), *sellers])
    assert source.for_body("mer_0421", None) == sellers[421]
    assert source.for_body("mer_unknown", None) == source.get("default")


def test_a_default_account_without_merchant_id_does_not_hide_the_merchants_own_sellers() -> None:
    """Regression (found by the 1,000-account receive bench): the default account from
    ``HOOKLEDGER_SECRETS`` (no merchant id: it owns any merchant's body) and the sellers of
    the merchant's own source each claimed a seller's body, and the chain answered "nobody"
    (404 ``HL_07`` at the shared URL for every seller); a single source prefers the seller."""
    default = Account(id="default")
    sellers = [Account(id=f"seller{i}", merchant_id=f"mer_{i}") for i in range(3)]
    chained = ChainedAccounts(StaticAccounts([default]), StaticAccounts(sellers))
    assert chained.for_body("mer_1", None) == sellers[1]
    assert chained.for_body("mer_other", None) == default
    assert StaticAccounts([default, *sellers]).for_body("mer_1", None) == sellers[1]
    # Two owners that are as specific as each other: nobody's, as within one source.
    twin = Account(id="twin", merchant_id="mer_1")
    assert (
        ChainedAccounts(StaticAccounts([twin]), StaticAccounts(sellers)).for_body("mer_1", None)
        is None
    )


def test_a_deactivated_account_keeps_what_it_owned_from_a_less_specific_one() -> None:
    """Review of issue 28: a merchant's catch-all account (no profiles) and a brand naming
    its profile, deactivated; or a platform's default account beside a deactivated seller.
    The deactivated account is answered (inactive), so its deliveries and objects are
    refused, never handed to the catch-all or the default account; a seller onboarded again
    under a new id with the same merchant takes it over."""
    catch_all = Account(id="rest", merchant_id="mer_a")
    brand = Account(id="eu", merchant_id="mer_a", profile_ids=("pro_eu",), active=False)
    owner = StaticAccounts([catch_all, brand]).for_body("mer_a", "pro_eu")
    assert owner is not None and (owner.id, owner.active) == ("eu", False)
    assert StaticAccounts([catch_all, brand]).for_body("mer_a", "pro_uk") == catch_all
    default = Account(id="default")
    gone = Account(id="seller_old", merchant_id="mer_b", active=False)
    chained = ChainedAccounts(StaticAccounts([default]), StaticAccounts([gone]))
    assert chained.for_body("mer_b", None) == gone
    again = Account(id="seller_new", merchant_id="mer_b")
    assert StaticAccounts([default, gone, again]).for_body("mer_b", None) == again
    chained = ChainedAccounts(StaticAccounts([default]), StaticAccounts([gone, again]))
    assert chained.for_body("mer_b", None) == again
