"""Finding the account of a delivery to the shared URL (pure): the merchant-id index of
:class:`StaticAccounts` answers exactly as a look at every account would."""

from __future__ import annotations

import random

import pytest

from receiver.core.accounts import Account, StaticAccounts, only_owner

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
