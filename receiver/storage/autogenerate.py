"""Living beside the merchant's own Alembic (Flask-Migrate) on the same database.

hookledger's tables belong to hookledger's migrations (``hookledger db upgrade``, with their
own version tables). A merchant's ``flask db migrate`` (Alembic autogenerate) on the same
database sees them in the database but not in the app's models, and writes a
``drop_table`` for each. These filters make autogenerate skip them::

    from receiver.storage.autogenerate import include_name, include_object

    Migrate(app, db, include_name=include_name, include_object=include_object)

or, in a hand-written Alembic ``env.py``::

    context.configure(..., include_name=include_name, include_object=include_object)

With filters of your own, chain them: ``include_object=chain_include_object(mine)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: Every table hookledger creates, its Alembic version tables included, starts with this.
TABLE_PREFIX = "hookledger_"

IncludeName = Callable[[str | None, str, Any], bool]
IncludeObject = Callable[[Any, str | None, str, bool, Any], bool]


def is_hookledger_table(name: str | None) -> bool:
    """Whether a table named ``name`` is one of hookledger's (receiver or reconciler)."""
    return bool(name) and str(name).startswith(TABLE_PREFIX)


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Alembic ``include_name`` hook: never reflect hookledger's tables (or their indexes)."""
    if type_ == "table":
        return not is_hookledger_table(name)
    if type_ in ("index", "column", "unique_constraint", "foreign_key_constraint"):
        table = (parent_names or {}).get("table_name") if isinstance(parent_names, dict) else None
        return not is_hookledger_table(table)
    return True


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic ``include_object`` hook: leave hookledger's tables, and everything on them,
    out of the comparison (no ``drop_table``, no index or column changes)."""
    if type_ == "table":
        return not is_hookledger_table(name)
    table = getattr(obj, "table", None)
    return not is_hookledger_table(getattr(table, "name", None))


def chain_include_name(*mine: IncludeName) -> IncludeName:
    """hookledger's :func:`include_name`, then each of yours (all must agree)."""
    filters: Sequence[IncludeName] = (include_name, *mine)

    def combined(name: str | None, type_: str, parent_names: Any) -> bool:
        return all(f(name, type_, parent_names) for f in filters)

    return combined


def chain_include_object(*mine: IncludeObject) -> IncludeObject:
    """hookledger's :func:`include_object`, then each of yours (all must agree)."""
    filters: Sequence[IncludeObject] = (include_object, *mine)

    def combined(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        return all(f(obj, name, type_, reflected, compare_to) for f in filters)

    return combined


__all__ = [
    "TABLE_PREFIX",
    "chain_include_name",
    "chain_include_object",
    "include_name",
    "include_object",
    "is_hookledger_table",
]
