"""Alembic environment for hookledger's own tables (run via ``receiver.db.upgrade``)."""

from __future__ import annotations

from alembic import context

from receiver.db import VERSION_TABLE
from receiver.models import metadata

config = context.config
engine = config.attributes["engine"]

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
