"""Data keys, sealing and the keyed body hash (receiver/crypto.py, receiver/sealing.py): pure."""

from __future__ import annotations

import base64
import hashlib

import pytest

from receiver.core.errors import BodyRedacted, ConfigurationError, DataKeyMissing, DataNotAuthentic
from receiver.core.keyring import DataKey, Keyring, generate_key, parse_data_keys, sealed_with
from receiver.storage.sealed_columns import (
    BODY,
    ERROR,
    open_body,
    open_error,
    open_headers,
    same_body,
    seal_error,
    seal_event_row,
)

K1 = base64.b64encode(bytes(range(32))).decode()
K2 = base64.urlsafe_b64encode(bytes(range(32, 64))).decode().rstrip("=")
BODY_BYTES = b'{"event_id":"evt_1","content":{"object":{"email":"ada@example.com"}}}'


def ring(spec: str) -> Keyring:
    return parse_data_keys(spec)


def test_a_sealed_body_opens_with_its_key_and_context_only() -> None:
    k = ring(f"k1:{K1}")
    sealed = k.seal(BODY_BYTES, purpose=BODY, context="evt_1")
    assert b"ada@example.com" not in sealed and sealed_with(sealed) == "k1"
    assert k.open(sealed, purpose=BODY, context="evt_1") == BODY_BYTES
    # Moved to another event's row, or read as something else: it does not open.
    with pytest.raises(DataNotAuthentic, match="'k1'"):
        k.open(sealed, purpose=BODY, context="evt_2")
    with pytest.raises(DataNotAuthentic):
        k.open(sealed, purpose="headers", context="evt_1")
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(DataNotAuthentic):
        k.open(tampered, purpose=BODY, context="evt_1")
    # Two seals of the same bytes differ (a fresh nonce each time).
    assert k.seal(BODY_BYTES, purpose=BODY, context="evt_1") != sealed


def test_reads_accept_any_configured_key_and_name_a_missing_one() -> None:
    old = ring(f"k1:{K1}")
    sealed = old.seal(BODY_BYTES, purpose=BODY, context="e")
    both = ring(f"k2:{K2},k1:{K1}")
    assert both.primary == "k2" and both.ids == ("k2", "k1")
    assert both.open(sealed, purpose=BODY, context="e") == BODY_BYTES
    assert sealed_with(both.seal(BODY_BYTES, purpose=BODY, context="e")) == "k2"
    with pytest.raises(DataKeyMissing, match="'k1', which is not configured"):
        ring(f"k2:{K2}").open(sealed, purpose=BODY, context="e")
    with pytest.raises(DataKeyMissing):
        Keyring().open(sealed, purpose=BODY, context="e")
    # The same id with another key value: a clear error, not garbage.
    with pytest.raises(DataNotAuthentic, match="another key value"):
        ring(f"k1:{K2}").open(sealed, purpose=BODY, context="e")


def test_without_a_key_nothing_is_sealed_and_plaintext_is_read_as_it_is() -> None:
    none = Keyring()
    assert not none.enabled and none.primary is None
    assert none.seal(BODY_BYTES, purpose=BODY) is BODY_BYTES
    assert none.seal_text("x", purpose=ERROR) == "x"
    assert ring(f"k1:{K1}").open(BODY_BYTES, purpose=BODY, context="e") == BODY_BYTES
    assert none.digest(BODY_BYTES, None) == hashlib.sha256(BODY_BYTES).hexdigest()


def test_the_body_hash_is_keyed_and_pinned() -> None:
    """A known answer, computed independently as HMAC-SHA-256 under HKDF-SHA-256 (RFC 5869,
    no salt, info ``hookledger/v1/body-hash``) of the key: changing the derivation would
    turn every stored body hash into a false conflict."""
    k = ring(f"k1:{K1},k2:{K2}")
    keyed = k.digest(b'{"type":"payment_intent"}', "k1")
    assert keyed == "b6652128293b184db9328c973fc74e6c66ecfc8c8903f62943801cfe58016b4d"
    assert keyed != hashlib.sha256(b'{"type":"payment_intent"}').hexdigest()
    assert k.digest(b'{"type":"payment_intent"}', "k2") != keyed
    with pytest.raises(DataKeyMissing):
        k.digest(b"x", "k9")


