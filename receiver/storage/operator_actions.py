"""Operator queries: list, requeue, replay and prune events; counts; the account's cut-over.

These serve the ``hookledger`` commands, the reconciler and tests; none of them is on the
receive or dispatch path (except :func:`read_cutover`, which every dispatched batch reads).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, case, column, delete, func, select, table, update
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

import receiver.core.guard as guard
from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.core.clock import as_utc
from receiver.core.errors import DataUnavailable, RedactedEvents
from receiver.core.events import Event
from receiver.storage.context import Storage, is_unavailable, unavailable
from receiver.storage.database import VERSION_TABLE
from receiver.storage.inbox import Inbox
from receiver.storage.intake import figures_of
from receiver.storage.sealed_columns import open_body, open_error, open_headers
from receiver.storage.sql.tables import CONFLICT, CUTOVER, EVENT, HANDLER_RUN, ORDER_REF
from receiver.storage.tables import (
    CUTOVER_NAME,
    DEFERRED_PREFIX,
    DEPLOYED_NAME,
    FIRST_DELIVERY_NAME,
    EventStatus,
    HandlerRun,
    InboxEvent,
    Projection,
    Source,
)

log = logging.getLogger("receiver.store")

#: hookledger's Alembic version table: one row, the schema's revision.
_VERSION = table(VERSION_TABLE, column("version_num"))


@dataclass(frozen=True, kw_only=True, slots=True)
class EventFilter:
    """Selects stored events for the operator commands (requeue, replay, list)."""

    pks: Sequence[int] = ()
    event_ids: Sequence[str] = ()
    event_types: Sequence[str] = ()
    statuses: Sequence[str] = ()
    since: datetime | None = None
    until: datetime | None = None
    limit: int | None = None
    #: Only events a handler deferred (waiting, with the reason in ``last_error``).
    deferred: bool = False
    #: Only events of these accounts (all accounts when empty).
    accounts: Sequence[str] = ()


def read_cutover(conn: Connection, account: str = DEFAULT_ACCOUNT) -> guard.CutOver | None:
    """The account's cut-over, if it was adopted, with the first delivery hookledger
    stored or was attempted with."""
    return read_cutovers(conn, [account]).get(account)


def read_cutovers(conn: Connection, accounts: Collection[str]) -> dict[str, guard.CutOver]:
    """The cut-overs of those of ``accounts`` that were adopted (read with every batch: up
    to three tiny rows per account of the batch)."""
    rows: dict[tuple[str, str], Any] = {
        (row.account, row.name): row
        for row in conn.execute(
            select(
                CUTOVER.c.account, CUTOVER.c.name, CUTOVER.c.cutover_at, CUTOVER.c.recorded_at
            ).where(
                CUTOVER.c.account.in_(sorted(set(accounts))),
                CUTOVER.c.name.in_([CUTOVER_NAME, FIRST_DELIVERY_NAME, DEPLOYED_NAME]),
            )
        )
    }
    found: dict[str, guard.CutOver] = {}
    for account in set(accounts):
        row = rows.get((account, CUTOVER_NAME))
        if row is None or row.cutover_at is None:
            continue
        first = rows.get((account, FIRST_DELIVERY_NAME))
        deployed = rows.get((account, DEPLOYED_NAME))
        found[account] = guard.CutOver(
            at=as_utc(row.cutover_at),
            recorded_at=as_utc(row.recorded_at),
            first_delivery=as_utc(first.cutover_at)
            if first is not None and first.cutover_at is not None
            else None,
            deployed_at=as_utc(deployed.cutover_at)
            if deployed is not None and deployed.cutover_at is not None
            else None,
        )
    return found


class Operations:
    """The operator's reads and repairs on one :class:`Storage`; replays go through ``inbox``."""

    def __init__(self, storage: Storage, *, inbox: Inbox) -> None:
        self.storage = storage
        self._inbox = inbox
        self._sql = storage.sql
        self._first_attempt: dict[str, datetime] = {}
        self._first_written: set[str] = set()

    def __repr__(self) -> str:
        return f"Operations(dialect={self._sql.name!r})"

    # -- events ---------------------------------------------------------------------------

    def select_events(self, flt: EventFilter) -> list[InboxEvent]:
        """The chosen events, detached, their ``last_error`` opened for reading (``body`` and
        ``headers`` stay as stored: :meth:`receiver.store.Store.open_body`)."""
        query = select(InboxEvent).order_by(InboxEvent.id)  # type: ignore[arg-type]
        query = query.where(*_filter_clauses(flt))
        if flt.limit:
            query = query.limit(flt.limit)
        with Session(self.storage.deferred) as session:
            rows = list(session.scalars(query))
            session.expunge_all()
        return [self._readable(e) for e in rows]

    def get(self, event_id: str, *, account: str | None = None) -> InboxEvent | None:
        """The stored event ``event_id`` (of ``account``; an event id is unique per account
        only: without one, the first stored of that id)."""
        query = select(InboxEvent).where(InboxEvent.event_id == event_id)  # type: ignore[arg-type]
        if account is not None:
            query = query.where(InboxEvent.account == account)  # type: ignore[arg-type]
        with Session(self.storage.deferred) as session:
            found = session.scalars(query.order_by(InboxEvent.id)).first()  # type: ignore[arg-type]
            session.expunge_all()
        return None if found is None else self._readable(found)

    def handler_runs(self, event_pk: int) -> dict[str, HandlerRun]:
        with Session(self.storage.deferred) as session:
            rows = session.scalars(
                select(HandlerRun).where(HandlerRun.event_pk == event_pk)  # type: ignore[arg-type]
            )
            runs = {r.handler: r for r in rows}
            session.expunge_all()
        for run in runs.values():
            run.last_error = open_error(self.storage.keyring, run.last_error)
        return runs

    def _readable(self, row: InboxEvent) -> InboxEvent:
        """``row`` (detached) with its error text opened for reading (never raises)."""
        row.last_error = open_error(self.storage.keyring, row.last_error)
        return row

    def requeue(self, flt: EventFilter, *, dry_run: bool = False) -> list[InboxEvent]:
        """Put dead (or, when asked, pending) events back in the queue with fresh attempts.

        Handlers that already succeeded for an event are not run again (the ledger is kept).
        """
        requeueable = (EventStatus.DEAD, EventStatus.PENDING)
        wanted = tuple(flt.statuses) or (EventStatus.DEAD,)
        if not set(wanted) <= set(requeueable):
            raise ValueError("only dead or pending events can be requeued")
        # Every other field of the filter holds (the accounts too: never another's events).
        chosen = self.select_events(replace(flt, statuses=wanted))
        refuse_redacted(chosen, "requeued")
        if dry_run or not chosen:
            return chosen
        now = self.storage.now()
        with self.storage.engine.begin() as conn:
            conn.execute(
                update(EVENT)
                .where(
                    EVENT.c.id.in_([e.id for e in chosen]),
                    EVENT.c.status.in_(wanted),
                    EVENT.c.redacted_at.is_(None),
                )
                .values(
                    status=EventStatus.PENDING,
                    attempts=0,
                    next_attempt_at=now,
                    lease_owner=None,
                    lease_expires_at=None,
                )
            )
        return chosen

    def replay(
        self, flt: EventFilter, *, dry_run: bool = False, parse: Callable[[bytes], Event]
    ) -> list[tuple[InboxEvent, str]]:
        """Store a copy of each chosen event with source ``replay``: every handler runs again
        for it, bypassing the staleness guard and the transition-once rule (the operator asked).
        Returns (original, new event id) pairs."""
        chosen = self.select_events(flt)
        refuse_redacted(chosen, "replayed")
        # Every body is opened before anything is stored: a row sealed with a key that is
        # not configured stops the replay, naming that row, with nothing half done.
        opened = [self._opened(original) for original in chosen]
        out: list[tuple[InboxEvent, str]] = []
        for original, (body, headers) in zip(chosen, opened, strict=True):
            assert original.id is not None
            with self.storage.deferred.connect() as conn:
                n = conn.execute(
                    select(func.count()).select_from(EVENT).where(EVENT.c.replay_of == original.id)
                ).scalar_one()
            new_id = f"{original.event_id}~replay{int(n) + 1}"
            out.append((original, new_id))
            if dry_run:
                continue
            copy = replace(parse(body), event_id=new_id)
            self._inbox.insert(
                copy,
                body,
                headers=headers.items(),
                secret_id=original.secret_id,
                source=Source.REPLAY,
                replay_of=original.id,
                account=original.account,
            )
        return out

    def _opened(self, row: InboxEvent) -> tuple[bytes, dict[str, str]]:
        """The plaintext body and headers of ``row``; raises naming the row."""
        try:
            return (
                open_body(self.storage.keyring, row.body, row.event_id),
                open_headers(self.storage.keyring, row.headers, row.event_id),
            )
        except DataUnavailable as exc:
            raise DataUnavailable(f"event #{row.id}: its body {exc.message}") from exc

    def prune(
        self, older_than: timedelta, *, include_dead: bool = False, dry_run: bool = False
    ) -> dict[str, int]:
        """Delete finished events (done, stale, duplicate; dead only when asked) received
        before ``now - older_than``, with their ledger rows, and old conflict records.

        Open events are never pruned. The projection and the transition table are kept, so
        the staleness guard and the transition-once rule still hold for pruned history.
        """
        cutoff = self.storage.now() - older_than
        finished = [EventStatus.DONE, EventStatus.STALE, EventStatus.DUPLICATE]
        if include_dead:
            finished.append(EventStatus.DEAD)
        old = and_(EVENT.c.status.in_(finished), EVENT.c.received_at < cutoff)
        with self.storage.engine.begin() as conn:
            events = int(
                conn.execute(select(func.count()).select_from(EVENT).where(old)).scalar_one()
            )
            conflicts = int(
                conn.execute(
                    select(func.count())
                    .select_from(CONFLICT)
                    .where(CONFLICT.c.received_at < cutoff)
                ).scalar_one()
            )
            if not dry_run:
                conn.execute(
                    delete(HANDLER_RUN).where(
                        HANDLER_RUN.c.event_pk.in_(select(EVENT.c.id).where(old))
                    )
                )
                conn.execute(
                    delete(ORDER_REF).where(ORDER_REF.c.event_pk.in_(select(EVENT.c.id).where(old)))
                )
                conn.execute(delete(EVENT).where(old))
                conn.execute(delete(CONFLICT).where(CONFLICT.c.received_at < cutoff))
        return {"events": events, "conflicts": conflicts}

    # -- counts ---------------------------------------------------------------------------

    def stats(self) -> tuple[dict[str, int], float | None]:
        """Counts by status and the age of the oldest open event, for operators (``hookledger
        stats``). It reads the whole inbox: never serve it on an unauthenticated route. Read
        in a read-only transaction (on SQLite a deferred BEGIN: never the write lock)."""
        with self.storage.deferred.connect() as conn:
            counts = _status_counts(conn)
            oldest = conn.execute(
                select(func.min(EVENT.c.received_at)).where(EVENT.c.status.in_(EventStatus.OPEN))
            ).scalar()
        # SQLite: webhooks still in the intake are pending events too.
        for found in figures_of(self.storage.engine).values():
            counts[EventStatus.PENDING] = counts.get(EventStatus.PENDING, 0) + found.count
            if oldest is None or found.oldest < as_utc(oldest):
                oldest = found.oldest
        age = None if oldest is None else (self.storage.now() - as_utc(oldest)).total_seconds()
        return counts, age

    def health(self) -> tuple[dict[str, int], float | None]:
        """The same as :meth:`stats` (its former name)."""
        return self.stats()

    def schema_revision(self) -> str | None:
        """The database's hookledger schema revision: the readiness probe. One read of a
        one-row table, whatever the size of the inbox, in a read-only transaction (on SQLite
        a deferred BEGIN: it never takes or waits for the write lock, so it neither blocks
        nor is blocked by the receipt of webhooks). Raises when the database is unreachable
        or has no hookledger schema."""
        with self.storage.deferred.connect() as conn:
            revision = conn.execute(select(_VERSION.c.version_num)).scalar()
        return None if revision is None else str(revision)

    def counts(self) -> dict[str, int]:
        with self.storage.deferred.connect() as conn:
            return _status_counts(conn)

    def dead_count(self, *, account: str | None = None) -> int:
        """The dead letters (of ``account`` only, when given): read through the status
        index, so its cost is the number of dead letters, not the size of the inbox."""
        query = select(func.count()).select_from(EVENT).where(EVENT.c.status == EventStatus.DEAD)
        if account is not None:
            query = query.where(EVENT.c.account == account)
        with self.storage.deferred.connect() as conn:
            return int(conn.execute(query).scalar_one())

    # -- objects and the cut-over ---------------------------------------------------------

    def projection(
        self, kind: str, object_id: str, *, account: str = DEFAULT_ACCOUNT
    ) -> Projection | None:
        with Session(self.storage.deferred) as session:
            return session.get(Projection, (account, kind, object_id))

    def cutover(self, *, account: str = DEFAULT_ACCOUNT) -> guard.CutOver | None:
        """The account's cut-over (see :class:`receiver.storage.tables.CutOver`), if one is set."""
        with self.storage.deferred.connect() as conn:
            return read_cutover(conn, account)

    def note_delivery(self, at: datetime, *, account: str = DEFAULT_ACCOUNT) -> None:
        """A signed webhook delivery reached this process at ``at`` (before it is stored).

        The first one bounds the deploy that pointed the processor at hookledger (see
        :attr:`receiver.core.guard.CutOver.history_ends`): it is written once per process,
        before the delivery itself, so no worker judges a delivery without it. If the
        database does not answer, this raises :class:`StorageUnavailable` at once (the
        delivery gets its 503 after one connection timeout, not two) and the earliest attempt
        is kept in memory and written with the next delivery. Costs nothing after the first
        write (per account)."""
        if account in self._first_written:
            return
        at = as_utc(at)
        attempt = self._first_attempt.get(account)
        if attempt is None or at < attempt:
            self._first_attempt[account] = attempt = at
        try:
            if self._inbox.intake is not None:
                # Kept in the intake if the database's lock is held for long (moved into the
                # database before any delivery it bounds).
                self._inbox.note_first_delivery(attempt, account=account)
            else:
                self.record_first_delivery(attempt, account=account)
        except DBAPIError as exc:
            if is_unavailable(exc):
                # The delivery's insert would wait out the same timeout: answer 503 now
                # (the processor retries; the attempt is kept for the next delivery).
                raise unavailable(exc) from exc
            log.warning(
                "first delivery not recorded yet (kept for the next one): %s",
                type(exc).__name__,
                extra={"action": "first_delivery"},
            )
            return
        except SQLAlchemyError as exc:
            log.warning(
                "first delivery not recorded yet (kept for the next one): %s",
                type(exc).__name__,
                extra={"action": "first_delivery"},
            )
            return
        self._first_written.add(account)
        self._first_attempt.pop(account, None)

    def record_first_delivery(self, at: datetime, *, account: str = DEFAULT_ACCOUNT) -> None:
        """Keep ``at`` as the account's first delivery unless an earlier one is kept already."""
        at = as_utc(at)
        insert = self._sql.insert(CUTOVER).values(
            account=account,
            name=FIRST_DELIVERY_NAME,
            mode="delivery",
            cutover_at=at,
            recorded_at=self.storage.now(),
        )
        earlier = case(
            (insert.excluded.cutover_at < CUTOVER.c.cutover_at, insert.excluded.cutover_at),
            else_=CUTOVER.c.cutover_at,
        )
        # Write-first: on SQLite a deferred BEGIN (the lock from this statement to commit).
        with self.storage.deferred.begin() as conn:
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=["account", "name"], set_={"cutover_at": earlier}
                )
            )

    def first_delivery(self, *, account: str = DEFAULT_ACCOUNT) -> datetime | None:
        """The first delivery kept by :meth:`record_first_delivery`, if any."""
        with self.storage.deferred.connect() as conn:
            value = conn.execute(
                select(CUTOVER.c.cutover_at).where(
                    CUTOVER.c.account == account, CUTOVER.c.name == FIRST_DELIVERY_NAME
                )
            ).scalar()
        return as_utc(value) if value is not None else None

    def record_deployed(self, at: datetime, *, account: str = DEFAULT_ACCOUNT) -> None:
        """Keep ``at`` as the account's deploy (``reconcile adopt --deployed-at``), stated to
        adoption's first run: written once, never moved (an existing one is kept)."""
        with self.storage.engine.begin() as conn:
            conn.execute(
                self._sql.insert(CUTOVER)
                .values(
                    account=account,
                    name=DEPLOYED_NAME,
                    mode="deployed",
                    cutover_at=as_utc(at),
                    recorded_at=self.storage.now(),
                )
                .on_conflict_do_nothing(index_elements=["account", "name"])
            )

    def first_stored_webhook(self, *, account: str = DEFAULT_ACCOUNT) -> datetime | None:
        """When the account's first webhook still in the inbox was received (one scan, for
        adoption)."""
        with self.storage.deferred.connect() as conn:
            value = conn.execute(
                select(func.min(EVENT.c.received_at)).where(
                    EVENT.c.account == account, EVENT.c.source == Source.WEBHOOK
                )
            ).scalar()
        return as_utc(value) if value is not None else None

    def cutover_mode(self, *, account: str = DEFAULT_ACCOUNT) -> str | None:
        """``adopted``, ``new_account``, or ``None`` when neither was recorded."""
        with self.storage.deferred.connect() as conn:
            return conn.execute(
                select(CUTOVER.c.mode).where(
                    CUTOVER.c.account == account, CUTOVER.c.name == CUTOVER_NAME
                )
            ).scalar()

    def set_cutover(
        self, mode: str, at: datetime | None, *, account: str = DEFAULT_ACCOUNT
    ) -> None:
        """Record the account's cut-over (``adopted`` at ``at``, or a ``new_account``)."""
        if mode not in ("adopted", "new_account"):
            raise ValueError("mode must be 'adopted' or 'new_account'")
        if (mode == "adopted") != (at is not None):
            raise ValueError("an adopted account has a cut-over time; a new account has none")
        values = {
            "mode": mode,
            "cutover_at": as_utc(at) if at is not None else None,
            "recorded_at": self.storage.now(),
        }
        with self.storage.engine.begin() as conn:
            conn.execute(
                self._sql.insert(CUTOVER)
                .values(account=account, name=CUTOVER_NAME, **values)
                .on_conflict_do_update(index_elements=["account", "name"], set_=values)
            )


