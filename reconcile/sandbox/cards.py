"""Test cards: which outcome a card number produces when a payment is confirmed (pure, no I/O).

Any expiry date in the future and any CVC work; a past expiry date declines like the expired
card. A number that fails the Luhn check is rejected with 400 ``IR_04`` (no attempt is made).
Any other Luhn-valid number succeeds.

====================  ===================================================================
card number           outcome on confirm
====================  ===================================================================
4242424242424242      ``succeeded`` (``requires_capture`` with ``capture_method: manual``
                      or ``manual_multiple``)
5555555555554444      same as 4242424242424242 (Mastercard)
4000000000000002      ``failed``, ``unified_code`` UE_1007 "declined by issuer"
                      (``error_code`` ``card_declined``, issuer code 05)
4000000000009995      ``failed``, UE_1001 "insufficient funds" (issuer code 51)
4000000000000069      ``failed``, UE_1002 "card expired" (issuer code 54)
4000000000003220      ``requires_customer_action`` (3-D Secure): complete it with
                      ``POST /__sandbox/payments/<id>/authenticate``
                      ``{"result": "success"|"failure"}``; failure is UE_5001
4000000000000259      succeeds like 4242..., then a dispute is opened on the next tick
                      (``POST /__sandbox/tick``; ``Sandbox(auto_dispute=False)`` turns it off)
4000000000000077      ``processing``; the next tick moves it to ``succeeded``
                      (or ``requires_capture`` for manual capture)
4000000000000333      authorises like 4242..., but its **captures and voids are
                      asynchronous**: ``POST /payments/<id>/capture`` answers ``processing``
                      (``partially_captured_and_processing`` for a partial capture of a
                      ``manual_multiple`` payment), ``POST /payments/<id>/cancel`` answers
                      ``processing``; the next tick settles them (``succeeded``,
                      ``partially_captured``, ``partially_captured_and_capturable``,
                      ``cancelled``), as Hyperswitch does for ``CaptureInitiated`` and
                      ``VoidInitiated`` attempts
4000000000000150      **partial authorisation**: the issuer approves half the amount (rounded
                      down). With ``enable_partial_authorization: true`` on the payment:
                      ``partially_authorized_and_requires_capture`` for manual capture,
                      ``partially_captured`` (half received) for automatic capture. Without
                      it: declined like 4000000000009995 (UE_1001)
====================  ===================================================================

Only the last four digits, the first six (the BIN, ``card_isin``) and the brand are ever kept;
the full number is never stored or echoed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

OutcomeKind = Literal[
    "success", "decline", "three_ds", "processing", "dispute", "async", "partial_auth"
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CardOutcome:
    """What a confirm with a given card does. Declines carry the codes the payment gets."""

    kind: OutcomeKind
    unified_code: str | None = None
    unified_message: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    issuer_code: str | None = None
    issuer_message: str | None = None


SUCCESS: Final = CardOutcome(kind="success")

EXPIRED: Final = CardOutcome(
    kind="decline",
    unified_code="UE_1002",
    unified_message="card expired",
    error_code="expired_card",
    error_message="Your card has expired.",
    issuer_code="54",
    issuer_message="Expired card",
)

AUTHENTICATION_FAILED: Final = CardOutcome(
    kind="decline",
    unified_code="UE_5001",
    unified_message="card authentication failed",
    error_code="authentication_failed",
    error_message="3-D Secure authentication failed.",
    issuer_code="N7",
    issuer_message="Authentication failed",
)

TEST_CARDS: Final[dict[str, CardOutcome]] = {
    "4242424242424242": SUCCESS,
    "5555555555554444": SUCCESS,
    "4000000000000002": CardOutcome(
        kind="decline",
        unified_code="UE_1007",
        unified_message="declined by issuer",
        error_code="card_declined",
        error_message="Your card was declined.",
        issuer_code="05",
        issuer_message="Do not honor",
    ),
    "4000000000009995": CardOutcome(
        kind="decline",
        unified_code="UE_1001",
        unified_message="insufficient funds",
        error_code="insufficient_funds",
        error_message="Your card has insufficient funds.",
        issuer_code="51",
        issuer_message="Insufficient funds",
    ),
    "4000000000000069": EXPIRED,
    "4000000000003220": CardOutcome(kind="three_ds"),
    "4000000000000259": CardOutcome(kind="dispute"),
    "4000000000000077": CardOutcome(kind="processing"),
    "4000000000000333": CardOutcome(kind="async"),
    "4000000000000150": CardOutcome(kind="partial_auth"),
}

#: The decline a partial-authorisation card gives a payment that does not allow it.
INSUFFICIENT_FUNDS: Final = TEST_CARDS["4000000000009995"]


def outcome_for(card_number: str) -> CardOutcome:
    """The outcome of confirming with ``card_number`` (digits only)."""
    return TEST_CARDS.get(card_number, SUCCESS)


def luhn_valid(card_number: str) -> bool:
    """True when ``card_number`` (digits only, 12 to 19 of them) passes the Luhn check."""
    if not card_number.isdigit() or not 12 <= len(card_number) <= 19:
        return False
    total = 0
    for index, char in enumerate(reversed(card_number)):
        digit = int(char)
        if index % 2 == 1:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


def brand_for(card_number: str) -> str:
    """The card network of ``card_number`` as Hyperswitch spells it (``Visa``, ...)."""
    if card_number.startswith("4"):
        return "Visa"
    if card_number[:2] in {"51", "52", "53", "54", "55"} or "2221" <= card_number[:4] <= "2720":
        return "Mastercard"
    if card_number[:2] in {"34", "37"}:
        return "AmericanExpress"
    if card_number.startswith(("6011", "65")):
        return "Discover"
    if card_number[:2] in {"35"}:
        return "JCB"
    return "Unknown"
