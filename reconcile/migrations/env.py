"""Alembic environment for the reconciler's tables (run via ``reconcile.store.upgrade``)."""

from alembic import context

from receiver.db import run_migrations
from reconcile.models import metadata

run_migrations(context, metadata)
