"""The sandbox's customer record and how the API renders it (``CustomerResponse``, and the
``customer`` a payment or payout carries).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from reconcile.sandbox.clock import format_timestamp
from reconcile.sandbox.models.shaping import JSONDict, address_details


@dataclass(slots=True, kw_only=True, eq=False)
class Customer:
    customer_id: str
    created: datetime
    name: str | None = None
    email: str | None = None
    phone: str | None = None
    phone_country_code: str | None = None
    description: str | None = None
    address: JSONDict | None = None
    metadata: JSONDict | None = None

    def to_api(self) -> JSONDict:
        """``CustomerResponse``."""
        return {
            "customer_id": self.customer_id,
            "name": self.name,
            "email": self.email,
            "phone": self.phone,
            "phone_country_code": self.phone_country_code,
            "description": self.description,
            "address": address_details(self.address),
            "created_at": format_timestamp(self.created),
            "metadata": self.metadata,
            "default_payment_method_id": None,
            "tax_registration_id": None,
            "document_details": None,
        }

    def details(self) -> JSONDict:
        """``CustomerDetailsResponse`` (the ``customer`` of a payment or payout)."""
        return {
            "id": self.customer_id,
            "name": self.name,
            "email": self.email,
            "phone": self.phone if self.phone is None or len(self.phone) <= 10 else None,
            "phone_country_code": (
                self.phone_country_code
                if self.phone_country_code is None or len(self.phone_country_code) <= 2
                else None
            ),
        }
