"""The migrations create exactly the tables the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import receiver.storage.database as db
from receiver.core.errors import ConfigurationError
from receiver.storage.tables import metadata as receiver_metadata
from reconcile.storage.store import RECONCILE_MIGRATIONS
from reconcile.storage.tables import metadata as reconcile_metadata

pytestmark = pytest.mark.storage


@pytest.mark.parametrize(
    ("tree", "metadata"),
    [(db.RECEIVER_MIGRATIONS, receiver_metadata), (RECONCILE_MIGRATIONS, reconcile_metadata)],
    ids=["receiver", "reconcile"],
)
def test_models_match_migrations(
    database_url: str, tree: db.MigrationTree, metadata: sa.MetaData
) -> None:
    engine = db.make_engine(database_url)
    try:
        with pytest.raises(ConfigurationError, match="upgrade"):
            db.check_schema(engine, tree)
        db.upgrade(engine, tree=tree)
        db.upgrade(engine, tree=tree)  # idempotent
        db.check_schema(engine, tree)
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"version_table": tree.version_table, "compare_type": True}
            )
            diff = [
                d
                for d in compare_metadata(context, metadata)
                # The other tree's tables are not this tree's business.
                if not (d[0] == "remove_table")
            ]
        assert diff == []
        db.downgrade(engine, "base", tree=tree)
        assert db.current_revision(engine, tree) is None
    finally:
        engine.dispose()
