"""Alembic environment for the receiver's tables (run via ``receiver.storage.database.upgrade``)."""

from alembic import context

from receiver.storage.database import run_migrations
from receiver.storage.tables import metadata

run_migrations(context, metadata)
