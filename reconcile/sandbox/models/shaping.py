"""What every answer of the sandbox shares: the JSON type, the connector's names, and the
projections of echoed request objects onto the response schema (pure, no I/O).

Request objects that are echoed back (``billing``, ``shipping``, ``order_details``, a
customer's ``address``, ``customer_acceptance``) are projected onto the fields the response
schema declares, so an unknown key a caller sends never leaks into an answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

JSONDict = dict[str, Any]

CONNECTOR = "sandbox"
MERCHANT_CONNECTOR_ID = "mca_sandbox"

_COUNTRY: Final = re.compile(r"[A-Z]{2}")
_ADDRESS_FIELDS: Final = (
    "city",
    "line1",
    "line2",
    "line3",
    "zip",
    "state",
    "first_name",
    "last_name",
    "origin_zip",
)
_ORDER_STRINGS: Final = (
    "product_img_link",
    "product_id",
    "category",
    "sub_category",
    "brand",
    "product_tax_code",
    "description",
    "sku",
    "upc",
    "commodity_code",
    "unit_of_measure",
)
_ORDER_INTEGERS: Final = ("total_tax_amount", "total_amount", "unit_discount_amount")


def _string(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def address_details(value: object) -> JSONDict | None:
    """``AddressDetails``: the string fields, ``country`` only when a two-letter code."""
    if not isinstance(value, Mapping):
        return None
    out: JSONDict = {name: _string(value.get(name)) for name in _ADDRESS_FIELDS}
    country = value.get("country")
    out["country"] = country if isinstance(country, str) and _COUNTRY.fullmatch(country) else None
    return out


def address(value: object) -> JSONDict | None:
    """``Address``: ``address`` (``AddressDetails``), ``phone`` and ``email``."""
    if not isinstance(value, Mapping):
        return None
    phone = value.get("phone")
    return {
        "address": address_details(value.get("address")),
        "phone": (
            {
                "number": _string(phone.get("number")),
                "country_code": _string(phone.get("country_code")),
            }
            if isinstance(phone, Mapping)
            else None
        ),
        "email": _string(value.get("email")),
    }


def order_details(items: object) -> list[JSONDict] | None:
    """``OrderDetailsWithAmount`` items (the seed's ``name`` is read as ``product_name``)."""
    if not isinstance(items, list):
        return None
    out: list[JSONDict] = []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        name = _string(item.get("product_name")) or _string(item.get("name"))
        quantity = _integer(item.get("quantity"))
        amount = _integer(item.get("amount"))
        if name is None or quantity is None or amount is None:
            continue
        row: JSONDict = {"product_name": name, "quantity": max(quantity, 0), "amount": amount}
        row.update({k: item[k] for k in _ORDER_STRINGS if isinstance(item.get(k), str)})
        row.update({k: item[k] for k in _ORDER_INTEGERS if _integer(item.get(k)) is not None})
        if isinstance(item.get("requires_shipping"), bool):
            row["requires_shipping"] = item["requires_shipping"]
        out.append(row)
    return out


def customer_acceptance(value: object) -> JSONDict | None:
    """``CustomerAcceptance`` (``acceptance_type`` online/offline, ``accepted_at``, ``online``)."""
    if not isinstance(value, Mapping):
        return None
    kind = value.get("acceptance_type")
    online = value.get("online")
    return {
        "acceptance_type": kind if kind in ("online", "offline") else "online",
        "accepted_at": _string(value.get("accepted_at")),
        "online": (
            {
                "ip_address": _string(online.get("ip_address")) or "",
                "user_agent": _string(online.get("user_agent")) or "",
            }
            if isinstance(online, Mapping)
            else None
        ),
    }
