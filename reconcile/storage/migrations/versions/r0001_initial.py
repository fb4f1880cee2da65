"""Reconciler schema: watermarks, runs, lock, seen ids.

Revision ID: r0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0001"
down_revision = None
branch_labels = None
depends_on = None

BIGINT_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "hookledger_recon_watermark",
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("high_water", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("kind", name="pk_hookledger_recon_watermark"),
    )
    op.create_table(
        "hookledger_recon_run",
        sa.Column("id", BIGINT_PK, primary_key=True, autoincrement=True),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("report", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_hookledger_recon_run"),
    )
    op.create_table(
        "hookledger_recon_lock",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_hookledger_recon_lock"),
    )
    op.create_table(
        "hookledger_recon_seen",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("object_id", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "kind", "object_id", name="pk_hookledger_recon_seen"),
    )


def downgrade() -> None:
    op.drop_table("hookledger_recon_seen")
    op.drop_table("hookledger_recon_lock")
    op.drop_table("hookledger_recon_run")
    op.drop_table("hookledger_recon_watermark")
