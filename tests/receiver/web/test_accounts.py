"""Several processor accounts in one installation: routing, refusal across accounts, the same
ids in two accounts living two lives, and an upgrade of a one-account database in place."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from freezegun import freeze_time

import receiver.storage.database as db
from receiver.core.accounts import (
    DEFAULT_ACCOUNT,
    Account,
    StaticAccounts,
    object_key,
    parse_accounts,
)
from receiver.core.errors import ConfigurationError, NotTheAccounts
from receiver.core.events import Event, parse_event
from receiver.core.signature import Secret
from receiver.extension import WebhookReceiver
from receiver.testing import WebhookTestClient, signed_headers
from receiver.testing.factories import build_event, encode
from tests.conftest import SECRETS, AppFactory

pytestmark = pytest.mark.storage

EU_SECRET = "whsec_eu_0123456789abcdef"
US_SECRET = "whsec_us_fedcba9876543210"
ACCOUNTS = {
    "eu": {"merchant_id": "merchant_eu", "secrets": f"k1:{EU_SECRET}"},
    "us": {"merchant_id": "merchant_us", "secrets": f"k1:{US_SECRET}"},
}


class Seen:
    """A handler that records what it was given."""

    def __init__(self) -> None:
        self.hooks = WebhookReceiver()
        self.events: list[tuple[str, str, str]] = []

        @self.hooks.on_any()
        def record(event: Event) -> None:
            ref = event.object_ref
            assert ref is not None
            self.events.append((event.account, ref.object_id, event.event_type))


def _two_accounts(make_app: AppFactory, seen: Seen | None = None, **config: Any) -> Flask:
    app, _ = make_app(
        seen.hooks if seen else None, secrets="", accounts=json.dumps(ACCOUNTS), **config
    )
    return app


def _post(app: Flask, url: str, body: dict[str, Any], secret: str) -> tuple[int, Any]:
    raw = encode(body)
    response = app.test_client().post(url, data=raw, headers=signed_headers(raw, secret))
    return response.status_code, response.get_json()


def _stored(app: Flask) -> list[tuple[str, str]]:
    store = WebhookReceiver.state(app).store
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT account, event_id FROM hookledger_event ORDER BY id")
        ).all()
    return [(r[0], r[1]) for r in rows]


def test_the_same_payment_id_lives_two_independent_lives(make_app: AppFactory) -> None:
    seen = Seen()
    app = _two_accounts(make_app, seen)
    # The same event id and payment id in both accounts: two events, two objects.
    eu = build_event(
        "payment_succeeded", object_id="pay_1", event_id="evt_same", merchant_id="merchant_eu"
    )
    us = build_event(
        "payment_failed", object_id="pay_1", event_id="evt_same", merchant_id="merchant_us"
    )
    assert _post(app, "/webhooks/eu/", eu, EU_SECRET)[1]["status"] == "inserted"
    assert _post(app, "/webhooks/us/", us, US_SECRET)[1]["status"] == "inserted"
    # A redelivery is a duplicate in its own account only.
    assert _post(app, "/webhooks/eu/", eu, EU_SECRET)[1]["status"] == "duplicate"
    WebhookTestClient(app, account="eu").drain()
    assert sorted(seen.events) == [
        ("eu", "pay_1", "payment_succeeded"),
        ("us", "pay_1", "payment_failed"),
    ]
    operations = WebhookReceiver.state(app).store.operations
    eu_row = operations.projection("payment", "pay_1", account="eu")
    us_row = operations.projection("payment", "pay_1", account="us")
    assert eu_row is not None and eu_row.status == "succeeded"
    assert us_row is not None and us_row.status == "failed"
    assert operations.projection("payment", "pay_1") is None  # not the default account's
    # A later state of the eu payment is judged against the eu projection only.
    refund_eu = build_event(
        "payment_succeeded", object_id="pay_1", event_id="evt_again", merchant_id="merchant_eu"
    )
    _post(app, "/webhooks/eu/", refund_eu, EU_SECRET)
    WebhookTestClient(app, account="eu").drain()
    assert Counter(a for a, _, _ in seen.events) == Counter(eu=1, us=1)
    assert operations.get("evt_same", account="us").account == "us"  # type: ignore[union-attr]


def test_a_body_for_one_account_posted_to_another_is_refused_and_stores_nothing(
    make_app: AppFactory,
) -> None:
    app = _two_accounts(make_app)
    eu = build_event("payment_succeeded", merchant_id="merchant_eu")
    # Signed with eu's secret, posted to us: us's secrets alone verify it.
    status, answer = _post(app, "/webhooks/us/", eu, EU_SECRET)
    assert (status, answer["error"]["code"]) == (401, "HL_01")
    # Signed with us's secret (a shared secret, say) but naming eu's merchant: refused.
    status, answer = _post(app, "/webhooks/us/", eu, US_SECRET)
    assert (status, answer["error"]["code"]) == (403, "HL_08")
    # An account that does not exist, and an id that cannot be one.
    for url in ("/webhooks/asia/", "/webhooks/Not%20An%20Id/"):
        status, answer = _post(app, url, eu, EU_SECRET)
        assert (status, answer["error"]["code"]) == (404, "HL_07"), url
    assert _stored(app) == []


def test_the_shared_url_routes_by_merchant_and_verifies_with_that_account_only(
    make_app: AppFactory,
) -> None:
    seen = Seen()
    app = _two_accounts(make_app, seen)
    eu = build_event("payment_succeeded", merchant_id="merchant_eu", object_id="pay_eu")
    us = build_event("payment_succeeded", merchant_id="merchant_us", object_id="pay_us")
    assert _post(app, "/webhooks/", eu, EU_SECRET)[0] == 200
    assert _post(app, "/webhooks/", us, US_SECRET)[0] == 200
    # eu's body with us's secret: the other account's secret never verifies it.
    forged = build_event("payment_failed", merchant_id="merchant_eu", object_id="pay_eu")
    status, answer = _post(app, "/webhooks/", forged, US_SECRET)
    assert (status, answer["error"]["code"]) == (401, "HL_01")
    nobody = build_event("payment_succeeded", merchant_id="merchant_xx")
    status, answer = _post(app, "/webhooks/", nobody, EU_SECRET)
    assert (status, answer["error"]["code"]) == (404, "HL_07")
    assert [a for a, _ in _stored(app)] == ["eu", "us"]
    WebhookTestClient(app, account="eu").drain()
    assert sorted(seen.events) == [
        ("eu", "pay_eu", "payment_succeeded"),
        ("us", "pay_us", "payment_succeeded"),
    ]


def test_business_profiles_of_one_merchant_are_accounts_of_their_own(
    make_app: AppFactory,
) -> None:
    profiles = {
        "brand_a": {"merchant_id": "m_1", "profile_ids": ["pro_a"], "secrets": "k:secret_a"},
        "brand_b": {"merchant_id": "m_1", "profile_ids": ["pro_b"], "secrets": "k:secret_b"},
    }
    app, _ = make_app(secrets="", accounts=json.dumps(profiles))
    a = build_event("payment_succeeded", merchant_id="m_1", profile_id="pro_a")
    b = build_event("payment_succeeded", merchant_id="m_1", profile_id="pro_b")
    assert _post(app, "/webhooks/", a, "secret_a")[0] == 200
    assert _post(app, "/webhooks/", b, "secret_b")[0] == 200
    assert _post(app, "/webhooks/", b, "secret_a")[0] == 401
    # brand_b's body at brand_a's URL, even signed with brand_a's key: refused.
    assert _post(app, "/webhooks/brand_a/", b, "secret_a")[0] == 403
    assert [acc for acc, _ in _stored(app)] == ["brand_a", "brand_b"]


#: A merchant's catch-all account (no profiles) and a brand naming its profile, both signing
#: with the merchant's key (a profile inherits it unless given its own).
_CATCH_ALL_AND_BRAND = {
    "rest": {"merchant_id": "m_1", "secrets": "k:whsec_merchant_key_0001"},
    "brand_eu": {
        "merchant_id": "m_1",
        "profile_ids": ["pro_eu"],
        "secrets": "k:whsec_merchant_key_0001",
    },
}


def test_a_brands_delivery_at_the_catch_alls_url_is_refused(make_app: AppFactory) -> None:
    """Review of issue 28: a merchant's catch-all account (no profiles) and a brand naming its
    profile, both signing with the merchant's key (a profile inherits the merchant account's
    ``payment_response_hash_key`` unless given its own). A brand delivery sent to the
    catch-all's URL (its profile's webhook URL not yet moved when the brand was split out)
    was stored under the catch-all, while the brand's reconcile recovered the same payment
    under the brand: dispatched twice. It is refused (403 HL_08) as observe() refuses it."""
    profiles = _CATCH_ALL_AND_BRAND
    app, hooks = make_app(secrets="", accounts=json.dumps(profiles))
    eu = build_event("payment_succeeded", merchant_id="m_1", profile_id="pro_eu")
    uk = build_event("payment_succeeded", merchant_id="m_1", profile_id="pro_uk")
    status, answer = _post(app, "/webhooks/rest/", eu, "whsec_merchant_key_0001")
    assert (status, answer["error"]["code"]) == (403, "HL_08")
    assert "'brand_eu''s" in answer["error"]["message"]
    assert _post(app, "/webhooks/brand_eu/", eu, "whsec_merchant_key_0001")[0] == 200
    assert _post(app, "/webhooks/rest/", uk, "whsec_merchant_key_0001")[0] == 200
    with app.app_context(), pytest.raises(NotTheAccounts):
        hooks.observe(dict(eu["content"]["object"]), account="rest")
    assert [acc for acc, _ in _stored(app)] == ["brand_eu", "rest"]


def test_a_delivery_refused_as_another_accounts_is_not_this_accounts_first_delivery(
    make_app: AppFactory,
) -> None:
    """Review of issue 28: a signed delivery refused at an account's own URL because it is
    another account's (403 HL_08) was noted as that account's first delivery, which bounds
    the end of its history at adoption (five minutes before it): another account's traffic
    could move this account's go-live."""
    profiles = _CATCH_ALL_AND_BRAND
    app, _ = make_app(secrets="", accounts=json.dumps(profiles))
    eu = build_event("payment_succeeded", merchant_id="m_1", profile_id="pro_eu")
    assert _post(app, "/webhooks/rest/", eu, "whsec_merchant_key_0001")[0] == 403

    def first_deliveries() -> list[str]:
        store = WebhookReceiver.state(app).store
        with store.engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT account FROM hookledger_cutover WHERE name = 'first_delivery'")
            ).all()
        return sorted(r[0] for r in rows)

    assert first_deliveries() == []
    assert _post(app, "/webhooks/brand_eu/", eu, "whsec_merchant_key_0001")[0] == 200
    assert first_deliveries() == ["brand_eu"]


