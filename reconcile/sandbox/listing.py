"""Parsing and validation of list requests, in both dialects (pure, no I/O).

Two dialects are served side by side:

- the seed interface's (``processor-interface.md``): JSON bodies with ``limit``/``offset``,
  ``created_gte``/``created_lte`` and single-value filters;
- Hyperswitch's real server (``hyperswitch-facts.md`` section 4): query strings that reject
  unknown parameters (``deny_unknown_fields``), ``created.gte``-style names, inclusive
  cursors, ``start_time``/``end_time`` ranges and array filters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reconcile.sandbox.clock import parse_timestamp
from reconcile.sandbox.errors import invalid


@dataclass(frozen=True, slots=True)
class Window:
    """An inclusive ``created`` range; ``None`` ends are open."""

    start: datetime | None = None
    end: datetime | None = None

    def __contains__(self, when: object) -> bool:
        if not isinstance(when, datetime):
            return False
        if self.start is not None and when < self.start:
            return False
        return self.end is None or when <= self.end


def query_params(items: Iterable[tuple[str, str]], allowed: Iterable[str]) -> dict[str, str]:
    """A query string as a dict; unknown or repeated parameters are a 400 (IR_04).

    Hyperswitch deserialises list queries into structs with ``deny_unknown_fields``.
    """
    allowed_set = set(allowed)
    params: dict[str, str] = {}
    for name, value in items:
        if name not in allowed_set:
            expected = ", ".join(f"`{n}`" for n in sorted(allowed_set))
            raise invalid(
                f"Query deserialize error: unknown field `{name}`, expected one of {expected}"
            )
        if name in params:
            raise invalid(f"Query deserialize error: duplicate field `{name}`")
        params[name] = value
    return params


def limit_from_query(value: str | None, *, default: int, maximum: int) -> int:
    """``limit`` from a query string: an unsigned integer in ``1..maximum``."""
    if value is None:
        return default
    if not value.isdigit():
        raise invalid("Query deserialize error: limit must be an unsigned integer")
    return _check_limit(int(value), maximum)


def limit_from_body(body: Mapping[str, Any], *, default: int, maximum: int) -> int:
    """``limit`` from a JSON body: an integer in ``1..maximum``."""
    value = body.get("limit")
    if value is None:
        return default
    if not _is_int(value):
        raise invalid("limit must be an integer")
    return _check_limit(value, maximum)


def offset_from(value: object) -> int:
    """``offset`` from a body (int) or a query (digits); default 0, never negative."""
    if value is None:
        return 0
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise invalid("offset must be a non-negative integer")


def time_from(source: Mapping[str, Any], name: str, *, allow_naive: bool) -> datetime | None:
    """An ISO 8601 timestamp field, or ``None`` when absent; 400 when malformed.

    The Hyperswitch dialect needs an explicit offset (``Z`` or ``+00:00``); the seed dialect
    takes a value without one as UTC.
    """
    value = source.get(name)
    if value is None:
        return None
    parsed = parse_timestamp(value, allow_naive=allow_naive)
    if parsed is None:
        hint = "" if allow_naive else " with an offset, e.g. 2026-01-31T00:00:00Z"
        raise invalid(f"{name} must be an ISO 8601 timestamp{hint}")
    return parsed


def values_from(
    source: Mapping[str, Any], name: str, *, allowed: Iterable[str] | None = None
) -> set[str] | None:
    """A filter that may be one string or a list of strings; ``None`` when absent.

    With ``allowed`` any other value is rejected like serde rejects an unknown enum variant.
    """
    value = source.get(name)
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise invalid(f"{name} must be a string or a list of strings")
    if allowed is not None:
        allowed_list = list(allowed)
        for item in items:
            if item not in allowed_list:
                raise invalid(
                    f"{name}: unknown variant `{item}`, expected one of "
                    + ", ".join(f"`{a}`" for a in allowed_list)
                )
    return set(items)


def csv_values(params: Mapping[str, str], name: str) -> set[str] | None:
    """A comma-separated query filter (``dispute_status=a,b``); ``None`` when absent."""
    value = params.get(name)
    if value is None:
        return None
    return {part.strip() for part in value.split(",") if part.strip()}


def _check_limit(limit: int, maximum: int) -> int:
    if not 1 <= limit <= maximum:
        raise invalid(f"limit should be in between 1 and {maximum}")
    return limit


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
