"""``reconcile run --all-accounts`` over two business profiles of one merchant: real
processes, a real database, the sandbox with two profiles (issue 28, hole 6)."""

from __future__ import annotations

import json

import pytest

from reconcile.sandbox import SandboxServer
from tests.reconcile.cli.test_cli import _run

pytestmark = [pytest.mark.storage, pytest.mark.slow]

KEY = "snd_brands_key_0001"


def test_each_profiles_account_recovers_its_own_objects_only(database_url: str) -> None:
    with SandboxServer(KEY, merchant_id="m_brands", profile_id="pro_eu") as server:
        sandbox = server.sandbox
        sandbox.add_profile("pro_us")
        eu = sandbox.seed_payments(5, sandbox.now(), profile_id="pro_eu")
        us = sandbox.seed_payments(7, sandbox.now(), profile_id="pro_us")
        for payment_id in (eu[0], us[0], us[1]):
            sandbox.create_refund({"payment_id": payment_id, "amount": 100})
        common = {"merchant_id": "m_brands", "api_key": KEY, "base_url": server.base_url}
        accounts = {
            "brand_eu": {**common, "profile_ids": ["pro_eu"], "secrets": "k:eu_secret"},
            "brand_us": {**common, "profile_ids": ["pro_us"], "secrets": "k:us_secret"},
        }
        env = {"HOOKLEDGER_ACCOUNTS": json.dumps(accounts), "HOOKLEDGER_API_KEY": ""}
        assert _run(database_url, None, "db", "upgrade", env=env).returncode == 0
        for account in accounts:
            adopt = _run(
                database_url, None, "--account", account, "adopt", "--new-account", env=env
            )
            assert adopt.returncode == 0, adopt.stderr
        kinds = ("--kind", "payments", "--kind", "refunds")
        both = _run(database_url, None, "run", "--all-accounts", "--json", *kinds, env=env)
        assert both.returncode == 0, both.stdout + both.stderr
        reports = json.loads(both.stdout)["accounts"]
        recovered = {
            account: {name: r["kinds"][name]["recovered"] for name in ("payments", "refunds")}
            for account, r in reports.items()
        }
        assert recovered == {
            "brand_eu": {"payments": {"payment_succeeded": 5}, "refunds": {"refund_succeeded": 1}},
            "brand_us": {"payments": {"payment_succeeded": 7}, "refunds": {"refund_succeeded": 2}},
        }
        # The payments list takes no profile filter: the other brand's are read and skipped;
        # the refunds list was asked for the account's profile only.
        skipped = {
            account: {name: r["kinds"][name]["other_profiles"] for name in ("payments", "refunds")}
            for account, r in reports.items()
        }
        assert skipped == {
            "brand_eu": {"payments": {"pro_us": 7}, "refunds": {}},
            "brand_us": {"payments": {"pro_eu": 5}, "refunds": {}},
        }
        text = _run(database_url, None, "--account", "brand_eu", "report", env=env).stdout
        assert "skipped 7 of other profiles' (not this account's): pro_us 7" in text
