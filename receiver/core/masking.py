"""Masking card data and secrets in stored bodies and headers before anyone looks at them.

Pure (no I/O). Used by the ops console and ``hookledger show``: an operator reads events,
never a card number, a CVC, a client secret or an API key. What is masked:

- values under keys that name a secret or card data (``card_number``, ``card_cvc``, ``cvc``,
  ``cvv``, ``pin``, ``password``, ``client_secret``, ``api_key``, ``*_secret``, ``*token``,
  ``authorization``, ``cookie``...), whatever the value;
- anywhere in a string: digit runs of 12 to 19 digits (spaces or dashes allowed) that pass
  the Luhn check (a card number, kept as its last four digits), processor API keys
  (``snd_``/``prd_``/``dev_``), webhook secrets (``whsec_``) and client secrets
  (``..._secret_...``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

MASK: Final = "•••"

_SECRET_KEYS: Final = frozenset(
    {
        "card_number",
        "card_cvc",
        "cvc",
        "cvv",
        "cvv2",
        "pin",
        "password",
        "passwd",
        "client_secret",
        "api_key",
        "api-key",
        "apikey",
        "secret",
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "account_number",
        "iban",
        "routing_number",
        "bank_account_number",
    }
)
_SECRET_PARTS: Final = ("secret", "password", "token", "cvc", "cvv", "private_key")

_CARDISH = re.compile(r"(?<![\d])(?:\d[ -]?){11,18}\d(?![\d])")
_KEYISH = re.compile(
    r"\b(?:snd|prd|dev)_[A-Za-z0-9]{8,}\b|\bwhsec_[A-Za-z0-9_\-]{4,}|\b[\w-]+_secret_[\w-]+"
)


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        n = ord(ch) - 48
        if i % 2:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def _card(match: re.Match[str]) -> str:
    digits = re.sub(r"[ -]", "", match.group(0))
    if 12 <= len(digits) <= 19 and _luhn(digits):
        return f"{MASK}{digits[-4:]}"
    return match.group(0)


def mask_text(text: str) -> str:
    """``text`` with card numbers (all but the last four digits) and keys masked."""
    return _KEYISH.sub(MASK, _CARDISH.sub(_card, text))


def is_secret_key(key: str) -> bool:
    """Whether a field or header of this name holds a secret or card data."""
    lowered = key.lower()
    return lowered in _SECRET_KEYS or any(part in lowered for part in _SECRET_PARTS)


def mask_value(value: Any) -> Any:
    """A copy of a decoded JSON value with secrets and card data masked."""
    if isinstance(value, Mapping):
        return {
            k: (MASK if is_secret_key(str(k)) and v not in (None, "") else mask_value(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mask_value(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10**11:
        return mask_value(str(value)) if _CARDISH.fullmatch(str(value)) else value
    return value


def mask_body(body: bytes) -> str:
    """A stored body for display: pretty JSON with secrets masked (or masked text when it
    is not JSON)."""
    try:
        data = json.loads(body)
    except ValueError:
        return mask_text(body.decode("utf-8", errors="replace"))
    return json.dumps(mask_value(data), indent=2, ensure_ascii=False, sort_keys=False)


def mask_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Stored headers for display, secrets masked."""
    return {k: MASK if is_secret_key(k) else mask_text(str(v)) for k, v in headers.items()}


__all__ = ["MASK", "is_secret_key", "mask_body", "mask_headers", "mask_text", "mask_value"]
