"""Data at rest: the data key of each stored row, redaction, and the rejected-deliveries table.

- ``hookledger_event`` and ``hookledger_event_conflict``: ``key_id`` (the data key the body,
  headers and body hash are sealed and keyed with; ``NULL`` for rows stored in the clear,
  as every existing row is: ``hookledger rotate-keys`` seals them) and ``redacted_at``
  (retention dropped the body and headers).
- ``hookledger_rejection``: a bounded record of rejected deliveries.

Nothing is rewritten here: encrypting existing rows is ``hookledger rotate-keys``, which
runs in batches while the system runs.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BIGINT_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    for table in ("hookledger_event", "hookledger_event_conflict"):
        # Nullable columns without a default: PostgreSQL adds them without rewriting the
        # table; SQLite's ADD COLUMN is a schema change only.
        op.add_column(table, sa.Column("key_id", sa.String(64), nullable=True))
        op.add_column(table, sa.Column("redacted_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "hookledger_rejection",
        sa.Column("id", BIGINT_PK, primary_key=True, autoincrement=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=False),
        sa.Column("remote_addr", sa.String(64), nullable=True),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("header_names", sa.Text(), nullable=False),
        sa.Column("secret_ids", sa.Text(), nullable=False),
        sa.Column("suppressed", sa.Integer(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=True),
        sa.Column("key_id", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_hookledger_rejection"),
    )
    op.create_index("ix_hookledger_rejection_received_at", "hookledger_rejection", ["received_at"])


def downgrade() -> None:
    op.drop_index("ix_hookledger_rejection_received_at", table_name="hookledger_rejection")
    op.drop_table("hookledger_rejection")
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table in ("hookledger_event_conflict", "hookledger_event"):
        for column in ("redacted_at", "key_id"):
            if sqlite:
                # SQLite 3.35+ drops an unindexed column in place: no table rebuild, so the
                # event table keeps its AUTOINCREMENT and its partial index.
                op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
            else:
                op.drop_column(table, column)
