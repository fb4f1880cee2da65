"""Initial schema: inbox, conflicts, handler ledger, projection, transitions, object leases.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BIGINT_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "hookledger_event",
        sa.Column("id", BIGINT_PK, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(255), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("merchant_id", sa.String(255), nullable=True),
        sa.Column("event_type", sa.String(64), nullable=True),
        sa.Column("content_type", sa.String(64), nullable=True),
        sa.Column("object_kind", sa.String(32), nullable=True),
        sa.Column("object_id", sa.String(255), nullable=True),
        sa.Column("object_status", sa.String(64), nullable=True),
        sa.Column("object_key", sa.String(300), nullable=False),
        sa.Column("event_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("object_created_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("headers", sa.Text(), nullable=False),
        sa.Column("body_sha256", sa.String(64), nullable=False),
        sa.Column("secret_id", sa.String(64), nullable=True),
        sa.Column("replay_of", sa.BigInteger(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_hookledger_event"),
        sa.UniqueConstraint("event_id", name="uq_hookledger_event_event_id"),
    )
    op.create_index("ix_hookledger_event_due", "hookledger_event", ["status", "next_attempt_at"])
    op.create_index(
        "ix_hookledger_event_object", "hookledger_event", ["object_key", "event_time", "id"]
    )
    op.create_table(
        "hookledger_event_conflict",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(255), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("headers", sa.Text(), nullable=False),
        sa.Column("body_sha256", sa.String(64), nullable=False),
        sa.Column("secret_id", sa.String(64), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_hookledger_event_conflict"),
        sa.UniqueConstraint(
            "event_id", "body_sha256", name="uq_hookledger_event_conflict_event_id_body_sha256"
        ),
    )
    op.create_table(
        "hookledger_handler_run",
        sa.Column("event_pk", sa.BigInteger(), nullable=False),
        sa.Column("handler", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("event_pk", "handler", name="pk_hookledger_handler_run"),
    )
    op.create_table(
        "hookledger_projection",
        sa.Column("object_kind", sa.String(32), nullable=False),
        sa.Column("object_id", sa.String(255), nullable=False),
        sa.Column("status", sa.String(64), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("event_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("object_created_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("event_pk", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("object_kind", "object_id", name="pk_hookledger_projection"),
    )
    op.create_index(
        "ix_hookledger_projection_created",
        "hookledger_projection",
        ["object_kind", "object_created_at"],
    )
    op.create_table(
        "hookledger_transition",
        sa.Column("object_kind", sa.String(32), nullable=False),
        sa.Column("object_id", sa.String(255), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("event_pk", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "object_kind", "object_id", "event_type", name="pk_hookledger_transition"
        ),
    )
    op.create_table(
        "hookledger_object_lease",
        sa.Column("object_key", sa.String(300), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("object_key", name="pk_hookledger_object_lease"),
    )


def downgrade() -> None:
    op.drop_table("hookledger_object_lease")
    op.drop_table("hookledger_transition")
    op.drop_index("ix_hookledger_projection_created", table_name="hookledger_projection")
    op.drop_table("hookledger_projection")
    op.drop_table("hookledger_handler_run")
    op.drop_table("hookledger_event_conflict")
    op.drop_index("ix_hookledger_event_object", table_name="hookledger_event")
    op.drop_index("ix_hookledger_event_due", table_name="hookledger_event")
    op.drop_table("hookledger_event")
