"""Lenient readers of JSON fields (pure, no I/O): a value of the wrong type becomes ``None``,
never an exception, because the receiver stores every authentic event, even one whose fields
it does not understand.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any


def read_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def read_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def read_minor_unit(value: object) -> int | None:
    """An amount in the lowest unit sent as an integer or as a string of digits (``"1000"``)."""
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text[:1] == "-" else text
        if digits.isascii() and digits.isdigit():
            return int(text)
        return None
    return read_int(value)


def read_mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, dict) else None


def read_datetime(value: object) -> datetime | None:
    """An ISO 8601 timestamp as an aware UTC datetime; naive values are taken as UTC."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        return None


def parse_timestamp(value: object) -> datetime | None:
    """Parse a processor timestamp (ISO 8601) to an aware UTC datetime; ``None`` if invalid."""
    return read_datetime(value)


def read_card(data: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    container = read_mapping(data.get(key))
    if container is None:
        return None
    return read_mapping(container.get("card"))
