"""Alembic environment for the receiver's tables (run via ``receiver.db.upgrade``)."""

from alembic import context

from receiver.db import run_migrations
from receiver.models import metadata

run_migrations(context, metadata)
