"""The projections' creation-time index covers only rows with a creation time.

``ix_hookledger_projection_created`` (kind, creation time) serves the reconciler's range
reads, which all imply a creation time. Over every row it also matched a bare kind, and
without statistics the planner would as soon probe it as the primary key for the guard's
lookup of one object (kind, id): a plan a worker's connection then keeps, and which reads
every projection of the kind once the ledger has grown. Partial, it cannot serve that
lookup; the primary key always does.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

NAME = "ix_hookledger_projection_created"
TABLE = "hookledger_projection"
COLUMNS = ["object_kind", "object_created_at"]
KNOWN = sa.text("object_created_at IS NOT NULL")


def upgrade() -> None:
    op.drop_index(NAME, table_name=TABLE)
    op.create_index(NAME, TABLE, COLUMNS, postgresql_where=KNOWN, sqlite_where=KNOWN)


def downgrade() -> None:
    op.drop_index(NAME, table_name=TABLE)
    op.create_index(NAME, TABLE, COLUMNS)
