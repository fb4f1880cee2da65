"""The ``reconcile`` command as ops run it: real processes, real database, the sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconcile.sandbox import SandboxServer

pytestmark = [pytest.mark.storage, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
API_KEY = "snd_cli_test_key_0001"


def _run(
    database_url: str, base_url: str | None, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HOOKLEDGER_DATABASE_URL": database_url,
        "HOOKLEDGER_API_KEY": API_KEY,
        **(env or {}),
    }
    if base_url:
        env["HOOKLEDGER_PROCESSOR_URL"] = base_url
    return subprocess.run(
        [sys.executable, "-m", "reconcile", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _spawn(database_url: str, base_url: str, *args: str) -> subprocess.Popen[str]:
    env = dict(
        os.environ,
        HOOKLEDGER_DATABASE_URL=database_url,
        HOOKLEDGER_API_KEY=API_KEY,
        HOOKLEDGER_PROCESSOR_URL=base_url,
    )
    return subprocess.Popen(
        [sys.executable, "-m", "reconcile", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_run_report_and_exit_codes(database_url: str) -> None:
    with SandboxServer(API_KEY) as server:
        server.sandbox.seed_payments(30, server.sandbox.now())
        missing = _run(database_url, server.base_url, "run")
        assert missing.returncode == 2
        assert "reconcile db upgrade" in missing.stderr
        assert _run(database_url, server.base_url, "db", "upgrade").returncode == 0
        refused = _run(database_url, server.base_url, "run")
        assert refused.returncode == 6
        assert refused.stderr.count("\n") == 1 and "reconcile adopt --new-account" in refused.stderr
        assert _run(database_url, server.base_url, "adopt", "--new-account").returncode == 0
        result = _run(database_url, server.base_url, "run", "--json", "--kind", "payments")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["kinds"]["payments"]["recovered"] == {"payment_succeeded": 30}
        table = _run(database_url, server.base_url, "report")
        assert "recovered 30 x payment_succeeded" in table.stdout
        dry = _run(
            database_url,
            server.base_url,
            "--processor-url",
            server.base_url,
            "run",
            "--dry-run",
            "--json",
        )
        assert dry.returncode == 0 and json.loads(dry.stdout)["dry_run"] is True
        assert API_KEY not in result.stdout + result.stderr + table.stdout + dry.stderr
    no_key = _run(database_url, None, "run")
    assert no_key.returncode == 2 and "HOOKLEDGER_PROCESSOR_URL" in no_key.stderr
    # The processor is unreachable: exit 4 (not 1, which means drift), with a report.
    down = _run(database_url, "http://127.0.0.1:9", "run", "--json", "--kind", "payments")
    assert down.returncode == 4, down.stderr
    assert json.loads(down.stdout)["status"] == "incomplete"
    # Issue 28, hole 9: a dry run that could not read the processor exits as a real run does.
    dry_down = _run(database_url, "http://127.0.0.1:9", "run", "--dry-run", "--kind", "payments")
    assert dry_down.returncode == 4, dry_down.stdout + dry_down.stderr
    assert "dry_run, incomplete" in dry_down.stdout


def test_environment_is_pinned_for_keys_without_a_prefix(database_url: str) -> None:
    with SandboxServer(API_KEY) as server:
        assert _run(database_url, server.base_url, "db", "upgrade").returncode == 0
        env = {"HOOKLEDGER_API_KEY": "custom_key_without_prefix"}
        unpinned = _run(database_url, server.base_url, "adopt", "--new-account", env=env)
        assert unpinned.returncode == 2 and "Traceback" not in unpinned.stderr
        assert "environment" in unpinned.stderr
        pinned = _run(
            database_url,
            server.base_url,
            "--environment",
            "sandbox",
            "adopt",
            "--new-account",
            env=env,
        )
        assert pinned.returncode == 0, pinned.stderr
        mismatch = _run(database_url, server.base_url, "--environment", "production", "run")
        assert mismatch.returncode == 2 and "Traceback" not in mismatch.stderr


def test_a_window_ending_in_the_future_is_clamped(database_url: str) -> None:
    with SandboxServer(API_KEY) as server:
        assert _run(database_url, server.base_url, "db", "upgrade").returncode == 0
        assert _run(database_url, server.base_url, "adopt", "--new-account").returncode == 0
        future = "2999-01-01T00:00:00"
        result = _run(
            database_url, server.base_url, "run", "--json", "--kind", "payments", "--until", future
        )
        assert result.returncode == 0, result.stderr
        end = json.loads(result.stdout)["kinds"]["payments"]["window"][1]
        assert end < "2100"


def test_two_reconcilers_started_together_one_runs(database_url: str) -> None:
    with SandboxServer(API_KEY) as server:
        server.sandbox.seed_payments(10, server.sandbox.now())
        assert _run(database_url, server.base_url, "db", "upgrade").returncode == 0
        assert _run(database_url, server.base_url, "adopt", "--new-account").returncode == 0
        # Slow the first list page down so the runs overlap.
        server.sandbox.faults.once("timeout", count=2, path="/payments/list", seconds=2.0)
        procs = [
            _spawn(database_url, server.base_url, "run", "--kind", "payments") for _ in range(2)
        ]
        outcomes = sorted((p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs)
        for p in procs:
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()
    assert [code for code, _ in outcomes] == [0, 3], outcomes
    assert "another reconcile run is in progress" in outcomes[1][1]


def test_every_account_reconciles_in_turn_and_one_failing_stops_no_other(
    database_url: str,
) -> None:
    """``reconcile --account`` and ``run --all-accounts``: two processor accounts (two
    sandboxes), each adopted and reconciled with its own key; a third whose processor is
    down fails alone, and the exit code and summary say which."""
    with (
        SandboxServer("snd_eu_key_0001", merchant_id="merchant_eu") as eu,
        SandboxServer("snd_us_key_0001", merchant_id="merchant_us") as us,
    ):
        eu.sandbox.seed_payments(5, eu.sandbox.now())
        us.sandbox.seed_payments(7, us.sandbox.now())
        accounts = {
            "eu": {
                "merchant_id": "merchant_eu",
                "secrets": "k:a",
                "api_key": "snd_eu_key_0001",
                "base_url": eu.base_url,
            },
            "us": {
                "merchant_id": "merchant_us",
                "secrets": "k:b",
                "api_key": "snd_us_key_0001",
                "base_url": us.base_url,
            },
        }
        env = {"HOOKLEDGER_ACCOUNTS": json.dumps(accounts), "HOOKLEDGER_API_KEY": ""}
        assert _run(database_url, None, "db", "upgrade", env=env).returncode == 0
        for account in accounts:
            adopt = _run(
                database_url, None, "--account", account, "adopt", "--new-account", env=env
            )
            assert adopt.returncode == 0, adopt.stderr
        unknown = _run(database_url, None, "--account", "asia", "run", env=env)
        assert unknown.returncode == 2 and "unknown account 'asia'" in unknown.stderr
        both = _run(
            database_url, None, "run", "--all-accounts", "--json", "--kind", "payments", env=env
        )
        assert both.returncode == 0, both.stderr
        reports = json.loads(both.stdout)
        assert reports["not_ok"] == []
        recovered = {a: r["kinds"]["payments"]["recovered"] for a, r in reports["accounts"].items()}
        assert recovered == {
            "eu": {"payment_succeeded": 5},
            "us": {"payment_succeeded": 7},
        }
        only_us = _run(database_url, None, "--account", "us", "report", "--json", env=env)
        assert json.loads(only_us.stdout)[0]["kinds"]["payments"]["recovered"] == {
            "payment_succeeded": 7
        }
        accounts["down"] = {
            "merchant_id": "m_down",
            "secrets": "k:c",
            "api_key": "snd_down_key_01",
            "base_url": "http://127.0.0.1:9",
        }
        env["HOOKLEDGER_ACCOUNTS"] = json.dumps(accounts)
        adopt = _run(database_url, None, "--account", "down", "adopt", "--new-account", env=env)
        eu.sandbox.seed_payments(2, eu.sandbox.now())
        mixed = _run(database_url, None, "run", "--all-accounts", "--kind", "payments", env=env)
        assert mixed.returncode == 4, mixed.stdout + mixed.stderr
        assert "not ok: down" in mixed.stdout
        assert "== account eu: exit 0" in mixed.stdout and "== account us: exit 0" in mixed.stdout
        for key in ("snd_eu_key_0001", "snd_us_key_0001", "snd_down_key_01"):
            assert key not in mixed.stdout + mixed.stderr + both.stdout + both.stderr


def test_stored_accounts_are_reconciled_with_the_configured_ones(database_url: str) -> None:
    """``reconcile --account ID`` and ``run --all-accounts`` include the accounts of
    hookledger's own table (``hookledger accounts add``), their API keys opened with
    HOOKLEDGER_DATA_KEYS; an inactive one is left alone."""
    import base64

    import receiver.storage.database as db
    from receiver.core.accounts import Account
    from receiver.core.keyring import parse_data_keys
    from receiver.core.signature import parse_secrets
    from receiver.store import Store

    data_keys = "k1:" + base64.b64encode(b"7" * 32).decode()
    with (
        SandboxServer("snd_eu_key_0001", merchant_id="merchant_eu") as eu,
        SandboxServer("snd_st_key_0001", merchant_id="merchant_st") as stored,
    ):
        eu.sandbox.seed_payments(3, eu.sandbox.now())
        stored.sandbox.seed_payments(4, stored.sandbox.now())
        accounts = {
            "eu": {
                "merchant_id": "merchant_eu",
                "secrets": "k:a",
                "api_key": "snd_eu_key_0001",
                "base_url": eu.base_url,
            }
        }
        env = {
            "HOOKLEDGER_ACCOUNTS": json.dumps(accounts),
            "HOOKLEDGER_API_KEY": "",
            "HOOKLEDGER_DATA_KEYS": data_keys,
        }
        assert _run(database_url, None, "db", "upgrade", env=env).returncode == 0
        engine = db.make_engine(database_url)
        try:
            table = Store(engine, keyring=parse_data_keys(data_keys)).accounts
            for account_id, active in (("shop-st", True), ("shop-off", False)):
                table.add(
                    Account(
                        id=account_id,
                        merchant_id="merchant_st",
                        secrets=parse_secrets("k:c"),
                        api_key="snd_st_key_0001",
                        base_url=stored.base_url,
                        active=active,
                    )
                )
        finally:
            engine.dispose()
        for account in ("eu", "shop-st"):
            adopt = _run(
                database_url, None, "--account", account, "adopt", "--new-account", env=env
            )
            assert adopt.returncode == 0, adopt.stderr
        off = _run(database_url, None, "--account", "shop-off", "run", env=env)
        assert off.returncode == 2 and "inactive" in off.stderr
        both = _run(
            database_url, None, "run", "--all-accounts", "--json", "--kind", "payments", env=env
        )
        assert both.returncode == 0, both.stderr
        reports = json.loads(both.stdout)
        recovered = {a: r["kinds"]["payments"]["recovered"] for a, r in reports["accounts"].items()}
        assert recovered == {
            "eu": {"payment_succeeded": 3},
            "shop-st": {"payment_succeeded": 4},
        }
        one = _run(database_url, None, "--account", "shop-st", "report", "--json", env=env)
        assert json.loads(one.stdout)[0]["kinds"]["payments"]["recovered"] == {
            "payment_succeeded": 4
        }
        assert "snd_st_key_0001" not in both.stdout + both.stderr + one.stdout + one.stderr


def test_a_new_seller_is_adopted_while_another_account_reconciles(database_url: str) -> None:
    """Issue 19: onboarding a seller with history (``--account asia adopt``) while another
    account's run is in progress (its list slowed to 2 s a page): neither waits for the
    other's lock, the adoption ends first, both exit 0, and the next run of every account
    is ok (the seller's history was recorded as seen, not dispatched as new)."""
    with (
        SandboxServer("snd_eu_key_0001", merchant_id="merchant_eu") as eu,
        SandboxServer("snd_asia_key_001", merchant_id="merchant_asia") as asia,
    ):
        eu.sandbox.seed_payments(5, eu.sandbox.now())
        asia.sandbox.seed_payments(40, asia.sandbox.now())
        accounts = {
            "eu": {"merchant_id": "merchant_eu", "secrets": "k:a", "api_key": "snd_eu_key_0001"},
            "asia": {
                "merchant_id": "merchant_asia",
                "secrets": "k:b",
                "api_key": "snd_asia_key_001",
            },
        }
        accounts["eu"]["base_url"] = eu.base_url
        accounts["asia"]["base_url"] = asia.base_url
        env = {"HOOKLEDGER_ACCOUNTS": json.dumps(accounts), "HOOKLEDGER_API_KEY": ""}
        assert _run(database_url, None, "db", "upgrade", env=env).returncode == 0
        adopt = _run(database_url, None, "--account", "eu", "adopt", "--new-account", env=env)
        assert adopt.returncode == 0, adopt.stderr
        eu.sandbox.faults.once("timeout", count=2, path="/payments/list", seconds=2.0)
        full_env = {
            **os.environ,
            "HOOKLEDGER_DATABASE_URL": database_url,
            **env,
        }

        def spawn(*args: str) -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, "-m", "reconcile", *args],
                env=full_env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

        running = spawn("--account", "eu", "run", "--kind", "payments")
        deployed = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")  # nothing reached it yet
        onboarding = spawn("--account", "asia", "adopt", "--deployed-at", deployed)
        adopted_code = onboarding.wait(timeout=120)
        adopted_err = onboarding.stderr.read() if onboarding.stderr else ""
        assert running.poll() is None, "the other account's run should still be going"
        assert adopted_code == 0, adopted_err
        assert running.wait(timeout=120) == 0, running.stderr.read() if running.stderr else ""
        for proc in (running, onboarding):
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()
        after = _run(database_url, None, "run", "--all-accounts", "--json", env=env)
        assert after.returncode == 0, after.stdout + after.stderr
        reports = json.loads(after.stdout)["accounts"]
        assert reports["asia"]["kinds"]["payments"]["recovered"] == {}
        assert reports["eu"]["status"] == "ok" and reports["asia"]["status"] == "ok"


