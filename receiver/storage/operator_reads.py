"""Read-only queries over the inbox for operators (the CLI and the ops console): events
(listed, counted by status, one with its details) and conflicting deliveries, one page at a
time.

SQLAlchemy Core over :mod:`receiver.storage.tables`, every read on SQLite without the write lock.
The reconciler's runs, as the console and the metrics read them, are in
:mod:`receiver.storage.recon_run_reads`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, String, Table, and_, column, func, select, text

import receiver.storage.order_refs as order_refs
from receiver.core.accounts import DEFAULT_ACCOUNT, is_account_id, object_key
from receiver.core.clock import as_utc
from receiver.core.errors import BodyRedacted, DataUnavailable
from receiver.core.keyring import Keyring
from receiver.core.masking import mask_text
from receiver.storage.database import deferred_begin
from receiver.storage.sealed_columns import BODY, open_body, open_error, open_headers
from receiver.storage.tables import (
    EventConflict,
    EventStatus,
    HandlerRun,
    InboxEvent,
    Projection,
    Source,
    Transition,
)

E: Table = InboxEvent.__table__  # type: ignore[attr-defined]
C: Table = EventConflict.__table__  # type: ignore[attr-defined]
H: Table = HandlerRun.__table__  # type: ignore[attr-defined]
P: Table = Projection.__table__  # type: ignore[attr-defined]
T: Table = Transition.__table__  # type: ignore[attr-defined]

#: How a deferred event's ``last_error`` begins (see ``receiver.store``).
DEFERRED_PREFIX = "deferred: "


@dataclass(frozen=True, kw_only=True, slots=True)
class EventQuery:
    """Which events to list. Empty fields do not filter. Times are UTC; ``since``/``until``
    bound the receipt time."""

    statuses: Sequence[str] = ()
    event_types: Sequence[str] = ()
    sources: Sequence[str] = ()
    #: ``kind:id`` (``payment:pay_123``, in every account, or in ``accounts``),
    #: ``account/kind:id``, or an object id alone (see :func:`object_clause`).
    object: str | None = None
    event_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    deferred: bool = False
    limit: int = 50
    offset: int = 0
    #: Only events of these processor accounts (all when empty).
    accounts: Sequence[str] = ()
    #: Only events indexed under this order reference of the shop's (``HOOKLEDGER_ORDER_FIELDS``:
    #: an exact value, see :mod:`receiver.storage.order_refs`).
    order: str | None = None

    def validate(self) -> EventQuery:
        """Raise ``ValueError`` for an unknown status or source, or bad paging."""
        bad = [s for s in self.statuses if s not in EventStatus.ALL]
        if bad:
            raise ValueError(f"unknown status {bad[0]!r}; known: {', '.join(EventStatus.ALL)}")
        bad = [s for s in self.sources if s not in Source.ALL]
        if bad:
            raise ValueError(f"unknown source {bad[0]!r}; known: {', '.join(Source.ALL)}")
        if not 1 <= self.limit <= 1000:
            raise ValueError("limit must be between 1 and 1000")
        if self.offset < 0:
            raise ValueError("offset must not be negative")
        return self


@dataclass(frozen=True, kw_only=True, slots=True)
class EventRow:
    """An inbox row as listed (without its body)."""

    id: int
    #: The processor account the event belongs to (:mod:`receiver.core.accounts`).
    account: str
    event_id: str
    event_type: str | None
    status: str
    source: str
    object_key: str
    object_kind: str | None
    object_id: str | None
    object_status: str | None
    object_stage: str | None
    attempts: int
    received_at: datetime
    event_time: datetime | None
    next_attempt_at: datetime | None
    processed_at: datetime | None
    lease_owner: str | None
    replay_of: int | None
    last_error: str | None

    @property
    def reason(self) -> str | None:
        """The last line of ``last_error``: the guard's reason, a handler's deferral, or the
        last failure."""
        if not self.last_error:
            return None
        lines = [line for line in self.last_error.strip().splitlines() if line.strip()]
        return lines[-1] if lines else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "account": self.account,
            "event_id": self.event_id,
            "event_type": self.event_type,
            "status": self.status,
            "source": self.source,
            "object": self.object_key,
            "attempts": self.attempts,
            "received_at": _iso(self.received_at),
            "event_time": _iso(self.event_time),
            "processed_at": _iso(self.processed_at),
            "reason": self.reason,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class EventDetail:
    """One inbox row with its body, headers, ledger, and its object's transitions."""

    row: EventRow
    body: bytes = field(repr=False)
    headers: dict[str, str] = field(repr=False)
    body_sha256: str
    secret_id: str | None
    ledger: tuple[LedgerRow, ...]
    transitions: tuple[TransitionRow, ...]
    projection: ProjectionRow | None
    conflicts: int
    replays: tuple[int, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class LedgerRow:
    handler: str
    status: str
    attempts: int
    updated_at: datetime
    #: The traceback of the last failure (``failed``), or the deferral's reason.
    last_error: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class TransitionRow:
    state: str
    #: The inbox row that dispatched it (0: recorded by adoption, nothing dispatched).
    event_pk: int
    created_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectionRow:
    status: str
    stage: str | None
    event_time: datetime | None
    event_pk: int
    updated_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class ConflictRow:
    id: int
    account: str
    event_id: str
    source: str
    received_at: datetime
    body_sha256: str
    secret_id: str | None
    #: The inbox row stored first under this event id.
    event_pk: int | None
    event_type: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Page:
    """One page of rows, newest first; ``has_more``: a further page exists."""

    rows: list[Any]
    offset: int
    limit: int
    has_more: bool


#: At most this many events of one order reference are listed (an order has a few).
ORDER_MATCHES = 10_000


def _iso(value: datetime | None) -> str | None:
    return as_utc(value).isoformat() if value is not None else None


_CLEAR = Keyring()


def shown_error(keyring: Keyring, stored: Any) -> str | None:
    """A stored error text (an inbox row's or a ledger row's ``last_error``: a traceback, a
    deferral's or the guard's reason) as an operator reads it: opened with ``keyring`` (a
    part that cannot be opened says why instead: see
    :func:`receiver.storage.sealed_columns.open_error`) and masked
    (:func:`receiver.core.masking.mask_text`: a handler's exception may quote a card number
    or a key from the payload)."""
    text_ = open_error(keyring, stored)
    return mask_text(text_) if text_ else text_


def _event_row(r: Any, keyring: Keyring = _CLEAR) -> EventRow:
    """A listed row, its error text opened with ``keyring`` and masked (:func:`shown_error`)."""
    return EventRow(
        id=int(r.id),
        account=r.account,
        event_id=r.event_id,
        event_type=r.event_type,
        status=r.status,
        source=r.source,
        object_key=r.object_key,
        object_kind=r.object_kind,
        object_id=r.object_id,
        object_status=r.object_status,
        object_stage=r.object_stage,
        attempts=int(r.attempts),
        received_at=as_utc(r.received_at),
        event_time=as_utc(r.event_time) if r.event_time is not None else None,
        next_attempt_at=as_utc(r.next_attempt_at) if r.next_attempt_at is not None else None,
        processed_at=as_utc(r.processed_at) if r.processed_at is not None else None,
        lease_owner=r.lease_owner,
        replay_of=r.replay_of,
        last_error=shown_error(keyring, r.last_error),
    )


_LISTED = [c for c in E.c if c.name not in ("body", "headers")]


def _clauses(q: EventQuery) -> list[Any]:
    clauses: list[Any] = []
    if q.statuses:
        clauses.append(E.c.status.in_(list(q.statuses)))
    if q.event_types:
        clauses.append(E.c.event_type.in_(list(q.event_types)))
    if q.sources:
        clauses.append(E.c.source.in_(list(q.sources)))
    if q.accounts:
        clauses.append(E.c.account.in_(list(q.accounts)))
    if q.object:
        clauses.append(object_clause(q.object, q.accounts))
    if q.event_id:
        clauses.append(E.c.event_id == q.event_id.strip())
    if q.since is not None:
        clauses.append(E.c.received_at >= as_utc(q.since))
    if q.until is not None:
        clauses.append(E.c.received_at <= as_utc(q.until))
    if q.deferred:
        clauses.append(
            and_(E.c.status == EventStatus.PENDING, E.c.last_error.like(f"{DEFERRED_PREFIX}%"))
        )
    return clauses


#: The object key of (kind, id) in every account that has events: the accounts are walked
#: one index probe each (the first account, then the next after it, ...), never the events.
_KEYS_IN_EVERY_ACCOUNT = (
    "WITH RECURSIVE hl_accounts(account, n) AS ("
    " SELECT (SELECT min(account) FROM hookledger_event), 1"
    " UNION ALL SELECT (SELECT min(e.account) FROM hookledger_event AS e"
    " WHERE e.account > hl_accounts.account), hl_accounts.n + 1 FROM hl_accounts"
    " WHERE hl_accounts.account IS NOT NULL AND hl_accounts.n < :hl_accounts_limit"
    ") SELECT CASE WHEN account = :hl_default_account THEN :hl_object_base"
    " ELSE account || '/' || :hl_object_base END AS object_key"
    " FROM hl_accounts WHERE account IS NOT NULL"
)


def object_clause(value: str, accounts: Sequence[str] = ()) -> Any:
    """The events of one object, as an operator names it: ``kind:id`` (in every account, or
    in ``accounts`` when some are chosen), ``account/kind:id`` as the listings show an object
    of another account than the default, or an object id alone (any kind, any account).

    An object's key is ``kind:id`` in the default account and ``account/kind:id`` in any
    other (:func:`receiver.core.accounts.object_key`): ``kind:id`` is matched against each
    account's key, by the object key's index."""
    value = value.strip()
    head, sep, rest = value.partition("/")
    if sep and ":" not in head and ":" in rest and is_account_id(head):
        return E.c.object_key == value if head != DEFAULT_ACCOUNT else E.c.object_key == rest
    kind, sep, object_id = value.partition(":")
    if not sep:
        return E.c.object_id == value
    if accounts:
        return E.c.object_key.in_([object_key(a, kind, object_id) for a in accounts])
    keys = (
        text(_KEYS_IN_EVERY_ACCOUNT)
        .bindparams(
            hl_accounts_limit=1_000_000,
            hl_default_account=DEFAULT_ACCOUNT,
            hl_object_base=value,
        )
        .columns(column("object_key", String))
    )
    return E.c.object_key.in_(keys)


def list_events(engine: Engine, q: EventQuery, *, keyring: Keyring | None = None) -> Page:
    """Events matching ``q``, newest first (by inbox id), one page; error texts opened with
    ``keyring`` (the store's data keys)."""
    q.validate()
    clauses = _clauses(q)
    with deferred_begin(engine).connect() as conn:
        if q.order is not None:
            # The order's events first (the index's digest lookup, a few rows), then the
            # listing by their ids: never a walk of the inbox testing each row.
            matching = order_refs.matching_events(keyring or _CLEAR, q.order, q.accounts)
            pks = [int(r[0]) for r in conn.execute(matching.limit(ORDER_MATCHES))]
            clauses.append(E.c.id.in_(pks))
        stmt = (
            select(*_LISTED)
            .where(*clauses)
            .order_by(E.c.id.desc())
            .offset(q.offset)
            .limit(q.limit + 1)
        )
        rows = [_event_row(r, keyring or _CLEAR) for r in conn.execute(stmt)]
    return Page(rows=rows[: q.limit], offset=q.offset, limit=q.limit, has_more=len(rows) > q.limit)


def event_pks(engine: Engine, q: EventQuery, *, cap: int = 10_000) -> list[int]:
    """Ids of every event matching ``q`` (paging ignored), at most ``cap``."""
    q.validate()
    stmt = select(E.c.id).where(*_clauses(q)).order_by(E.c.id).limit(cap)
    with deferred_begin(engine).connect() as conn:
        return [int(r[0]) for r in conn.execute(stmt)]


class AmbiguousEvent(LookupError):
    """An event id stored in several accounts, looked up without naming one."""

    def __init__(self, event_id: str, accounts: Sequence[str]) -> None:
        super().__init__(f"event {event_id!r} is in accounts {', '.join(accounts)}")
        self.event_id = event_id
        self.accounts = tuple(accounts)


def find_event(
    engine: Engine, ref: str, *, keyring: Keyring | None = None, account: str | None = None
) -> EventDetail | None:
    """One event by inbox id (``123`` or ``#123``) or by event id, with its details; its body,
    headers and error texts opened with ``keyring`` (a body that cannot be opened is replaced
    by a note saying why).

    An event id is unique per account: with ``account``, only that account's event is found;
    without, an event id stored in several accounts raises :class:`AmbiguousEvent` (never
    the first one found)."""
    keyring = keyring or _CLEAR
    ref = ref.strip()
    by_pk = ref.lstrip("#")
    in_account = [E.c.account == account] if account is not None else []
    with deferred_begin(engine).connect() as conn:
        row = None
        if by_pk.isdigit():
            row = conn.execute(select(E).where(E.c.id == int(by_pk), *in_account)).first()
        if row is None:
            found = conn.execute(
                select(E).where(E.c.event_id == ref, *in_account).order_by(E.c.id).limit(100)
            ).all()
            accounts = sorted({r.account for r in found})
            if len(accounts) > 1:
                raise AmbiguousEvent(ref, accounts)
            row = found[0] if found else None
        if row is None:
            return None
        pk = int(row.id)
        ledger = tuple(
            LedgerRow(
                handler=r.handler,
                status=r.status,
                attempts=int(r.attempts),
                updated_at=as_utc(r.updated_at),
                last_error=shown_error(keyring, r.last_error),
            )
            for r in conn.execute(select(H).where(H.c.event_pk == pk).order_by(H.c.handler))
        )
        transitions: tuple[TransitionRow, ...] = ()
        projection = None
        if row.object_kind and row.object_id:
            transitions = tuple(
                TransitionRow(
                    state=r.state, event_pk=int(r.event_pk), created_at=as_utc(r.created_at)
                )
                for r in conn.execute(
                    select(T)
                    .where(
                        T.c.account == row.account,
                        T.c.object_kind == row.object_kind,
                        T.c.object_id == row.object_id,
                    )
                    .order_by(T.c.created_at, T.c.state)
                )
            )
            p = conn.execute(
                select(P).where(
                    P.c.account == row.account,
                    P.c.object_kind == row.object_kind,
                    P.c.object_id == row.object_id,
                )
            ).first()
            if p is not None:
                projection = ProjectionRow(
                    status=p.status,
                    stage=p.stage,
                    event_time=as_utc(p.event_time) if p.event_time is not None else None,
                    event_pk=int(p.event_pk),
                    updated_at=as_utc(p.updated_at),
                )
        conflicts = int(
            conn.execute(
                select(func.count())
                .select_from(C)
                .where(C.c.account == row.account, C.c.event_id == row.event_id)
            ).scalar_one()
        )
        replays = tuple(
            int(r[0])
            for r in conn.execute(select(E.c.id).where(E.c.replay_of == pk).order_by(E.c.id))
        )
    try:
        opened = open_headers(keyring, row.headers or "{}", row.event_id)
        headers = {str(k): str(v) for k, v in opened.items()}
    except (ValueError, AttributeError, DataUnavailable):
        headers = {}
    try:
        body = open_body(keyring, bytes(row.body), row.event_id)
    except BodyRedacted:
        body = b"[redacted by retention]"
    except DataUnavailable as exc:
        body = f"[body {exc.message}]".encode()
    return EventDetail(
        row=_event_row(row, keyring),
        body=body,
        headers=headers,
        body_sha256=row.body_sha256,
        secret_id=row.secret_id,
        ledger=ledger,
        transitions=transitions,
        projection=projection,
        conflicts=conflicts,
        replays=replays,
    )


def _conflicts_query() -> Any:
    return select(
        C.c.id,
        C.c.account,
        C.c.event_id,
        C.c.source,
        C.c.received_at,
        C.c.body_sha256,
        C.c.secret_id,
        E.c.id.label("event_pk"),
        E.c.event_type,
    ).select_from(C.outerjoin(E, and_(E.c.account == C.c.account, E.c.event_id == C.c.event_id)))


def _conflict_row(r: Any) -> ConflictRow:
    return ConflictRow(
        id=int(r.id),
        account=r.account,
        event_id=r.event_id,
        source=r.source,
        received_at=as_utc(r.received_at),
        body_sha256=r.body_sha256,
        secret_id=r.secret_id,
        event_pk=int(r.event_pk) if r.event_pk is not None else None,
        event_type=r.event_type,
    )


def get_conflict(engine: Engine, conflict_id: int) -> ConflictRow | None:
    """One conflicting delivery (without its body: :func:`conflict_body`)."""
    with deferred_begin(engine).connect() as conn:
        row = conn.execute(_conflicts_query().where(C.c.id == conflict_id)).first()
    return _conflict_row(row) if row is not None else None


def list_conflicts(
    engine: Engine, *, limit: int = 50, offset: int = 0, accounts: Sequence[str] = ()
) -> Page:
    """Conflicting deliveries (an event id seen again with another body), newest first; of
    ``accounts`` only, when given."""
    stmt = _conflicts_query()
    if accounts:
        stmt = stmt.where(C.c.account.in_(list(accounts)))
    stmt = stmt.order_by(C.c.id.desc()).offset(offset).limit(limit + 1)
    with deferred_begin(engine).connect() as conn:
        rows = [_conflict_row(r) for r in conn.execute(stmt)]
    return Page(rows=rows[:limit], offset=offset, limit=limit, has_more=len(rows) > limit)


def conflict_body(
    engine: Engine, conflict_id: int, *, keyring: Keyring | None = None
) -> bytes | None:
    """The body of one conflicting delivery, opened with ``keyring`` (a note when it cannot
    be)."""
    with deferred_begin(engine).connect() as conn:
        row = conn.execute(select(C.c.event_id, C.c.body).where(C.c.id == conflict_id)).first()
    if row is None or row.body is None:
        return None
    try:
        return (keyring or _CLEAR).open(bytes(row.body), purpose=BODY, context=row.event_id)
    except DataUnavailable as exc:
        return f"[body {exc.message}]".encode()


def status_counts(engine: Engine, *, accounts: Sequence[str] = ()) -> dict[str, int]:
    """Events by status (every status, zero included), of ``accounts`` only when given."""
    where = [E.c.account.in_(list(accounts))] if accounts else []
    with deferred_begin(engine).connect() as conn:
        found = {
            str(s): int(n)
            for s, n in conn.execute(
                select(E.c.status, func.count()).where(*where).group_by(E.c.status)
            )
        }
    return {s: found.get(s, 0) for s in EventStatus.ALL}


__all__ = [
    "AmbiguousEvent",
    "ConflictRow",
    "EventDetail",
    "EventQuery",
    "EventRow",
    "LedgerRow",
    "Page",
    "ProjectionRow",
    "TransitionRow",
    "conflict_body",
    "event_pks",
    "find_event",
    "get_conflict",
    "list_conflicts",
    "list_events",
    "shown_error",
    "status_counts",
]
