"""The order index: ``hookledger_order_ref`` and ``hookledger_order_backfill``.

``hookledger_order_ref`` holds, per inbox row and configured reference field
(``HOOKLEDGER_ORDER_FIELDS``), a digest of the shop's order reference (keyed with a data
key, or plain SHA-256 without one), indexed by (digest, account) for ``hookledger events
--order`` and the console's search. ``hookledger_order_backfill`` keeps where ``hookledger
order-index backfill`` stands. New tables: nothing existing is rewritten; the events stored
before this revision are indexed by that backfill.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hookledger_order_ref",
        sa.Column("event_pk", sa.BigInteger(), nullable=False),
        sa.Column("path", sa.String(length=128), nullable=False),
        sa.Column("account", sa.String(length=64), nullable=False, server_default="default"),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("event_pk", "path", name="pk_hookledger_order_ref"),
    )
    op.create_index("ix_hookledger_order_ref_digest", "hookledger_order_ref", ["digest", "account"])
    op.create_table(
        "hookledger_order_backfill",
        sa.Column("scope", sa.String(length=200), nullable=False),
        sa.Column("fields", sa.Text(), nullable=False),
        sa.Column("after_pk", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("scope", name="pk_hookledger_order_backfill"),
    )


def downgrade() -> None:
    """Drops the order index (only digests: every event keeps its body, and ``hookledger
    order-index backfill`` builds it again after an upgrade)."""
    op.drop_table("hookledger_order_backfill")
    op.drop_index("ix_hookledger_order_ref_digest", table_name="hookledger_order_ref")
    op.drop_table("hookledger_order_ref")
