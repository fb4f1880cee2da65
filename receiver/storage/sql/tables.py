"""The inbox's tables as SQLAlchemy Core handles, and the column lists the statements share."""

from __future__ import annotations

from sqlalchemy import Table, text

from receiver.storage.tables import (
    CutOver,
    EventConflict,
    HandlerRun,
    InboxEvent,
    ObjectLease,
    OrderIndexBackfill,
    OrderReference,
    Projection,
    Transition,
)

EVENT: Table = InboxEvent.__table__  # type: ignore[attr-defined]
CONFLICT: Table = EventConflict.__table__  # type: ignore[attr-defined]
HANDLER_RUN: Table = HandlerRun.__table__  # type: ignore[attr-defined]
PROJECTION: Table = Projection.__table__  # type: ignore[attr-defined]
TRANSITION: Table = Transition.__table__  # type: ignore[attr-defined]
LEASE: Table = ObjectLease.__table__  # type: ignore[attr-defined]
CUTOVER: Table = CutOver.__table__  # type: ignore[attr-defined]
ORDER_REF: Table = OrderReference.__table__  # type: ignore[attr-defined]
ORDER_BACKFILL: Table = OrderIndexBackfill.__table__  # type: ignore[attr-defined]

#: Open events, written as a literal so the planner can always use the partial index over them.
OPEN_SQL = text("hookledger_event.status IN ('pending', 'processing')")

#: The inbox columns a new event is inserted with (see :func:`receiver.storage.inbox.event_row`),
#: with their PostgreSQL array types: the reconciler's events are inserted as one array per column.
EVENT_COLUMNS = {
    "account": "varchar",
    "event_id": "varchar",
    "source": "varchar",
    "merchant_id": "varchar",
    "event_type": "varchar",
    "content_type": "varchar",
    "object_kind": "varchar",
    "object_id": "varchar",
    "object_status": "varchar",
    "object_stage": "varchar",
    "object_key": "varchar",
    "event_time": "timestamptz",
    "object_created_at": "timestamptz",
    "received_at": "timestamptz",
    "body": "bytea",
    "headers": "text",
    "body_sha256": "varchar",
    "secret_id": "varchar",
    "replay_of": "bigint",
    "status": "varchar",
    "attempts": "integer",
    "next_attempt_at": "timestamptz",
    "key_id": "varchar",
}

#: The inbox row values that carry a delivery's order references, their fields and digests
#: as parallel lists (no table has these columns; see :mod:`receiver.storage.order_refs`).
PATHS = "ref_paths"
DIGESTS = "ref_digests"

#: The rows a dispatched batch writes (see :class:`receiver.storage.sql.base.Outcomes`): transitions
#: (``t``), projections (``p``), ledger (``l``) and the claimed events' final states (``b``).
OUTCOME_COLUMNS = {
    "t": ("account", "object_kind", "object_id", "state", "event_pk", "created_at"),
    "p": (
        "account",
        "object_kind",
        "object_id",
        "status",
        "stage",
        "event_time",
        "object_created_at",
        "event_pk",
        "updated_at",
    ),
    "l": ("event_pk", "handler", "status", "attempts", "last_error", "updated_at"),
    "b": ("b_id", "b_owner", "b_status", "b_error", "b_next", "b_processed", "b_undo"),
}
