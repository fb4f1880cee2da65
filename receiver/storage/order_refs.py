"""The order index's rows: built with an event's inbox row, written with it, deleted with
its payload.

An event's references (:meth:`receiver.core.order_refs.OrderFields.references`) are read
from the event already parsed for storage (no second parse), digested with the primary data
key (:meth:`receiver.core.keyring.Keyring.reference_digest`) and carried in the inbox row's
values under :data:`PATHS` and :data:`DIGESTS` (columns no table has: SQLAlchemy and the
driver ignore them). Every path that inserts an inbox row writes them in the same
transaction, with the new row's id: the webhook's one statement on PostgreSQL (a
data-modifying ``WITH``), the SQLite transaction, the reconciler's batches. A delivery that
is not inserted (a duplicate, a conflict) writes none: the stored event already has its own.

What is stored is a digest, never the reference: with a data key an HMAC under a key derived
for the order index alone, so a database copy can neither read an order id nor confirm a
guessed one; without one a plain SHA-256, as ``body_sha256`` is (the body it comes from is
in the clear then).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, delete, select

from receiver.core.keyring import Keyring
from receiver.core.order_refs import OrderFields, normalise
from receiver.storage.sql.base import Statements
from receiver.storage.sql.tables import DIGESTS, EVENT, ORDER_REF, PATHS

#: The order index's columns, in the order the statements write them.
COLUMNS = ("event_pk", "path", "account", "digest", "key_id")


def add_references(
    values: dict[str, Any], body: Mapping[str, Any], fields: OrderFields, keyring: Keyring
) -> dict[str, Any]:
    """``values`` (an inbox row, sealed: its ``key_id`` set) with the references of the event
    ``body`` (its parsed JSON), digested under the row's key."""
    found = fields.references(body)
    if not found:
        values[PATHS] = values[DIGESTS] = ()
        return values
    key_id = values["key_id"]
    values[PATHS] = [path for path, _ in found]
    values[DIGESTS] = [keyring.reference_digest(value, key_id) for _, value in found]
    return values


def rows_of(values: Mapping[str, Any], pk: int) -> list[dict[str, Any]]:
    """The order index rows of the inbox row ``values``, stored as ``pk``."""
    return [
        {
            "event_pk": pk,
            "path": path,
            "account": values["account"],
            "digest": digest,
            "key_id": values.get("key_id"),
        }
        for path, digest in zip(values.get(PATHS) or (), values.get(DIGESTS) or (), strict=True)
    ]


def write(conn: Connection, sql: Statements, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert order index rows on ``conn`` (in the caller's transaction); a row already there
    (the same event and field) is kept."""
    if rows:
        conn.execute(sql.insert(ORDER_REF).on_conflict_do_nothing(), list(rows))


def write_for(
    conn: Connection, sql: Statements, stored: Iterable[tuple[Mapping[str, Any], int]]
) -> None:
    """The order index rows of inbox rows just inserted (``(values, pk)`` pairs)."""
    write(conn, sql, [row for values, pk in stored for row in rows_of(values, pk)])


def matching_events(keyring: Keyring, reference: str, accounts: Sequence[str] = ()) -> Any:
    """The ids of the inbox rows indexed under ``reference`` (as the shop wrote it, see
    :func:`receiver.core.order_refs.normalise`), as a subquery: its digest under each
    configured data key and the plain one, looked up in the (digest, account) index."""
    value = normalise(reference) or ""
    digests = sorted(set(keyring.reference_digests(value).values()))
    where = [ORDER_REF.c.digest.in_(digests)]
    if accounts:
        where.append(ORDER_REF.c.account.in_(list(accounts)))
    return select(ORDER_REF.c.event_pk).where(*where)


def delete_of(conn: Connection, sql: Statements, event_pks: Sequence[int]) -> None:
    """Delete the order index rows of ``event_pks``."""
    if event_pks:
        conn.execute(delete(ORDER_REF).where(sql.among(ORDER_REF.c.event_pk, list(event_pks))))


def delete_orphans(conn: Connection, sql: Statements, event_pks: Sequence[int]) -> None:
    """Delete the order index rows of those of ``event_pks`` that are no longer stored (after
    a delete of events that may have left some: a row whose status changed meanwhile)."""
    if not event_pks:
        return
    kept = select(EVENT.c.id).where(sql.among(EVENT.c.id, list(event_pks)))
    conn.execute(
        delete(ORDER_REF).where(
            sql.among(ORDER_REF.c.event_pk, list(event_pks)), ORDER_REF.c.event_pk.not_in(kept)
        )
    )


def delete_redacted(conn: Connection, sql: Statements, event_pks: Sequence[int]) -> None:
    """Delete the order index rows of those of ``event_pks`` that are redacted (their payload,
    the references with it, is gone)."""
    if not event_pks:
        return
    redacted = select(EVENT.c.id).where(
        sql.among(EVENT.c.id, list(event_pks)), EVENT.c.redacted_at.is_not(None)
    )
    conn.execute(delete(ORDER_REF).where(ORDER_REF.c.event_pk.in_(redacted)))


__all__ = [
    "COLUMNS",
    "DIGESTS",
    "PATHS",
    "add_references",
    "delete_of",
    "delete_orphans",
    "delete_redacted",
    "matching_events",
    "rows_of",
    "write",
    "write_for",
]
