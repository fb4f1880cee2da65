"""Payload builders for the merchant test kit: shape, encoding and round trips."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from receiver.core.codes import Retry
from receiver.core.errors import UnknownEventType
from receiver.core.events import (
    CONTENT_TYPE_FOR_CLASS,
    EVENT_TYPES,
    RESOURCE_TYPES,
    Dispute,
    Payment,
    parse_event,
)
from receiver.core.signature import sign
from receiver.core.status import CONTENT_TYPE_KIND, STATUS_FOR_EVENT
from receiver.core.transitions import lifecycle
from receiver.testing.factories import (
    OMIT,
    build_event,
    encode,
    format_timestamp,
    new_event_id,
    new_id,
)

SAMPLES = Path(__file__).parents[3].parent / "shared" / "reference" / "hyperswitch-samples"
WHEN = datetime(2026, 8, 12, 8, 14, 55, 392512, tzinfo=UTC)
TIMESTAMP_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield f"{path}.{key}", item
            yield from _walk(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]")


@pytest.mark.parametrize("event_type", list(EVENT_TYPES))
def test_round_trip(event_type: str) -> None:
    body = build_event(event_type, object_id="obj_123", event_id="evt_abc", timestamp=WHEN)
    event = parse_event(encode(body))
    kind, status = STATUS_FOR_EVENT[event_type]
    content_type = CONTENT_TYPE_FOR_CLASS[EVENT_TYPES[event_type]]

    assert event.event_id == "evt_abc"
    assert event.event_type == event_type
    assert event.event_class == EVENT_TYPES[event_type]
    assert event.merchant_id == "merchant_1234"
    assert event.timestamp == datetime(2026, 8, 12, 8, 14, 55, 392000, tzinfo=UTC)
    assert event.content_type == content_type
    assert isinstance(event.object, RESOURCE_TYPES[content_type])
    assert event.object.kind == kind == CONTENT_TYPE_KIND[content_type]
    assert event.object.object_id == "obj_123"
    assert event.object.status == status
    assert event.object_ref is not None
    assert (event.object_ref.kind, event.object_ref.object_id, event.object_ref.status) == (
        kind,
        "obj_123",
        status,
    )
    model = lifecycle(kind)
    assert model is not None and model.knows(status)
    assert event.raw == body


@pytest.mark.parametrize("event_type", list(EVENT_TYPES))
def test_body_shape(event_type: str) -> None:
    body = build_event(event_type)
    assert list(body) == ["merchant_id", "event_id", "event_type", "content", "timestamp"]
    assert list(body["content"]) == ["type", "object"]
    assert re.fullmatch(r"evt_[0-9a-f]{32}", body["event_id"])
    assert TIMESTAMP_RE.fullmatch(body["timestamp"])
    obj = body["content"]["object"]
    assert isinstance(obj, dict) and obj
    # a fresh random object id with a Hyperswitch-style prefix
    event = parse_event(encode(body))
    assert event.object is not None and event.object.object_id
    assert re.fullmatch(r"[a-z]+_[A-Za-z0-9]+", event.object.object_id)


@pytest.mark.parametrize("event_type", list(EVENT_TYPES))
def test_no_full_card_number_anywhere(event_type: str) -> None:
    body = build_event(event_type)
    for path, value in _walk(body):
        leaf = path.rsplit(".", 1)[-1]
        assert leaf not in {"card_number", "number", "cvc", "card_cvc"}, path
        if isinstance(value, str) and ("card" in path or "bank" in path):
            assert not re.search(r"\d{9,}", value), (path, value)


def test_payment_object_fields() -> None:
    obj = build_event("payment_succeeded", timestamp=WHEN)["content"]["object"]
    for name in (
        "payment_id",
        "merchant_id",
        "status",
        "amount",
        "net_amount",
        "amount_capturable",
        "amount_received",
        "currency",
        "capture_method",
        "payment_method",
        "payment_method_type",
        "payment_method_data",
        "customer_id",
        "metadata",
        "created",
        "modified_at",
        "updated",
        "connector",
        "unified_code",
        "unified_message",
        "error_code",
        "error_message",
    ):
        assert name in obj, name
    assert list(obj)[:3] == ["payment_id", "merchant_id", "status"]
    assert obj["amount_received"] == obj["amount"] == 6540
    assert obj["amount_capturable"] == 0
    card = obj["payment_method_data"]["card"]
    assert card["last4"] == "4242"
    assert card["card_network"] == "Visa"
    assert obj["updated"] == "2026-08-12T08:14:55.392Z"
    assert obj["unified_code"] is None


def test_payment_failed_carries_a_unified_code() -> None:
    event = parse_event(encode(build_event("payment_failed")))
    payment = event.payment
    assert payment.status == "failed"
    assert payment.unified_code == "UE_1001"
    assert payment.unified_message == "Insufficient funds"
    assert payment.error_code and payment.error_message
    assert payment.failure is not None
    assert payment.failure.meaning == "insufficient funds"
    assert payment.failure.retry is Retry.NEVER


def test_payment_authorized_is_manual_capture() -> None:
    payment = parse_event(encode(build_event("payment_authorized"))).payment
    assert payment.status == "requires_capture"
    assert payment.capture_method == "manual"
    assert payment.amount_capturable == payment.amount
    assert payment.amount_received is None


def test_payment_captured_is_partial() -> None:
    payment = parse_event(encode(build_event("payment_captured", amount=1000))).payment
    assert payment.status == "partially_captured"
    assert payment.amount_received == 500


def test_dispute_amount_is_a_string() -> None:
    body = build_event("dispute_opened", amount=1000, timestamp=WHEN)
    assert body["content"]["object"]["amount"] == "1000"
    assert body["content"]["object"]["dispute_status"] == "dispute_opened"
    dispute = parse_event(encode(body)).dispute
    assert isinstance(dispute, Dispute)
    assert dispute.amount == 1000


def test_refund_object() -> None:
    obj = build_event("refund_succeeded", object_id="ref_1", timestamp=WHEN)["content"]["object"]
    assert obj["refund_id"] == "ref_1"
    assert obj["status"] == "succeeded"
    for name in ("payment_id", "amount", "currency", "reason", "created_at", "updated_at"):
        assert obj[name] is not None


def test_payout_failed_has_a_unified_code() -> None:
    payout = parse_event(encode(build_event("payout_failed"))).payout
    assert payout.status == "failed"
    assert payout.failure is not None and payout.failure.retry is Retry.TERMINAL


def test_invoice_paid_object_id_is_the_invoice() -> None:
    body = build_event("invoice_paid", object_id="invoice_1")
    obj = body["content"]["object"]
    assert obj["invoice"]["id"] == "invoice_1"
    assert obj["invoice"]["status"] == "invoice_paid"
    assert obj["status"] == "active"
    subscription = parse_event(encode(body)).subscription
    assert subscription.object_id == "invoice_1"
    assert subscription.id == obj["id"] != "invoice_1"


def test_status_override() -> None:
    body = build_event("payment_succeeded", status="processing")
    assert body["event_type"] == "payment_succeeded"
    assert parse_event(encode(body)).payment.status == "processing"


def test_object_fields_override_add_and_omit() -> None:
    created = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    body = build_event(
        "payment_succeeded",
        object_id="pay_1",
        metadata={"order_id": "A-1"},
        customer_id=None,
        created=created,
        brand_new_field=[1, 2],
        amount_received=OMIT,
        amount=1234,
        currency="EUR",
    )
    obj = body["content"]["object"]
    assert obj["metadata"] == {"order_id": "A-1"}
    assert obj["customer_id"] is None
    assert obj["created"] == "2026-01-02T03:04:05.678Z"
    assert obj["brand_new_field"] == [1, 2]
    assert "amount_received" not in obj
    assert obj["amount"] == obj["net_amount"] == 1234
    assert obj["currency"] == "EUR"
    assert list(obj)[0] == "payment_id"  # overrides keep the field's position
    assert list(obj)[-1] == "brand_new_field"  # new fields are appended
    payment = parse_event(encode(body)).payment
    assert payment.metadata == {"order_id": "A-1"}
    assert payment.amount_received is None


def test_sparse_object_falls_back_to_event_status() -> None:
    body = build_event("payment_succeeded", object_id="pay_1", status=OMIT)
    assert "status" not in body["content"]["object"]
    ref = parse_event(encode(body)).object_ref
    assert ref is not None and ref.status == "succeeded"


@pytest.mark.parametrize("event_type", ["dispute_won", "invoice_paid", "mandate_revoked"])
def test_omitted_status_per_kind(event_type: str) -> None:
    body = build_event(event_type, object_id="obj_1", status=OMIT)
    kind, status = STATUS_FOR_EVENT[event_type]
    event = parse_event(encode(body))
    assert event.object is not None and event.object.status is None
    assert event.object_ref is not None
    assert (event.object_ref.kind, event.object_ref.status) == (kind, status)


def test_non_int_amount_is_applied_verbatim() -> None:
    body = build_event("payment_succeeded", amount="6540")
    assert body["content"]["object"]["amount"] == "6540"
    assert parse_event(encode(body)).payment.amount is None


def test_merchant_id_and_timestamp() -> None:
    naive = datetime(2026, 8, 12, 8, 14, 55, 392999)
    body = build_event("refund_failed", merchant_id="merchant_9", timestamp=naive)
    assert body["merchant_id"] == "merchant_9"
    assert body["timestamp"] == "2026-08-12T08:14:55.392Z"
    event = parse_event(encode(body))
    assert event.merchant_id == "merchant_9"


def test_unknown_event_type_is_rejected_with_a_suggestion() -> None:
    with pytest.raises(UnknownEventType, match="did you mean 'payment_succeeded'"):
        build_event("payment_succeded")


@pytest.mark.parametrize(
    ("event_type", "content_type", "resource_type"),
    [
        ("payment_method_updated", "payment_details", Payment),
        ("customer_created", "customer_details", type(None)),
    ],
)
def test_unknown_event_type_allowed(
    event_type: str, content_type: str, resource_type: type[Any]
) -> None:
    body = build_event(event_type, allow_unknown=True, object_id="x_1", status="weird")
    assert body["content"]["type"] == content_type
    event = parse_event(encode(body))
    assert not event.is_known
    assert event.event_class is None
    assert isinstance(event.object, resource_type)


# --- ids ----------------------------------------------------------------------------------


def test_event_ids_are_uuid7_and_time_ordered() -> None:
    ids = [new_event_id(WHEN + timedelta(milliseconds=i)) for i in range(50)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 50
    for event_id in ids:
        parsed = uuid.UUID(hex=event_id.removeprefix("evt_"))
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        assert parsed.int >> 80 == int(WHEN.timestamp() * 1000) + ids.index(event_id)


def test_default_event_id_follows_the_timestamp() -> None:
    body = build_event("payment_succeeded", timestamp=WHEN)
    assert int(body["event_id"][4:16], 16) == int(WHEN.timestamp() * 1000)


def test_new_id() -> None:
    assert re.fullmatch(r"pay_[A-Za-z0-9]{20}", new_id("pay"))
    assert re.fullmatch(r"ref_[A-Za-z0-9]{8}", new_id("ref", 8))


# --- timestamps ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dt", "expected"),
    [
        (WHEN, "2026-08-12T08:14:55.392Z"),
        (datetime(2026, 8, 12, 10, 14, 55, tzinfo=timezone(timedelta(hours=2))),
         "2026-08-12T08:14:55.000Z"),
        (datetime(2026, 8, 12, 8, 14, 55, 999999), "2026-08-12T08:14:55.999Z"),
        (datetime(5, 1, 2, 3, 4, 5, tzinfo=UTC), "0005-01-02T03:04:05.000Z"),
    ],
)  # fmt: skip
def test_format_timestamp(dt: datetime, expected: str) -> None:
    assert format_timestamp(dt) == expected


# --- encode -------------------------------------------------------------------------------


def test_encode_is_compact_utf8_and_ordered() -> None:
    body = {"z": 1, "a": {"name": "Zoë 東京", "list": [1, None, True]}, "m": "line\nbreak"}
    raw = encode(body)
    assert raw == '{"z":1,"a":{"name":"Zoë 東京","list":[1,null,true]},"m":"line\\nbreak"}'.encode()
    assert json.loads(raw) == body


def test_encode_escapes_like_serde_json() -> None:
    assert encode({"s": 'q"\\\t\x01\x7f/'}) == b'{"s":"q\\"\\\\\\t\\u0001\x7f/"}'


def test_encode_rejects_nan() -> None:
    with pytest.raises(ValueError):
        encode({"amount": float("nan")})


def test_encode_matches_hyperswitch_signature_test_vector() -> None:
    expected = (
        "38b0bc1ea66b14793e39cd58e93d37b799a507442d0dd8d37443fa95dec58e57"
        "da6db4742636fea31201c48e57a66e73a308a2e5a5c6bb831e4e39fe2227c00f"
    )
    raw = encode({"type": "payment_intent"})
    assert sign(raw, "hmac_secret_1234") == expected
    sample = SAMPLES / "common_utils_crypto_test_message.json"
    if sample.is_file():
        assert raw == sample.read_bytes()


def test_encode_reproduces_the_prism_sample_byte_for_byte() -> None:
    sample = SAMPLES / "prism_hyperswitch_connector_sample_webhook_body.json"
    if not sample.is_file():
        pytest.skip(f"reference sample {sample} is not available")
    raw = sample.read_bytes()
    assert encode(json.loads(raw)) == raw


def test_signed_factory_body_verifies() -> None:
    from receiver.core.signature import Secret, verify

    raw = encode(build_event("payment_succeeded"))
    assert verify(raw, sign(raw, "whsec"), [Secret.of("k1", "whsec")]) == "k1"
