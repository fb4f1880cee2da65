"""Disputes: opened on a captured payment, moved by the sandbox admin's actions through
statuses and stages, and ``GET /disputes/list``: :class:`DisputesMixin`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Final

from reconcile.sandbox.errors import conflict, invalid
from reconcile.sandbox.listing import (
    Window,
    csv_values,
    limit_from_query,
    offset_from,
    query_params,
    time_from,
)
from reconcile.sandbox.models import Dispute, JSONDict, Payment
from reconcile.sandbox.state.base import IGNORE_FILTERS, REFUNDABLE, SandboxBase, new_id

DISPUTE_ACTIONS: Final = {
    "challenge": "dispute_challenged",
    "accept": "dispute_accepted",
    "win": "dispute_won",
    "lose": "dispute_lost",
    "expire": "dispute_expired",
    "cancel": "dispute_cancelled",
}
#: Stage actions: the stage they move to and the stages they may move from.
DISPUTE_STAGE_ACTIONS: Final = {
    "pre_arbitration": ("pre_arbitration", frozenset({"pre_dispute", "dispute"})),
    "arbitration": ("arbitration", frozenset({"pre_dispute", "dispute", "pre_arbitration"})),
}
#: The statuses a stage action may start from: a decided dispute.
DISPUTE_DECIDED: Final = frozenset({"dispute_won", "dispute_lost"})
DISPUTE_STAGES: Final = (
    "pre_dispute",
    "dispute",
    "pre_arbitration",
    "arbitration",
    "dispute_reversal",
)
_DISPUTE_MOVES: Final = {
    "dispute_opened": frozenset(DISPUTE_ACTIONS.values()),
    "dispute_challenged": frozenset(
        {"dispute_won", "dispute_lost", "dispute_expired", "dispute_cancelled", "dispute_accepted"}
    ),
}
_GET_DISPUTES_PARAMS: Final = (
    "dispute_id",
    "payment_id",
    "limit",
    "offset",
    "profile_id",
    "dispute_status",
    "dispute_stage",
    "connector",
    "currency",
    "reason",
    "merchant_connector_id",
    "start_time",
    "end_time",
)


class DisputesMixin(SandboxBase):
    """The disputes API."""

    # -- disputes --------------------------------------------------------------------------

    def open_dispute(
        self,
        payment_id: str,
        *,
        amount: int | None = None,
        reason: str | None = None,
        reason_code: str | None = None,
        stage: str = "dispute",
    ) -> JSONDict:
        """Open a dispute (``dispute_opened``) on a captured payment (sandbox admin)."""
        if stage not in DISPUTE_STAGES:
            raise invalid(f"stage must be one of {', '.join(DISPUTE_STAGES)}")
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status not in REFUNDABLE:
                raise conflict("Only a succeeded payment can be disputed")
            received = payment.amount_received or 0
            if amount is None:
                amount = received
            if not 1 <= amount <= received:
                raise invalid(f"the dispute amount must be between 1 and {received}")
            return self._open_dispute(payment, amount, reason, reason_code, stage).to_api()

    def dispute_action(self, dispute_id: str, action: str) -> JSONDict:
        """Move a dispute (sandbox admin), at any later sandbox time.

        ``challenge``, ``accept``, ``win``, ``lose``, ``expire``, ``cancel`` change its status
        (``dispute_opened`` -> any; ``dispute_challenged`` -> won, lost, expired, cancelled,
        accepted). ``pre_arbitration`` and ``arbitration`` reopen a decided dispute
        (``dispute_won``/``dispute_lost``) at that later stage: status ``dispute_opened``, no
        webhook (already sent for this dispute). ``reversal`` turns ``dispute_lost`` into
        stage ``dispute_reversal``, status ``dispute_won``.
        """
        known = (*DISPUTE_ACTIONS, *DISPUTE_STAGE_ACTIONS, "reversal")
        if action not in known:
            raise invalid(f"action must be one of {', '.join(known)}")
        with self.lock:
            dispute = self._dispute(dispute_id)
            if action in DISPUTE_STAGE_ACTIONS:
                stage, sources = DISPUTE_STAGE_ACTIONS[action]
                if dispute.status not in DISPUTE_DECIDED or dispute.stage not in sources:
                    raise conflict(
                        f"a dispute in {dispute.status} at stage {dispute.stage} cannot move to "
                        f"{stage} (from dispute_won or dispute_lost at "
                        f"{' or '.join(sorted(sources))})"
                    )
                dispute.stage = stage
                dispute.challenge_required_by = self.now() + timedelta(days=7)
                self._set_dispute_status(dispute, "dispute_opened")
                return dispute.to_api()
            if action == "reversal":
                if dispute.status != "dispute_lost":
                    raise conflict(f"a dispute in {dispute.status} cannot be reversed")
                dispute.stage = "dispute_reversal"
                self._set_dispute_status(dispute, "dispute_won")
                return dispute.to_api()
            target = DISPUTE_ACTIONS[action]
            if target not in _DISPUTE_MOVES.get(dispute.status, frozenset()):
                raise conflict(f"a dispute in {dispute.status} cannot {action}")
            if target == "dispute_lost":
                payment = self._payments[dispute.payment_id]
                refunded = sum(
                    r.amount
                    for r in self._refunds_by_payment.get(payment.payment_id, [])
                    if r.status == "succeeded"
                )
                dispute.is_already_refunded = refunded + dispute.amount > (
                    payment.amount_received or 0
                )
            self._set_dispute_status(dispute, target)
            return dispute.to_api()

    def get_dispute(self, dispute_id: str) -> JSONDict:
        """``GET /disputes/<id>``."""
        with self.lock:
            return self._dispute(dispute_id).to_api()

    def list_disputes(
        self, items: Iterable[tuple[str, str]], *, list_fault: str | None = None
    ) -> list[JSONDict]:
        """``GET /disputes/list``: a bare JSON array, newest first, ``limit``/``offset``,
        ``start_time``/``end_time`` on ``created_at``, comma-separated ``dispute_status``,
        ``dispute_stage`` and ``currency``, ``profile_id`` (one business profile's)."""
        params = query_params(items, _GET_DISPUTES_PARAMS)
        limit = limit_from_query(params.get("limit"), default=100, maximum=100)
        offset = offset_from(params.get("offset"))
        window = Window(
            time_from(params, "start_time", allow_naive=False),
            time_from(params, "end_time", allow_naive=False),
        )
        statuses = csv_values(params, "dispute_status")
        stages = csv_values(params, "dispute_stage")
        currencies = csv_values(params, "currency")
        single = {k: params.get(k) for k in ("payment_id", "dispute_id", "reason", "profile_id")}
        if list_fault == IGNORE_FILTERS:
            window, statuses, stages, currencies = Window(), None, None, None
            single = {}
        if list_fault is not None:
            offset, window = 0, Window(window.start, None)
        with self.lock:
            matches = [
                d
                for d in sorted(
                    self._disputes.values(), key=lambda d: (d.created, d.seq), reverse=True
                )
                if d.created in window
                and (statuses is None or d.status in statuses)
                and (stages is None or d.stage in stages)
                and (currencies is None or d.currency in currencies)
                and all(v is None or getattr(d, k) == v for k, v in single.items())
            ]
            return [d.to_api() for d in matches[offset : offset + limit]]

    # -- internals -------------------------------------------------------------------------

    def _open_dispute(
        self,
        payment: Payment,
        amount: int,
        reason: str | None,
        reason_code: str | None,
        stage: str,
    ) -> Dispute:
        now = self.now()
        dispute = Dispute(
            dispute_id=new_id("dp_"),
            seq=self._next_seq(),
            payment_id=payment.payment_id,
            attempt_id=payment.attempt_id,
            profile_id=payment.profile_id,
            amount=amount,
            currency=payment.currency,
            status="dispute_opened",
            created=now,
            challenge_required_by=now + timedelta(days=7),
            stage=stage,
            reason=reason or "fraudulent",
            reason_code=reason_code or "10.4",
            connector_dispute_id=new_id("dp_conn_"),
        )
        self._disputes[dispute.dispute_id] = dispute
        self._set_dispute_status(dispute, "dispute_opened")
        return dispute
