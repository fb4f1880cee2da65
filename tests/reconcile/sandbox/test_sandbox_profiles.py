"""Business profiles: one merchant, several profiles, each with its own webhook URL and key.

Hyperswitch signs a webhook with the ``payment_response_hash_key`` of the object's business
profile and sends it to that profile's URL; an object is created under the request's
``profile_id`` (the merchant's default profile when none), its refunds, disputes and
mandates belong to its payment's profile. The lists take ``profile_id`` where the real API
does (``POST /refunds/list``, ``POST /payouts/list``, ``GET /disputes/list``, the events
API) and refuse it where the real API's query has no such field (``GET /payments/list``,
``GET /payouts/list``: unknown parameters are a 400). Every answer here is also validated
against the contract.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from receiver.core.errors import ConfigurationError
from receiver.core.signature import Secret, verify
from reconcile.sandbox import FrozenClock, Sandbox, create_app, mount_wsgi
from reconcile.sandbox.merchants import MerchantsApp
from tests.reconcile.sandbox.sandbox_support import (
    ADMIN_KEY,
    API_KEY,
    BASE_URL,
    HOOK_URL,
    SECRET,
    RecordingSender,
    card,
)
from tests.reconcile.sandbox.test_sandbox_schema import Recorder

US_URL = "http://shop.test/webhooks/brand_us/"
US_KEY = "whsec_brand_us_abcdefghijklmnopqrstuvwxyz"


@pytest.fixture
def rec(sb: Sandbox) -> Iterator[Recorder]:
    with requests.Session() as session:
        mount_wsgi(session, BASE_URL, create_app(sb))
        yield Recorder(session)


def _pay(rec: Recorder, profile_id: str | None = None, **body: Any) -> Any:
    payload: dict[str, Any] = {
        "amount": 1000,
        "currency": "USD",
        "confirm": True,
        "payment_method": "card",
        "payment_method_data": card(),
        **body,
    }
    if profile_id is not None:
        payload["profile_id"] = profile_id
    return rec.call("POST", "/payments", payload)


def _refused(rec: Recorder, method: str, path: str, body: Any = None) -> requests.Response:
    kwargs: dict[str, Any] = {"headers": {"api-key": API_KEY}, "timeout": 5}
    if body is not None:
        kwargs["params" if method == "GET" else "json"] = body
    return rec.session.request(method, BASE_URL + path, **kwargs)


def _objects(sent: RecordingSender) -> list[tuple[str, str, str]]:
    """(url, event type, object id) of every webhook request, in order."""
    out = []
    for request in sent.sent:
        body = json.loads(request.body)
        kind = body["content"]["type"].removesuffix("_details")
        object_id = body["content"]["object"][f"{kind}_id"]
        out.append((request.url, body["event_type"], object_id))
    return out


def test_each_profiles_webhooks_go_to_its_url_signed_with_its_key(
    sb: Sandbox, rec: Recorder, sender: RecordingSender
) -> None:
    us = sb.add_profile("pro_brand_us", webhook_url=US_URL, webhook_secret=US_KEY)
    assert us.profile_id == "pro_brand_us" and US_KEY not in repr(us)
    assert sb.profile_ids == (sb.profile_id, "pro_brand_us")
    eu_payment = _pay(rec, sb.profile_id)
    us_payment = _pay(rec, "pro_brand_us", setup_future_usage="off_session")
    assert eu_payment["profile_id"] == sb.profile_id
    assert us_payment["profile_id"] == "pro_brand_us"
    refund = rec.call("POST", "/refunds", {"payment_id": us_payment["payment_id"], "amount": 100})
    assert refund["profile_id"] == "pro_brand_us"
    dispute = sb.open_dispute(us_payment["payment_id"])
    assert dispute["profile_id"] == "pro_brand_us"
    sb.revoke_mandate(us_payment["mandate_id"])
    sb.deliver_due()
    by_url: dict[str, set[str]] = {}
    for url, _, object_id in _objects(sender):
        by_url.setdefault(url, set()).add(object_id)
    assert by_url == {
        HOOK_URL: {eu_payment["payment_id"]},
        US_URL: {
            us_payment["payment_id"],
            us_payment["mandate_id"],
            refund["refund_id"],
            dispute["dispute_id"],
        },
    }
    for request in sender.sent:
        # Signed with its own profile's key, and only with it.
        assert request.verified(US_KEY if request.url == US_URL else SECRET)
        assert not request.verified(SECRET if request.url == US_URL else US_KEY)
        assert json.loads(request.body)["merchant_id"] == sb.merchant_id


def test_a_payout_and_a_mandate_are_created_under_a_profile(
    sb: Sandbox, rec: Recorder, sender: RecordingSender
) -> None:
    sb.add_profile("pro_brand_us", webhook_url=US_URL, webhook_secret=US_KEY)
    payout = rec.call(
        "POST",
        "/payouts/create",
        {
            "amount": 1000,
            "currency": "USD",
            "profile_id": "pro_brand_us",
            "auto_fulfill": True,
            "confirm": True,
            "payout_type": "bank",
            "payout_method_data": {
                "bank": {
                    "bank_account_number": "000123456789",
                    "bank_routing_number": "110000000",
                    "bank_name": "Bank",
                }
            },
        },
    )
    assert payout["profile_id"] == "pro_brand_us"
    mandate = sb.create_mandate(profile_id="pro_brand_us")
    sb.deliver_due()
    assert {(url, oid) for url, _, oid in _objects(sender)} == {
        (US_URL, payout["payout_id"]),
        (US_URL, mandate["mandate_id"]),
    }


def test_the_default_profile_until_there_are_several(sb: Sandbox, rec: Recorder) -> None:
    """Hyperswitch: ``profile_id`` may be left out while the merchant has one profile; with
    several it is mandatory."""
    assert _pay(rec)["profile_id"] == sb.profile_id
    sb.add_profile("pro_brand_us")
    for path, body in (
        ("/payments", {"amount": 100, "currency": "USD"}),
        ("/payouts/create", {"amount": 100, "currency": "USD", "payout_type": "bank"}),
    ):
        refused = _refused(rec, "POST", path, body)
        assert refused.status_code == 400, path
        assert refused.json()["error"]["message"] == "Missing required param: profile_id"
    assert _pay(rec, "pro_brand_us")["profile_id"] == "pro_brand_us"
    # The sandbox's own helpers keep the first profile.
    assert sb.seed_payments(1, sb.now()) and sb.create_mandate()


def test_a_profile_the_merchant_does_not_have_is_refused(sb: Sandbox, rec: Recorder) -> None:
    made = _refused(
        rec,
        "POST",
        "/payments",
        {"amount": 100, "currency": "USD", "profile_id": "pro_nobody"},
    )
    assert made.status_code == 404
    assert made.json()["error"]["message"] == "Business profile does not exist in our records"
    assert sb.stats()["objects"]["payments"] == 0  # nothing was created
    with pytest.raises(ConfigurationError, match="already used"):
        sb.add_profile(sb.profile_id)
    with pytest.raises(ConfigurationError, match="already used"):
        sb.add_profile(sb.merchant_id)
    with pytest.raises(ConfigurationError, match="empty"):
        sb.add_profile("pro_x", webhook_secret="")


def test_a_profile_created_without_a_key_inherits_the_merchant_accounts(
    sb: Sandbox, rec: Recorder, sender: RecordingSender
) -> None:
    """Hyperswitch's profile create: ``payment_response_hash_key`` or the merchant
    account's; the id is generated when none is given."""
    other = sb.add_profile(webhook_url=US_URL)
    assert other.profile_id.startswith("pro_") and len(other.profile_id) == 24
    assert other.webhook_secret == sb.webhook_secret
    _pay(rec, other.profile_id)
    sb.deliver_due()
    assert [s.url for s in sender.sent] == [US_URL] and sender.sent[0].verified(SECRET)


