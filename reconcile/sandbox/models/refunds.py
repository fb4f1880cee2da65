"""The sandbox's refund record and how the API renders it (``RefundResponse``).

A refund answers ``created_at``/``updated_at`` (there is no ``created``/``modified_at``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from reconcile.sandbox.clock import format_timestamp
from reconcile.sandbox.models.shaping import CONNECTOR, MERCHANT_CONNECTOR_ID, JSONDict


@dataclass(slots=True, kw_only=True, eq=False)
class Refund:
    refund_id: str
    seq: int
    payment_id: str
    merchant_id: str
    profile_id: str
    amount: int
    currency: str
    status: str
    created: datetime
    updated_at: datetime
    reason: str | None = None
    refund_type: str = "instant"
    metadata: JSONDict | None = None
    error_code: str | None = None
    error_message: str | None = None
    unified_code: str | None = None
    unified_message: str | None = None
    connector_refund_id: str | None = None

    def to_api(self) -> JSONDict:
        """``RefundResponse`` (``created_at``/``updated_at``; no ``created``/``modified_at``)."""
        return {
            "refund_id": self.refund_id,
            "payment_id": self.payment_id,
            "amount": self.amount,
            "currency": self.currency,
            "status": self.status,
            "reason": self.reason,
            "metadata": self.metadata,
            "error_message": self.error_message,
            "error_code": self.error_code,
            "unified_code": self.unified_code,
            "unified_message": self.unified_message,
            "created_at": format_timestamp(self.created),
            "updated_at": format_timestamp(self.updated_at),
            "connector": CONNECTOR,
            "profile_id": self.profile_id,
            "merchant_connector_id": MERCHANT_CONNECTOR_ID,
            "split_refunds": None,
            "issuer_error_code": None,
            "issuer_error_message": None,
        }