def test_the_default_account_keeps_todays_settings_beside_new_accounts(
    make_app: AppFactory,
) -> None:
    seen = Seen()
    app, hooks = make_app(
        seen.hooks, merchant_id="merchant_1234", accounts=json.dumps({"eu": ACCOUNTS["eu"]})
    )
    # Today's body (factories' merchant id) at today's URL, signed with today's secret.
    client = WebhookTestClient(app)
    assert client.send("payment_succeeded", object_id="pay_d").status_code == 200
    eu = build_event("payment_succeeded", merchant_id="merchant_eu", object_id="pay_d")
    assert _post(app, "/webhooks/", eu, EU_SECRET)[0] == 200
    client.drain()
    assert sorted(seen.events) == [
        ("default", "pay_d", "payment_succeeded"),
        ("eu", "pay_d", "payment_succeeded"),
    ]
    # observe() in an account: the api response dispatches in that account only.
    api = dict(build_event("payment_failed", object_id="pay_o")["content"]["object"])
    api_eu = {**api, "merchant_id": "merchant_eu"}
    with app.app_context():
        first = hooks.observe(api_eu, dispatch=True, account="eu")
        other = hooks.observe(api, dispatch=True)
        with pytest.raises(ConfigurationError, match="unknown account"):
            hooks.observe(api, account="nowhere")
    assert (first.status, other.status) == ("done", "done")
    assert ("eu", "pay_o", "payment_failed") in seen.events
    assert ("default", "pay_o", "payment_failed") in seen.events