def test_a_profile_without_a_url_records_its_events_and_sends_none(
    sb: Sandbox, rec: Recorder, sender: RecordingSender
) -> None:
    quiet = sb.add_profile("pro_quiet", webhook_secret=US_KEY)
    _pay(rec, "pro_quiet")
    _pay(rec, sb.profile_id)
    sb.deliver_due()
    assert [s.url for s in sender.sent] == [HOOK_URL]
    states = {e["state"] for e in sb.events() if quiet.profile_id in e["body"]}
    assert states == {"undeliverable"}
    quiet.webhook_url = US_URL  # set later: a manual retry now reaches it
    undelivered = [e["event_id"] for e in sb.events() if e["state"] == "undeliverable"]
    rec.call("POST", f"/events/{sb.merchant_id}/{undelivered[0]}/retry", admin=True)
    assert sender.sent[-1].url == US_URL and sender.sent[-1].verified(US_KEY)


def test_the_lists_filter_by_profile_where_the_real_api_does(
    sb: Sandbox, rec: Recorder, clock: FrozenClock
) -> None:
    sb.add_profile("pro_brand_us", webhook_url=US_URL, webhook_secret=US_KEY)
    payments = {p: _pay(rec, p)["payment_id"] for p in (sb.profile_id, "pro_brand_us")}
    for payment_id in payments.values():
        rec.call("POST", "/refunds", {"payment_id": payment_id, "amount": 100})
        sb.open_dispute(payment_id)
        clock.advance(1)
    us = "pro_brand_us"
    refunds = rec.call("POST", "/refunds/list", {"profile_id": us, "limit": 100})
    assert {r["profile_id"] for r in refunds["data"]} == {us}
    assert refunds["total_count"] == 1
    disputes = rec.call("GET", "/disputes/list", {"profile_id": us})
    assert [d["payment_id"] for d in disputes] == [payments[us]]
    both = rec.call("GET", "/disputes/list")
    assert len(both) == 2
    # The payments list and the payouts GET list take no profile_id: a 400, as on the real
    # server (deny_unknown_fields).
    for path in ("/payments/list", "/payouts/list"):
        refused = _refused(rec, "GET", path, {"profile_id": us})
        assert refused.status_code == 400, path
    listed = rec.call("GET", "/payments/list", {"limit": 100})
    assert {p["profile_id"] for p in listed["data"]} == {sb.profile_id, us}


