"""Accounts: every row belongs to one processor account; an object is (account, kind, id).

- ``account`` (``NOT NULL DEFAULT 'default'``) on ``hookledger_event``,
  ``hookledger_event_conflict``, ``hookledger_projection``, ``hookledger_transition`` and
  ``hookledger_cutover``; every existing row becomes the default account's, as it was the
  installation's only account. ``hookledger_rejection`` gets a nullable ``account`` (the
  account a refused delivery was addressed to, when it named one).
- The unique keys include the account: an event id is unique per account
  (``uq_hookledger_event_account_event_id``), a conflict per (account, event id, body),
  a projection per (account, kind, id), a transition per (account, kind, id, state), a
  cut-over row per (account, name). The projections' creation-time index leads with the
  account (the reconciler reads one account's range), and so does the index over open
  events (``ix_hookledger_event_open_due``: workers take turns between accounts).
- Object keys (``kind:id``) and the handler ledger (keyed by the event's row id) are not
  rewritten: the default account keeps its keys, other accounts' keys carry their id
  (:func:`receiver.core.accounts.object_key`). Nothing is re-dispatched.

On PostgreSQL the column is added without a rewrite (a constant default) and the keys are
rebuilt in place; on SQLite the five tables are rebuilt once (``batch_alter_table``), keeping
the event table's AUTOINCREMENT and its partial index.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

import warnings
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

DEFAULT = sa.text("'default'")
OPEN = sa.text("status IN ('pending', 'processing')")
KNOWN = sa.text("object_created_at IS NOT NULL")
CREATED = "ix_hookledger_projection_created"
#: The open events by account, then due time: workers take turns between the accounts with
#: due events, each account's in due order (see :meth:`receiver.storage.queue.Queue.claim_batch`).
OPEN_DUE = "ix_hookledger_event_open_due"

#: table -> (old key kind, old key name, old columns, new key name, new columns)
KEYS: dict[str, tuple[str, str, list[str], str, list[str]]] = {
    "hookledger_event": (
        "unique",
        "uq_hookledger_event_event_id",
        ["event_id"],
        "uq_hookledger_event_account_event_id",
        ["account", "event_id"],
    ),
    "hookledger_event_conflict": (
        "unique",
        "uq_hookledger_event_conflict_event_id_body_sha256",
        ["event_id", "body_sha256"],
        "uq_hookledger_event_conflict_account_event_id_body_sha256",
        ["account", "event_id", "body_sha256"],
    ),
    "hookledger_projection": (
        "primary",
        "pk_hookledger_projection",
        ["object_kind", "object_id"],
        "pk_hookledger_projection",
        ["account", "object_kind", "object_id"],
    ),
    "hookledger_transition": (
        "primary",
        "pk_hookledger_transition",
        ["object_kind", "object_id", "state"],
        "pk_hookledger_transition",
        ["account", "object_kind", "object_id", "state"],
    ),
    "hookledger_cutover": (
        "primary",
        "pk_hookledger_cutover",
        ["name"],
        "pk_hookledger_cutover",
        ["account", "name"],
    ),
}


def _account_column() -> sa.Column[str]:
    return sa.Column("account", sa.String(64), nullable=False, server_default=DEFAULT)


def _rekey(
    ops: Any, table: str, kind: str, old_name: str, new_name: str, columns: list[str]
) -> None:
    """Replace a table's key: ``ops`` is ``op`` (PostgreSQL) or a batch (SQLite)."""
    where = {} if ops is not op else {"table_name": table}
    if kind == "unique":
        ops.drop_constraint(old_name, type_="unique", **where)
        ops.create_unique_constraint(new_name, *([table] if ops is op else []), columns)
    else:
        if ops is op:  # a batch rebuild takes the new primary key from create_primary_key
            ops.drop_constraint(old_name, type_="primary", **where)
        ops.create_primary_key(new_name, *([table] if ops is op else []), columns)