def test_one_account_alone_takes_every_delivery_at_the_shared_url_as_before(
    make_app: AppFactory,
) -> None:
    app, _ = make_app()
    body = build_event("payment_succeeded", merchant_id="any_merchant_at_all")
    assert _post(app, "/webhooks/", body, SECRETS["primary"])[0] == 200
    assert [a for a, _ in _stored(app)] == [DEFAULT_ACCOUNT]
    # Its own URL works too.
    again = build_event("payment_succeeded")
    assert _post(app, "/webhooks/default/", again, SECRETS["primary"])[0] == 200


class Onboarding:
    """The merchant's own source: accounts appear and go while the app runs."""

    def __init__(self) -> None:
        self.accounts: dict[str, Account] = {}

    def get(self, account_id: str) -> Account | None:
        return self.accounts.get(account_id)

    def for_body(self, merchant_id: str | None, profile_id: str | None) -> Account | None:
        return StaticAccounts(self.accounts.values()).for_body(merchant_id, profile_id)

    def ids(self) -> list[str]:
        return list(self.accounts)


def test_accounts_from_the_merchants_source_come_and_go_without_a_restart(
    database_url: str,
) -> None:
    source = Onboarding()
    app = Flask("platform")
    app.config.update(HOOKLEDGER_DATABASE_URL=database_url, HOOKLEDGER_AUTO_MIGRATE=True)
    WebhookReceiver(app, accounts=source)  # no secret in the configuration at all
    try:
        body = build_event("payment_succeeded", merchant_id="m_seller_1")
        assert _post(app, "/webhooks/seller-1/", body, "seller_secret")[0] == 404
        source.accounts["seller-1"] = Account(
            id="seller-1",
            merchant_id="m_seller_1",
            secrets=(Secret.of("k", "seller_secret"),),
        )
        assert _post(app, "/webhooks/seller-1/", body, "seller_secret")[0] == 200
        assert _post(app, "/webhooks/", body, "seller_secret")[1]["status"] == "duplicate"
        source.accounts["seller-1"] = Account(
            id="seller-1",
            merchant_id="m_seller_1",
            secrets=(Secret.of("k", "seller_secret"),),
            active=False,
        )
        assert _post(app, "/webhooks/seller-1/", body, "seller_secret")[0] == 404
        assert [a for a, _ in _stored(app)] == ["seller-1"]  # its history stays
    finally:
        WebhookReceiver.state(app).store.engine.dispose()


