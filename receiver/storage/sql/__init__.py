"""The SQL that differs between PostgreSQL and SQLite, one module per database.

:class:`~receiver.storage.sql.base.Statements` names each dialect-specific statement;
:mod:`receiver.storage.sql.postgresql` and :mod:`receiver.storage.sql.sqlite` build them, in the
same order.
"""

from __future__ import annotations

from sqlalchemy import Engine

from receiver.storage.sql.base import Outcomes, Statements
from receiver.storage.sql.postgresql import PostgreSQLStatements
from receiver.storage.sql.sqlite import SQLiteStatements


def statements_for(engine: Engine) -> Statements:
    """The statements of ``engine``'s database."""
    if engine.dialect.name == "postgresql":
        return PostgreSQLStatements()
    if engine.dialect.name == "sqlite":
        return SQLiteStatements()
    raise ValueError(f"unsupported database {engine.dialect.name!r} (use sqlite or postgresql)")


__all__ = ["Outcomes", "PostgreSQLStatements", "SQLiteStatements", "Statements", "statements_for"]