def test_text_tokens_keep_plain_words_around_them_and_never_raise_when_read() -> None:
    k = ring(f"k1:{K1}")
    deferred = seal_error(k, "deferred: order for ada@example.com not there yet")
    assert deferred is not None and deferred.startswith("deferred: {enc1:k1:")
    assert "ada@" not in deferred
    appended = seal_error(k, "boom: ada@example.com") + "\nlease expired after 3 attempts"
    assert open_error(k, appended) == "boom: ada@example.com\nlease expired after 3 attempts"
    assert open_error(k, deferred) == "deferred: order for ada@example.com not there yet"
    assert open_error(ring(f"k2:{K2}"), appended) == (
        "[sealed with data key 'k1', which is not configured]\nlease expired after 3 attempts"
    )
    assert open_error(ring(f"k1:{K2}"), deferred) == (
        "deferred: [sealed text that does not open with data key 'k1']"
    )
    assert open_error(k, None) is None and seal_error(k, None) is None


def test_reseal_text_moves_tokens_to_the_primary_and_seals_clear_text() -> None:
    old = ring(f"k1:{K1}")
    new = ring(f"k2:{K2},k1:{K1}")
    text = old.seal_text("secret", purpose=ERROR) + "\nplain"
    again, changed = new.reseal_text(text, purpose=ERROR)
    assert changed and again.startswith("{enc1:k2:") and again.endswith("\nplain")
    assert ring(f"k2:{K2}").open_text(again, purpose=ERROR) == "secret\nplain"
    assert new.reseal_text(again, purpose=ERROR) == (again, False)
    clear, changed = new.reseal_text("a legacy traceback", purpose=ERROR)
    assert changed and new.open_text(clear, purpose=ERROR) == "a legacy traceback"
    with pytest.raises(DataKeyMissing):
        ring(f"k3:{K2}").reseal_text(text, purpose=ERROR)


def test_a_sealed_row_and_duplicate_detection_across_keys() -> None:
    k1 = ring(f"k1:{K1}")
    row = seal_event_row(
        k1, {"event_id": "evt_1", "body": BODY_BYTES, "headers": '{"user-agent": "x"}'}
    )
    assert row["key_id"] == "k1" and b"ada" not in row["body"]
    assert "user-agent" not in row["headers"]
    assert row["body_sha256"] == k1.digest(BODY_BYTES, "k1")
    assert open_body(k1, row["body"], "evt_1") == BODY_BYTES
    assert open_headers(k1, row["headers"], "evt_1") == {"user-agent": "x"}
    # The same body arriving after a rotation to k2 is still the same body.
    k2 = ring(f"k2:{K2},k1:{K1}")
    again = seal_event_row(k2, {"event_id": "evt_1", "body": BODY_BYTES, "headers": "{}"})
    assert same_body(k2, "k1", row["body_sha256"], again) is True
    other = seal_event_row(k2, {"event_id": "evt_1", "body": b"{}", "headers": "{}"})
    assert same_body(k2, "k1", row["body_sha256"], other) is False
    # Against a row stored in the clear (plain SHA-256), too.
    assert same_body(k2, None, hashlib.sha256(BODY_BYTES).hexdigest(), again) is True
    # The stored row's key is gone: it cannot be told.
    only_k2 = ring(f"k2:{K2}")
    again2 = seal_event_row(only_k2, {"event_id": "evt_1", "body": BODY_BYTES, "headers": "{}"})
    assert same_body(only_k2, "k1", row["body_sha256"], again2) is None
    with pytest.raises(BodyRedacted):
        open_body(k1, b"", "evt_1")
    assert open_headers(k1, "{}", "evt_1") == {}


def test_configuration_errors_are_one_line_and_never_show_a_key() -> None:
    secret = "c2VjcmV0LXZhbHVlLXRoYXQtaXMtbm90LTMyLWJ5dGVz"
    for spec in (f"k1:{secret}", f"k1:{K1},k1:{K2}", "k1", f"bad id:{K1}", "k1:@@@"):
        with pytest.raises(ConfigurationError) as caught:
            parse_data_keys(spec)
        message = caught.value.message
        assert "\n" not in message and secret not in message and K1 not in message
    assert "value" not in repr(DataKey("k1", bytes(32)))
    assert repr(ring(f"k1:{K1}")) == "Keyring(ids=['k1'], primary='k1')"
    assert parse_data_keys(None).enabled is False
    assert parse_data_keys({"a": K1, "b": K2}).ids == ("a", "b")
    assert len(base64.urlsafe_b64decode(generate_key())) == 32