def test_account_configuration_mistakes_are_one_clear_line() -> None:
    with pytest.raises(ConfigurationError, match="invalid account id"):
        parse_accounts({"EU shop": {"secrets": "k:x"}})
    with pytest.raises(ConfigurationError, match="reserved"):
        parse_accounts({"health": {"secrets": "k:x"}})
    with pytest.raises(ConfigurationError, match="unknown setting"):
        parse_accounts({"eu": {"secret": "k:x"}})
    with pytest.raises(ConfigurationError, match="not valid JSON"):
        parse_accounts('{"eu": ')
    with pytest.raises(ConfigurationError) as caught:
        parse_accounts({"eu": {"secrets": "k:\x01oops_secret"}})
    assert "oops_secret" not in str(caught.value)
    eu = parse_accounts({"eu": {"secrets": "k:very_secret", "api_key": "snd_key_123"}})[0]
    assert "very_secret" not in repr(eu) and "snd_key_123" not in repr(eu)
    with pytest.raises(ConfigurationError, match="configured twice"):
        StaticAccounts([eu, eu])


def test_account_settings_mistakes_stop_init_app(database_url: str) -> None:
    def init(**config: Any) -> None:
        app = Flask("x")
        app.config.update(
            HOOKLEDGER_DATABASE_URL=database_url,
            **{f"HOOKLEDGER_{k.upper()}": v for k, v in config.items()},
        )
        WebhookReceiver(app)
        WebhookReceiver.state(app).store.engine.dispose()

    with pytest.raises(ConfigurationError, match="has no webhook secret"):
        init(secrets="k:x", accounts=json.dumps({"eu": {"merchant_id": "m"}}))
    with pytest.raises(ConfigurationError, match="configured twice"):
        init(secrets="k:x", accounts=json.dumps({"default": {"secrets": "k:y"}}))


