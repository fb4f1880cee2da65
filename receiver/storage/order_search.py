"""What an order search cannot see, said next to its results (read-only).

The search itself is a filter of the event listing (:attr:`receiver.storage.operator_reads.
EventQuery.order`, through :func:`receiver.storage.order_refs.matching_events`). A search that
finds nothing must not read as "no such order" when the index could not have found it:

- index rows keyed with a data key this process does not have (a command run without
  ``HOOKLEDGER_DATA_KEYS``, or a key dropped before ``rotate-keys`` finished): their digests
  cannot be computed here;
- events stored before the index existed (migration ``0009``) that ``hookledger order-index
  backfill`` has not reached yet (a backfill that started and has not reached the end of the
  inbox), or indexed with other fields than those configured;
- no field configured at all (``HOOKLEDGER_ORDER_FIELDS=none``).

Redacted events have no index rows (their payload, the reference with it, is gone): a search
never finds an order whose events are all older than the ``redact`` retention age.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, and_, exists, func, select

from receiver.core.clock import as_utc
from receiver.core.keyring import Keyring
from receiver.core.order_refs import OrderFields
from receiver.storage.database import deferred_begin
from receiver.storage.sql.tables import EVENT, ORDER_BACKFILL, ORDER_REF

#: The progress row of a backfill over every account (``receiver.atrest.order_index``).
EVERY_ACCOUNT = "*"


def search_notes(
    engine: Engine, keyring: Keyring, fields: OrderFields, accounts: Sequence[str] = ()
) -> list[str]:
    """What a search in ``accounts`` (every account when empty) may miss, one sentence each
    (none: the index covers every stored event that has a body)."""
    notes: list[str] = []
    if not fields.enabled:
        notes.append(
            "no order reference field is configured in this process "
            "(HOOKLEDGER_ORDER_FIELDS=none): new events are not indexed"
        )
    of_accounts = [ORDER_REF.c.account.in_(list(accounts))] if accounts else []
    other_keys: Any = ORDER_REF.c.key_id.is_not(None)
    if keyring.ids:
        other_keys = and_(other_keys, ORDER_REF.c.key_id.not_in(list(keyring.ids)))
    with deferred_begin(engine).connect() as conn:
        missing = sorted(
            str(k)
            for (k,) in conn.execute(
                select(ORDER_REF.c.key_id).where(other_keys, *of_accounts).distinct()
            )
        )
        first = conn.execute(select(func.min(ORDER_REF.c.event_pk))).scalar()
        backfills = conn.execute(select(ORDER_BACKFILL)).all()
        progress = next((b for b in backfills if b.scope == EVERY_ACCOUNT), None)
        done = 0
        if progress is not None and progress.fields == fields.describe():
            done = int(progress.after_pk)
        before = [EVENT.c.id > done, EVENT.c.redacted_at.is_(None)]
        if first is not None:
            before.append(EVENT.c.id < int(first))
        if accounts:
            before.append(EVENT.c.account.in_(list(accounts)))
        unindexed = conn.execute(select(exists().where(*before))).scalar()
    unfinished = _unfinished(backfills, progress, fields, accounts)
    if unfinished:
        notes.append(
            "`hookledger order-index backfill` has not finished ("
            + ", ".join(unfinished)
            + "): the events it has not reached, or could not open, are not found; run it "
            "again (with every data key: its report names any it lacked)"
        )
    if missing:
        keys = ", ".join(repr(k) for k in missing)
        notes.append(
            f"index rows keyed with data key(s) {keys}, which this process does not have "
            "(HOOKLEDGER_DATA_KEYS): the orders among them cannot be found here"
        )
    if unindexed and first is None:
        notes.append(
            "no stored event is in the order index yet: if events were stored before it "
            "existed (or carry no reference in the configured fields), run `hookledger "
            "order-index backfill`"
        )
    elif unindexed and not unfinished:
        notes.append(
            "events stored before the order index began are not all indexed: run "
            "`hookledger order-index backfill`"
        )
    if progress is not None and progress.fields != fields.describe():
        notes.append(
            f"the last backfill indexed the fields {progress.fields}; this process is "
            f"configured with {fields.describe()} (HOOKLEDGER_ORDER_FIELDS)"
        )
    return notes


def _unfinished(
    backfills: Sequence[Any], progress: Any, fields: OrderFields, accounts: Sequence[str]
) -> list[str]:
    """The scopes (``every account``, or ``account(s) A,B``) of the backfills of the current
    fields that started and have not reached the end of the inbox, among those that cover
    ``accounts`` (all when empty); one a complete backfill of every account began after is
    covered by it."""
    described = fields.describe()
    covered_since = None
    if progress is not None and progress.finished_at is not None and progress.fields == described:
        covered_since = as_utc(progress.started_at)
    found: list[str] = []
    for b in backfills:
        if b.finished_at is not None or b.fields != described:
            continue
        scope = set(str(b.scope).split(","))
        if b.scope != EVERY_ACCOUNT and accounts and not scope & set(accounts):
            continue
        if covered_since is not None and covered_since >= as_utc(b.updated_at):
            continue
        found.append("every account" if b.scope == EVERY_ACCOUNT else f"account(s) {b.scope}")
    return sorted(found)


__all__ = ["search_notes"]
