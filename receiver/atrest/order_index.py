"""The order index from stored bodies: ``hookledger order-index backfill`` and what
``rotate-keys`` does to it.

Receipt indexes each new event (:mod:`receiver.storage.order_refs`); the events stored
before the index existed (migration ``0009``), or before ``HOOKLEDGER_ORDER_FIELDS``
named a field, are indexed here, from their bodies: each is opened, parsed, its references
read with the configured fields and digested with the primary data key, and its index rows
replaced by those, in the transaction that read it. The same step re-keys the index for
``rotate-keys`` (a digest cannot be keyed again without its reference, so the reference is
read again from the body).

The backfill runs while everything runs: rows in id order, a short transaction per batch
(on SQLite it leaves the write lock free between batches, as retention does). It is
resumable: it keeps, per scope (every account, or the accounts it was limited to), the last
row it indexed and the fields it indexed them with (``hookledger_order_backfill``), so
running it again goes on from there, and from the start when the fields changed. Redacted
events have no body left: they have no index rows. A body whose data key is not configured
is reported (by row and key) and skipped, and the progress kept stops before it: the
backfill is not finished, and a later run with that key configured goes on from there.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, func, select

import receiver.storage.order_refs as order_refs
from receiver.core.errors import DataUnavailable, HookledgerError
from receiver.core.events import parse_event
from receiver.storage.context import Storage
from receiver.storage.sealed_columns import REDACTED_BODY, open_body
from receiver.storage.sql.tables import EVENT, ORDER_BACKFILL, ORDER_REF

_SAMPLES = 10

#: The columns of an inbox row the index is read from.
SOURCE_COLUMNS = (EVENT.c.id, EVENT.c.account, EVENT.c.event_id, EVENT.c.body)


def scope_of(accounts: Collection[str]) -> str:
    """The backfill's progress key: ``*`` for every account, else the accounts, sorted."""
    return ",".join(sorted(set(accounts))) or "*"


@dataclass(kw_only=True)
class Reindexed:
    """What re-reading some events' references did."""

    events: int = 0
    rows: int = 0
    unreadable: Counter[str] = field(default_factory=Counter)
    unreadable_sample: list[str] = field(default_factory=list)
    #: The first event whose body could not be opened (``None``: none).
    first_unreadable: int | None = None


def reindex(storage: Storage, conn: Connection, events: Iterable[Any], result: Reindexed) -> None:
    """Replace the order index rows of ``events`` (rows of :data:`SOURCE_COLUMNS`) by their
    references read again from their bodies, digested with the primary data key, on ``conn``
    (in the caller's transaction). A redacted event keeps no row; one whose body cannot be
    opened keeps what it has and is counted in ``result``."""
    keyring, fields, sql = storage.keyring, storage.order_fields, storage.sql
    replaced: list[int] = []
    rows: list[dict[str, Any]] = []
    for event in events:
        pk = int(event.id)
        if bytes(event.body) == REDACTED_BODY:
            replaced.append(pk)
            continue
        try:
            body = open_body(keyring, bytes(event.body), event.event_id)
        except DataUnavailable as exc:
            key_id = str(getattr(exc, "key_id", "?"))
            result.unreadable[key_id] += 1
            if result.first_unreadable is None or pk < result.first_unreadable:
                result.first_unreadable = pk
            if len(result.unreadable_sample) < _SAMPLES:
                result.unreadable_sample.append(f"hookledger_event #{pk}: {exc.message}")
            continue
        try:
            raw = parse_event(body).raw
        except HookledgerError:  # stored, so parsed once: a body no parse accepts has none
            raw = {}
        values = order_refs.add_references(
            {"account": event.account, "key_id": keyring.primary}, raw, fields, keyring
        )
        replaced.append(pk)
        rows.extend(order_refs.rows_of(values, pk))
        result.events += 1
    order_refs.delete_of(conn, sql, replaced)
    order_refs.write(conn, sql, rows)
    result.rows += len(rows)


