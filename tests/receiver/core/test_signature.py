from __future__ import annotations

from pathlib import Path

import pytest

from receiver.core.errors import (
    ConfigurationError,
    SignatureError,
    SignatureMalformed,
    SignatureMissing,
)
from receiver.core.signature import Secret, parse_secrets, sign, verify

VECTOR_KEY = "hmac_secret_1234"
VECTOR_MESSAGE = b'{"type":"payment_intent"}'
VECTOR_HEX = (
    "38b0bc1ea66b14793e39cd58e93d37b799a507442d0dd8d37443fa95dec58e57"
    "da6db4742636fea31201c48e57a66e73a308a2e5a5c6bb831e4e39fe2227c00f"
)
SAMPLE = (
    Path(__file__).resolve().parents[4]
    / "shared/reference/hyperswitch-samples/common_utils_crypto_test_message.json"
)


def test_known_answer_vector_from_hyperswitch() -> None:
    assert sign(VECTOR_MESSAGE, VECTOR_KEY) == VECTOR_HEX
    assert verify(VECTOR_MESSAGE, VECTOR_HEX, [Secret.of("k", VECTOR_KEY)]) == "k"


def test_known_answer_vector_over_the_shipped_sample_bytes() -> None:
    if not SAMPLE.exists():
        pytest.skip("shared/ samples not present beside the checkout")
    assert sign(SAMPLE.read_bytes(), VECTOR_KEY) == VECTOR_HEX


def test_upper_case_hex_and_surrounding_space_accepted() -> None:
    assert verify(VECTOR_MESSAGE, f" {VECTOR_HEX.upper()} ", [Secret.of("k", VECTOR_KEY)]) == "k"


def test_reserialised_body_fails() -> None:
    import json

    reserialised = json.dumps(json.loads(VECTOR_MESSAGE)).encode()  # ", " and ": " separators
    assert reserialised != VECTOR_MESSAGE
    with pytest.raises(SignatureError):
        verify(reserialised, VECTOR_HEX, [Secret.of("k", VECTOR_KEY)])


def test_rotation_reports_which_secret_matched() -> None:
    secrets = parse_secrets("new:s3cr3t-new,old:s3cr3t-old")
    assert verify(b"{}", sign(b"{}", "s3cr3t-old"), secrets) == "old"
    assert verify(b"{}", sign(b"{}", "s3cr3t-new"), secrets) == "new"


@pytest.mark.parametrize(
    "signature",
    [None, "", "abc", "z" * 128, "é" * 128, VECTOR_HEX[:-1], VECTOR_HEX + "0", "0" * 128],
)
def test_bad_signatures_rejected(signature: str | None) -> None:
    with pytest.raises(SignatureError):
        verify(VECTOR_MESSAGE, signature, [Secret.of("k", VECTOR_KEY)])


@pytest.mark.parametrize(
    ("signature", "error"),
    [
        (None, SignatureMissing),
        (" \t ", SignatureMissing),
        ("abc", SignatureMalformed),
        (VECTOR_HEX[:64] + "  " + VECTOR_HEX[66:], SignatureMalformed),  # white space inside
        (VECTOR_HEX[:64] + "\t\n" + VECTOR_HEX[66:], SignatureMalformed),
        (VECTOR_HEX[:64] + "\x0b\x0c" + VECTOR_HEX[66:], SignatureMalformed),
        ("\u0663" * 128, SignatureMalformed),  # a digit, not an ASCII one
        ("\uff10" * 128, SignatureMalformed),
        ("0x" + VECTOR_HEX[2:], SignatureMalformed),
        (VECTOR_HEX[:-1] + "g", SignatureMalformed),
        ("0" * 128, SignatureError),
        (VECTOR_HEX[:-1] + ("1" if VECTOR_HEX[-1] != "1" else "2"), SignatureError),
    ],
)
def test_each_bad_signature_is_told_apart(signature: str | None, error: type[Exception]) -> None:
    with pytest.raises(SignatureError) as raised:
        verify(VECTOR_MESSAGE, signature, [Secret.of("k", VECTOR_KEY)])
    assert type(raised.value) is error


def test_mixed_case_hex_accepted() -> None:
    mixed = "".join(c.upper() if i % 2 else c for i, c in enumerate(VECTOR_HEX))
    assert verify(VECTOR_MESSAGE, mixed, [Secret.of("k", VECTOR_KEY)]) == "k"


def test_no_secret_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        verify(VECTOR_MESSAGE, VECTOR_HEX, [])
    with pytest.raises(ConfigurationError):
        Secret.of("k", "")
    with pytest.raises(ConfigurationError):
        parse_secrets("a:x,a:y")


def test_secret_value_never_in_repr() -> None:
    secret = Secret.of("primary", "super-secret-value")
    assert "super-secret-value" not in repr(secret)
    assert "super-secret-value" not in repr(parse_secrets({"p": "super-secret-value"}))


def test_bare_secret_gets_default_id() -> None:
    (only,) = parse_secrets("just-a-secret")
    assert only.id == "default"
