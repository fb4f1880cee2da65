"""A payout's ``payout_method_data`` as ``PayoutMethodDataResponse`` shows it: the bank,
card, wallet, bank redirect or passthrough shape, numbers masked, never a card number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from reconcile.sandbox.cards import brand_for, luhn_valid
from reconcile.sandbox.errors import invalid, missing
from reconcile.sandbox.models import JSONDict

PAYOUT_METHODS: Final = ("card", "bank", "bank_transfer", "wallet", "bank_redirect", "passthrough")
_SENSITIVE_KEYS: Final = frozenset(
    {
        "bank_account_number",
        "bank_routing_number",
        "bank_sort_code",
        "iban",
        "pix_key",
        "psp_token",
        "tax_id",
        "telephone_number",
    }
)


def _mask(value: str) -> str:
    return "*" * max(len(value) - 4, 4) + value[-4:] if len(value) > 4 else "****"


def _masked(details: Mapping[str, Any], name: str) -> str:
    value = details.get(name)
    return _mask(value) if isinstance(value, str) else "****"


def _text(details: Mapping[str, Any], name: str) -> str | None:
    value = details.get(name)
    return value if isinstance(value, str) else None


def _country(details: Mapping[str, Any]) -> str | None:
    value = details.get("bank_country_code")
    return value if isinstance(value, str) and len(value) == 2 and value.isupper() else None


def _bank_response(details: Mapping[str, Any]) -> JSONDict:
    """``BankAdditionalData``: the ACH, BACS, SEPA or PIX shape, numbers masked."""
    if "iban" in details:
        return {
            "iban": _masked(details, "iban"),
            "bank_name": _text(details, "bank_name"),
            "bank_country_code": _country(details),
            "bank_city": _text(details, "bank_city"),
            "bic": _text(details, "bic"),
        }
    if "bank_sort_code" in details:
        return {
            "bank_sort_code": _masked(details, "bank_sort_code"),
            "bank_account_number": _masked(details, "bank_account_number"),
            "bank_name": _text(details, "bank_name"),
            "bank_country_code": _country(details),
            "bank_city": _text(details, "bank_city"),
        }
    if "pix_key" in details:
        return {
            "pix_key": _masked(details, "pix_key"),
            "cpf": None,
            "cnpj": None,
            "source_bank_account_id": None,
            "destination_bank_account_id": None,
            "expiry_date": None,
        }
    for name in ("bank_account_number", "bank_routing_number"):
        if not isinstance(details.get(name), str):
            raise missing(f"payout_method_data.bank.{name}")
    return {
        "bank_account_number": _masked(details, "bank_account_number"),
        "bank_routing_number": _masked(details, "bank_routing_number"),
        "bank_name": None,
        "bank_country_code": _country(details),
        "bank_city": _text(details, "bank_city"),
    }


def _card_payout_response(details: Mapping[str, Any]) -> JSONDict:
    """``CardAdditionalData``: last four digits, BIN and network; never the number."""
    raw = details.get("card_number")
    digits = raw.replace(" ", "") if isinstance(raw, str) else ""
    if not luhn_valid(digits):
        raise invalid("Invalid value provided: payout_method_data.card.card_number")
    brand = brand_for(digits)
    return {
        "card_issuer": None,
        "card_network": None if brand == "Unknown" else brand,
        "card_type": None,
        "card_issuing_country": None,
        "bank_code": None,
        "last4": digits[-4:],
        "card_isin": digits[:6],
        "card_extended_bin": None,
        "card_exp_month": _text(details, "expiry_month") or _text(details, "card_exp_month") or "",
        "card_exp_year": _text(details, "expiry_year") or _text(details, "card_exp_year") or "",
        "card_holder_name": _text(details, "card_holder_name") or "",
    }


def _wallet_response(details: Mapping[str, Any]) -> JSONDict:
    """``WalletAdditionalData`` of ``paypal``, ``venmo`` or ``apple_pay_decrypt``."""
    if len(details) != 1 or not isinstance(next(iter(details.values())), dict):
        raise invalid("payout_method_data.wallet takes one of paypal, venmo, apple_pay_decrypt")
    name, inner = next(iter(details.items()))
    if name == "paypal":
        return {
            "email": _text(inner, "email"),
            "telephone_number": (
                _masked(inner, "telephone_number") if "telephone_number" in inner else None
            ),
            "paypal_id": _text(inner, "paypal_id"),
        }
    if name == "venmo":
        return {"telephone_number": _masked(inner, "telephone_number")}
    if name == "apple_pay_decrypt":
        return {
            "card_exp_month": _text(inner, "expiry_month") or "",
            "card_exp_year": _text(inner, "expiry_year") or "",
            "card_holder_name": _text(inner, "card_holder_name") or "",
        }
    raise invalid("payout_method_data.wallet takes one of paypal, venmo, apple_pay_decrypt")


def mask_payout_method(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """``payout_method_data`` as ``PayoutMethodDataResponse`` shows it: masked numbers, no card
    number, the fields of the matching ``*AdditionalData`` schema only. The request's
    ``bank`` (Hyperswitch) or ``bank_transfer`` (the seed's name) answers as ``bank``."""
    if data is None:
        return None
    if len(data) != 1 or next(iter(data)) not in PAYOUT_METHODS:
        raise invalid(
            "Invalid value provided: payout_method_data (exactly one of "
            + ", ".join(PAYOUT_METHODS)
            + ")"
        )
    method, details = next(iter(data.items()))
    if not isinstance(details, dict):
        raise invalid(f"Invalid value provided: payout_method_data.{method} (an object)")
    if method in ("bank", "bank_transfer"):
        return {"bank": _bank_response(details)}
    if method == "card":
        return {"card": _card_payout_response(details)}
    if method == "wallet":
        return {"wallet": _wallet_response(details)}
    if method == "bank_redirect":
        interac = details.get("interac")
        email = _text(interac, "email") if isinstance(interac, dict) else None
        return {"bank_redirect": {"email": email}}
    token_type = _text(details, "token_type")
    if token_type is None:
        raise missing("payout_method_data.passthrough.token_type")
    return {"passthrough": {"psp_token": _masked(details, "psp_token"), "token_type": token_type}}