@dataclass(kw_only=True)
class BackfillReport:
    """What a backfill did (or, dry, has left to do)."""

    fields: str
    accounts: list[str] | None = None
    dry_run: bool = False
    #: Events read and indexed this run (dry: events left to read).
    events: int = 0
    #: Index rows written this run.
    rows: int = 0
    #: The last inbox row indexed (where a later run goes on).
    after_pk: int = 0
    #: Events left after it (not redacted).
    remaining: int = 0
    #: It started from the first row again, because the fields changed since the last run.
    restarted: bool = False
    unreadable: Counter[str] = field(default_factory=Counter)
    unreadable_sample: list[str] = field(default_factory=list)
    stopped: bool = False
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.stopped and not self.remaining and not self.unreadable

    def as_dict(self) -> dict[str, Any]:
        return {
            "fields": self.fields,
            "accounts": self.accounts,
            "dry_run": self.dry_run,
            "complete": self.complete,
            "events": self.events,
            "rows": self.rows,
            "after_pk": self.after_pk,
            "remaining": self.remaining,
            "restarted": self.restarted,
            "unreadable": dict(self.unreadable),
            "unreadable_sample": list(self.unreadable_sample),
            "stopped": self.stopped,
            "seconds": round(self.seconds, 3),
        }

    def render(self) -> str:
        scope = f" in account(s) {', '.join(self.accounts)}" if self.accounts else ""
        if self.dry_run:
            head = f"order-index backfill{scope} (fields {self.fields}): would index {self.events}"
            head += f" event(s) after #{self.after_pk}"
            return head + (" (the fields changed: from the first row)" if self.restarted else "")
        lines = [
            f"order-index backfill{scope} (fields {self.fields}): indexed {self.events} "
            f"event(s), {self.rows} reference(s), through #{self.after_pk} "
            f"in {self.seconds:.2f} s"
        ]
        if self.restarted:
            lines.append("the fields changed since the last run: started from the first row")
        if self.unreadable:
            lines.append(
                "cannot be opened: "
                + ", ".join(f"{n} under {k!r}" for k, n in sorted(self.unreadable.items()))
            )
            lines.extend(f"  {line}" for line in self.unreadable_sample)
            lines.append(
                f"configure those keys (HOOKLEDGER_DATA_KEYS) and run it again: it goes on "
                f"after #{self.after_pk}"
            )
        if self.stopped:
            lines.append(f"stopped before the end ({self.remaining} left): run it again to go on")
        elif self.complete:
            lines.append("complete: every stored event with a body is indexed")
        return "\n".join(lines)


