"""``reconcile.core.jsondecode``: the iterative parser agrees with ``json.loads`` and never
recurses."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconcile.core.jsondecode import loads, loads_iterative

#: Any character, lone surrogates included (hypothesis leaves them out by default).
_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | _TEXT,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_TEXT, children, max_size=5),
    max_leaves=40,
)


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN and -0.0 told from 0.0 (``json.loads`` keeps both)."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(value=_JSON, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2, "\t"]))
def test_the_iterative_parser_equals_json_loads(value: Any, ascii_only: bool, indent: Any) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert _same(loads_iterative(text), json.loads(text))
    assert _same(loads(text), json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "{",
        "[1,]",
        "[1 2]",
        '{"a" 1}',
        '{"a":1,}',
        "{1:2}",
        "tru",
        "01",
        "1 2",
        '"\x01"',
        '"\\x"',
        '"unterminated',
        "<html>captive portal</html>",
        "[" * 5000,
        '{"a":' * 5000,
        "-",
        "1.",
        ".5",
        "+1",
        "nan",
    ],
)
def test_invalid_documents_are_refused_like_json_loads(text: str) -> None:
    with pytest.raises((ValueError, RecursionError)):  # "[" * 5000: recursion first
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        loads_iterative(text)
    with pytest.raises(ValueError):
        loads(text)


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deep_documents_decode(depth: int) -> None:
    text = '{"rows":[' + "[" * depth + '{"leaf":"\\ud800"}' + "]" * depth + "]}"
    with pytest.raises(RecursionError):
        json.loads(text)
    value = loads(text)["rows"]
    for _ in range(depth):
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
    assert value == [{"leaf": "\ud800"}]


def test_the_fallback_is_linear() -> None:
    def seconds(depth: int) -> float:
        text = '{"k":' * depth + "1" + "}" * depth
        started = time.perf_counter()
        loads_iterative(text)
        return time.perf_counter() - started

    small, large = min(seconds(20_000) for _ in range(3)), min(seconds(200_000) for _ in range(3))
    assert large < small * 10 * 3  # ten times the depth, well under a hundred times the time


def test_huge_integers_and_a_bom() -> None:
    digits = "7" * 10_000
    sevens = 7 * (10**10_000 - 1) // 9  # 10,000 sevens, without int(str)
    assert loads(f'{{"n": {digits}, "m": -{digits}}}') == {"n": sevens, "m": -sevens}
    assert loads('\ufeff{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}