#: SQLite: the highest event id ever used (or still referred to: a pruned event's id may live
#: on as a transition's, projection's or ledger row's owner). A rebuilt table starts a new
#: ``sqlite_sequence`` row; ids are never reused, so it must start above this.
HIGHEST_ID = sa.text(
    "SELECT max(coalesce((SELECT max(id) FROM hookledger_event), 0), "
    "coalesce((SELECT max(event_pk) FROM hookledger_transition), 0), "
    "coalesce((SELECT max(event_pk) FROM hookledger_projection), 0), "
    "coalesce((SELECT max(event_pk) FROM hookledger_handler_run), 0), "
    "coalesce((SELECT max(replay_of) FROM hookledger_event), 0), "
    "coalesce((SELECT max(seq) FROM sqlite_sequence WHERE name = 'hookledger_event'), 0))"
)


def _keep_sequence(high: int) -> None:
    bind = op.get_bind()
    high = max(high, int(bind.execute(HIGHEST_ID).scalar_one()))
    # sqlite_sequence has no key: one row per table, replaced by hand.
    bind.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = 'hookledger_event'"))
    bind.execute(
        sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES ('hookledger_event', :seq)"),
        {"seq": high},
    )


def _migrate(*, up: bool) -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    high = int(op.get_bind().execute(HIGHEST_ID).scalar_one()) if sqlite else 0
    op.drop_index(CREATED, table_name="hookledger_projection")
    op.drop_index(OPEN_DUE, table_name="hookledger_event")
    for table, (kind, old_name, old_cols, new_name, new_cols) in KEYS.items():
        if sqlite:
            kwargs = {"sqlite_autoincrement": True} if table == "hookledger_event" else {}
            with warnings.catch_warnings():
                # A batch copies the reflected columns, still flagged as the old primary key,
                # then takes the new one from create_primary_key: SQLAlchemy says so (and
                # does it). The message is the expected one, never an error here.
                warnings.filterwarnings(
                    "ignore", message=".*not matching locally specified columns", category=Warning
                )
                with op.batch_alter_table(table, recreate="always", table_kwargs=kwargs) as batch:
                    if up:
                        batch.add_column(_account_column())
                        _rekey(batch, table, kind, old_name, new_name, new_cols)
                    else:
                        _rekey(batch, table, kind, new_name, old_name, old_cols)
                        batch.drop_column("account")
        elif up:
            op.add_column(table, _account_column())
            _rekey(op, table, kind, old_name, new_name, new_cols)
        else:
            _rekey(op, table, kind, new_name, old_name, old_cols)
            op.drop_column(table, "account")
    if up:
        op.add_column("hookledger_rejection", sa.Column("account", sa.String(64), nullable=True))
    elif sqlite:
        op.execute("ALTER TABLE hookledger_rejection DROP COLUMN account")
    else:
        op.drop_column("hookledger_rejection", "account")
    if sqlite:
        _keep_sequence(high)
    op.create_index(
        OPEN_DUE,
        "hookledger_event",
        ["account", "next_attempt_at", "id"] if up else ["next_attempt_at", "id"],
        postgresql_where=OPEN,
        sqlite_where=OPEN,
    )
    created = ["account", "object_kind", "object_created_at"] if up else ["object_kind"]
    if not up:
        created.append("object_created_at")
    op.create_index(
        CREATED, "hookledger_projection", created, postgresql_where=KNOWN, sqlite_where=KNOWN
    )


def upgrade() -> None:
    _migrate(up=True)


def downgrade() -> None:
    """Back to one account: only possible while every row is the default account's (two
    accounts' rows could share an event id or an object, which the old keys forbid)."""
    bind = op.get_bind()
    for table in KEYS:
        other = bind.execute(
            sa.text(f"SELECT count(*) FROM {table} WHERE account <> 'default'")  # noqa: S608
        ).scalar_one()
        if other:
            raise RuntimeError(
                f"cannot downgrade below 0007: {table} holds {other} row(s) of accounts other "
                "than 'default'; prune them first"
            )
    _migrate(up=False)