def test_object_keys_of_the_default_account_are_unchanged() -> None:
    assert object_key(DEFAULT_ACCOUNT, "payment", "pay_1") == "payment:pay_1"
    assert object_key("eu", "payment", "pay_1") == "eu/payment:pay_1"


T0 = datetime(2026, 3, 1, tzinfo=UTC)


def test_a_one_account_database_upgrades_in_place(database_url: str) -> None:
    """Rows written before accounts become the default account's; nothing is re-dispatched,
    their dedupe and guard hold, and a second account can use the same ids at once."""
    engine = db.make_engine(database_url)
    try:
        db.upgrade(engine, "0006")
        meta = sa.MetaData()
        meta.reflect(engine)
        body = encode(build_event("payment_succeeded", object_id="pay_old", event_id="evt_old"))
        event = parse_event(body)
        with engine.begin() as conn:
            conn.execute(
                meta.tables["hookledger_event"].insert(),
                {
                    "id": 7,
                    "event_id": "evt_old",
                    "source": "webhook",
                    "event_type": "payment_succeeded",
                    "content_type": event.content_type,
                    "object_kind": "payment",
                    "object_id": "pay_old",
                    "object_status": "succeeded",
                    "object_key": "payment:pay_old",
                    "event_time": T0,
                    "received_at": T0,
                    "body": body,
                    "headers": "{}",
                    "body_sha256": hashlib.sha256(body).hexdigest(),
                    "status": "done",
                    "attempts": 1,
                    "next_attempt_at": T0,
                },
            )
            conn.execute(
                meta.tables["hookledger_projection"].insert(),
                {
                    "object_kind": "payment",
                    "object_id": "pay_old",
                    "status": "succeeded",
                    "event_time": T0,
                    "event_pk": 7,
                    "updated_at": T0,
                },
            )
            conn.execute(
                meta.tables["hookledger_transition"].insert(),
                {
                    "object_kind": "payment",
                    "object_id": "pay_old",
                    "state": "succeeded",
                    "event_pk": 7,
                    "created_at": T0,
                },
            )
            conn.execute(
                meta.tables["hookledger_cutover"].insert(),
                {"name": "cutover", "mode": "new_account", "recorded_at": T0},
            )
        db.upgrade(engine)
        with engine.connect() as conn:
            for table in (
                "hookledger_event",
                "hookledger_projection",
                "hookledger_transition",
                "hookledger_cutover",
            ):
                accounts = conn.execute(sa.text(f"SELECT account FROM {table}")).scalars().all()
                assert accounts == ["default"], table
            key = conn.execute(sa.text("SELECT object_key FROM hookledger_event")).scalar_one()
            assert key == "payment:pay_old"
    finally:
        engine.dispose()
    seen = Seen()
    app = Flask("upgraded")
    app.config.update(
        HOOKLEDGER_DATABASE_URL=database_url,
        HOOKLEDGER_SECRETS="primary:" + SECRETS["primary"],
        HOOKLEDGER_ACCOUNTS=json.dumps({"eu": ACCOUNTS["eu"]}),
    )
    seen.hooks.init_app(app)
    try:
        client = WebhookTestClient(app)
        # The old delivery again: a duplicate (default account); the same state from a new
        # event: the guard remembers it was dispatched.
        assert client.post(body).get_json()["status"] == "duplicate"
        client.send("payment_succeeded", object_id="pay_old")
        # The same ids in the new account: its own first life.
        eu = build_event(
            "payment_succeeded", object_id="pay_old", event_id="evt_old", merchant_id="merchant_eu"
        )
        assert _post(app, "/webhooks/eu/", eu, EU_SECRET)[1]["status"] == "inserted"
        client.drain()
        assert seen.events == [("eu", "pay_old", "payment_succeeded")]
        with app.app_context():
            ids = WebhookReceiver.state(app).store.inbox.insert(
                event, body, account="eu", source="webhook"
            )
        # The default account's body under eu's event id: judged against eu's row (another
        # body: a conflict, kept in eu), never against the default account's.
        with app.app_context(), WebhookReceiver.state(app).store.engine.connect() as conn:
            kept = conn.execute(sa.text("SELECT account FROM hookledger_event_conflict")).all()
            eu_pk = conn.execute(
                sa.text(
                    "SELECT id FROM hookledger_event WHERE account = 'eu' AND event_id = 'evt_old'"
                )
            ).scalar_one()
        assert (ids.result, ids.pk) == ("conflict", eu_pk) and eu_pk != 7
        assert [r[0] for r in kept] == ["eu"]
    finally:
        WebhookReceiver.state(app).store.engine.dispose()


