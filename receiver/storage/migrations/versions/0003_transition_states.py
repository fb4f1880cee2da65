"""Transitions keyed by state, not event type; dispute stages; ids never reused on SQLite;
the cut-over of an adopted account.

- ``hookledger_transition``: the key (object, event type) becomes (object, state), where the
  state is the status, or ``stage/status`` for a dispute (see ``receiver.core.transitions``).
  Existing rows get the state their owning event reported (or the status their event type
  implies when that event was pruned).
- ``hookledger_projection``: ``rank`` is dropped (the transition model replaced the single
  rank) and ``stage`` added.
- ``hookledger_event``: ``object_stage`` added (filled in for stored dispute events); on
  SQLite the table is rebuilt with ``AUTOINCREMENT`` and its sequence set above every id
  any table still refers to, so an id freed by ``prune`` is never handed out again (the
  guard tells a retry of a transition's owner from another event by its id).
- ``hookledger_cutover``: where hookledger's own history starts on an adopted account.

The code here is self-contained on purpose: a migration must keep doing what it did when
it was written, whatever the package's modules become.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

OPEN = sa.text("status IN ('pending', 'processing')")

_REFUND_ALIASES = {
    "success": "succeeded",
    "failure": "failed",
    "transaction_failure": "failed",
    "manual_review": "review",
    "Success": "succeeded",
    "Failure": "failed",
    "TransactionFailure": "failed",
    "ManualReview": "review",
    "Pending": "pending",
}
_DISPUTE = (
    "dispute_opened",
    "dispute_expired",
    "dispute_accepted",
    "dispute_cancelled",
    "dispute_challenged",
    "dispute_won",
    "dispute_lost",
)
#: The status each event type implies (as of this revision).
_IMPLIED = {
    "payment_succeeded": "succeeded",
    "payment_failed": "failed",
    "payment_processing": "processing",
    "payment_cancelled": "cancelled",
    "payment_cancelled_post_capture": "cancelled_post_capture",
    "payment_authorized": "requires_capture",
    "payment_partially_authorized": "partially_authorized_and_requires_capture",
    "payment_captured": "partially_captured",
    "payment_expired": "expired",
    "action_required": "requires_customer_action",
    "refund_succeeded": "succeeded",
    "refund_failed": "failed",
    **{status: status for status in _DISPUTE},
    "mandate_active": "active",
    "mandate_revoked": "revoked",
    "payout_success": "success",
    "payout_failed": "failed",
    "payout_initiated": "initiated",
    "payout_processing": "pending",
    "payout_cancelled": "cancelled",
    "payout_expired": "expired",
    "payout_reversed": "reversed",
    "invoice_paid": "invoice_paid",
}
#: For the downgrade: revision 0002's ranks and status -> event mapping.
_OLD_RANK = {
    "payment": {
        "requires_payment_method": 10,
        "requires_confirmation": 20,
        "requires_customer_action": 30,
        "requires_merchant_action": 30,
        "conflicted": 30,
        "processing": 40,
        "partially_authorized_and_requires_capture": 50,
        "requires_capture": 50,
        "partially_captured_and_processing": 55,
        "partially_captured_and_capturable": 60,
        "partially_captured": 70,
        "succeeded": 80,
        "failed": 80,
        "cancelled": 80,
        "expired": 80,
        "cancelled_post_capture": 90,
    },
    "refund": {"pending": 10, "review": 20, "succeeded": 80, "failed": 80},
    "dispute": {**{s: 80 for s in _DISPUTE}, "dispute_opened": 10, "dispute_challenged": 30},
    "mandate": {"pending": 10, "active": 20, "inactive": 20, "revoked": 80},
    "payout": {
        "requires_creation": 5,
        "requires_vendor_account_creation": 7,
        "requires_payout_method_data": 8,
        "requires_confirmation": 10,
        "requires_fulfillment": 20,
        "pending": 30,
        "initiated": 40,
        "success": 80,
        "failed": 80,
        "cancelled": 80,
        "expired": 80,
        "ineligible": 80,
        "reversed": 90,
    },
    "invoice": {"payment_pending": 10, "invoice_paid": 80},
}
_EVENT_OF = {
    "payment": {
        "succeeded": "payment_succeeded",
        "failed": "payment_failed",
        "processing": "payment_processing",
        "partially_captured_and_processing": "payment_processing",
        "requires_merchant_action": "action_required",
        "requires_customer_action": "action_required",
        "conflicted": "action_required",
        "cancelled": "payment_cancelled",
        "cancelled_post_capture": "payment_cancelled_post_capture",
        "expired": "payment_expired",
        "partially_captured": "payment_captured",
        "partially_captured_and_capturable": "payment_captured",
        "requires_capture": "payment_authorized",
        "partially_authorized_and_requires_capture": "payment_partially_authorized",
    },
    "refund": {"succeeded": "refund_succeeded", "failed": "refund_failed"},
    "dispute": {s: s for s in _DISPUTE},
    "mandate": {"active": "mandate_active", "revoked": "mandate_revoked"},
    "payout": {
        "success": "payout_success",
        "failed": "payout_failed",
        "cancelled": "payout_cancelled",
        "initiated": "payout_initiated",
        "expired": "payout_expired",
        "reversed": "payout_reversed",
    },
    "invoice": {"invoice_paid": "invoice_paid"},
}

_BATCH = 1000


def _normalize(kind: str, status: str) -> str:
    return _REFUND_ALIASES.get(status, status) if kind == "refund" else status


def _key(kind: str, status: str, stage: str | None) -> str:
    status = _normalize(kind, status)
    return f"{stage or 'dispute'}/{status}" if kind == "dispute" else status


def _stage_of(body: Any) -> str | None:
    try:
        data = json.loads(bytes(body).decode("utf-8"))
        stage = data["content"]["object"].get("dispute_stage")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    return stage if isinstance(stage, str) and stage else None


def _event_table() -> sa.TableClause:
    return sa.table(
        "hookledger_event",
        sa.column("id", sa.BigInteger()),
        sa.column("object_kind", sa.String()),
        sa.column("object_status", sa.String()),
        sa.column("object_stage", sa.String()),
        sa.column("event_type", sa.String()),
        sa.column("body", sa.LargeBinary()),
    )


def upgrade() -> None:
    bind = op.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    event = _event_table()

    # -- hookledger_event: object_stage; on SQLite, AUTOINCREMENT ------------------------------
    if sqlite:
        op.drop_index("ix_hookledger_event_open_due", table_name="hookledger_event")
        with op.batch_alter_table(
            "hookledger_event", recreate="always", table_kwargs={"sqlite_autoincrement": True}
        ) as batch:
            batch.add_column(sa.Column("object_stage", sa.String(64), nullable=True))
        op.create_index(
            "ix_hookledger_event_open_due",
            "hookledger_event",
            ["next_attempt_at", "id"],
            sqlite_where=OPEN,
        )
    else:
        op.add_column("hookledger_event", sa.Column("object_stage", sa.String(64), nullable=True))
    last = 0
    while True:
        rows = bind.execute(
            sa.select(event.c.id, event.c.body)
            .where(event.c.object_kind == "dispute", event.c.id > last)
            .order_by(event.c.id)
            .limit(_BATCH)
        ).all()
        if not rows:
            break
        last = int(rows[-1].id)
        staged = [{"pk": row.id, "stage": _stage_of(row.body)} for row in rows]
        staged = [row for row in staged if row["stage"] is not None]
        if staged:
            bind.execute(
                event.update()
                .where(event.c.id == sa.bindparam("pk"))
                .values(object_stage=sa.bindparam("stage")),
                staged,
            )
    if sqlite:
        # Above every id still referred to anywhere (a pruned event's id may live on as a
        # transition's or projection's owner).
        high = bind.execute(
            sa.text(
                "SELECT max(coalesce((SELECT max(id) FROM hookledger_event), 0), "
                "coalesce((SELECT max(event_pk) FROM hookledger_transition), 0), "
                "coalesce((SELECT max(event_pk) FROM hookledger_projection), 0), "
                "coalesce((SELECT max(event_pk) FROM hookledger_handler_run), 0), "
                "coalesce((SELECT max(replay_of) FROM hookledger_event), 0), "
                "coalesce((SELECT max(seq) FROM sqlite_sequence "
                "WHERE name = 'hookledger_event'), 0))"
            )
        ).scalar_one()
        # sqlite_sequence has no key: one row per table, replaced by hand.
        bind.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = 'hookledger_event'"))
        bind.execute(
            sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES ('hookledger_event', :seq)"),
            {"seq": int(high)},
        )

    # -- hookledger_projection: stage instead of rank ------------------------------------------
    with op.batch_alter_table("hookledger_projection") as batch:
        batch.add_column(sa.Column("stage", sa.String(64), nullable=True))
        batch.drop_column("rank")
    bind.execute(
        sa.text(
            "UPDATE hookledger_projection SET stage = coalesce((SELECT e.object_stage FROM "
            "hookledger_event e WHERE e.id = hookledger_projection.event_pk), 'dispute') "
            "WHERE object_kind = 'dispute'"
        )
    )

    # -- hookledger_transition: keyed by state ----------------------------------------------------
    old = sa.table(
        "hookledger_transition",
        sa.column("object_kind", sa.String()),
        sa.column("object_id", sa.String()),
        sa.column("event_type", sa.String()),
        sa.column("event_pk", sa.BigInteger()),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    owned = bind.execute(
        sa.select(
            old.c.object_kind,
            old.c.object_id,
            old.c.event_type,
            old.c.event_pk,
            old.c.created_at,
            event.c.object_status,
            event.c.object_stage,
        ).select_from(old.outerjoin(event, event.c.id == old.c.event_pk))
    ).all()
    op.drop_table("hookledger_transition")
    new = op.create_table(
        "hookledger_transition",
        sa.Column("object_kind", sa.String(32), nullable=False),
        sa.Column("object_id", sa.String(255), nullable=False),
        sa.Column("state", sa.String(140), nullable=False),
        sa.Column("event_pk", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "object_kind", "object_id", "state", name="pk_hookledger_transition"
        ),
    )
    keyed: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in owned:
        status = row.object_status or _IMPLIED.get(row.event_type)
        if status is None:
            continue
        state = _key(row.object_kind, status, row.object_stage)
        keyed.setdefault(
            (row.object_kind, row.object_id, state),
            {
                "object_kind": row.object_kind,
                "object_id": row.object_id,
                "state": state,
                "event_pk": row.event_pk,
                "created_at": row.created_at,
            },
        )
    values = list(keyed.values())
    for start in range(0, len(values), _BATCH):
        op.bulk_insert(new, values[start : start + _BATCH])

    # -- hookledger_cutover -----------------------------------------------------------------------
    op.create_table(
        "hookledger_cutover",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("cutover_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_hookledger_cutover"),
    )


def downgrade() -> None:
    bind = op.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    op.drop_table("hookledger_cutover")

    current = sa.table(
        "hookledger_transition",
        sa.column("object_kind", sa.String()),
        sa.column("object_id", sa.String()),
        sa.column("state", sa.String()),
        sa.column("event_pk", sa.BigInteger()),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    event = _event_table()
    rows = bind.execute(
        sa.select(
            current.c.object_kind,
            current.c.state,
            current.c.object_id,
            current.c.event_pk,
            current.c.created_at,
            event.c.event_type,
        ).select_from(current.outerjoin(event, event.c.id == current.c.event_pk))
    ).all()
    op.drop_table("hookledger_transition")
    old = op.create_table(
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
    keyed: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in rows:
        status = row.state.rsplit("/", 1)[-1]
        event_type = _EVENT_OF.get(row.object_kind, {}).get(status) or row.event_type
        if not event_type:
            continue
        keyed.setdefault(
            (row.object_kind, row.object_id, event_type),
            {
                "object_kind": row.object_kind,
                "object_id": row.object_id,
                "event_type": event_type,
                "event_pk": row.event_pk,
                "created_at": row.created_at,
            },
        )
    values = list(keyed.values())
    for start in range(0, len(values), _BATCH):
        op.bulk_insert(old, values[start : start + _BATCH])

    with op.batch_alter_table("hookledger_projection") as batch:
        batch.add_column(sa.Column("rank", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_column("stage")
    projection = sa.table(
        "hookledger_projection",
        sa.column("object_kind", sa.String()),
        sa.column("object_id", sa.String()),
        sa.column("status", sa.String()),
        sa.column("rank", sa.Integer()),
    )
    for kind, ranks in _OLD_RANK.items():
        for status, rank in ranks.items():
            bind.execute(
                projection.update()
                .where(projection.c.object_kind == kind, projection.c.status == status)
                .values(rank=rank)
            )
    with op.batch_alter_table("hookledger_projection") as batch:
        batch.alter_column("rank", server_default=None)

    if sqlite:
        op.drop_index("ix_hookledger_event_open_due", table_name="hookledger_event")
        with op.batch_alter_table(
            "hookledger_event", recreate="always", table_kwargs={"sqlite_autoincrement": False}
        ) as batch:
            batch.drop_column("object_stage")
        op.create_index(
            "ix_hookledger_event_open_due",
            "hookledger_event",
            ["next_attempt_at", "id"],
            sqlite_where=OPEN,
        )
    else:
        op.drop_column("hookledger_event", "object_stage")
