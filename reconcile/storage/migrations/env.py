"""Alembic environment for the reconciler's tables (run via ``reconcile.storage.store.upgrade``)."""

from alembic import context

from receiver.storage.database import run_migrations
from reconcile.storage.tables import metadata

run_migrations(context, metadata)
