"""Parsing webhook bodies into typed events: envelope validation and lenient content."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from receiver.core.codes import Retry
from receiver.core.errors import MalformedEvent, ReceiveError, UnknownEventType
from receiver.core.events import (
    _OBJECT_SLOT,
    CONTENT_TYPE_FOR_CLASS,
    CONTENT_TYPES,
    EVENT_CLASSES,
    EVENT_TYPES,
    RESOURCE_TYPES,
    Dispute,
    Event,
    Invoice,
    Mandate,
    ObjectRef,
    Payment,
    Payout,
    Refund,
    Subscription,
    parse_event,
    validate_event_type,
)
from receiver.core.status import CONTENT_TYPE_KIND, STATUS_FOR_EVENT

SAMPLES = Path(__file__).parents[3].parent / "shared" / "reference" / "hyperswitch-samples"


def _body(
    event_type: str = "payment_succeeded",
    content_type: str | None = "payment_details",
    obj: Any = None,
    **extra: Any,
) -> bytes:
    body: dict[str, Any] = {
        "merchant_id": "merchant_1234",
        "event_id": "evt_018e48d5ad6c73d5a289342e6132b224",
        "event_type": event_type,
    }
    if content_type is not None:
        body["content"] = {"type": content_type, "object": obj if obj is not None else {}}
    body["timestamp"] = "2026-08-12T08:14:55.392Z"
    body.update(extra)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _sample(name: str) -> bytes:
    path = SAMPLES / name
    if not path.is_file():
        pytest.skip(f"reference sample {path} is not available")
    return path.read_bytes()


# --- vocabularies -------------------------------------------------------------------------


def test_event_types_cover_all_29_and_match_status_mapping() -> None:
    assert len(EVENT_TYPES) == 29
    assert set(EVENT_TYPES) == set(STATUS_FOR_EVENT)
    assert set(EVENT_TYPES.values()) == set(EVENT_CLASSES)
    assert EVENT_TYPES["invoice_paid"] == "subscriptions"
    assert EVENT_TYPES["action_required"] == "payments"
    assert EVENT_TYPES["payment_partially_authorized"] == "payments"


def test_content_types() -> None:
    assert set(CONTENT_TYPES) == set(CONTENT_TYPE_KIND)
    assert set(RESOURCE_TYPES) == set(CONTENT_TYPES)
    assert dict(CONTENT_TYPE_FOR_CLASS) == {
        "payments": "payment_details",
        "refunds": "refund_details",
        "disputes": "dispute_details",
        "mandates": "mandate_details",
        "payouts": "payout_details",
        "subscriptions": "subscription_details",
    }
    for content_type, resource_type in RESOURCE_TYPES.items():
        assert resource_type.kind == CONTENT_TYPE_KIND[content_type]


def test_event_types_is_read_only() -> None:
    with pytest.raises(TypeError):
        EVENT_TYPES["new_event"] = "payments"  # type: ignore[index]


# --- envelope -----------------------------------------------------------------------------


def test_parse_envelope() -> None:
    event = parse_event(_body(obj={"payment_id": "pay_1", "status": "succeeded"}))
    assert event.event_id == "evt_018e48d5ad6c73d5a289342e6132b224"
    assert event.event_type == "payment_succeeded"
    assert event.event_class == "payments"
    assert event.merchant_id == "merchant_1234"
    assert event.timestamp == datetime(2026, 8, 12, 8, 14, 55, 392000, tzinfo=UTC)
    assert event.timestamp is not None and event.timestamp.utcoffset() is not None
    assert event.content_type == "payment_details"
    assert event.kind == "payment"
    assert event.is_known
    assert isinstance(event.object, Payment)
    assert event.raw["content"]["object"]["payment_id"] == "pay_1"


def test_from_dict_equals_parse_event() -> None:
    raw = _body(obj={"payment_id": "pay_1"})
    assert Event.from_dict(json.loads(raw)) == parse_event(raw)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-08-12T08:14:55.392Z", datetime(2026, 8, 12, 8, 14, 55, 392000, tzinfo=UTC)),
        ("2026-08-12T10:14:55.392+02:00", datetime(2026, 8, 12, 8, 14, 55, 392000, tzinfo=UTC)),
        ("2026-08-12T08:14:55", datetime(2026, 8, 12, 8, 14, 55, tzinfo=UTC)),
        ("2026-08-12T08:14:55.392123456Z", datetime(2026, 8, 12, 8, 14, 55, 392123, tzinfo=UTC)),
        ("yesterday", None),
        ("", None),
        (1755000000, None),
        (None, None),
    ],
)
def test_timestamp_parsing(value: Any, expected: datetime | None) -> None:
    event = parse_event(_body(timestamp=value))
    assert event.timestamp == expected
    if expected is not None:
        assert event.timestamp is not None and event.timestamp.tzinfo is UTC


def test_missing_timestamp_and_merchant_id() -> None:
    body = {"event_id": "evt_1", "event_type": "payment_succeeded"}
    event = parse_event(json.dumps(body).encode())
    assert event.timestamp is None
    assert event.merchant_id is None
    assert event.content_type is None
    assert event.object is None
    assert event.object_ref is None
    assert event.kind is None


LONG_ID = "evt_" + "a" * 251


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b'{"event_id": "evt_\xc3"}', "not valid UTF-8"),
        (b"", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b'{"event_id": "evt_1",}', "not valid JSON"),
        (b"\xef\xbb\xbf{}", "not valid JSON"),
        (b'{"event_id": "evt_1", "amount": NaN}', "not valid JSON"),
        (b'{"event_id": "evt_1", "amount": Infinity}', "not valid JSON"),
        (b"[]", "must be a JSON object, not an array"),
        (b'"evt_1"', "must be a JSON object, not a string"),
        (b"null", "must be a JSON object, not null"),
        (b"42", "must be a JSON object, not a number"),
        (b"{}", "no event_id"),
        (b'{"event_id": null}', "no event_id"),
        (b'{"event_id": 12}', "event_id must be a string, not a number"),
        (b'{"event_id": ["evt_1"]}', "event_id must be a string, not an array"),
        (b'{"event_id": {"id": "evt_1"}}', "event_id must be a string, not an object"),
        (b'{"event_id": true}', "event_id must be a string, not a boolean"),
        (b'{"event_id": ""}', "event_id is empty"),
        (b'{"event_id": "   "}', "event_id is empty"),
        (json.dumps({"event_id": LONG_ID + "x"}).encode(), "at most 255"),
        (b'{"event_id": "evt_1", "content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deeply"),
        (b"[" * 100_000, "deeply"),
    ],
    ids=lambda value: value[:40] if isinstance(value, bytes) else value,
)
def test_malformed_bodies(body: bytes, message: str) -> None:
    with pytest.raises(MalformedEvent) as excinfo:
        parse_event(body)
    assert message in str(excinfo.value)
    assert isinstance(excinfo.value, ReceiveError)
    assert excinfo.value.http_status == 400


def test_event_id_of_255_characters_is_accepted() -> None:
    assert len(LONG_ID) == 255
    assert parse_event(json.dumps({"event_id": LONG_ID}).encode()).event_id == LONG_ID


@pytest.mark.parametrize("data", [[], "evt_1", None, 3])
def test_from_dict_rejects_non_objects(data: Any) -> None:
    with pytest.raises(MalformedEvent):
        Event.from_dict(data)


def test_parse_event_accepts_bytearray_and_memoryview() -> None:
    raw = _body(obj={"payment_id": "pay_1"})
    assert parse_event(bytearray(raw)) == parse_event(raw)  # type: ignore[arg-type]
    assert parse_event(memoryview(raw)) == parse_event(raw)  # type: ignore[arg-type]


# --- unknown things parse fine ------------------------------------------------------------


def test_unknown_event_type_parses() -> None:
    event = parse_event(_body("payment_teleported", obj={"payment_id": "pay_1"}))
    assert not event.is_known
    assert event.event_type == "payment_teleported"
    assert event.event_class is None
    assert event.payment.payment_id == "pay_1"
    assert event.object_ref == ObjectRef(kind="payment", object_id="pay_1", status=None)


@pytest.mark.parametrize("event_type", [None, 7, ["payment_succeeded"]])
def test_missing_or_non_string_event_type_parses_as_unknown(event_type: Any) -> None:
    body = {"event_id": "evt_1", "event_type": event_type}
    event = parse_event(json.dumps(body).encode())
    assert event.event_type == ""
    assert not event.is_known
    assert event.event_class is None


def test_unknown_content_type_parses() -> None:
    event = parse_event(_body("payment_succeeded", "customer_details", {"customer_id": "c_1"}))
    assert event.content_type == "customer_details"
    assert event.object is None
    assert event.kind is None
    assert event.object_ref is None
    assert event.raw["content"]["object"] == {"customer_id": "c_1"}
    with pytest.raises(AttributeError, match="customer_details"):
        _ = event.payment


def test_unknown_fields_are_accepted_and_kept() -> None:
    raw = _body(
        "dispute_opened",
        "dispute_details",
        {"dispute_id": "dp_1", "dispute_status": "dispute_opened", "brand_new": {"x": [1]}},
        processor_merchant_id="merchant_platform_1",
    )
    event = parse_event(raw)
    assert event.raw["processor_merchant_id"] == "merchant_platform_1"
    assert event.dispute.raw["brand_new"] == {"x": [1]}
    assert event.object_ref == ObjectRef("dispute", "dp_1", "dispute_opened")


@pytest.mark.parametrize("content", [None, [], "payment_details", 5, {"type": 3, "object": {}}])
def test_bad_content_is_tolerated(content: Any) -> None:
    event = parse_event(_body(content_type=None, content=content))
    assert event.object is None
    assert event.object_ref is None
    assert event.content_type is None


@pytest.mark.parametrize("obj", [None, [], "pay_1", 12])
def test_bad_object_is_tolerated(obj: Any) -> None:
    body = _body(content_type=None, content={"type": "payment_details", "object": obj})
    event = parse_event(body)
    assert event.content_type == "payment_details"
    assert event.kind == "payment"
    assert event.object is None
    assert event.object_ref is None
    with pytest.raises(AttributeError, match="without an object"):
        _ = event.payment


def test_wrong_typed_fields_become_none() -> None:
    obj = {
        "payment_id": 123,
        "status": ["succeeded"],
        "amount": "6540",
        "net_amount": True,
        "amount_received": 65.4,
        "currency": 840,
        "metadata": ["order", "1"],
        "created": 1755000000,
        "modified_at": "not a time",
        "payment_method_data": {"card": "4242"},
        "unified_code": 1001,
    }
    event = parse_event(_body(obj=obj))
    payment = event.payment
    assert payment.payment_id is None
    assert payment.status is None
    assert payment.amount is None
    assert payment.net_amount is None
    assert payment.amount_received is None
    assert payment.currency is None
    assert payment.metadata is None
    assert payment.created is None
    assert payment.modified_at is None
    assert payment.card_last4 is None
    assert payment.failure is None
    assert event.object_ref is None  # no usable id
    assert event.raw["content"]["object"]["amount"] == "6540"


# --- typed resources ----------------------------------------------------------------------


def test_payment_fields() -> None:
    obj = {
        "payment_id": "pay_1",
        "merchant_id": "merchant_1234",
        "status": "failed",
        "amount": 6540,
        "net_amount": 6540,
        "amount_capturable": 0,
        "amount_received": None,
        "currency": "USD",
        "capture_method": "automatic",
        "payment_method": "card",
        "payment_method_type": "credit",
        "payment_method_data": {"card": {"last4": "4242", "card_network": "Visa"}},
        "customer_id": "cus_1",
        "metadata": {"order_id": "1042"},
        "created": "2026-08-12T08:14:13.000Z",
        "modified_at": "2026-08-12T08:14:55.392Z",
        "updated": "2026-08-12T08:14:55.392Z",
        "connector": "stripe",
        "error_code": "insufficient_funds",
        "error_message": "Your card has insufficient funds.",
        "unified_code": "UE_1001",
        "unified_message": "Insufficient funds",
        "attempt_count": 1,
    }
    payment = parse_event(_body("payment_failed", obj=obj)).payment
    assert payment.kind == "payment"
    assert payment.object_id == "pay_1"
    assert payment.amount == 6540
    assert payment.amount_received is None
    assert payment.card_last4 == "4242"
    assert payment.card_network == "Visa"
    assert payment.metadata == {"order_id": "1042"}
    assert payment.created == datetime(2026, 8, 12, 8, 14, 13, tzinfo=UTC)
    assert payment.updated == datetime(2026, 8, 12, 8, 14, 55, 392000, tzinfo=UTC)
    assert payment.connector == "stripe"
    assert payment.attempt_count == 1
    failure = payment.failure
    assert failure is not None
    assert failure.code == "UE_1001"
    assert failure.retry is Retry.NEVER
    assert not failure.retryable


def test_payment_without_unified_code_has_no_failure() -> None:
    payment = parse_event(_body(obj={"payment_id": "pay_1", "status": "succeeded"})).payment
    assert payment.failure is None


@pytest.mark.parametrize(
    ("raw_status", "status"),
    [
        ("succeeded", "succeeded"),
        ("success", "succeeded"),
        ("Failure", "failed"),
        ("transaction_failure", "failed"),
        ("manual_review", "review"),
        ("pending", "pending"),
        ("brand_new", "brand_new"),
    ],
)
def test_refund_status_is_normalised(raw_status: str, status: str) -> None:
    obj = {"refund_id": "ref_1", "payment_id": "pay_1", "status": raw_status, "amount": 100}
    event = parse_event(_body("refund_succeeded", "refund_details", obj))
    assert event.refund.status == status
    assert event.refund.raw["status"] == raw_status
    assert event.object_ref == ObjectRef("refund", "ref_1", status)


@pytest.mark.parametrize(
    ("amount", "expected"),
    [("1000", 1000), ("0", 0), (" 250 ", 250), ("-5", -5), (1000, 1000), ("10.50", None),
     ("", None), ("ten", None), (None, None), (True, None), ("١٢", None)],
)  # fmt: skip
def test_dispute_amount_arrives_as_a_string(amount: Any, expected: int | None) -> None:
    obj = {"dispute_id": "dp_1", "dispute_status": "dispute_opened", "amount": amount}
    dispute = parse_event(_body("dispute_opened", "dispute_details", obj)).dispute
    assert dispute.amount == expected
    assert dispute.raw["amount"] == amount


def test_dispute_fields() -> None:
    obj = {
        "dispute_id": "dp_1",
        "payment_id": "pay_1",
        "attempt_id": "pay_1_1",
        "amount": "6540",
        "currency": "USD",
        "dispute_stage": "dispute",
        "dispute_status": "dispute_won",
        "connector": "stripe",
        "connector_status": "won",
        "connector_dispute_id": "dp_stripe_1",
        "challenge_required_by": "2026-08-19T08:14:55.000Z",
        "created_at": "2026-08-11T08:14:55.000Z",
        "is_already_refunded": False,
    }
    dispute = parse_event(_body("dispute_won", "dispute_details", obj)).dispute
    assert dispute.kind == "dispute"
    assert dispute.object_id == "dp_1"
    assert dispute.status == "dispute_won"
    assert dispute.dispute_stage == "dispute"
    assert dispute.is_already_refunded is False
    assert dispute.created_at == datetime(2026, 8, 11, 8, 14, 55, tzinfo=UTC)


def test_mandate_fields() -> None:
    obj = {
        "mandate_id": "man_1",
        "status": "revoked",
        "payment_method_id": "pm_1",
        "payment_method": "card",
        "card": {"last4_digits": "1111", "card_network": "Visa", "card_holder_name": "J Doe"},
    }
    mandate = parse_event(_body("mandate_revoked", "mandate_details", obj)).mandate
    assert isinstance(mandate, Mandate)
    assert (mandate.kind, mandate.object_id, mandate.status) == ("mandate", "man_1", "revoked")
    assert mandate.card_last4 == "1111"
    assert "J Doe" not in repr(mandate)


def test_payout_fields_and_failure() -> None:
    obj = {
        "payout_id": "payout_1",
        "merchant_id": "merchant_1234",
        "amount": 1000,
        "currency": "EUR",
        "status": "failed",
        "auto_fulfill": True,
        "recurring": "no",
        "created": "2026-08-12T08:14:55.392Z",
        "unified_code": "UE_9000",
        "unified_message": "Something went wrong",
    }
    payout = parse_event(_body("payout_failed", "payout_details", obj)).payout
    assert isinstance(payout, Payout)
    assert (payout.kind, payout.object_id, payout.status) == ("payout", "payout_1", "failed")
    assert payout.auto_fulfill is True
    assert payout.recurring is None
    assert payout.failure is not None and payout.failure.retry is Retry.TERMINAL


def test_subscription_tracks_its_invoice() -> None:
    obj = {
        "id": "sub_1",
        "status": "active",
        "profile_id": "pro_1",
        "payment": {"payment_id": "pay_1", "status": "succeeded", "amount": 999},
        "customer_id": "cus_1",
        "invoice": {
            "id": "invoice_1",
            "subscription_id": "sub_1",
            "amount": 999,
            "currency": "USD",
            "status": "invoice_paid",
        },
    }
    event = parse_event(_body("invoice_paid", "subscription_details", obj))
    subscription = event.subscription
    assert subscription.kind == "invoice"
    assert subscription.object_id == "invoice_1"
    assert subscription.status == "invoice_paid"
    assert subscription.subscription_status == "active"
    assert subscription.payment_id == "pay_1"
    assert subscription.amount == 999
    assert subscription.currency == "USD"
    assert isinstance(subscription.invoice, Invoice)
    assert event.object_ref == ObjectRef("invoice", "invoice_1", "invoice_paid")


def test_subscription_without_invoice_falls_back_to_subscription_id() -> None:
    event = parse_event(_body("invoice_paid", "subscription_details", {"id": "sub_1"}))
    assert event.subscription.object_id == "sub_1"
    assert event.subscription.status is None
    assert event.subscription.amount is None
    assert event.object_ref == ObjectRef("invoice", "sub_1", "invoice_paid")


def test_subscription_invoice_without_id_falls_back() -> None:
    obj = {"id": "sub_1", "invoice": {"status": "payment_pending"}}
    event = parse_event(_body("invoice_paid", "subscription_details", obj))
    assert event.object_ref == ObjectRef("invoice", "sub_1", "payment_pending")


# --- object_ref ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event_type", "content_type", "obj", "expected"),
    [
        ("payment_succeeded", "payment_details", {"payment_id": "p"},
         ("payment", "p", "succeeded")),
        ("payment_authorized", "payment_details", {"payment_id": "p"},
         ("payment", "p", "requires_capture")),
        ("refund_failed", "refund_details", {"refund_id": "r"}, ("refund", "r", "failed")),
        ("dispute_lost", "dispute_details", {"dispute_id": "d"}, ("dispute", "d", "dispute_lost")),
        ("mandate_active", "mandate_details", {"mandate_id": "m"}, ("mandate", "m", "active")),
        ("payout_processing", "payout_details", {"payout_id": "po"}, ("payout", "po", "pending")),
        # the object's own status wins over the event type's
        ("payment_succeeded", "payment_details", {"payment_id": "p", "status": "processing"},
         ("payment", "p", "processing")),
        # an event type about another kind implies nothing
        ("refund_succeeded", "payment_details", {"payment_id": "p"}, ("payment", "p", None)),
        ("something_new", "payout_details", {"payout_id": "po"}, ("payout", "po", None)),
    ],
)  # fmt: skip
def test_object_ref_falls_back_to_the_status_the_event_implies(
    event_type: str, content_type: str, obj: dict[str, Any], expected: tuple[str, str, str | None]
) -> None:
    assert parse_event(_body(event_type, content_type, obj)).object_ref == ObjectRef(*expected)


@pytest.mark.parametrize("obj", [{"status": "succeeded"}, {"payment_id": ""}, {"payment_id": " "}])
def test_object_ref_without_id_is_none(obj: dict[str, Any]) -> None:
    assert parse_event(_body(obj=obj)).object_ref is None


def test_object_ref_is_kept_per_event_type() -> None:
    """Read twice on the receive path, made once; a copy of another event type (whose
    object is parsed then) gets its own."""
    event = parse_event(_body("payment_succeeded", obj={"payment_id": "p"}))
    assert event.object_ref is event.object_ref
    other = dataclasses.replace(event, event_type="payment_failed")
    assert other.object_ref == ObjectRef("payment", "p", "failed")
    assert event.object_ref == ObjectRef("payment", "p", "succeeded")


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("event_id", r"evt_\u0000", "event_id contains a NUL character"),
        ("event_id", r"evt_\u00e9\u0000", "event_id contains a NUL character"),
        ("event_id", r"evt_\ud800", "event_id contains an unpaired surrogate escape"),
        ("merchant_id", r"m\u00e9\udfff", "merchant_id contains an unpaired surrogate escape"),
        ("payment_id", r"p\u0000", "object id contains a NUL character"),
        ("status", r"\ud83d", "object status contains an unpaired surrogate escape"),
    ],
)
def test_text_no_column_holds_is_refused(where: str, value: str, message: str) -> None:
    body = _body(obj={"payment_id": "p", "status": "succeeded"}).decode()
    doc = json.loads(body)
    target = doc["content"]["object"] if where in ("payment_id", "status") else doc
    target[where] = "@@"
    text = json.dumps(doc).replace('"@@"', f'"{value}"')
    with pytest.raises(MalformedEvent, match=message):
        parse_event(text.encode())


@pytest.mark.parametrize("value", [r"evt_\u00e9\u4e2d", r"evt_\ud83d\ude00", "evt_plain"])
def test_non_ascii_text_that_encodes_is_storable(value: str) -> None:
    text = _body().decode().replace('"evt_018e48d5ad6c73d5a289342e6132b224"', f'"{value}"')
    assert parse_event(text.encode()).event_id == json.loads(f'"{value}"')


@pytest.mark.parametrize("content_type", [*CONTENT_TYPES, "unknown_details", None])
def test_for_account_is_replace_without_parsing_the_object(content_type: str | None) -> None:
    body = _body(content_type=content_type, obj={"payment_id": "p", "refund_id": "r"})
    event = parse_event(body)
    moved = event.for_account("seller_1")
    assert type(_OBJECT_SLOT.__get__(moved, Event)) is type(_OBJECT_SLOT.__get__(event, Event))
    assert moved.object_ref == event.object_ref
    assert moved == dataclasses.replace(parse_event(body), account="seller_1")
    assert repr(moved) == repr(dataclasses.replace(parse_event(body), account="seller_1"))
    assert event.account == "default" and moved.account == "seller_1"
    parsed = parse_event(body)
    parsed_object = parsed.object  # built: the copy carries the typed resource
    assert parsed.for_account("seller_1").object is parsed_object


# --- accessors ----------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
def test_typed_accessors(content_type: str) -> None:
    event = parse_event(_body(content_type=content_type, obj={}))
    accessors = {
        "payment_details": ("payment", Payment),
        "refund_details": ("refund", Refund),
        "dispute_details": ("dispute", Dispute),
        "mandate_details": ("mandate", Mandate),
        "payout_details": ("payout", Payout),
        "subscription_details": ("subscription", Subscription),
    }
    for name, (other, resource_type) in accessors.items():
        if name == content_type:
            assert isinstance(getattr(event, other), resource_type)
        else:
            with pytest.raises(AttributeError) as excinfo:
                getattr(event, other)
            assert repr(content_type) in str(excinfo.value)
            assert repr(name) in str(excinfo.value)
            assert getattr(event, other, None) is None


# --- validate_event_type ------------------------------------------------------------------


@pytest.mark.parametrize("event_type", list(EVENT_TYPES))
def test_validate_known_event_type(event_type: str) -> None:
    assert validate_event_type(event_type) == event_type


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("payment_succeded", "payment_succeeded"),
        ("payment.succeeded", "payment_succeeded"),
        ("PAYMENT_FAILED", "payment_failed"),
        ("refund-succeeded", "refund_succeeded"),
        ("payout_succeeded", "payout_success"),
        ("dispute_open", "dispute_opened"),
        ("invoice.paid", "invoice_paid"),
        ("mandate_revoke", "mandate_revoked"),
        ("payout_reverse", "payout_reversed"),
        ("payment_canceled", "payment_cancelled"),
    ],
)
def test_unknown_event_type_suggests(name: str, suggestion: str) -> None:
    with pytest.raises(UnknownEventType, match=f"did you mean '{suggestion}'"):
        validate_event_type(name)


@pytest.mark.parametrize("name", ["zzz", "", "customer_created_and_deleted_twice"])
def test_unknown_event_type_without_suggestion(name: str) -> None:
    with pytest.raises(UnknownEventType) as excinfo:
        validate_event_type(name)
    assert "did you mean" not in str(excinfo.value)
    assert isinstance(excinfo.value, ValueError)


def test_validate_event_type_rejects_non_strings() -> None:
    with pytest.raises(UnknownEventType):
        validate_event_type(None)  # type: ignore[arg-type]


# --- reprs and immutability ---------------------------------------------------------------

CARD_OBJECT = {
    "payment_id": "pay_1",
    "status": "succeeded",
    "amount": 6540,
    "currency": "USD",
    "client_secret": "pay_1_secret_abcdef",
    "customer_id": "cus_secretive",
    "email": "john.doe@example.com",
    "payment_method_data": {
        "card": {
            "last4": "4242",
            "card_isin": "424242",
            "card_exp_month": "03",
            "card_exp_year": "2030",
            "card_holder_name": "Johnny Cardholder",
        }
    },
}


def test_repr_hides_card_data() -> None:
    event = parse_event(_body(obj=CARD_OBJECT))
    for text in (repr(event.object), repr(event), str(event)):
        for secret in ("4242", "2030", "Johnny", "secret", "john.doe", "card", "raw"):
            assert secret not in text, (secret, text)
    assert repr(event.object) == (
        "Payment(kind='payment', id='pay_1', status='succeeded', amount=6540, currency='USD')"
    )


def test_resources_are_frozen() -> None:
    event = parse_event(_body(obj=CARD_OBJECT))
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.payment.status = "failed"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.event_id = "evt_2"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Payment("pay_1")  # type: ignore[call-arg]  # keyword-only


# --- real samples -------------------------------------------------------------------------


def test_prism_sample_webhook_parses() -> None:
    event = parse_event(_sample("prism_hyperswitch_connector_sample_webhook_body.json"))
    assert event.event_id == "evt_probe_001"
    assert event.is_known
    assert event.timestamp is None  # the probe has no timestamp
    assert event.payment.connector_transaction_id == "txn_probe001"
    assert event.object_ref == ObjectRef("payment", "pay_probe001", "succeeded")


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("openapi_v1_payments_response_01_requires_payment_method.json", "requires_payment_method"),
        ("openapi_v1_payments_response_05_setup_mandate_succeeded.json", "succeeded"),
        ("openapi_v1_payments_response_07_succeeded_card_saved.json", "succeeded"),
    ],
)
def test_openapi_payment_samples_parse_as_webhook_content(name: str, status: str) -> None:
    obj = json.loads(_sample(name))
    event = parse_event(_body("payment_succeeded", "payment_details", obj))
    payment = event.payment
    assert payment.payment_id == obj["payment_id"]
    assert payment.status == status
    assert payment.amount == 6540
    assert payment.currency == "USD"
    assert payment.created is not None and payment.created.tzinfo is UTC
    assert payment.raw == obj
    if "payment_method_data" in obj:
        assert payment.card_last4 == "4242"
        assert "joseph" not in repr(event)


def test_outgoing_webhook_schema_sample_lists_the_content_types() -> None:
    schemas = json.loads(_sample("openapi_v1_components_schemas_webhook_list_subset.json"))
    variants = schemas["OutgoingWebhookContent"]["oneOf"]
    types = {v["properties"]["type"]["enum"][0] for v in variants}
    assert types == set(CONTENT_TYPES)
    assert set(schemas["EventType"]["enum"]) == set(EVENT_TYPES)