def test_the_payouts_post_list_filters_by_profile(sb: Sandbox, rec: Recorder) -> None:
    sb.add_profile("pro_brand_us")
    for profile in (sb.profile_id, "pro_brand_us", "pro_brand_us"):
        rec.call(
            "POST",
            "/payouts/create",
            {"amount": 1000, "currency": "USD", "profile_id": profile, "payout_type": "bank"},
        )
    page = rec.call("POST", "/payouts/list", {"profile_id": "pro_brand_us", "limit": 20})
    assert page["total_count"] == 2
    assert {p["profile_id"] for p in page["data"]} == {"pro_brand_us"}


def test_the_events_api_by_profile(sb: Sandbox, rec: Recorder) -> None:
    sb.add_profile("pro_brand_us", webhook_url=US_URL, webhook_secret=US_KEY)
    eu = _pay(rec, sb.profile_id)["payment_id"]
    us = _pay(rec, "pro_brand_us")["payment_id"]
    sb.deliver_due()
    merchant = f"/events/{sb.merchant_id}"
    everything = rec.call("POST", merchant, {}, admin=True)
    assert {e["object_id"] for e in everything["events"]} == {eu, us}
    mine = rec.call("POST", merchant, {"profile_id": "pro_brand_us"}, admin=True)
    assert [e["object_id"] for e in mine["events"]] == [us]
    assert mine["total_count"] == 1 and mine["events"][0]["profile_id"] == "pro_brand_us"
    # An object lookup is the profile's too.
    looked_up = rec.call(
        "POST", merchant, {"profile_id": "pro_brand_us", "object_id": eu}, admin=True
    )
    assert looked_up["events"] == []
    # The older form: a profile id in place of the merchant id.
    by_path = rec.call("POST", "/events/pro_brand_us", {}, admin=True)
    assert [e["object_id"] for e in by_path["events"]] == [us]
    eu_event = next(e["event_id"] for e in everything["events"] if e["object_id"] == eu)
    attempts = rec.session.get(
        f"{BASE_URL}/events/pro_brand_us/{eu_event}/attempts",
        headers={"api-key": ADMIN_KEY},
        timeout=5,
    )
    assert attempts.status_code == 404
    stored = rec.call("GET", f"{merchant}/{eu_event}/attempts", admin=True)
    headers = dict(stored[0]["request"]["headers"])
    assert stored[0]["profile_id"] == sb.profile_id
    # The stored request carries the signature of the event's own profile's key.
    body = stored[0]["request"]["body"].encode()
    keys = [Secret.of("eu", SECRET)]
    assert verify(body, headers["X-Webhook-Signature-512"], keys) == "eu"
    unknown = rec.session.post(
        BASE_URL + merchant,
        json={"profile_id": "pro_nobody"},
        headers={"api-key": ADMIN_KEY},
        timeout=5,
    )
    assert unknown.status_code == 404


def test_merchants_route_a_profile_added_later(clock: FrozenClock) -> None:
    eu = Sandbox("snd_eu_key_0123", admin_api_key=ADMIN_KEY, merchant_id="m_eu", now=clock)
    us = Sandbox(
        "snd_us_key_0123",
        admin_api_key=ADMIN_KEY,
        merchant_id="m_us",
        profile_id="pro_us",
        now=clock,
    )
    app = MerchantsApp([eu, us])
    us.add_profile("pro_us_outlet")
    assert app.sandbox("pro_us_outlet") is us
    assert app.sandbox("m_eu") is eu
    with pytest.raises(KeyError):
        app.sandbox("pro_nobody")
    listing = {m["merchant_id"]: m for m in app.listing()}
    assert [p["profile_id"] for p in listing["m_us"]["profiles"]] == ["pro_us", "pro_us_outlet"]
    with requests.Session() as session:
        mount_wsgi(session, BASE_URL, app)
        answer = session.post(
            f"{BASE_URL}/events/pro_us_outlet", json={}, headers={"api-key": ADMIN_KEY}, timeout=5
        )
        assert answer.status_code == 200 and answer.json()["total_count"] == 0
    with pytest.raises(ConfigurationError, match="used twice"):
        MerchantsApp([us, Sandbox("snd_x_key_0123", merchant_id="pro_us_outlet", now=clock)])


def test_an_id_is_the_merchants_whatever_the_profile(sb: Sandbox, rec: Recorder) -> None:
    """Hyperswitch keeps a payment id unique per merchant: the same id under another profile
    of the same merchant is a duplicate (HE_01), never a second object."""
    sb.add_profile("pro_brand_us")
    _pay(rec, sb.profile_id, payment_id="pay_same")
    again = _refused(
        rec,
        "POST",
        "/payments",
        {"amount": 100, "currency": "USD", "payment_id": "pay_same", "profile_id": "pro_brand_us"},
    )
    assert again.status_code == 400 and again.json()["error"]["code"] == "HE_01"
    assert sb.get_payment("pay_same")["profile_id"] == sb.profile_id
