"""The shop's order references in an event (pure) and their digests."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from receiver.core.errors import ConfigurationError, DataKeyMissing
from receiver.core.keyring import parse_data_keys
from receiver.core.order_refs import DEFAULT_ORDER_FIELDS, OrderFields, normalise
from receiver.testing.factories import build_event

KEY1 = base64.b64encode(b"1" * 32).decode()
KEY2 = base64.b64encode(b"2" * 32).decode()


def test_what_a_reference_is() -> None:
    assert normalise("  1234 ") == "1234"
    assert normalise(1234) == "1234"
    assert normalise("ORD/ä 'x' \"y\"") == "ORD/ä 'x' \"y\""
    for nothing in ("", "   ", None, True, 12.5, {"a": 1}, [1]):
        assert normalise(nothing) is None


def test_the_fields_are_read_from_the_events_object() -> None:
    fields = OrderFields()
    assert fields.paths == DEFAULT_ORDER_FIELDS
    body = build_event(
        "payment_succeeded", metadata={"order_id": 42}, merchant_order_reference_id="r-42"
    )
    assert fields.references(body) == [
        ("metadata.order_id", "42"),
        ("merchant_order_reference_id", "r-42"),
    ]
    assert fields.references(build_event("dispute_opened")) == []
    assert fields.references({"content": "not an object"}) == []
    assert fields.references({"content": {"object": {"metadata": "flat"}}}) == []
    nested = OrderFields.parse("metadata.shop.order")
    assert nested.references({"content": {"object": {"metadata": {"shop": {"order": "7"}}}}}) == [
        ("metadata.shop.order", "7")
    ]


def test_the_setting() -> None:
    assert OrderFields.parse(None) == OrderFields()
    assert OrderFields.parse(" a , b.c ").paths == ("a", "b.c")
    assert OrderFields.parse("none").paths == () and not OrderFields.parse("OFF").enabled
    assert OrderFields.parse("").paths == DEFAULT_ORDER_FIELDS
    for bad in ("a..b", "a b", "metadata.order_id,metadata.order_id", ",".join("abcdefghi")):
        with pytest.raises(ConfigurationError) as caught:
            OrderFields.parse(bad)
        assert "HOOKLEDGER_ORDER_FIELDS" in caught.value.message


def test_the_digest_is_keyed_for_the_order_index_alone() -> None:
    ring = parse_data_keys(f"k2:{KEY2},k1:{KEY1}")
    digest = ring.reference_digest("1234", "k1")
    # Not the plain hash, not the body hash's key, not another data key's digest.
    assert digest != hashlib.sha256(b"1234").hexdigest()
    assert digest != ring.digest(b"1234", "k1")
    assert digest != ring.reference_digest("1234", "k2")
    assert digest != hmac.new(base64.b64decode(KEY1), b"1234", hashlib.sha256).hexdigest()
    assert ring.reference_digest("1234", None) == hashlib.sha256(b"1234").hexdigest()
    assert ring.reference_digests("1234") == {
        "k2": ring.reference_digest("1234", "k2"),
        "k1": digest,
        None: hashlib.sha256(b"1234").hexdigest(),
    }
    with pytest.raises(DataKeyMissing):
        ring.reference_digest("1234", "k0")
    # Odd text (an unpaired surrogate from a JSON escape) is digested, never an error.
    assert len(ring.reference_digest("\ud800", "k1")) == 64
