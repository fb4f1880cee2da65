"""Seen ids one listed chunk per row (a JSON array) instead of one row per id.

A run marks every id it lists as seen, while listing; a row per id cost the database an
index insert and WAL records for each of them, a row per chunk costs one. The marks only live
for the run that writes them (deleted when it finishes), so nothing is carried over.

Revision ID: r0002
Revises: r0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0002"
down_revision = "r0001"
branch_labels = None
depends_on = None

BIGINT_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "hookledger_recon_seen_batch",
        sa.Column("id", BIGINT_PK, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("object_ids", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_hookledger_recon_seen_batch"),
    )
    op.create_index(
        "ix_hookledger_recon_seen_batch_run_id_kind",
        "hookledger_recon_seen_batch",
        ["run_id", "kind"],
    )
    op.drop_table("hookledger_recon_seen")


def downgrade() -> None:
    op.create_table(
        "hookledger_recon_seen",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("object_id", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "kind", "object_id", name="pk_hookledger_recon_seen"),
    )
    op.drop_index(
        "ix_hookledger_recon_seen_batch_run_id_kind", table_name="hookledger_recon_seen_batch"
    )
    op.drop_table("hookledger_recon_seen_batch")
