"""The shop's order references in an event's object (pure: no I/O, no configuration read).

Support's first question is "where is order 1234?", and the processor's object does not
answer it by its id: the shop's reference is in the payment's ``metadata`` (the README's
example uses ``metadata.order_id``) or in ``merchant_order_reference_id``. The reference
fields are configured (``HOOKLEDGER_ORDER_FIELDS``: dotted paths into the event's
``content.object``); each stored event's values of them are indexed as a digest
(:meth:`receiver.core.keyring.Keyring.reference_digest`: keyed with the data keys, never the
value itself), so an exact value finds its events whatever seals their bodies.

A value is taken as the shop wrote it, less surrounding white space: a JSON string (not
empty), or a JSON integer written as its decimal digits (``1234`` and ``"1234"`` are one
order). Anything else (an object, a list, a float, a boolean, null) is not a reference.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from receiver.core.errors import ConfigurationError

#: The fields indexed when ``HOOKLEDGER_ORDER_FIELDS`` is not set.
DEFAULT_ORDER_FIELDS: Final = ("metadata.order_id", "merchant_order_reference_id")
#: At most this many fields (each costs a digest and an index row per event).
MAX_FIELDS: Final = 8
#: A field: 1 to 6 dot-separated names of letters, digits, ``_`` and ``-``; 128 characters.
FIELD: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,5}$")
MAX_FIELD_LENGTH: Final = 128
#: Words that turn the index off (``HOOKLEDGER_ORDER_FIELDS=none``).
OFF: Final = frozenset({"none", "off"})


def normalise(value: Any) -> str | None:
    """A reference as it is indexed and searched: a string less surrounding white space
    (``None`` when that leaves nothing), an integer's decimal digits; ``None`` otherwise."""
    if isinstance(value, str):
        text = value.strip()
        return text or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


@dataclass(frozen=True, slots=True)
class OrderFields:
    """The configured reference fields, in order (empty: nothing is indexed)."""

    paths: tuple[str, ...] = DEFAULT_ORDER_FIELDS
    #: Each path split at its dots (read on the receive path: split once, here).
    _names: tuple[tuple[str, tuple[str, ...]], ...] = field(
        init=False, repr=False, compare=False, default=()
    )

    def __post_init__(self) -> None:
        if len(self.paths) > MAX_FIELDS:
            raise ConfigurationError(
                f"HOOKLEDGER_ORDER_FIELDS: at most {MAX_FIELDS} fields, not {len(self.paths)}"
            )
        for path in self.paths:
            if not isinstance(path, str) or len(path) > MAX_FIELD_LENGTH or not FIELD.match(path):
                shown = path[:60] if isinstance(path, str) else type(path).__name__
                raise ConfigurationError(
                    f"HOOKLEDGER_ORDER_FIELDS: {shown!r} is not a field: dotted names of "
                    "letters, digits, '_' and '-' into the event's object "
                    "(metadata.order_id, merchant_order_reference_id)"
                )
        if len(set(self.paths)) != len(self.paths):
            raise ConfigurationError("HOOKLEDGER_ORDER_FIELDS: a field is named twice")
        names = tuple((path, tuple(path.split("."))) for path in self.paths)
        object.__setattr__(self, "_names", names)

    @classmethod
    def parse(cls, spec: str | Iterable[str] | OrderFields | None) -> OrderFields:
        """``"metadata.order_id,merchant_order_reference_id"`` (comma-separated), an iterable
        of paths, or ``none``/``off`` (nothing indexed); ``None``: the defaults."""
        if isinstance(spec, OrderFields):
            return spec
        if spec is None:
            return cls()
        if isinstance(spec, str):
            if spec.strip().lower() in OFF:
                return cls(())
            parts = [p.strip() for p in spec.split(",")]
            paths = tuple(p for p in parts if p)
            if not paths:
                return cls()
            return cls(paths)
        return cls(tuple(str(p).strip() for p in spec))

    @property
    def enabled(self) -> bool:
        return bool(self.paths)

    def describe(self) -> str:
        """The fields as :meth:`parse` takes them (``none`` for none)."""
        return ",".join(self.paths) or "none"

    def references(self, body: Mapping[str, Any]) -> list[tuple[str, str]]:
        """``(field, value)`` for each configured field the event ``body``'s
        ``content.object`` holds a reference in (see :func:`normalise`), in field order."""
        found: list[tuple[str, str]] = []
        if not self._names:
            return found
        content = body.get("content")
        obj = content.get("object") if type(content) is dict else None
        if type(obj) is not dict:
            return found
        for path, names in self._names:
            value: Any = obj
            for name in names:
                if type(value) is not dict:
                    value = None
                    break
                value = value.get(name)
            if value is None:
                continue
            reference = normalise(value)
            if reference is not None:
                found.append((path, reference))
        return found


__all__ = ["DEFAULT_ORDER_FIELDS", "OrderFields", "normalise"]
