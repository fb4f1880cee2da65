"""The open-object sweep's followed objects and the adoption's progress.

Revision ID: r0003
Revises: r0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0003"
down_revision = "r0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hookledger_recon_object",
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("object_id", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(64), nullable=False),
        sa.Column("stage", sa.String(64), nullable=True),
        sa.Column("last_checked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_check_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("checks", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("kind", "object_id", name="pk_hookledger_recon_object"),
    )
    op.create_index(
        "ix_hookledger_recon_object_kind_next_check_at",
        "hookledger_recon_object",
        ["kind", "next_check_at"],
    )
    op.create_table(
        "hookledger_recon_adoption",
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("cutover_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("history_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reached", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("counts", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("kind", name="pk_hookledger_recon_adoption"),
    )


def downgrade() -> None:
    op.drop_table("hookledger_recon_adoption")
    op.drop_index(
        "ix_hookledger_recon_object_kind_next_check_at", table_name="hookledger_recon_object"
    )
    op.drop_table("hookledger_recon_object")
