"""JSON decoding that cannot crash on valid JSON: :func:`loads`.

The standard :func:`json.loads` is recursive: a document nested about a thousand levels deep
(say a ``metadata`` object in one list row) raises :class:`RecursionError`, which would end a
whole listing. It also refuses integers of more than 4,300 digits (``ValueError``, Python's
guard against quadratic ``int(str)``). Both are valid JSON a processor may relay from a
merchant's own ``metadata``.

:func:`loads` therefore tries :func:`json.loads` first (fast, C) and, when it raises
``RecursionError`` or ``ValueError``, parses again with :func:`loads_iterative`: a parser with
an explicit stack instead of recursion, which builds the same Python structure (``dict`` with
the last of duplicate keys, ``list``, ``str`` with the same escape handling, lone surrogates
included, ``int``, ``float``, ``NaN``/``Infinity``, ``True``/``False``/``None``) at any depth in
linear time. Text that is not JSON still raises :class:`json.JSONDecodeError` (a ``ValueError``).

Beware that a structure nested that deep cannot be handled by recursive code either
(``repr``, ``==``, :func:`json.dumps`, ``copy.deepcopy``); it can be walked iteratively, and it
can be freed (CPython's deallocator does not recurse on the C stack for ``dict``/``list``).
"""

from __future__ import annotations

import json
import json.decoder
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

__all__ = ["loads", "loads_iterative"]

_WS: Final = re.compile(r"[ \t\n\r]*")
_NUMBER: Final = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_CONSTANTS: Final[dict[str, Any]] = {
    "true": True,
    "false": False,
    "null": None,
    "NaN": float("nan"),
    "Infinity": float("inf"),
    "-Infinity": float("-inf"),
}
#: The string scanner of :mod:`json` (C when available): escapes, lone surrogates, strictness.
_scanstring: Final[Callable[[str, int, bool], tuple[str, int]]] = json.decoder.scanstring  # type: ignore[attr-defined]
#: Python's default ``int`` string conversion limit (``sys.get_int_max_str_digits()``).
_INT_DIGITS: Final = 4300


def loads(text: str) -> Any:
    """Decode JSON ``text``: :func:`json.loads`, else :func:`loads_iterative` for deep documents.

    A leading byte-order mark is ignored. Raises :class:`json.JSONDecodeError` for text that
    is not JSON.
    """
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        return json.loads(text)
    except RecursionError:
        pass
    except ValueError:
        # Not JSON, or an integer over 4,300 digits: the iterative parser tells them apart.
        pass
    return loads_iterative(text)


def _skip(text: str, index: int) -> int:
    """Where the whitespace at ``index`` ends."""
    match = _WS.match(text, index)
    return match.end() if match else index


def _int(digits: str) -> int:
    if len(digits) <= _INT_DIGITS:
        return int(digits)
    return int(Decimal(digits))  # not subject to the int(str) digit limit


def loads_iterative(text: str) -> Any:
    """Parse JSON ``text`` without recursion; the result equals ``json.loads(text)``'s."""
    end = len(text)
    index = _skip(text, 0)
    # Open containers, innermost last, with the key awaiting its value (objects only).
    stack: list[tuple[dict[str, Any] | list[Any], str]] = []
    while True:
        # -- one value starting at ``index`` ----------------------------------------------
        value: Any
        char = text[index : index + 1]
        if char == "{":
            index = _skip(text, index + 1)
            if text.startswith("}", index):
                value, index = {}, index + 1
            else:
                key, index = _key(text, index)
                stack.append(({}, key))
                continue
        elif char == "[":
            index = _skip(text, index + 1)
            if text.startswith("]", index):
                value, index = [], index + 1
            else:
                stack.append(([], ""))
                continue
        elif char == '"':
            value, index = _scanstring(text, index + 1, True)
        else:
            value, index = _scalar(text, index)
        # -- attach it to its container, closing every container that ends here ------------
        while True:
            index = _skip(text, index)
            if not stack:
                if index != end:
                    raise json.JSONDecodeError("Extra data", text, index)
                return value
            container, key = stack[-1]
            if isinstance(container, dict):
                container[key] = value
            else:
                container.append(value)
            char = text[index : index + 1]
            if char == ",":
                index = _skip(text, index + 1)
                if isinstance(container, dict):
                    key, index = _key(text, index)
                    stack[-1] = (container, key)
                break
            if char == ("}" if isinstance(container, dict) else "]"):
                stack.pop()
                value, index = container, index + 1
                continue
            expected = "',' or '}'" if isinstance(container, dict) else "',' or ']'"
            raise json.JSONDecodeError(f"Expecting {expected} delimiter", text, index)


def _key(text: str, index: int) -> tuple[str, int]:
    """An object key and its ``:`` at ``index``; returns the key and where its value starts."""
    if not text.startswith('"', index):
        raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, index)
    key, index = _scanstring(text, index + 1, True)
    index = _skip(text, index)
    if not text.startswith(":", index):
        raise json.JSONDecodeError("Expecting ':' delimiter", text, index)
    return key, _skip(text, index + 1)


def _scalar(text: str, index: int) -> tuple[Any, int]:
    """A number or a constant at ``index``."""
    for word, constant in _CONSTANTS.items():
        if text.startswith(word, index):
            return constant, index + len(word)
    match = _NUMBER.match(text, index)
    if match is None:
        raise json.JSONDecodeError("Expecting value", text, index)
    integer, fraction, exponent = match.groups()
    if fraction or exponent:
        return float(integer + (fraction or "") + (exponent or "")), match.end()
    return _int(integer), match.end()