class OrderIndex:
    """The order index's backfill and status on one :class:`Storage`."""

    def __init__(self, storage: Storage, *, batch_size: int = 500) -> None:
        self.storage = storage
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"OrderIndex(dialect={self.storage.sql.name!r})"

    def _events(self, accounts: Collection[str]) -> list[Any]:
        where = [EVENT.c.redacted_at.is_(None)]
        if accounts:
            where.append(EVENT.c.account.in_(sorted(set(accounts))))
        return where

    def progress(self, accounts: Collection[str] = ()) -> Any:
        """The stored progress row of this scope (``None``: never run)."""
        with self.storage.deferred.connect() as conn:
            return conn.execute(
                select(ORDER_BACKFILL).where(ORDER_BACKFILL.c.scope == scope_of(accounts))
            ).first()

    def status(self, *, accounts: Collection[str] = ()) -> dict[str, Any]:
        """The fields, the backfill's progress, the events it has left, and the index rows by
        data key (``null``: plain SHA-256), of ``accounts`` only when given."""
        fields = self.storage.order_fields.describe()
        progress = self.progress(accounts)
        current = progress is not None and progress.fields == fields
        after = int(progress.after_pk) if current else 0
        of_accounts = [ORDER_REF.c.account.in_(sorted(set(accounts)))] if accounts else []
        with self.storage.deferred.connect() as conn:
            left = int(
                conn.execute(
                    select(func.count())
                    .select_from(EVENT)
                    .where(EVENT.c.id > after, *self._events(accounts))
                ).scalar_one()
            )
            by_key = {
                str(k) if k is not None else "null": int(n)
                for k, n in conn.execute(
                    select(ORDER_REF.c.key_id, func.count())
                    .where(*of_accounts)
                    .group_by(ORDER_REF.c.key_id)
                )
            }
        return {
            "fields": fields,
            "accounts": sorted(set(accounts)) or None,
            "backfill": None
            if progress is None
            else {
                "fields": progress.fields,
                "after_pk": int(progress.after_pk),
                "started_at": progress.started_at,
                "updated_at": progress.updated_at,
                "finished_at": progress.finished_at,
            },
            "fields_changed": progress is not None and not current,
            "events_left": left,
            "rows_by_key": by_key,
        }

    def backfill(
        self,
        *,
        accounts: Collection[str] = (),
        dry_run: bool = False,
        stop: threading.Event | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> BackfillReport:
        """Index the stored events (of ``accounts`` only, when given) from where the last run
        of this scope stopped; see the module docstring."""
        started = time.monotonic()
        storage = self.storage
        fields = storage.order_fields.describe()
        scope = scope_of(accounts)
        report = BackfillReport(
            fields=fields, accounts=sorted(set(accounts)) or None, dry_run=dry_run
        )
        stored = self.progress(accounts)
        after = 0
        if stored is not None:
            if stored.fields == fields:
                after = int(stored.after_pk)
            else:
                report.restarted = True
        report.after_pk = after
        where = self._events(accounts)
        if dry_run:
            report.events = report.remaining = self._left(after, where)
            report.seconds = time.monotonic() - started
            return report
        result = Reindexed()

        def kept(last: int) -> int:
            # The progress kept: never past an event it could not open, so that the next
            # run (its data key configured again) goes on from there.
            if result.first_unreadable is None:
                return last
            return min(last, result.first_unreadable - 1)

        now = storage.now()
        with storage.engine.begin() as conn:
            self._save(conn, scope, fields, after, now, started=True)
        while True:
            if stop is not None and stop.is_set():
                report.stopped = True
                break
            began = time.monotonic()
            with storage.engine.begin() as conn:
                # Locked (FOR SHARE; SQLite: its one writer) until the batch's index rows
                # are written: a redaction of one of them waits, then deletes its rows. Read
                # unlocked, a redaction committed meanwhile would leave rows of a payload
                # that is gone (it deletes only those it sees).
                rows = conn.execute(
                    select(*SOURCE_COLUMNS)
                    .where(EVENT.c.id > after, *where)
                    .order_by(EVENT.c.id)
                    .limit(self.batch_size)
                    .with_for_update(read=True)
                ).all()
                if rows:
                    before = result.events
                    reindex(storage, conn, rows, result)
                    after = int(rows[-1].id)
                    self._save(conn, scope, fields, kept(after), storage.now())
                else:
                    # Not finished while an event it could not open waits for its key.
                    finished = result.first_unreadable is None
                    self._save(conn, scope, fields, kept(after), storage.now(), finished=finished)
            if not rows:
                break
            if progress is not None:
                progress(result.events - before)
            if storage.single_writer:
                held = time.monotonic() - began
                time.sleep(0.11 if held >= 0.05 else max(0.002, held))
        report.events, report.rows, report.after_pk = result.events, result.rows, kept(after)
        report.unreadable, report.unreadable_sample = result.unreadable, result.unreadable_sample
        report.remaining = self._left(after, where) if report.stopped else 0
        report.seconds = time.monotonic() - started
        return report

    def _left(self, after: int, where: list[Any]) -> int:
        with self.storage.deferred.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(EVENT).where(and_(EVENT.c.id > after, *where))
                ).scalar_one()
            )

    def _save(
        self,
        conn: Connection,
        scope: str,
        fields: str,
        after: int,
        now: Any,
        *,
        started: bool = False,
        finished: bool = False,
    ) -> None:
        sql = self.storage.sql
        values: dict[str, Any] = {"fields": fields, "after_pk": after, "updated_at": now}
        if started:
            values["started_at"] = now
            values["finished_at"] = None
        if finished:
            values["finished_at"] = now
        insert = sql.insert(ORDER_BACKFILL).values(
            scope=scope, started_at=now, **{k: v for k, v in values.items() if k != "started_at"}
        )
        conn.execute(insert.on_conflict_do_update(index_elements=["scope"], set_=values))


__all__ = ["BackfillReport", "OrderIndex", "Reindexed", "reindex", "scope_of"]
