"""Unified error codes: the table, families and retry advice."""

from __future__ import annotations

import dataclasses

import pytest

from receiver.core.codes import (
    FAMILIES,
    LEGACY_CODES,
    UNIFIED_CODES,
    Retry,
    UnifiedCode,
    describe_unified_code,
)

SPEC_CODES = (
    [f"UE_{n}" for n in range(1001, 1019)]
    + ["UE_1099"]
    + [f"UE_{n}" for n in range(2001, 2005)]
    + [f"UE_{n}" for n in range(3001, 3004)]
    + [f"UE_{n}" for n in range(4001, 4005)]
    + [f"UE_{n}" for n in range(5001, 5022)]
    + ["UE_9000", "UE_1000", "UE_2000", "UE_3000", "UE_4000"]
)


def test_table_holds_every_spec_code_and_nothing_else() -> None:
    assert set(UNIFIED_CODES) == set(SPEC_CODES)
    assert len(UNIFIED_CODES) == 56
    assert all(meaning for meaning in UNIFIED_CODES.values())


def test_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        UNIFIED_CODES["UE_1001"] = "changed"  # type: ignore[index]


@pytest.mark.parametrize(
    ("code", "meaning"),
    [
        ("UE_1001", "insufficient funds"),
        ("UE_1018", "possible duplicate"),
        ("UE_2002", "additional authentication required"),
        ("UE_5003", "authentication not completed"),
        ("UE_9000", "fallback: something went wrong"),
        ("UE_2000", "not eligible, blocked, or 3DS required"),
    ],
)
def test_meanings(code: str, meaning: str) -> None:
    described = describe_unified_code(code)
    assert described is not None
    assert described.meaning == meaning
    assert described.is_known


@pytest.mark.parametrize(
    ("code", "family", "retry", "retryable"),
    [
        ("UE_1001", "UE_1xxx", Retry.NEVER, False),
        ("UE_1099", "UE_1xxx", Retry.NEVER, False),
        ("UE_1018", "UE_1xxx", Retry.CHECK_PREVIOUS_FIRST, True),
        ("UE_2001", "UE_2xxx", Retry.NEVER, False),
        ("UE_2002", "UE_2xxx", Retry.WITH_3DS, True),
        ("UE_3001", "UE_3xxx", Retry.WITH_BACKOFF, True),
        ("UE_3003", "UE_3xxx", Retry.WITH_BACKOFF, True),
        ("UE_4001", "UE_4xxx", Retry.FIX_REQUEST, False),
        ("UE_4004", "UE_4xxx", Retry.FIX_REQUEST, False),
        ("UE_5001", "UE_5xxx", Retry.SOMETIMES, True),
        ("UE_5003", "UE_5xxx", Retry.WITH_BACKOFF, True),
        ("UE_5021", "UE_5xxx", Retry.SOMETIMES, True),
        ("UE_9000", "UE_9xxx", Retry.TERMINAL, False),
        ("UE_1000", "UE_1xxx", Retry.NEVER, False),
        ("UE_2000", "UE_2xxx", Retry.NEVER, False),
        ("UE_3000", "UE_3xxx", Retry.WITH_BACKOFF, True),
        ("UE_4000", "UE_4xxx", Retry.FIX_REQUEST, False),
    ],
)
def test_family_and_retry_advice(code: str, family: str, retry: Retry, retryable: bool) -> None:
    described = describe_unified_code(code)
    assert described == UnifiedCode(
        code=code, family=family, meaning=UNIFIED_CODES[code], retry=retry
    )
    assert described.retryable is retryable


@pytest.mark.parametrize("code", SPEC_CODES)
def test_every_spec_code_is_described(code: str) -> None:
    described = describe_unified_code(code)
    assert described is not None
    assert described.code == code
    assert described.family in FAMILIES
    assert described.family == f"UE_{code[3]}xxx"
    assert described.is_legacy is (code in LEGACY_CODES)


@pytest.mark.parametrize(
    ("code", "family", "retry"),
    [
        ("UE_1042", "UE_1xxx", Retry.NEVER),
        ("UE_2999", "UE_2xxx", Retry.NEVER),
        ("UE_3100", "UE_3xxx", Retry.WITH_BACKOFF),
        ("UE_4005", "UE_4xxx", Retry.FIX_REQUEST),
        ("UE_5022", "UE_5xxx", Retry.SOMETIMES),
        ("UE_9001", "UE_9xxx", Retry.TERMINAL),
    ],
)
def test_unknown_well_formed_code_gets_family_advice(code: str, family: str, retry: Retry) -> None:
    described = describe_unified_code(code)
    assert described is not None
    assert described.family == family
    assert described.retry is retry
    assert described.meaning.startswith(f"unknown code in family {family}")
    assert not described.is_known
    assert not described.is_legacy


@pytest.mark.parametrize(
    "code",
    [None, "", "   ", "UE_", "UE_100", "UE_10011", "UE_000", "XE_1001", "UE-1001", "UE_7001",
     "UE_0001", "UE_1O01", "1001", "UE_１００１"],
)  # fmt: skip
def test_garbage_is_none(code: str | None) -> None:
    assert describe_unified_code(code) is None


def test_non_string_is_none() -> None:
    assert describe_unified_code(1001) is None  # type: ignore[arg-type]


def test_whitespace_and_case_are_tolerated() -> None:
    described = describe_unified_code("  ue_1001\n")
    assert described is not None
    assert described.code == "UE_1001"
    assert described.meaning == "insufficient funds"


def test_retry_is_a_str_enum() -> None:
    assert Retry("with_3ds") is Retry.WITH_3DS
    assert str(Retry.CHECK_PREVIOUS_FIRST) == "check_previous_first"
    assert {r.value for r in Retry} == {
        "never",
        "with_backoff",
        "with_3ds",
        "check_previous_first",
        "sometimes",
        "fix_request",
        "terminal",
    }


def test_unified_code_is_frozen() -> None:
    described = describe_unified_code("UE_1001")
    assert described is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        described.retry = Retry.WITH_BACKOFF  # type: ignore[misc]
