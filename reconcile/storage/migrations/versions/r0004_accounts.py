"""Accounts: the reconciler's watermarks, runs, run lock, followed objects and adoption
progress belong to one processor account each (see :mod:`receiver.core.accounts`).

``account`` (``NOT NULL DEFAULT 'default'``) on every reconciler table but the seen batches
(which belong to a run); what exists becomes the default account's, as it was the
installation's only account. The keys lead with the account: a watermark per (account,
kind), a lock per (account, name), a followed object per (account, kind, id), adoption
progress per (account, kind); runs are read per account (``ix_hookledger_recon_run_account_id``).

Revision ID: r0004
Revises: r0003
Create Date: 2026-11-26
"""

from __future__ import annotations

import warnings

import sqlalchemy as sa
from alembic import op

revision = "r0004"
down_revision = "r0003"
branch_labels = None
depends_on = None

DEFAULT = sa.text("'default'")
#: table -> (primary key name, columns before, columns after)
KEYED = {
    "hookledger_recon_watermark": ("pk_hookledger_recon_watermark", ["kind"]),
    "hookledger_recon_lock": ("pk_hookledger_recon_lock", ["name"]),
    "hookledger_recon_object": ("pk_hookledger_recon_object", ["kind", "object_id"]),
    "hookledger_recon_adoption": ("pk_hookledger_recon_adoption", ["kind"]),
}
DUE = "ix_hookledger_recon_object_kind_next_check_at"
DUE_NEW = "ix_hookledger_recon_object_account_kind_next_check_at"
RUNS = "ix_hookledger_recon_run_account_id"


def _column() -> sa.Column[str]:
    return sa.Column("account", sa.String(64), nullable=False, server_default=DEFAULT)


def _rekey(table: str, name: str, columns: list[str], *, up: bool) -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if not sqlite:
        if up:
            op.add_column(table, _column())
        op.drop_constraint(name, table, type_="primary")
        op.create_primary_key(name, table, ["account", *columns] if up else columns)
        if not up:
            op.drop_column(table, "account")
        return
    with warnings.catch_warnings():
        # The batch copies the reflected columns, still flagged as the old key, then takes
        # the new one from create_primary_key (SQLAlchemy says so, and does it).
        warnings.filterwarnings(
            "ignore", message=".*not matching locally specified columns", category=Warning
        )
        with op.batch_alter_table(table, recreate="always") as batch:
            if up:
                batch.add_column(_column())
                batch.create_primary_key(name, ["account", *columns])
            else:
                batch.create_primary_key(name, columns)
                batch.drop_column("account")


def upgrade() -> None:
    op.drop_index(DUE, table_name="hookledger_recon_object")
    for table, (name, columns) in KEYED.items():
        _rekey(table, name, columns, up=True)
    op.create_index(DUE_NEW, "hookledger_recon_object", ["account", "kind", "next_check_at"])
    op.add_column("hookledger_recon_run", _column())
    op.create_index(RUNS, "hookledger_recon_run", ["account", "id"])


def downgrade() -> None:
    bind = op.get_bind()
    for table in (*KEYED, "hookledger_recon_run"):
        other = bind.execute(
            sa.text(f"SELECT count(*) FROM {table} WHERE account <> 'default'")  # noqa: S608
        ).scalar_one()
        if other:
            raise RuntimeError(
                f"cannot downgrade below r0004: {table} holds {other} row(s) of accounts other "
                "than 'default'; prune them first"
            )
    op.drop_index(RUNS, table_name="hookledger_recon_run")
    if bind.dialect.name == "sqlite":
        op.execute("ALTER TABLE hookledger_recon_run DROP COLUMN account")
    else:
        op.drop_column("hookledger_recon_run", "account")
    op.drop_index(DUE_NEW, table_name="hookledger_recon_object")
    for table, (name, columns) in KEYED.items():
        _rekey(table, name, columns, up=False)
    op.create_index(DUE, "hookledger_recon_object", ["kind", "next_check_at"])
