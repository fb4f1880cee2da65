"""Accounts in hookledger's own table: ``hookledger_account`` (``hookledger accounts ...``).

One row per processor account managed with the ``hookledger accounts`` commands, read per
request: the id (the URL's slug), the processor merchant id (indexed: the shared URL finds
the account by the body's ``merchant_id``), the profile ids (JSON), the webhook secrets and
the API keys, sealed under a data key (``key_id``), the processor URL and environment,
whether it is active, and when it was created and last changed. A new table: nothing
existing is rewritten.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hookledger_account",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("merchant_id", sa.String(length=255), nullable=False),
        sa.Column("profile_ids", sa.Text(), nullable=False),
        sa.Column("secrets", sa.Text(), nullable=False),
        sa.Column("api_key", sa.Text(), nullable=True),
        sa.Column("admin_key", sa.Text(), nullable=True),
        sa.Column("base_url", sa.String(length=500), nullable=True),
        sa.Column("environment", sa.String(length=16), nullable=True),
        sa.Column("active", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_hookledger_account"),
    )
    op.create_index("ix_hookledger_account_merchant_id", "hookledger_account", ["merchant_id"])


def downgrade() -> None:
    """Drops the stored accounts (their sealed secrets with them); their events, transitions
    and projections stay, as they do when an account is removed."""
    op.drop_index("ix_hookledger_account_merchant_id", table_name="hookledger_account")
    op.drop_table("hookledger_account")
