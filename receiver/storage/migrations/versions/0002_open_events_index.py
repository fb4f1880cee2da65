"""Partial index over open events, so a claim stays cheap whatever the backlog of done ones.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

OPEN = sa.text("status IN ('pending', 'processing')")


def upgrade() -> None:
    op.create_index(
        "ix_hookledger_event_open_due",
        "hookledger_event",
        ["next_attempt_at", "id"],
        postgresql_where=OPEN,
        sqlite_where=OPEN,
    )


def downgrade() -> None:
    op.drop_index("ix_hookledger_event_open_due", table_name="hookledger_event")
