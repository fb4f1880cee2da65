"""Worker heartbeats: each running worker process keeps a row fresh, so ``hookledger status``
and readiness probes can tell "no worker alive" from "a quiet queue".

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hookledger_worker",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("processed", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_hookledger_worker"),
    )


def downgrade() -> None:
    op.drop_table("hookledger_worker")
