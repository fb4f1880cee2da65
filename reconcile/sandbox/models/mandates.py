"""The sandbox's card mandate record and how the API renders it (``MandateResponse``,
``MandateRevokedResponse``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from reconcile.sandbox.models.payments import CardInfo
from reconcile.sandbox.models.shaping import JSONDict


@dataclass(slots=True, kw_only=True, eq=False)
class Mandate:
    """A card mandate (``MandateResponse``): ``active`` until revoked."""

    mandate_id: str
    seq: int
    customer_id: str | None
    payment_method_id: str
    card: CardInfo
    status: str
    created: datetime
    customer_acceptance: JSONDict | None = None
    #: The payment that set it up (``None`` for one made by the sandbox admin).
    payment_id: str | None = None
    #: Its business profile (its payment's): where its webhooks go. ``MandateResponse``
    #: does not show it.
    profile_id: str = ""
    revoked_at: datetime | None = None

    def to_api(self) -> JSONDict:
        """``MandateResponse``."""
        return {
            "mandate_id": self.mandate_id,
            "status": self.status,
            "payment_method_id": self.payment_method_id,
            "payment_method": "card",
            "payment_method_type": "credit",
            "card": self.card.to_mandate_api(),
            "customer_acceptance": self.customer_acceptance,
        }

    def to_revoked_api(self) -> JSONDict:
        """``MandateRevokedResponse``."""
        return {
            "mandate_id": self.mandate_id,
            "status": self.status,
            "error_code": None,
            "error_message": None,
        }
