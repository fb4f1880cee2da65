"""The sandbox's payout record and how the API renders it (``PayoutCreateResponse``).

A payout keeps ``modified_at`` internally (``PayoutCreateResponse`` has only ``created``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from reconcile.sandbox.clock import format_timestamp
from reconcile.sandbox.models.customers import Customer
from reconcile.sandbox.models.shaping import (
    CONNECTOR,
    MERCHANT_CONNECTOR_ID,
    JSONDict,
    address,
)


@dataclass(slots=True, kw_only=True, eq=False)
class Payout:
    payout_id: str
    seq: int
    merchant_id: str
    profile_id: str
    amount: int
    currency: str
    status: str
    customer: Customer
    client_secret: str
    created: datetime
    #: Internal only: ``PayoutCreateResponse`` has no modification time.
    modified_at: datetime
    return_url: str
    business_country: str
    entity_type: str
    merchant_order_reference_id: str | None = None
    payout_type: str | None = None
    payout_method_data: JSONDict | None = None
    billing: JSONDict | None = None
    auto_fulfill: bool = False
    recurring: bool = False
    description: str | None = None
    priority: str | None = None
    metadata: JSONDict | None = None
    payout_method_id: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    unified_code: str | None = None
    unified_message: str | None = None
    connector_transaction_id: str | None = None

    def to_api(self) -> JSONDict:
        """``PayoutCreateResponse`` (``created`` only: no modification time)."""
        attempt = {
            "attempt_id": f"{self.payout_id}_1",
            "status": self.status,
            "amount": self.amount,
            "currency": self.currency,
            "connector": CONNECTOR,
            "error_code": self.error_code,
            "error_message": self.error_message,
            "payment_method": self.payout_type,
            "payout_method_type": None,
            "connector_transaction_id": self.connector_transaction_id,
            "cancellation_reason": None,
            "unified_code": self.unified_code,
            "unified_message": self.unified_message,
        }
        customer = self.customer.details()
        return {
            "payout_id": self.payout_id,
            "merchant_id": self.merchant_id,
            "merchant_order_reference_id": self.merchant_order_reference_id,
            "amount": self.amount,
            "currency": self.currency,
            "connector": CONNECTOR,
            "payout_type": self.payout_type,
            "payout_method_data": self.payout_method_data,
            "billing": address(self.billing),
            "auto_fulfill": self.auto_fulfill,
            "customer_id": self.customer.customer_id,
            "customer": customer,
            "client_secret": self.client_secret,
            "return_url": self.return_url,
            "business_country": self.business_country,
            "business_label": None,
            "description": self.description,
            "entity_type": self.entity_type,
            "recurring": self.recurring,
            "metadata": self.metadata,
            "merchant_connector_id": MERCHANT_CONNECTOR_ID,
            "status": self.status,
            "error_message": self.error_message,
            "error_code": self.error_code,
            "profile_id": self.profile_id,
            "created": format_timestamp(self.created),
            "connector_transaction_id": self.connector_transaction_id,
            "priority": self.priority,
            "attempts": [attempt] if self.connector_transaction_id else None,
            "payout_link": None,
            "email": customer["email"],
            "name": customer["name"],
            "phone": customer["phone"],
            "phone_country_code": customer["phone_country_code"],
            "unified_code": self.unified_code,
            "unified_message": self.unified_message,
            "payout_method_id": self.payout_method_id,
        }
