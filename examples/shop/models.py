"""The shop's own table: orders. Its status only ever changes in event handlers."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlmodel import Field, SQLModel


class OrderStatus:
    PENDING = "pending"
    PAID = "paid"
    FAILED = "failed"
    PARTIALLY_REFUNDED = "partially_refunded"
    REFUNDED = "refunded"
    DISPUTED = "disputed"
    CHARGEBACK = "chargeback"  # dispute lost
    CANCELLED = "cancelled"


class Order(SQLModel, table=True):
    __tablename__ = "shop_order"

    id: str = Field(primary_key=True, max_length=64)
    amount: int
    currency: str = Field(max_length=3)
    status: str = Field(default=OrderStatus.PENDING, max_length=32)
    payment_id: str | None = Field(default=None, max_length=64, index=True)
    refunded_amount: int = 0
    failure_code: str | None = Field(default=None, max_length=16)
    failure_message: str | None = Field(default=None, max_length=255)
    dispute_status: str | None = Field(default=None, max_length=32)
    #: Times the goods were shipped: a paid order ships once, whichever of the checkout's
    #: API response, the webhook and the reconciler tells the shop first.
    shipments: int = 0
    history: str = Field(default="", max_length=2000)
    updated_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
