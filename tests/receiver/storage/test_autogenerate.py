"""A merchant's Flask-Migrate on hookledger's database: with hookledger's filters,
``flask db migrate`` writes the merchant's own tables and never a ``drop_table`` for ours."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask

import receiver.storage.database as hookledger_db
from receiver.storage.autogenerate import (
    chain_include_object,
    include_name,
    include_object,
    is_hookledger_table,
)
from reconcile.storage.store import RECONCILE_MIGRATIONS

pytestmark = [
    pytest.mark.storage,
    # Flask-Migrate's own env.py template still tries Flask-SQLAlchemy's deprecated API first.
    pytest.mark.filterwarnings("ignore:'get_engine' is deprecated:DeprecationWarning"),
]


@pytest.fixture(autouse=True)
def keep_logging() -> Iterator[None]:
    """Flask-Migrate's env.py runs ``logging.config.fileConfig``, which disables every logger
    that exists: put them back, or later tests in this process log nothing."""
    manager = logging.root.manager
    saved = {
        name: (known.disabled, known.level, list(known.handlers), known.propagate)
        for name, known in manager.loggerDict.items()
        if isinstance(known, logging.Logger)
    }
    root = (logging.root.level, list(logging.root.handlers))
    yield
    for name, (disabled, level, handlers, propagate) in saved.items():
        known = logging.getLogger(name)
        known.disabled, known.propagate = disabled, propagate
        known.setLevel(level)
        known.handlers[:] = handlers
    for name, known in manager.loggerDict.items():
        if isinstance(known, logging.Logger) and name not in saved:
            known.disabled = False
    logging.root.setLevel(root[0])
    logging.root.handlers[:] = root[1]


def _merchant_app(database_url: str, **migrate_options: object) -> tuple[Flask, object]:
    from flask_migrate import Migrate
    from flask_sqlalchemy import SQLAlchemy

    app = Flask("merchant")
    app.config["SQLALCHEMY_DATABASE_URI"] = hookledger_db.normalise_url(database_url)
    sa_db = SQLAlchemy(app)

    class Order(sa_db.Model):  # type: ignore[name-defined,misc]
        __tablename__ = "shop_order"
        id = sa_db.Column(sa_db.String(40), primary_key=True)
        amount = sa_db.Column(sa_db.Integer, nullable=False)

    Migrate(app, sa_db, **migrate_options)
    return app, sa_db


def _autogenerate(app: Flask, directory: Path) -> str:
    from flask_migrate import init, migrate

    with app.app_context():
        init(directory=str(directory))
        migrate(directory=str(directory), message="orders")
    (script,) = (directory / "versions").glob("*.py")
    return script.read_text()


@pytest.fixture
def hookledger_tables(database_url: str) -> str:
    engine = hookledger_db.make_engine(database_url)
    hookledger_db.upgrade(engine)
    hookledger_db.upgrade(engine, tree=RECONCILE_MIGRATIONS)
    engine.dispose()
    return database_url


def test_without_the_filters_autogenerate_drops_our_tables(
    hookledger_tables: str, tmp_path: Path
) -> None:
    app, sa_db = _merchant_app(hookledger_tables)
    script = _autogenerate(app, tmp_path / "migrations")
    assert "op.drop_table('hookledger_event')" in script  # the problem the filters solve
    with app.app_context():
        sa_db.engine.dispose()  # type: ignore[attr-defined]


def test_with_the_filters_it_writes_only_the_merchants_tables(
    hookledger_tables: str, tmp_path: Path
) -> None:
    app, sa_db = _merchant_app(
        hookledger_tables, include_name=include_name, include_object=include_object
    )
    script = _autogenerate(app, tmp_path / "migrations")
    assert "op.create_table('shop_order'" in script
    assert "hookledger" not in script
    with app.app_context():
        sa_db.engine.dispose()  # type: ignore[attr-defined]


def test_the_filters() -> None:
    assert is_hookledger_table("hookledger_alembic_version")
    assert is_hookledger_table("hookledger_reconcile_alembic_version")
    assert not is_hookledger_table("orders") and not is_hookledger_table(None)
    assert include_name("hookledger_event", "table", {}) is False
    assert include_name("ix_x", "index", {"table_name": "hookledger_event"}) is False
    assert include_name("orders", "table", {}) is True

    def no_audit(obj: object, name: str | None, type_: str, reflected: bool, to: object) -> bool:
        return name != "audit"

    combined = chain_include_object(no_audit)
    assert combined(None, "audit", "table", True, None) is False
    assert combined(None, "hookledger_event", "table", True, None) is False
    assert combined(None, "orders", "table", True, None) is True
