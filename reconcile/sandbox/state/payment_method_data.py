"""The card a request's ``payment_method_data`` carries, read and checked: last four
digits and brand only (payments and mandates take cards this way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconcile.sandbox import fields
from reconcile.sandbox.cards import brand_for, luhn_valid, outcome_for
from reconcile.sandbox.errors import invalid, missing
from reconcile.sandbox.models import CardInfo


def payment_method_from(body: Mapping[str, Any]) -> tuple[CardInfo | None, str | None, str | None]:
    """The card of ``payment_method_data`` (last4 and brand only), and the method names."""
    payment_method = fields.string(body, "payment_method")
    payment_method_type = fields.string(body, "payment_method_type")
    data = fields.obj(body, "payment_method_data")
    if data is None:
        return None, payment_method, payment_method_type
    if payment_method not in (None, "card") or not isinstance(data.get("card"), dict):
        raise invalid(
            "the sandbox processes only payment_method card with payment_method_data.card"
        )
    card = data["card"]
    prefix = "payment_method_data.card."
    raw_number = card.get("card_number")
    if raw_number is None:
        raise missing(prefix + "card_number")
    number = raw_number.replace(" ", "") if isinstance(raw_number, str) else ""
    if not luhn_valid(number):
        raise invalid("Invalid card number")
    month = _card_field(card, "card_exp_month", prefix)
    year = _card_field(card, "card_exp_year", prefix)
    cvc = _card_field(card, "card_cvc", prefix)
    if not month.isdigit() or not 1 <= int(month) <= 12:
        raise invalid(f"Invalid value provided: {prefix}card_exp_month")
    if not year.isdigit() or len(year) not in (2, 4):
        raise invalid(f"Invalid value provided: {prefix}card_exp_year")
    if not cvc.isdigit() or len(cvc) not in (3, 4):
        raise invalid(f"Invalid value provided: {prefix}card_cvc")
    holder = card.get("card_holder_name")
    info = CardInfo(
        last4=number[-4:],
        brand=brand_for(number),
        exp_month=f"{int(month):02d}",
        exp_year=year if len(year) == 4 else f"20{year}",
        holder_name=holder if isinstance(holder, str) else None,
        isin=number[:6],
        outcome=outcome_for(number),
    )
    return info, "card", payment_method_type or "credit"


def _card_field(card: Mapping[str, Any], name: str, prefix: str) -> str:
    value = card.get(name)
    if value is None:
        raise missing(prefix + name)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise invalid(f"Invalid value provided: {prefix}{name}")
    return value.strip()
