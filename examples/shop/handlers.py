"""Event handlers that move orders: pending -> paid -> refunded / failed / disputed.

Every handler takes the ledger's session, so its change to the order commits in the same
transaction that records the handler as done: each runs exactly once per transition even if
the worker is killed. The ``paid`` handler ships the goods; it runs once per payment whether
the checkout's own API response (``hooks.observe`` in :mod:`examples.shop.app`), the webhook
or the reconciler reports the payment first. An event for an order the shop has not written
yet (the webhook beat the checkout's commit) is deferred, not failed: it waits without
using up its attempts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime

from sqlalchemy.orm import Session
from sqlmodel import select

from examples.shop.models import Order, OrderStatus
from receiver import Defer, Event, WebhookReceiver

log = logging.getLogger("examples.shop")

hooks = WebhookReceiver()


def _order_for_payment(session: Session, payment_id: str | None, metadata: object) -> Order:
    order_id = metadata.get("order_id") if isinstance(metadata, Mapping) else None
    order = session.get(Order, order_id) if order_id else None
    if order is None and payment_id:
        order = session.scalars(select(Order).where(Order.payment_id == payment_id)).first()
    if order is None:
        raise Defer(2, f"no order for payment {payment_id} yet")
    return order


def _move(order: Order, status: str, note: str) -> None:
    order.history = (order.history + f"{order.status}->{status} ({note});")[-2000:]
    order.status = status
    order.updated_at = datetime.now(UTC)


@hooks.on("payment_succeeded", name="shop.paid")
def paid(event: Event, session: Session) -> None:
    payment = event.payment
    order = _order_for_payment(session, payment.payment_id, payment.metadata)
    order.payment_id = payment.payment_id
    if order.status in (OrderStatus.PENDING, OrderStatus.FAILED):
        order.failure_code = order.failure_message = None
        _move(order, OrderStatus.PAID, event.event_type)
    order.shipments += 1  # ship the goods: once per payment, by the transition-once rule
    log.info("order %s shipped", order.id, extra={"action": "ship", "event_id": event.event_id})
    session.add(order)


@hooks.on("payment_failed", name="shop.failed")
def failed(event: Event, session: Session) -> None:
    payment = event.payment
    order = _order_for_payment(session, payment.payment_id, payment.metadata)
    order.payment_id = payment.payment_id
    if order.status == OrderStatus.PENDING:
        order.failure_code = payment.unified_code
        order.failure_message = payment.unified_message or payment.error_message
        _move(order, OrderStatus.FAILED, payment.unified_code or "failed")
    session.add(order)


@hooks.on("payment_cancelled", "payment_expired", name="shop.cancelled")
def cancelled(event: Event, session: Session) -> None:
    payment = event.payment
    order = _order_for_payment(session, payment.payment_id, payment.metadata)
    if order.status == OrderStatus.PENDING:
        _move(order, OrderStatus.CANCELLED, event.event_type)
    session.add(order)


@hooks.on("refund_succeeded", name="shop.refunded")
def refunded(event: Event, session: Session) -> None:
    refund = event.refund
    order = _order_for_payment(session, refund.payment_id, refund.metadata)
    order.refunded_amount += refund.amount or 0
    full = order.refunded_amount >= order.amount
    _move(
        order,
        OrderStatus.REFUNDED if full else OrderStatus.PARTIALLY_REFUNDED,
        f"refund {refund.refund_id}",
    )
    session.add(order)


@hooks.on("dispute_opened", "dispute_challenged", name="shop.disputed")
def disputed(event: Event, session: Session) -> None:
    dispute = event.dispute
    order = _order_for_payment(session, dispute.payment_id, None)
    order.dispute_status = dispute.status
    if order.status != OrderStatus.CHARGEBACK:
        _move(order, OrderStatus.DISPUTED, event.event_type)
    session.add(order)


@hooks.on("dispute_won", "dispute_cancelled", "dispute_expired", name="shop.dispute_closed")
def dispute_closed(event: Event, session: Session) -> None:
    dispute = event.dispute
    order = _order_for_payment(session, dispute.payment_id, None)
    order.dispute_status = dispute.status
    if order.status == OrderStatus.DISPUTED:
        _move(order, OrderStatus.PAID, event.event_type)
    session.add(order)


@hooks.on("dispute_lost", "dispute_accepted", name="shop.chargeback")
def chargeback(event: Event, session: Session) -> None:
    dispute = event.dispute
    order = _order_for_payment(session, dispute.payment_id, None)
    order.dispute_status = dispute.status
    _move(order, OrderStatus.CHARGEBACK, event.event_type)
    session.add(order)