def test_a_sellers_recovered_events_name_the_sellers_merchant(database_url: str) -> None:
    """Issue 28, hole 5: a platform (the default account: ``HOOKLEDGER_MERCHANT_ID``) and a
    seller (its own merchant). Every event recovered into the seller's account names the
    seller's merchant: a payment's, its own; a refund's (the object names none), the
    seller account's. A platform that credits sellers by ``event.merchant_id`` never
    credits itself."""
    import sqlalchemy as sa

    with (
        SandboxServer("snd_platform_key_01", merchant_id="merchant_platform") as own,
        SandboxServer("snd_seller_key_001", merchant_id="merchant_seller") as seller,
    ):
        own.sandbox.seed_payments(1, own.sandbox.now(), id_prefix="pay_own_")
        (paid,) = seller.sandbox.seed_payments(1, seller.sandbox.now(), id_prefix="pay_sold_")
        seller.sandbox.create_refund({"payment_id": paid, "amount": 500})
        accounts = {
            "seller": {
                "merchant_id": "merchant_seller",
                "secrets": "k:b",
                "api_key": "snd_seller_key_001",
                "base_url": seller.base_url,
            }
        }
        env = {
            "HOOKLEDGER_ACCOUNTS": json.dumps(accounts),
            "HOOKLEDGER_API_KEY": "snd_platform_key_01",
            "HOOKLEDGER_MERCHANT_ID": "merchant_platform",
            "HOOKLEDGER_SECRETS": "k:a",
        }
        assert _run(database_url, own.base_url, "db", "upgrade", env=env).returncode == 0
        for account in ("default", "seller"):
            adopt = _run(
                database_url, own.base_url, "--account", account, "adopt", "--new-account", env=env
            )
            assert adopt.returncode == 0, adopt.stderr
        ran = _run(database_url, own.base_url, "run", "--all-accounts", "--json", env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        alone = _run(database_url, own.base_url, "--account", "seller", "run", env=env)
        assert alone.returncode == 0, alone.stdout + alone.stderr
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT account, object_kind, object_id, merchant_id, body "
                    "FROM hookledger_event ORDER BY account, object_kind"
                )
            ).all()
    finally:
        engine.dispose()
    found = {
        (r.account, r.object_kind, r.merchant_id, json.loads(bytes(r.body))["merchant_id"])
        for r in rows
    }
    assert found == {
        ("default", "payment", "merchant_platform", "merchant_platform"),
        ("seller", "payment", "merchant_seller", "merchant_seller"),
        ("seller", "refund", "merchant_seller", "merchant_seller"),
    }


def test_report_says_when_no_run_is_recorded(database_url: str) -> None:
    """A review's finding: ``reconcile --account X report`` printed nothing for an account
    with no run, which reads as "nothing to report"; an unknown account was not named."""
    _run(database_url, None, "db", "upgrade")
    env = {
        "HOOKLEDGER_ACCOUNTS": json.dumps(
            {"eu": {"merchant_id": "m_eu", "secrets": "k:c", "api_key": "snd_eu_key_0001"}}
        )
    }
    empty = _run(database_url, None, "--account", "eu", "report", env=env)
    assert empty.returncode == 0, empty.stderr
    assert "no run is recorded for account 'eu' yet" in empty.stderr
    as_json = _run(database_url, None, "--account", "eu", "report", "--json", env=env)
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == []
    unknown = _run(database_url, None, "--account", "nope", "report", env=env)
    assert unknown.returncode == 2
    assert "unknown account 'nope'" in unknown.stderr
