"""The sandbox's dispute record and how the API renders it (``DisputeResponse``).

A dispute has no modification time at all: ``DisputeResponse`` carries ``created_at`` and the
connector's ``connector_created_at``/``connector_updated_at``; the sandbox, being the
connector, sends ``connector_updated_at: null`` (Hyperswitch's own status changes do not move
it, only a connector that reports one does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from reconcile.sandbox.clock import format_timestamp
from reconcile.sandbox.models.shaping import CONNECTOR, MERCHANT_CONNECTOR_ID, JSONDict

#: ``connector_status`` the sandbox (as the connector) reports for each dispute status.
DISPUTE_CONNECTOR_STATUS: Final[Mapping[str, str]] = {
    "dispute_opened": "needs_response",
    "dispute_expired": "expired",
    "dispute_accepted": "accepted",
    "dispute_cancelled": "warning_closed",
    "dispute_challenged": "under_review",
    "dispute_won": "won",
    "dispute_lost": "lost",
}


@dataclass(slots=True, kw_only=True, eq=False)
class Dispute:
    """A dispute. No modification time: ``DisputeResponse`` has none (see the module doc)."""

    dispute_id: str
    seq: int
    payment_id: str
    attempt_id: str
    profile_id: str
    amount: int
    currency: str
    status: str
    created: datetime
    challenge_required_by: datetime
    stage: str = "dispute"
    reason: str = "fraudulent"
    reason_code: str = "10.4"
    connector_dispute_id: str = ""
    is_already_refunded: bool = False

    def to_api(self) -> JSONDict:
        """``DisputeResponse``."""
        return {
            "dispute_id": self.dispute_id,
            "payment_id": self.payment_id,
            "attempt_id": self.attempt_id,
            # DisputeResponse.amount is a StringMinorUnit in Hyperswitch: a string.
            "amount": str(self.amount),
            "currency": self.currency,
            "dispute_stage": self.stage,
            "dispute_status": self.status,
            "connector": CONNECTOR,
            "connector_status": DISPUTE_CONNECTOR_STATUS.get(self.status, self.status),
            "connector_dispute_id": self.connector_dispute_id,
            "connector_reason": self.reason,
            "connector_reason_code": self.reason_code,
            "challenge_required_by": format_timestamp(self.challenge_required_by),
            "connector_created_at": format_timestamp(self.created),
            # Hyperswitch's own status changes never move it; the sandbox connector sends none.
            "connector_updated_at": None,
            "created_at": format_timestamp(self.created),
            "profile_id": self.profile_id,
            "merchant_connector_id": MERCHANT_CONNECTOR_ID,
            "is_already_refunded": self.is_already_refunded,
        }
