"""Masking card data and secrets before an operator sees a body (pure)."""

from __future__ import annotations

import json

from receiver.core.masking import MASK, mask_body, mask_headers, mask_text, mask_value
from receiver.testing.factories import build_event, encode


def test_card_numbers_keep_only_their_last_four_digits() -> None:
    assert mask_text("card 4242 4242 4242 4242 used") == f"card {MASK}4242 used"
    assert mask_text("4000-0566-5566-5556") == f"{MASK}5556"
    # Not a card: fails the Luhn check, or too short.
    assert mask_text("order 4242424242424241") == "order 4242424242424241"
    assert mask_text("amount 123456") == "amount 123456"


def test_secret_fields_and_keys_are_masked_wherever_they_are() -> None:
    body = {
        "content": {
            "object": {
                "client_secret": "pay_1_secret_abc",
                "payment_method_data": {"card": {"card_number": "4242424242424242", "cvc": "123"}},
                "metadata": {"note": "key snd_abcdefghijklmnop1234 and 5555555555554444"},
                "last4": "4242",
                "amount": 4242424242424242,
            }
        }
    }
    masked = mask_value(body)["content"]["object"]
    assert masked["client_secret"] == MASK
    assert masked["payment_method_data"]["card"] == {"card_number": MASK, "cvc": MASK}
    assert masked["metadata"]["note"] == f"key {MASK} and {MASK}4444"
    assert masked["last4"] == "4242"
    assert masked["amount"] == f"{MASK}4242"


def test_a_realistic_body_shows_no_secret() -> None:
    raw = build_event("payment_succeeded", object_id="pay_1", metadata={"pan": "4111111111111111"})
    shown = mask_body(encode(raw))
    assert "4111111111111111" not in shown
    assert raw["content"]["object"]["client_secret"] not in shown
    assert json.loads(shown)["content"]["object"]["payment_id"] == "pay_1"
    assert mask_body(b"not json 4111111111111111") == f"not json {MASK}1111"


def test_headers() -> None:
    shown = mask_headers({"X-Api-Key": "k", "Authorization": "Bearer x", "User-Agent": "ua"})
    assert shown == {"X-Api-Key": MASK, "Authorization": MASK, "User-Agent": "ua"}
