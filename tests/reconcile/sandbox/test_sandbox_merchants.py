"""Several merchants on one sandbox base URL (:mod:`reconcile.sandbox.merchants`), as
Hyperswitch serves them: the ``api-key`` picks the merchant, the events API is routed by the
merchant id in its path, each merchant's webhooks go to its own URL signed with its own
secret, and the same ``payment_id`` lives in each merchant independently. Every 200 answer is
validated against the OpenAPI contract, as ``test_sandbox_schema`` validates a single
sandbox's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import requests

from receiver.core.errors import ConfigurationError
from reconcile.sandbox import (
    FrozenClock,
    MerchantsApp,
    MerchantsServer,
    Sandbox,
    create_app,
    mount_wsgi,
)
from reconcile.sandbox.__main__ import build_parser, main, merchant_options
from tests.reconcile.sandbox.contract_schema import errors, ref, response_schema, validate
from tests.reconcile.sandbox.sandbox_support import (
    FAST_RETRIES,
    RecordingSender,
    Sent,
    WebhookSink,
    card,
)
from tests.support import serve

BASE = "http://processor.test"
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
MERCHANTS = {
    "merchant_eu": {
        "api_key": "snd_eu_key_0123456789",
        "admin_api_key": "admin_eu_0123456789",
        "webhook_secret": "whsec_eu_abcdefghijklmnopqrstuvwxyz",
        "profile_id": "pro_eu",
    },
    "merchant_us": {
        "api_key": "snd_us_key_0123456789",
        "admin_api_key": "admin_us_0123456789",
        "webhook_secret": "whsec_us_abcdefghijklmnopqrstuvwxyz",
        "profile_id": "pro_us",
    },
}
EU, US = MERCHANTS["merchant_eu"], MERCHANTS["merchant_us"]
EVERY_KEY = [v for m in MERCHANTS.values() for k, v in m.items() if k != "profile_id"]


def make(merchant_id: str, **options: Any) -> Sandbox:
    settings = MERCHANTS[merchant_id]
    return Sandbox(
        settings["api_key"],
        merchant_id=merchant_id,
        profile_id=settings["profile_id"],
        admin_api_key=settings["admin_api_key"],
        webhook_secret=settings["webhook_secret"],
        **options,
    )


class Caller:
    """Requests to the shared base URL with one key; 200 answers are checked against the
    contract (``template`` is the OpenAPI path)."""

    def __init__(self, session: requests.Session, key: str | None) -> None:
        self.session, self.key = session, key

    def send(self, method: str, path: str, body: Any = None) -> requests.Response:
        headers = {} if self.key is None else {"api-key": self.key}
        kwargs: dict[str, Any] = {"headers": headers, "timeout": 5}
        if body is not None:
            kwargs["params" if method == "GET" else "json"] = body
        return self.session.request(method, BASE + path, **kwargs)

    def ok(self, method: str, path: str, template: str, body: Any = None) -> Any:
        response = self.send(method, path, body)
        assert response.status_code == 200, (method, path, response.text)
        data = response.json()
        problems = errors(response_schema(method, template), data)
        assert not problems, f"{method} {path}:\n" + "\n".join(problems)
        return data

    def pay(self, number: str, **body: Any) -> Any:
        payload = {
            "amount": 1000,
            "currency": "USD",
            "confirm": True,
            "payment_method": "card",
            "payment_method_data": card(number),
            **body,
        }
        return self.ok("POST", "/payments", "/payments", payload)


@pytest.fixture
def senders() -> dict[str, RecordingSender]:
    return {merchant_id: RecordingSender() for merchant_id in MERCHANTS}


@pytest.fixture
def platform(senders: dict[str, RecordingSender]) -> MerchantsApp:
    """Two merchants on the frozen clock, each delivering to its own sender and URL."""
    clock = FrozenClock(T0)
    return MerchantsApp(
        make(m, now=clock, send=senders[m], webhook_url=f"http://shop.test/hooks/{m}")
        for m in MERCHANTS
    )


@pytest.fixture
def session(platform: MerchantsApp) -> Iterator[requests.Session]:
    with requests.Session() as s:
        mount_wsgi(s, BASE, platform)
        yield s


def test_the_same_payment_id_lives_in_each_merchant_and_each_key_sees_only_its_own(
    platform: MerchantsApp, session: requests.Session
) -> None:
    eu, us = Caller(session, EU["api_key"]), Caller(session, US["api_key"])
    made_eu = eu.pay("4242424242424242", payment_id="pay_same", amount=5000, currency="EUR")
    made_us = us.pay("4000000000000002", payment_id="pay_same", amount=700)
    assert (made_eu["status"], made_us["status"]) == ("succeeded", "failed")
    assert made_eu["merchant_id"] == "merchant_eu" and made_us["merchant_id"] == "merchant_us"
    eu.pay("4242424242424242", payment_id="pay_eu_only")
    eu.ok("POST", "/refunds", "/refunds", {"payment_id": "pay_same", "amount": 1000})
    platform.sandbox("merchant_eu").open_dispute("pay_same", amount=500)

    got_eu = eu.ok("GET", "/payments/pay_same", "/payments/{payment_id}")
    got_us = us.ok("GET", "/payments/pay_same", "/payments/{payment_id}")
    assert (got_eu["amount"], got_eu["status"], got_eu["currency"]) == (5000, "succeeded", "EUR")
    assert (got_us["amount"], got_us["status"], got_us["currency"]) == (700, "failed", "USD")
    missing = us.send("GET", "/payments/pay_eu_only")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "IR_05"

    def ids(caller: Caller) -> dict[str, list[str]]:
        return {
            "get": [
                p["payment_id"]
                for p in caller.ok("GET", "/payments/list", "/payments/list", {"limit": 100})[
                    "data"
                ]
            ],
            "post": [
                p["payment_id"]
                for p in caller.ok("POST", "/payments/list", "/payments/list", {"limit": 100})[
                    "data"
                ]
            ],
            "refunds": [
                r["payment_id"]
                for r in caller.ok("POST", "/refunds/list", "/refunds/list", {"limit": 100})["data"]
            ],
            "disputes": [
                d["payment_id"] for d in caller.ok("GET", "/disputes/list", "/disputes/list")
            ],
        }

    assert ids(eu) == {
        "get": ["pay_eu_only", "pay_same"],
        "post": ["pay_eu_only", "pay_same"],
        "refunds": ["pay_same"],
        "disputes": ["pay_same"],
    }
    assert ids(us) == {"get": ["pay_same"], "post": ["pay_same"], "refunds": [], "disputes": []}
    assert platform.sandbox("merchant_us").get_payment("pay_same")["amount"] == 700


def test_an_unknown_key_is_refused_exactly_as_a_single_sandbox_refuses_it(
    session: requests.Session,
) -> None:
    single = Sandbox(EU["api_key"], merchant_id="merchant_eu")
    with requests.Session() as alone:
        mount_wsgi(alone, "http://single.test", create_app(single))
        for key in (None, "", "snd_nobody_0123456789", EU["admin_api_key"]):
            headers = {} if key is None else {"api-key": key}
            for method, path in (("GET", "/health"), ("POST", "/payments/list")):
                shared = session.request(method, BASE + path, headers=headers, timeout=5)
                own = alone.request(method, "http://single.test" + path, headers=headers)
                assert shared.status_code == own.status_code == 401
                assert shared.content == own.content
                assert shared.json()["error"]["code"] == "AU_01"
                assert set(shared.headers) == set(own.headers)
                assert "X-RateLimit-Remaining" in shared.headers
    assert Caller(session, US["api_key"]).send("GET", "/health").status_code == 200


def test_the_events_api_is_routed_by_the_merchant_in_its_path(
    platform: MerchantsApp, session: requests.Session, senders: dict[str, RecordingSender]
) -> None:
    Caller(session, EU["api_key"]).pay("4242424242424242", payment_id="pay_same")
    Caller(session, US["api_key"]).pay("4000000000000002", payment_id="pay_same")
    for sandbox in platform.sandboxes:
        sandbox.deliver_due()
    eu_admin, us_admin = Caller(session, EU["admin_api_key"]), Caller(session, US["admin_api_key"])
    listing = "/events/{merchant_id}"
    eu_events = eu_admin.ok("POST", "/events/merchant_eu", listing, {})["events"]
    us_events = us_admin.ok("POST", "/events/pro_us", listing, {})["events"]  # a profile id too
    assert [e["event_type"] for e in eu_events] == ["payment_succeeded"]
    assert [e["event_type"] for e in us_events] == ["payment_failed"]
    assert eu_events[0]["merchant_id"] == "merchant_eu"
    event_id = us_events[0]["event_id"]
    attempts = us_admin.ok(
        "GET",
        f"/events/merchant_us/{event_id}/attempts",
        "/events/{merchant_id}/{event_id}/attempts",
    )
    assert attempts and attempts[0]["event_id"] == event_id
    retried = us_admin.ok(
        "POST", f"/events/merchant_us/{event_id}/retry", "/events/{merchant_id}/{event_id}/retry"
    )
    assert (
        retried["initial_attempt_id"] == event_id and retried["delivery_attempt"] == "manual_retry"
    )
    assert [len(senders[m].sent) for m in MERCHANTS] == [1, 2]  # us's own URL, once more
    assert senders["merchant_us"].sent[-1].body == senders["merchant_us"].sent[0].body
    # Another merchant's admin key, a merchant key, no key: 401 (the path's merchant checks).
    for caller in (eu_admin, Caller(session, US["api_key"]), Caller(session, None)):
        refused = caller.send("POST", "/events/merchant_us", {})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "AU_01"
    unknown = eu_admin.send("POST", "/events/merchant_nobody", {})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "IR_05"
    assert Caller(session, "wrong").send("POST", "/events/merchant_nobody", {}).status_code == 401
    # An admin key is no API key.
    assert eu_admin.send("GET", "/payments/pay_same").status_code == 401


def test_each_merchant_sends_its_webhooks_to_its_url_signed_with_its_secret(
    platform: MerchantsApp, session: requests.Session, senders: dict[str, RecordingSender]
) -> None:
    Caller(session, EU["api_key"]).pay("4242424242424242", payment_id="pay_same")
    Caller(session, US["api_key"]).pay("4242424242424242", payment_id="pay_same")
    for sandbox in platform.sandboxes:
        sandbox.deliver_due()
    for merchant_id, sender in senders.items():
        (sent,) = sender.sent
        body = json.loads(sent.body)
        validate("OutgoingWebhook", body)
        assert sent.url == f"http://shop.test/hooks/{merchant_id}"
        assert body["merchant_id"] == merchant_id
        assert body["content"]["object"]["payment_id"] == "pay_same"
        assert body["content"]["object"]["profile_id"] == MERCHANTS[merchant_id]["profile_id"]
        assert verified_by(sent) == merchant_id


def verified_by(sent: Sent) -> str | None:
    """The merchant whose secret (and only whose) verifies a webhook."""
    verifying = [m for m, s in MERCHANTS.items() if sent.verified(s["webhook_secret"])]
    assert len(verifying) <= 1
    return verifying[0] if verifying else None


def test_the_sandbox_admin_routes_are_per_merchant(
    platform: MerchantsApp, session: requests.Session
) -> None:
    listing = session.get(BASE + "/__sandbox/merchants", timeout=5)
    assert listing.status_code == 200
    assert [m["merchant_id"] for m in listing.json()] == ["merchant_eu", "merchant_us"]
    assert not any(secret in listing.text for secret in EVERY_KEY)
    faults = {"webhooks": {"drop": 1.0}}
    set_eu = session.post(BASE + "/__sandbox/merchants/merchant_eu/faults", json=faults)
    assert set_eu.status_code == 200 and set_eu.json()["webhooks"]["drop"] == 1.0
    assert platform.sandbox("merchant_us").faults.to_json()["webhooks"]["drop"] == 0.0
    stats = session.get(BASE + "/__sandbox/merchants/pro_us/stats", timeout=5)
    assert stats.status_code == 200
    short = session.get(BASE + "/__sandbox/stats", timeout=5)
    assert short.status_code == 404 and "/__sandbox/merchants/<merchant_id>/stats" in short.text
    nobody = session.get(BASE + "/__sandbox/merchants/nobody/stats", timeout=5)
    assert nobody.status_code == 404 and nobody.json()["error"]["code"] == "IR_05"
    assert session.post(BASE + "/__sandbox/merchants", json={}).status_code == 405
    for response in (listing, short, nobody):
        assert "X-RateLimit-Limit" in response.headers


def test_ids_and_keys_must_tell_the_merchants_apart() -> None:
    with pytest.raises(ConfigurationError, match="at least one"):
        MerchantsApp([])
    with pytest.raises(ConfigurationError, match="'merchant_eu' is used twice"):
        MerchantsApp([make("merchant_eu"), make("merchant_eu")])
    with pytest.raises(ConfigurationError, match="'pro_sandbox' is used twice"):
        MerchantsApp(
            [Sandbox("snd_a_0123", merchant_id="a"), Sandbox("snd_b_0123", merchant_id="b")]
        )
    with pytest.raises(ConfigurationError, match="same API key") as caught:
        MerchantsApp(
            [make("merchant_eu"), Sandbox(EU["api_key"], merchant_id="m2", profile_id="p2")]
        )
    assert EU["api_key"] not in str(caught.value)
    app = MerchantsApp([make("merchant_eu"), make("merchant_us")])
    server = MerchantsServer(app.sandboxes)
    for shown in (repr(app), repr(server)):
        assert "merchant_eu" in shown and not any(key in shown for key in EVERY_KEY)


def test_the_server_serves_every_merchant_over_http_and_delivers_their_webhooks() -> None:
    sinks = {m: WebhookSink() for m in MERCHANTS}
    with serve(sinks["merchant_eu"].app) as eu_url, serve(sinks["merchant_us"].app) as us_url:
        urls = {"merchant_eu": eu_url + "/webhooks", "merchant_us": us_url + "/webhooks"}
        sandboxes = [make(m, webhook_url=urls[m], retry_schedule=FAST_RETRIES) for m in MERCHANTS]
        with MerchantsServer(sandboxes) as server, requests.Session() as http:
            for merchant_id, settings in MERCHANTS.items():
                response = http.post(
                    server.base_url + "/payments",
                    headers={"api-key": settings["api_key"]},
                    json={
                        "amount": 1000,
                        "currency": "USD",
                        "confirm": True,
                        "payment_id": "pay_same",
                        "payment_method": "card",
                        "payment_method_data": card(),
                    },
                    timeout=5,
                )
                assert response.status_code == 200, response.text
                assert server.sandbox(merchant_id).public_url == server.base_url
            for sandbox in server.sandboxes:
                assert sandbox.flush_webhooks(5)
            assert server.admin_url("pro_eu").endswith("/__sandbox/merchants/merchant_eu")
    for merchant_id, sink in sinks.items():
        (delivery,) = sink.wait_for(1)
        assert json.loads(delivery.body)["merchant_id"] == merchant_id
        secret = MERCHANTS[merchant_id]["webhook_secret"]
        other = next(s["webhook_secret"] for m, s in MERCHANTS.items() if m != merchant_id)
        assert delivery.verified(secret) and not delivery.verified(other)


# -- python -m reconcile.sandbox with several merchants ----------------------------------------


def test_merchants_come_from_the_option_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SANDBOX_MERCHANTS", json.dumps({"merchant_us": {"api_key": "snd_us_1"}}))
    args = build_parser().parse_args(
        [
            "--admin-api-key",
            "admin_all",
            "--merchant",
            "merchant_eu:snd_eu_1:sec_eu:http://127.0.0.1:9/hooks/eu",
            "--merchant",
            "merchant_xx:snd_xx_1",
        ]
    )
    found = {m["merchant_id"]: m for m in merchant_options(args)}
    assert found["merchant_eu"] == {
        "merchant_id": "merchant_eu",
        "api_key": "snd_eu_1",
        "webhook_secret": "sec_eu",
        "webhook_url": "http://127.0.0.1:9/hooks/eu",
        "profile_id": "pro_merchant_eu",
        "admin_api_key": "admin_all",
    }
    assert found["merchant_xx"]["webhook_url"] is None
    assert found["merchant_us"]["api_key"] == "snd_us_1"
    assert found["merchant_us"]["admin_api_key"] == "admin_all"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--merchant", "merchant_eu"], None, "expected MERCHANT_ID:API_KEY"),
        (["--merchant", "m:snd_key_secret_1::http://x/"], None, "expected MERCHANT_ID:API_KEY"),
        ([], "[1]", "SANDBOX_MERCHANTS must be a JSON object"),
        ([], '{"m": {"api_key": "snd_key_secret_1", "secret": "x"}}', "unknown setting"),
        ([], '{"m": {"api_key": "snd_key_secret_1", "webhook_url": "http://x/"}}', "needs a"),
        (["--merchant", "a:snd_key_secret_1", "--merchant", "b:snd_key_secret_1"], None, "same"),
    ],
)
def test_bad_merchants_are_refused_without_showing_a_key(
    argv: list[str],
    env: str | None,
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SANDBOX_API_KEY", raising=False)
    if env is None:
        monkeypatch.delenv("SANDBOX_MERCHANTS", raising=False)
    else:
        monkeypatch.setenv("SANDBOX_MERCHANTS", env)
    assert main([*argv, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert message in err and "snd_key_secret_1" not in err


@pytest.mark.slow
def test_python_m_serves_several_merchants_until_sigterm() -> None:
    env = {
        **os.environ,
        "SANDBOX_API_KEY": EU["api_key"],
        "SANDBOX_MERCHANT_ID": "merchant_eu",
        "SANDBOX_MERCHANTS": json.dumps({"merchant_us": {"api_key": US["api_key"]}}),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "reconcile.sandbox", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout=30)
    try:
        assert lines and lines[0].startswith("http://127.0.0.1:"), lines
        base_url = lines[0].strip()
        with requests.Session() as http:
            for merchant_id, key in (
                ("merchant_eu", EU["api_key"]),
                ("merchant_us", US["api_key"]),
            ):
                made = http.post(
                    base_url + "/payments",
                    headers={"api-key": key},
                    json={"amount": 100, "currency": "USD", "payment_id": "pay_same"},
                    timeout=5,
                )
                assert made.status_code == 200 and made.json()["merchant_id"] == merchant_id
            merchants = http.get(base_url + "/__sandbox/merchants", timeout=5).json()
            assert [m["profile_id"] for m in merchants] == ["pro_sandbox", "pro_merchant_us"]
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=15)
    assert process.returncode == 0
    assert EU["api_key"] not in out + err and US["api_key"] not in out + err


def test_every_answer_of_a_shared_url_is_one_merchants_contract_answer(
    session: requests.Session,
) -> None:
    """The router adds nothing to a merchant's answers: a payment validates as
    ``PaymentsResponse`` whichever merchant answered it."""
    for key in (EU["api_key"], US["api_key"]):
        made = Caller(session, key).pay("4242424242424242", payment_id="pay_same")
        validate(ref("PaymentsResponse"), made)
