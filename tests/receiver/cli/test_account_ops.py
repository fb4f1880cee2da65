"""Operators per account (issue 19): ``prune``, ``redact``, ``rotate-keys`` and
``retention`` limited with ``--account`` never touch another account's rows; ``show`` of an
event id stored in several accounts asks which one. On SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from receiver import Event, WebhookReceiver
from receiver.store import Store
from receiver.testing import signed_headers
from receiver.testing.factories import build_event, encode
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage

KEY1 = base64.b64encode(b"1" * 32).decode()
KEY2 = base64.b64encode(b"2" * 32).decode()
T0 = datetime(2026, 11, 1, 12, tzinfo=UTC)
SECRET = {"eu": "whsec_eu_0123456789abcdef", "us": "whsec_us_fedcba9876543210"}
# No merchant id: every body posted to an account's URL is that account's, so both accounts
# can be sent the very same bodies (the same event ids, the same hashes).
ACCOUNTS = json.dumps({a: {"secrets": f"s1:{s}"} for a, s in SECRET.items()})


def _hooks() -> WebhookReceiver:
    hooks = WebhookReceiver()

    @hooks.on("payment_failed", name="failing")
    def failing(event: Event) -> None:
        raise RuntimeError("declined")

    return hooks


def _app(make_app: AppFactory, keys: str = f"k1:{KEY1}", **config: Any) -> Flask:
    app, _ = make_app(
        _hooks(),
        secrets="",
        accounts=ACCOUNTS,
        data_keys=keys,
        max_attempts=1,
        rejections_body_bytes=64,
        **config,
    )
    return app


def _store(app: Flask) -> Store:
    return WebhookReceiver.state(app).store


def _post(app: Flask, account: str, body: bytes, *, secret: str | None = None) -> str:
    headers = signed_headers(body, secret or SECRET[account])
    answer = app.test_client().post(f"/webhooks/{account}/", data=body, headers=headers)
    return str((answer.get_json() or {}).get("status") or answer.status_code)


DONE = encode(build_event("payment_succeeded", event_id="evt_done", object_id="pay_1"))
DEAD = encode(build_event("payment_failed", event_id="evt_dead", object_id="pay_2"))
OTHER = encode(build_event("refund_succeeded", event_id="evt_done", object_id="ref_1"))


def _fill(app: Flask) -> None:
    """The same history in both accounts: a done event, a dead letter, a conflicting
    delivery and a rejected one (a wrong signature on the account's URL)."""
    for account in SECRET:
        assert _post(app, account, DONE) == "inserted"
        assert _post(app, account, DEAD) == "inserted"
        assert _post(app, account, OTHER) == "conflict"
        assert _post(app, account, DONE, secret="whsec_wrong_00000000000") == "401"
    WebhookReceiver.state(app).worker(name="test").drain()
    _store(app).rejections.flush()


def _by_account(app: Flask, sql: str) -> dict[str, Any]:
    with _store(app).engine.connect() as conn:
        return {str(r[0]): r[1] for r in conn.execute(sa.text(sql))}


def _counts(app: Flask) -> dict[str, dict[str, Any]]:
    return {
        "events": _by_account(
            app, "SELECT account, count(*) FROM hookledger_event GROUP BY account"
        ),
        "conflicts": _by_account(
            app, "SELECT account, count(*) FROM hookledger_event_conflict GROUP BY account"
        ),
        "rejections": _by_account(
            app, "SELECT account, count(*) FROM hookledger_rejection GROUP BY account"
        ),
    }


def _cli(app: Flask, *args: str) -> Any:
    result = app.test_cli_runner().invoke(args=["hookledger", *args])
    return result


def test_redact_and_prune_one_account_leave_the_others_rows(make_app: AppFactory) -> None:
    app = _app(make_app)
    store = _store(app)
    now = [T0]
    store.clock = lambda: now[0]
    _fill(app)
    assert _counts(app) == {
        "events": {"eu": 2, "us": 2},
        "conflicts": {"eu": 1, "us": 1},
        "rejections": {"eu": 1, "us": 1},
    }
    now[0] = T0 + timedelta(days=40)

    # redact eu only: eu's done event, conflict and kept rejected body; us keeps them.
    dry = _cli(app, "redact", "--account", "eu", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would be redacted in account(s) eu" in dry.output
    result = _cli(app, "redact", "--account", "eu", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "dry_run": False,
        "older_than_days": 30,
        "accounts": ["eu"],
        "events": 1,
        "conflicts": 1,
        "rejections": 1,
    }
    assert _by_account(
        app,
        "SELECT account, count(*) FROM hookledger_event WHERE redacted_at IS NOT NULL "
        "GROUP BY account",
    ) == {"eu": 1}
    assert _by_account(
        app,
        "SELECT account, count(*) FROM hookledger_rejection WHERE body IS NOT NULL "
        "GROUP BY account",
    ) == {"us": 1}
    us_done = store.operations.get("evt_done", account="us")
    assert us_done is not None and us_done.redacted_at is None

    # prune eu only (every kind at once): us's rows all stay.
    now[0] = T0 + timedelta(days=200)
    result = _cli(app, "prune", "--account", "eu", "--json")
    assert result.exit_code == 0, result.output
    pruned = json.loads(result.output)
    assert pruned["accounts"] == ["eu"]
    assert {k: pruned[k] for k in ("events", "dead", "conflicts", "rejections")} == {
        "events": 1,
        "dead": 1,
        "conflicts": 1,
        "rejections": 1,
    }
    assert _counts(app) == {
        "events": {"us": 2},
        "conflicts": {"us": 1},
        "rejections": {"us": 1},
    }
    # The guard's memory stays in both accounts.
    assert store.operations.projection("payment", "pay_1", account="eu") is not None
    # An account that is not configured (a removed one) may be named: nothing of it here.
    gone = _cli(app, "prune", "--account", "old-shop", "--json")
    assert gone.exit_code == 0, gone.output
    assert json.loads(gone.output)["events"] == 0 and _counts(app)["events"] == {"us": 2}
    bad = _cli(app, "prune", "--account", "Not An Id")
    assert bad.exit_code == 2 and "not an account id" in bad.output
    # Without --account: every account, as before.
    result = _cli(app, "prune", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["accounts"] is None
    assert _counts(app)["events"] == {}


def test_retention_with_an_account_runs_for_that_account_only(make_app: AppFactory) -> None:
    app = _app(make_app)
    store = _store(app)
    now = [T0]
    store.clock = lambda: now[0]
    _fill(app)
    now[0] = T0 + timedelta(days=100)  # past done=90 and conflicts=90, not dead=180
    result = _cli(app, "retention", "--account", "us", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["accounts"] == ["us"]
    assert report["pruned"]["events"] == 1 and report["pruned"]["conflicts"] == 1
    assert _counts(app)["events"] == {"eu": 2, "us": 1}
    assert "in account(s) us" in _cli(app, "retention", "--account", "us", "--dry-run").output


def test_rotate_keys_for_one_account_leaves_the_others_under_their_key(
    make_app: AppFactory,
) -> None:
    old = _app(make_app)
    _fill(old)
    new = _app(make_app, keys=f"k2:{KEY2},k1:{KEY1}")
    # Under k2 the hash of OTHER differs: eu records it a second time (one body, two keys).
    assert _post(new, "eu", OTHER) == "conflict"
    rotation = _store(new).rotation
    assert rotation.status(accounts=["us"])["remaining"] == {
        "events": 2,
        "conflicts": 1,
        "rejections": 1,
        "handler_errors": 1,
        "order_refs": 2,  # the events' order references (their metadata.order_id)
        "accounts": 0,  # none in hookledger's own account table
    }
    dry = _cli(new, "rotate-keys", "--account", "eu", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["accounts"] == ["eu"]
    result = _cli(new, "rotate-keys", "--account", "eu", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["accounts"] == ["eu"] and report["complete"]
    assert report["rotated"] == {
        "events": 2,
        "conflicts": 1,  # the k1 copy of the body eu holds under k2 is deleted, not sealed
        "rejections": 1,
        "handler_errors": 1,
        "order_refs": 2,
    }
    keys = _by_account(
        new,
        "SELECT account || ':' || coalesce(key_id, '-'), count(*) FROM hookledger_event "
        "GROUP BY account, key_id",
    )
    assert keys == {"eu:k2": 2, "us:k1": 2}
    status = _cli(new, "keys", "status", "--account", "us", "--json")
    assert json.loads(status.output)["remaining"]["handler_errors"] == 1
    # Rotating the rest: us's conflict record is us's own, never taken for a copy of eu's.
    result = _cli(new, "rotate-keys", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["accounts"] is None
    assert _counts(new)["conflicts"] == {"eu": 1, "us": 1}
    assert rotation.status()["remaining"] == {
        "events": 0,
        "conflicts": 0,
        "rejections": 0,
        "handler_errors": 0,
        "order_refs": 0,
        "accounts": 0,
    }


def test_show_an_event_id_in_several_accounts_asks_for_the_account(
    make_app: AppFactory,
) -> None:
    app = _app(make_app)
    for account in SECRET:
        assert _post(app, account, DONE) == "inserted"
    assert _post(app, "us", DEAD) == "inserted"
    result = _cli(app, "show", "evt_done")
    assert result.exit_code == 2, result.output
    assert "eu, us" in result.output and "--account" in result.output
    shown = _cli(app, "show", "evt_done", "--account", "us", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["account"] == "us"
    text = _cli(app, "show", "evt_done", "--account", "eu")
    assert text.exit_code == 0 and "account    eu" in text.output
    # An id in one account only needs no --account; an inbox id never does.
    assert json.loads(_cli(app, "show", "evt_dead", "--json").output)["account"] == "us"
    pk = store_pk(app, "evt_done", "us")
    assert json.loads(_cli(app, "show", f"#{pk}", "--json").output)["account"] == "us"
    missing = _cli(app, "show", "evt_dead", "--account", "eu")
    assert missing.exit_code == 1 and "in account 'eu'" in missing.output


def store_pk(app: Flask, event_id: str, account: str) -> int:
    row = _store(app).operations.get(event_id, account=account)
    assert row is not None and row.id is not None
    return row.id


def test_requeue_with_an_account_requeues_that_accounts_dead_letters_only(
    make_app: AppFactory,
) -> None:
    app = _app(make_app)
    _fill(app)
    result = _cli(app, "requeue", "--account", "eu", "--json")
    assert result.exit_code == 0, result.output
    requeued = json.loads(result.output)["requeued"]
    assert [(r["account"], r["event_id"]) for r in requeued] == [("eu", "evt_dead")]
    operations = _store(app).operations
    assert operations.get("evt_dead", account="us").status == "dead"  # type: ignore[union-attr]
    assert operations.get("evt_dead", account="eu").status == "pending"  # type: ignore[union-attr]


def test_conflicts_with_an_account_lists_that_accounts_only(make_app: AppFactory) -> None:
    app = _app(make_app)
    _fill(app)
    every = json.loads(_cli(app, "conflicts", "--json").output)["conflicts"]
    assert sorted(c["account"] for c in every) == ["eu", "us"]
    result = _cli(app, "conflicts", "--account", "us", "--json")
    assert result.exit_code == 0, result.output
    only = json.loads(result.output)["conflicts"]
    assert [(c["account"], c["event_id"]) for c in only] == [("us", "evt_done")]
    assert only[0]["event_type"] == "payment_succeeded"  # joined with its own account's event
    text = _cli(app, "conflicts", "--account", "eu", "--account", "us")
    assert text.exit_code == 0 and "2 conflict(s) listed" in text.output


def test_events_by_object_in_every_account_each_naming_its_account(
    make_app: AppFactory,
) -> None:
    """Issue 28, hole 10: outside the default account an object's key is
    ``account/kind:id``, so ``events --account eu --object payment:pay_1`` (the form the README
    shows) listed nothing. ``kind:id`` now finds the object in the accounts chosen, or in every
    account, each line naming its account; ``account/kind:id`` and an id alone work too."""
    from tests.conftest import SECRETS

    app, _ = make_app(_hooks(), accounts=ACCOUNTS)  # the default account beside eu and us
    secrets = {**SECRET, "default": SECRETS["primary"]}
    for account in ("default", "eu", "us"):
        headers = signed_headers(DONE, secrets[account])
        response = app.test_client().post(f"/webhooks/{account}/", data=DONE, headers=headers)
        assert response.status_code == 200, response.get_data()
    assert _post(app, "eu", DEAD) == "inserted"

    def listed(*args: str) -> list[tuple[str, str]]:
        result = _cli(app, "events", *args, "--json")
        assert result.exit_code == 0, result.output
        return sorted((r["account"], r["event_id"]) for r in json.loads(result.output)["listed"])

    assert listed("--account", "eu", "--object", "payment:pay_1") == [("eu", "evt_done")]
    assert listed("--account", "eu", "--account", "us", "--object", "payment:pay_1") == [
        ("eu", "evt_done"),
        ("us", "evt_done"),
    ]
    assert listed("--object", "payment:pay_1") == [
        ("default", "evt_done"),
        ("eu", "evt_done"),
        ("us", "evt_done"),
    ]
    assert listed("--object", "us/payment:pay_1") == [("us", "evt_done")]
    assert listed("--object", "default/payment:pay_1") == [("default", "evt_done")]
    assert listed("--account", "default", "--object", "payment:pay_1") == [("default", "evt_done")]
    assert listed("--object", "pay_2") == [("eu", "evt_dead")]
    assert listed("--account", "us", "--object", "payment:pay_2") == []
    assert listed("--object", "refund:pay_1") == []
    text = _cli(app, "events", "--object", "payment:pay_1")
    assert text.exit_code == 0, text.output
    lines = text.output.strip().splitlines()
    assert sorted(line.split()[3] for line in lines[:3]) == ["default", "eu", "us"]
    assert lines[-1] == "3 event(s) listed"