def test_a_flood_in_one_account_does_not_keep_another_waiting(make_app: AppFactory) -> None:
    """Workers take turns between accounts: the quiet account's event, received after a
    flood of the other's, is in the very next batch (FIFO would run it after the flood)."""
    app = _two_accounts(make_app)
    store = WebhookReceiver.state(app).store
    flood = [
        (build_event("payment_succeeded", merchant_id="merchant_eu"), "eu") for _ in range(300)
    ]
    for body, account in flood:
        raw = encode(body)
        store.inbox.insert(parse_event(raw), raw, account=account)
    quiet = encode(build_event("payment_succeeded", merchant_id="merchant_us", object_id="pay_q"))
    store.inbox.insert(parse_event(quiet), quiet, account="us")
    claimed = store.queue.claim_batch("w1", 60, limit=16)
    assert len(claimed) == 16
    assert [c.account for c in claimed].count("us") == 1
    # Within an account, due order still holds: eu's earliest come first.
    eu_ids = [c.pk for c in claimed if c.account == "eu"]
    assert eu_ids == sorted(eu_ids)


def test_operators_list_requeue_and_replay_one_account(make_app: AppFactory) -> None:
    app = _two_accounts(make_app)
    for account, merchant, secret in (
        ("eu", "merchant_eu", EU_SECRET),
        ("us", "merchant_us", US_SECRET),
    ):
        body = build_event("payment_succeeded", merchant_id=merchant, object_id="pay_op")
        assert _post(app, f"/webhooks/{account}/", body, secret)[0] == 200
    cli = app.test_cli_runner()
    listed = json.loads(
        cli.invoke(args=["hookledger", "events", "--account", "us", "--json"]).output
    )["listed"]
    assert [r["object"] for r in listed] == ["us/payment:pay_op"]
    replayed = cli.invoke(args=["hookledger", "replay", "--account", "eu", "--json"])
    assert replayed.exit_code == 0, replayed.output
    assert [acc for acc, _ in _stored(app)] == ["eu", "us", "eu"]  # the copy stays in eu
    requeued = json.loads(
        cli.invoke(args=["hookledger", "requeue", "--account", "us", "--dry-run", "--json"]).output
    )
    assert requeued["dry_run"] is True


def test_status_says_which_account_has_old_open_events(make_app: AppFactory) -> None:
    app = _two_accounts(make_app)
    body = build_event("payment_succeeded", merchant_id="merchant_us")
    assert _post(app, "/webhooks/us/", body, US_SECRET)[0] == 200
    cli = app.test_cli_runner()
    with freeze_time(datetime.now(UTC) + timedelta(minutes=30)):
        result = cli.invoke(args=["hookledger", "status", "--no-worker-ok"])
        shown = cli.invoke(args=["hookledger", "status", "--no-worker-ok", "--json"])
    assert result.exit_code == 1
    assert "oldest open event of account us is" in result.output
    assert "account us: open 1" in result.output
    assert json.loads(shown.output)["accounts"]["us"]["open"] == 1


SELLER_SECRET = "whsec_seller_0123456789abcdef"
SELLER = {
    "merchant_id": "merchant_seller",
    "profile_ids": "pro_seller",
    "secrets": f"k1:{SELLER_SECRET}",
}


def _api(event_type: str, object_id: str, **fields: Any) -> dict[str, Any]:
    """The object the processor's API returns (the content of its webhook)."""
    return dict(build_event(event_type, object_id=object_id, **fields)["content"]["object"])


