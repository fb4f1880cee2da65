"""Time passing: :meth:`~TimePassingMixin.tick` moves everything that waits one step
(asynchronous outcomes settle, authorisations expire, the dispute card's dispute opens,
refunds and payouts settle): :class:`TimePassingMixin`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from reconcile.sandbox.state.base import REFUNDABLE, SandboxBase

#: Authorisations that expire 7 days after they were granted (and what they become).
EXPIRING: Final = {
    "requires_capture": "expired",
    "partially_authorized_and_requires_capture": "expired",
    "partially_captured_and_capturable": "partially_captured",
}
AUTHORISATION_LIFETIME: Final = timedelta(days=7)


class TimePassingMixin(SandboxBase):
    """The sandbox clock's step."""

    # -- time passing ----------------------------------------------------------------------

    def tick(self) -> dict[str, list[str]]:
        """Advance everything that waits by one step; return the ids that changed.

        ``processing`` payments authorise, asynchronous captures and voids settle,
        authorisations older than 7 days expire, payments of the dispute test card get their
        dispute, ``pending``/``review`` refunds succeed, ``pending``/``initiated`` payouts
        succeed. Keys: ``payments``, ``refunds``, ``payouts``, ``disputes``, ``mandates``.
        """
        changed: dict[str, list[str]] = {
            "payments": [],
            "refunds": [],
            "payouts": [],
            "disputes": [],
            "mandates": [],
        }
        with self.lock:
            now = self.now()
            for payment in list(self._payments.values()):
                if payment.pending_behaviour == "processing" and payment.status == "processing":
                    payment.pending_behaviour = None
                    self._authorised(payment, payment.amount)
                    changed["payments"].append(payment.payment_id)
                elif payment.pending_operation is not None:
                    kind, amount = payment.pending_operation
                    payment.pending_operation = None
                    if kind == "capture":
                        for capture in payment.captures:
                            if capture.status == "pending":
                                capture.status = "charged"
                        self._settle_capture(payment, amount)
                    else:
                        self._void(payment)
                    changed["payments"].append(payment.payment_id)
                elif (
                    payment.status in EXPIRING
                    and payment.authorised_at is not None
                    and now >= payment.authorised_at + AUTHORISATION_LIFETIME
                ):
                    payment.amount_capturable = 0
                    self._set_payment_status(payment, EXPIRING[payment.status])
                    changed["payments"].append(payment.payment_id)
                elif payment.pending_behaviour == "dispute" and payment.status in REFUNDABLE:
                    payment.pending_behaviour = None
                    dispute = self._open_dispute(
                        payment, payment.amount_received or payment.amount, None, None, "dispute"
                    )
                    changed["disputes"].append(dispute.dispute_id)
            for refund in self._refunds.values():
                if refund.status in {"pending", "review"}:
                    self._set_refund_status(refund, "succeeded")
                    changed["refunds"].append(refund.refund_id)
            for payout in self._payouts.values():
                if payout.status in {"pending", "initiated"}:
                    self._set_payout_status(payout, "success")
                    changed["payouts"].append(payout.payout_id)
        return changed