def refuse_redacted(chosen: Sequence[InboxEvent], verb: str) -> None:
    """Raise :class:`RedactedEvents` if any of ``chosen`` was redacted: its body is gone, so
    it must never be dispatched again (the operator narrows the filter)."""
    redacted = [e for e in chosen if e.redacted_at is not None]
    if not redacted:
        return
    shown = ", ".join(f"#{e.id}" for e in redacted[:10]) + (" ..." if len(redacted) > 10 else "")
    raise RedactedEvents(
        f"{len(redacted)} of the chosen events were redacted ({shown}): their bodies are "
        f"gone, so they cannot be {verb}; narrow the filter (--since, --id, ...)"
    )


def _status_counts(conn: Connection) -> dict[str, int]:
    rows = conn.execute(select(EVENT.c.status, func.count()).group_by(EVENT.c.status)).all()
    return {row[0]: int(row[1]) for row in rows}


def _filter_clauses(flt: EventFilter) -> list[Any]:
    clauses: list[Any] = []
    if flt.pks:
        clauses.append(EVENT.c.id.in_(list(flt.pks)))
    if flt.event_ids:
        clauses.append(EVENT.c.event_id.in_(list(flt.event_ids)))
    if flt.accounts:
        clauses.append(EVENT.c.account.in_(list(flt.accounts)))
    if flt.event_types:
        clauses.append(EVENT.c.event_type.in_(list(flt.event_types)))
    if flt.statuses:
        clauses.append(EVENT.c.status.in_(list(flt.statuses)))
    if flt.since is not None:
        clauses.append(EVENT.c.received_at >= as_utc(flt.since))
    if flt.until is not None:
        clauses.append(EVENT.c.received_at <= as_utc(flt.until))
    if flt.deferred:
        clauses.append(EVENT.c.status == EventStatus.PENDING)
        clauses.append(EVENT.c.last_error.like(f"{DEFERRED_PREFIX}%"))
    return clauses