@pytest.mark.parametrize("default_merchant", [None, "merchant_1234"], ids=["any", "named"])
def test_a_sellers_payment_observed_without_account_is_the_sellers(
    make_app: AppFactory, default_merchant: str | None
) -> None:
    """Issue 28, hole 7: observe() without account= filed a seller's payment under the
    default account, so the seller's own webhook dispatched it a second time. It now goes
    where the shared URL routes it: by its merchant_id and profile_id."""
    seen = Seen()
    config: dict[str, Any] = {"accounts": json.dumps({"seller": SELLER})}
    if default_merchant is not None:
        config["merchant_id"] = default_merchant
    app, hooks = make_app(seen.hooks, **config)
    paid = {"merchant_id": "merchant_seller", "profile_id": "pro_seller"}
    with app.app_context():
        seen_here = hooks.observe(_api("payment_succeeded", "pay_s", **paid), dispatch=True)
    assert seen_here.status == "done"
    webhook = build_event(
        "payment_succeeded",
        object_id="pay_s",
        merchant_id="merchant_seller",
        profile_id="pro_seller",
    )
    status, answer = _post(app, "/webhooks/seller/", webhook, SELLER_SECRET)
    assert (status, answer["status"]) == (200, "inserted")
    WebhookTestClient(app, account="seller").drain()
    WebhookTestClient(app).drain()
    assert seen.events == [("seller", "pay_s", "payment_succeeded")]  # once, the seller's
    operations = WebhookReceiver.state(app).store.operations
    assert operations.projection("payment", "pay_s") is None  # nothing in the default account
    row = operations.get(str(answer["event_id"]), account="seller")
    assert row is not None and row.status == "duplicate"
    # The seller's refund names no merchant: its profile, named by the seller, routes it.
    refund = _api("refund_succeeded", "ref_s", payment_id="pay_s", profile_id="pro_seller")
    assert "merchant_id" not in refund
    with app.app_context():
        hooks.observe(refund, dispatch=True)
    assert seen.events[-1] == ("seller", "ref_s", "refund_succeeded")


def test_observe_refuses_an_object_of_another_account_and_one_nobody_owns(
    make_app: AppFactory,
) -> None:
    """An explicit account= that the object's merchant or profile contradicts is refused,
    as a delivery to an account's URL naming another merchant is (403 HL_08); so is, without
    account=, an object no single account owns. Nothing is stored."""
    seen = Seen()
    app, hooks = make_app(
        seen.hooks, merchant_id="merchant_1234", accounts=json.dumps({"seller": SELLER})
    )
    sellers = _api(
        "payment_succeeded", "pay_s", merchant_id="merchant_seller", profile_id="pro_seller"
    )
    defaults = _api("payment_succeeded", "pay_d")  # merchant_1234, the default's
    with app.app_context():
        with pytest.raises(NotTheAccounts, match="account 'seller''s, not 'default''s"):
            hooks.observe(sellers, account="default")
        with pytest.raises(NotTheAccounts, match="account 'default''s, not 'seller''s"):
            hooks.observe(defaults, account="seller", dispatch=True)
        other_profile = {**sellers, "payment_id": "pay_p", "profile_id": "pro_elsewhere"}
        with pytest.raises(NotTheAccounts, match="not account 'seller''s"):
            hooks.observe(other_profile, account="seller")
        with pytest.raises(NotTheAccounts, match="no single account owns"):
            hooks.observe({**sellers, "payment_id": "pay_x", "merchant_id": "merchant_zzz"})
        unnamed = _api("refund_succeeded", "ref_x", profile_id="pro_nobody")
        with pytest.raises(NotTheAccounts, match="pass account="):
            hooks.observe(unnamed)
        assert _stored(app) == []
        # The right account, named or not, is taken.
        assert hooks.observe(sellers, account="seller").stored == "inserted"
        assert hooks.observe(defaults).stored == "inserted"
        assert hooks.observe(unnamed, account="default").stored == "inserted"
    assert sorted(a for a, _ in _stored(app)) == ["default", "default", "seller"]


def test_one_account_alone_observes_every_object_as_before(make_app: AppFactory) -> None:
    """One account: whatever merchant a payment names, and a mandate that names none."""
    app, hooks = make_app()
    with app.app_context():
        payment = _api("payment_succeeded", "pay_1", merchant_id="any_merchant_at_all")
        assert hooks.observe(payment).stored == "inserted"
        mandate = _api("mandate_active", "man_1")
        assert hooks.observe(mandate).stored == "inserted"
    assert [a for a, _ in _stored(app)] == [DEFAULT_ACCOUNT, DEFAULT_ACCOUNT]
