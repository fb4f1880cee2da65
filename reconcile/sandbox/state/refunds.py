"""Refunds: create (the amount decides the outcome), update, fail late, and the refund list
in both dialects: :class:`RefundsMixin`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from receiver.core.status import REFUND_STATUS_ALIASES
from reconcile.sandbox import fields
from reconcile.sandbox.errors import conflict, duplicate, invalid
from reconcile.sandbox.listing import Window, limit_from_body, offset_from, time_from, values_from
from reconcile.sandbox.models import JSONDict, Refund
from reconcile.sandbox.state.base import (
    FAILURE_UNIFIED,
    IGNORE_FILTERS,
    REFUNDABLE,
    SandboxBase,
    new_id,
)

#: Refund filter values of Hyperswitch's ``refund_status[]``: the *internal* enum.
REFUND_FILTER_STATUSES: Final = (
    "success",
    "failure",
    "pending",
    "manual_review",
    "transaction_failure",
)


class RefundsMixin(SandboxBase):
    """The refunds API."""

    # -- refunds ---------------------------------------------------------------------------

    def create_refund(self, body: fields.Body) -> JSONDict:
        """``POST /refunds``: full (no ``amount``) or partial refund of a captured payment."""
        payment_id = fields.required_string(body, "payment_id")
        refund_id = fields.identifier(body, "refund_id")
        amount = fields.integer(body, "amount", minimum=1)
        reason = fields.string(body, "reason", max_length=255)
        refund_type = (fields.string(body, "refund_type") or "instant").lower()
        if refund_type not in {"instant", "scheduled"}:
            raise invalid("Invalid value provided: refund_type (instant or scheduled)")
        metadata = fields.metadata(body)
        with self.lock:
            payment = self._payment(payment_id)
            if refund_id is None:
                refund_id = new_id("ref_")
            elif refund_id in self._refunds:
                raise duplicate(
                    "Duplicate refund request. Refund already attempted with the refund ID"
                )
            if payment.status not in REFUNDABLE:
                raise conflict(
                    "The payment has not succeeded yet. Please pass a successful payment to "
                    "initiate refund"
                )
            refunded = sum(
                r.amount
                for r in self._refunds_by_payment.get(payment_id, [])
                if r.status != "failed"
            )
            refundable = (payment.amount_received or 0) - refunded
            amount = refundable if amount is None else amount
            if amount > refundable or amount <= 0:
                raise invalid(
                    f"Refund amount exceeds the refundable amount ({refundable} left of "
                    f"{payment.amount_received or 0})"
                )
            now = self.now()
            refund = Refund(
                refund_id=refund_id,
                seq=self._next_seq(),
                payment_id=payment_id,
                merchant_id=self.merchant_id,
                profile_id=payment.profile_id,
                amount=amount,
                currency=payment.currency,
                status=_refund_outcome(amount),
                created=now,
                updated_at=now,
                reason=reason,
                refund_type=refund_type,
                metadata=metadata,
                connector_refund_id=new_id("re_conn_"),
            )
            self._refunds[refund_id] = refund
            self._refunds_by_payment.setdefault(payment_id, []).append(refund)
            if refund.status == "failed":
                refund.error_code = "refund_declined"
                refund.error_message = "Refund declined by the sandbox (amount ends in 02)"
                refund.unified_code, refund.unified_message = FAILURE_UNIFIED
            self._emit("refund", refund_id, refund.status, refund.to_api(), refund.profile_id)
            return refund.to_api()

    def update_refund(self, refund_id: str, body: fields.Body) -> JSONDict:
        """``POST /refunds/<id>``: change ``reason``/``metadata`` (moves ``updated_at``)."""
        reason = fields.string(body, "reason", max_length=255)
        metadata = fields.metadata(body)
        with self.lock:
            refund = self._refund(refund_id)
            if reason is not None:
                refund.reason = reason
            if metadata is not None:
                refund.metadata = metadata
            refund.updated_at = self.now()
            return refund.to_api()

    def get_refund(self, refund_id: str) -> JSONDict:
        """``GET /refunds/<id>``."""
        with self.lock:
            return self._refund(refund_id).to_api()

    def fail_refund(self, refund_id: str, *, reason: str | None = None) -> JSONDict:
        """Fail a refund late (sandbox admin): ``succeeded``/``pending``/``review`` -> ``failed``.

        The connector reports the failure after the fact, days later if the clock says so;
        emits ``refund_failed`` and frees the amount for another refund.
        """
        with self.lock:
            refund = self._refund(refund_id)
            if refund.status not in {"succeeded", "pending", "review"}:
                raise conflict(
                    f"a refund in {refund.status} cannot fail (succeeded, pending or review)"
                )
            refund.error_code = "refund_failed"
            refund.error_message = reason or "The refund was reversed by the connector"
            refund.unified_code, refund.unified_message = FAILURE_UNIFIED
            self._set_refund_status(refund, "failed")
            return refund.to_api()

    def list_refunds(self, body: fields.Body, *, list_fault: str | None = None) -> JSONDict:
        """``POST /refunds/list`` in both dialects: ``{count, total_count, data}``.

        Seed fields: ``limit``, ``offset``, ``payment_id``, ``status`` (API enum),
        ``created_gte``, ``created_lte``. Hyperswitch fields: ``limit`` (1..100), ``offset``,
        ``start_time``/``end_time``, ``refund_status[]`` (internal enum: ``success``,
        ``failure``, ``pending``, ``manual_review``, ``transaction_failure``), ``refund_id``,
        ``profile_id``, ``currency[]``, ``amount_filter``. Ordered by ``updated_at`` descending
        like the real server, so offset pages shift when refunds change. Time filters apply to
        ``created``.
        """
        limit = limit_from_body(body, default=10, maximum=100)
        offset = offset_from(body.get("offset"))
        payment_id = fields.string(body, "payment_id")
        refund_id = fields.string(body, "refund_id")
        profile_id = fields.string(body, "profile_id")
        seed_statuses = values_from(body, "status")
        internal = values_from(body, "refund_status", allowed=REFUND_FILTER_STATUSES)
        statuses = _intersect(
            seed_statuses,
            None if internal is None else {REFUND_STATUS_ALIASES.get(s, s) for s in internal},
        )
        currencies = values_from(body, "currency")
        windows = [
            Window(
                time_from(body, "created_gte", allow_naive=True),
                time_from(body, "created_lte", allow_naive=True),
            ),
            Window(
                time_from(body, "start_time", allow_naive=False),
                time_from(body, "end_time", allow_naive=False),
            ),
        ]
        low, high = _amount_filter(body)
        if list_fault == IGNORE_FILTERS:
            payment_id = refund_id = profile_id = None
            statuses = currencies = None
            low = high = None
            windows = []
        if list_fault is not None:
            offset = 0
            windows = [Window(w.start, None) for w in windows]
        with self.lock:
            matches = [
                r
                for r in self._refunds.values()
                if (payment_id is None or r.payment_id == payment_id)
                and (refund_id is None or r.refund_id == refund_id)
                and (profile_id is None or r.profile_id == profile_id)
                and (statuses is None or r.status in statuses)
                and (currencies is None or r.currency in currencies)
                and all(r.created in window for window in windows)
                and (low is None or r.amount >= low)
                and (high is None or r.amount <= high)
            ]
            matches.sort(key=lambda r: (r.updated_at, r.seq), reverse=True)
            page = matches[offset : offset + limit]
            return {
                "count": len(page),
                "total_count": len(matches),
                "data": [r.to_api() for r in page],
            }


def _refund_outcome(amount: int) -> str:
    return {2: "failed", 77: "pending", 88: "review"}.get(amount % 100, "succeeded")


def _intersect(first: set[str] | None, second: set[str] | None) -> set[str] | None:
    if first is None:
        return second
    if second is None:
        return first
    return first & second


def _amount_filter(body: Mapping[str, Any]) -> tuple[int | None, int | None]:
    raw = fields.obj(body, "amount_filter")
    if raw is None:
        return None, None
    return fields.integer(raw, "start_amount"), fields.integer(raw, "end_amount")
