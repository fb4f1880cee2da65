"""Reading and validating fields of JSON request bodies (pure, no I/O).

Each helper raises :class:`~reconcile.sandbox.errors.SandboxError`: ``IR_01`` when a required
field is missing (or ``null``), ``IR_04`` when a field has the wrong type or value.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any, Final

from reconcile.sandbox.errors import invalid, missing

#: Caller-supplied ids: 1 to 64 letters, digits, ``_`` and ``-``.
ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
CURRENCY_PATTERN: Final = re.compile(r"[A-Z]{3}")

Body = Mapping[str, Any]


def integer(body: Body, name: str, *, required: bool = False, minimum: int = 0) -> int | None:
    """An integer field (``true`` is not an integer) of at least ``minimum``."""
    value = body.get(name)
    if value is None:
        if required:
            raise missing(name)
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise invalid(f"Invalid value provided: {name} (an integer of at least {minimum})")
    return value


def required_integer(body: Body, name: str, *, minimum: int = 0) -> int:
    """A required integer field."""
    value = integer(body, name, required=True, minimum=minimum)
    assert value is not None
    return value


def string(
    body: Body,
    name: str,
    *,
    required: bool = False,
    max_length: int | None = None,
    choices: Collection[str] | None = None,
) -> str | None:
    """A string field, optionally bounded in length or limited to ``choices``."""
    value = body.get(name)
    if value is None:
        if required:
            raise missing(name)
        return None
    if not isinstance(value, str):
        raise invalid(f"Invalid value provided: {name} (a string)")
    if max_length is not None and len(value) > max_length:
        raise invalid(f"Invalid value provided: {name} (at most {max_length} characters)")
    if choices is not None and value not in choices:
        raise invalid(f"Invalid value provided: {name} (one of {', '.join(sorted(choices))})")
    return value


def required_string(body: Body, name: str, **kwargs: Any) -> str:
    """A required string field."""
    value = string(body, name, required=True, **kwargs)
    assert value is not None
    return value


def identifier(body: Body, name: str) -> str | None:
    """A caller-supplied id: 1 to 64 letters, digits, ``_`` and ``-``."""
    value = string(body, name)
    if value is not None and not ID_PATTERN.fullmatch(value):
        raise invalid(f"Invalid value provided: {name} (1 to 64 letters, digits, '_' and '-')")
    return value


def currency(body: Body, *, required: bool = True) -> str | None:
    """A three-letter upper-case ISO 4217 code."""
    value = string(body, "currency", required=required)
    if value is not None and not CURRENCY_PATTERN.fullmatch(value):
        raise invalid("Invalid value provided: currency (a three-letter ISO 4217 code)")
    return value


def boolean(body: Body, name: str, default: bool = False) -> bool:
    """A boolean field."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"Invalid value provided: {name} (true or false)")
    return value


def obj(body: Body, name: str) -> dict[str, Any] | None:
    """A JSON object field."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"Invalid value provided: {name} (an object)")
    return value


def array(body: Body, name: str) -> list[Any] | None:
    """A JSON array field."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise invalid(f"Invalid value provided: {name} (an array)")
    return value


def metadata(
    body: Body, *, max_pairs: int = 50, max_key: int = 40, max_value: int = 500
) -> dict[str, Any] | None:
    """``metadata``: at most 50 pairs, keys up to 40 characters, string values up to 500."""
    value = obj(body, "metadata")
    if value is None:
        return None
    if len(value) > max_pairs:
        raise invalid(f"Invalid value provided: metadata (at most {max_pairs} pairs)")
    for key, item in value.items():
        if len(key) > max_key:
            raise invalid(f"Invalid value provided: metadata (keys at most {max_key} characters)")
        if isinstance(item, str) and len(item) > max_value:
            raise invalid(
                f"Invalid value provided: metadata (values at most {max_value} characters)"
            )
    return value
