"""Unified error codes (``UE_xxxx``) and the retry advice for each (pure, no I/O).

Hyperswitch normalises acquirer declines into ``unified_code`` / ``unified_message`` on the
payment (and payout) object. Callers branch on the code, never on ``error_message``. The code's
first digit names its family; each family has one piece of retry advice, with a few documented
exceptions (``UE_1018``, ``UE_2002``, ``UE_5003``). Legacy coarse codes (``UE_1000`` ..
``UE_4000``) are still sent by acquirers not yet migrated and get their family's advice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final

__all__ = [
    "FAMILIES",
    "LEGACY_CODES",
    "UNIFIED_CODES",
    "Retry",
    "UnifiedCode",
    "describe_unified_code",
]


class Retry(StrEnum):
    """What a merchant should do about a payment that failed with a unified code."""

    NEVER = "never"
    """Do not retry: the card or issuer declined, or risk rules stopped the payment."""
    WITH_BACKOFF = "with_backoff"
    """A temporary problem: retry later with exponential backoff."""
    WITH_3DS = "with_3ds"
    """The issuer asks for authentication: retry with 3-D Secure."""
    CHECK_PREVIOUS_FIRST = "check_previous_first"
    """Possible duplicate: check the earlier payment before retrying or refunding."""
    SOMETIMES = "sometimes"
    """3-D Secure failed; the card may be fine, a retry may succeed."""
    FIX_REQUEST = "fix_request"
    """The request was wrong: fix it before trying again."""
    TERMINAL = "terminal"
    """Unrecognised failure: treat as final."""


_RETRYABLE: Final = frozenset(
    {Retry.WITH_BACKOFF, Retry.WITH_3DS, Retry.CHECK_PREVIOUS_FIRST, Retry.SOMETIMES}
)

#: Every unified code the processor documents, with its meaning.
UNIFIED_CODES: Final[Mapping[str, str]] = MappingProxyType(
    {
        # Legacy coarse codes (one code covers several messages; show ``unified_message``).
        "UE_1000": "card or payment-method problem",
        "UE_2000": "not eligible, blocked, or 3DS required",
        "UE_3000": "temporary problem",
        "UE_4000": "request data problem",
        # UE_1xxx: card or issuer declined.
        "UE_1001": "insufficient funds",
        "UE_1002": "card expired",
        "UE_1003": "card number invalid",
        "UE_1004": "security code incorrect",
        "UE_1005": "PIN incorrect",
        "UE_1006": "card reported lost or stolen",
        "UE_1007": "declined by issuer",
        "UE_1008": "card not supported",
        "UE_1009": "card restricted",
        "UE_1010": "transaction not permitted for this card",
        "UE_1011": "exceeds card limit",
        "UE_1012": "declined for security reasons",
        "UE_1013": "contact the card issuer",
        "UE_1014": "no record of the card",
        "UE_1015": "card not active",
        "UE_1016": "account cannot be used for this payment",
        "UE_1017": "cardholder cancelled the payment",
        "UE_1018": "possible duplicate",
        "UE_1099": "generic decline",
        # UE_2xxx: not eligible or stopped by risk rules.
        "UE_2001": "payment method unavailable",
        "UE_2002": "additional authentication required",
        "UE_2003": "payment blocked",
        "UE_2004": "currency or country unsupported",
        # UE_3xxx: temporary availability problem.
        "UE_3001": "service temporarily unavailable",
        "UE_3002": "could not be processed, try again",
        "UE_3003": "timed out",
        # UE_4xxx: problem in the request.
        "UE_4001": "required payment information missing or invalid",
        "UE_4002": "security code has the wrong length",
        "UE_4003": "payment session expired",
        "UE_4004": "transaction in an invalid state",
        # UE_5xxx: failed during 3-D Secure.
        "UE_5001": "card authentication failed",
        "UE_5002": "authentication declined by issuer",
        "UE_5003": "authentication not completed",
        "UE_5004": "cardholder could not be verified",
        "UE_5005": "authentication service unavailable",
        "UE_5006": "too many authentication attempts",
        "UE_5007": "device not recognised",
        "UE_5008": "invalid authentication response",
        "UE_5009": "no response from authentication service",
        "UE_5010": "card not enrolled",
        "UE_5011": "authentication timed out",
        "UE_5012": "authentication method unsupported",
        "UE_5013": "card expired",
        "UE_5014": "card number invalid",
        "UE_5015": "transaction not valid for authentication",
        "UE_5016": "no record of the card",
        "UE_5017": "declined for security reasons",
        "UE_5018": "card reported lost or stolen",
        "UE_5019": "authentication not permitted for the card",
        "UE_5020": "required authentication data missing or invalid",
        "UE_5021": "authentication session expired",
        # UE_9000: fallback.
        "UE_9000": "fallback: something went wrong",
    }
)

#: The legacy coarse codes, still returned by acquirers not yet migrated.
LEGACY_CODES: Final = frozenset({"UE_1000", "UE_2000", "UE_3000", "UE_4000"})

#: Family (``UE_<digit>xxx``) to (meaning, default retry advice).
FAMILIES: Final[Mapping[str, tuple[str, Retry]]] = MappingProxyType(
    {
        "UE_1xxx": ("card or issuer declined", Retry.NEVER),
        "UE_2xxx": ("not eligible or stopped by risk rules", Retry.NEVER),
        "UE_3xxx": ("temporary availability problem", Retry.WITH_BACKOFF),
        "UE_4xxx": ("problem in the request", Retry.FIX_REQUEST),
        "UE_5xxx": ("failed during 3-D Secure", Retry.SOMETIMES),
        "UE_9xxx": ("unrecognised failure", Retry.TERMINAL),
    }
)

#: Codes whose advice differs from their family's.
_EXCEPTIONS: Final[Mapping[str, Retry]] = MappingProxyType(
    {
        "UE_1018": Retry.CHECK_PREVIOUS_FIRST,
        "UE_2002": Retry.WITH_3DS,
        "UE_5003": Retry.WITH_BACKOFF,
    }
)

_CODE_RE: Final = re.compile(r"UE_([0-9])[0-9]{3}")


@dataclass(frozen=True, slots=True)
class UnifiedCode:
    """A unified error code with its family, meaning and retry advice."""

    code: str
    family: str
    meaning: str
    retry: Retry

    @property
    def retryable(self) -> bool:
        """True when a retry can succeed (possibly after a check or with 3-D Secure)."""
        return self.retry in _RETRYABLE

    @property
    def is_known(self) -> bool:
        """True when the code is one the processor documents (see :data:`UNIFIED_CODES`)."""
        return self.code in UNIFIED_CODES

    @property
    def is_legacy(self) -> bool:
        """True for the legacy coarse codes ``UE_1000`` .. ``UE_4000``."""
        return self.code in LEGACY_CODES


def describe_unified_code(code: str | None) -> UnifiedCode | None:
    """Describe ``code`` (for example ``"UE_1001"``); ``None`` for ``None`` or garbage.

    Surrounding whitespace and lower case are tolerated. A well-formed code that is not
    documented (``UE_1042``) gets its family's advice and the meaning
    ``"unknown code in family UE_1xxx (card or issuer declined)"``. A well-formed code in an
    undocumented family (``UE_7001``) is garbage, as is anything else.
    """
    if not isinstance(code, str):
        return None
    normalized = code.strip().upper()
    match = _CODE_RE.fullmatch(normalized)
    if match is None:
        return None
    family = f"UE_{match.group(1)}xxx"
    family_info = FAMILIES.get(family)
    if family_info is None:
        return None
    family_meaning, family_retry = family_info
    meaning = UNIFIED_CODES.get(normalized)
    if meaning is None:
        meaning = f"unknown code in family {family} ({family_meaning})"
    retry = _EXCEPTIONS.get(normalized, family_retry)
    return UnifiedCode(code=normalized, family=family, meaning=meaning, retry=retry)
