"""One object's whole story, for operators (read-only): ``hookledger object payment:pay_x``
and the console's object page.

What the database knows about one (account, kind, id), in one place:

- **deliveries**: every stored event of the object (webhooks, the shop's ``observe`` =
  ``api``, the reconciler's ``reconcile`` and ``recovered`` events, ``backfill``,
  ``replay``) with its answer: its status, the guard's reason or the last failure, its
  conflicting deliveries (the same event id with another body);
- **transitions**: each (object, state) dispatched, in order, with the source of the event
  that dispatched it (``adoption`` when adoption recorded it and nothing ran);
- **handler runs**: each delivery's ledger (attempts, status, the last error, masked);
- **the reconciler**: the runs whose window holds the receipt of one of its recovered
  events (runs of one account never overlap: they hold a lock), and the runs whose report
  names it in a sample; the sweep's row for the object (what the processor said at its
  last check), when the sweep follows it;
- **what the processor last said**: the newest of its deliveries' reported states and the
  sweep's last check, and the projection (hookledger's view).

What it cannot show, it says: the rejected-deliveries log names no object (it has no body:
only its count for the account while the object's deliveries arrived is shown); a report
samples at most a few ids per list, and a run that found the object in sync leaves no trace
of it; pruned events are gone (their transitions and the projection stay).

The reconciler's tables are read through lightweight table clauses (the receiver never
imports :mod:`reconcile`), and only when they exist.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Connection,
    DateTime,
    Engine,
    Integer,
    String,
    Text,
    column,
    func,
    inspect,
    or_,
    select,
    table,
    text,
)

from receiver.core.accounts import DEFAULT_ACCOUNT, is_account_id, object_key
from receiver.core.clock import as_utc
from receiver.core.keyring import Keyring
from receiver.core.status import CONTENT_TYPE_KIND
from receiver.storage.database import deferred_begin
from receiver.storage.operator_reads import (
    _LISTED,
    C,
    E,
    EventRow,
    H,
    LedgerRow,
    P,
    ProjectionRow,
    T,
    _event_row,
    shown_error,
)
from receiver.storage.tables import Rejection, Source

#: The object kinds (``kind`` of ``kind:id``).
KINDS: Final = tuple(dict.fromkeys(CONTENT_TYPE_KIND.values()))
#: At most this many deliveries are shown (an object has few; a flood of replays is cut).
MAX_DELIVERIES: Final = 500
#: Reports read, newest first, for the runs that name the object.
MAX_REPORTS: Final = 200
#: Sources of the events a reconcile run inserts.
RECONCILER_SOURCES: Final = (Source.RECONCILE, Source.RECOVERED, Source.BACKFILL)

R: Any = Rejection.__table__  # type: ignore[attr-defined]

#: The reconciler's tables, as far as they are read here (``reconcile.storage.tables``).
RECON_RUN = table(
    "hookledger_recon_run",
    column("id", BigInteger().with_variant(Integer(), "sqlite")),
    column("account", String()),
    column("mode", String()),
    column("started_at", DateTime(timezone=True)),
    column("finished_at", DateTime(timezone=True)),
    column("status", String()),
    column("report", Text()),
)
RECON_OBJECT = table(
    "hookledger_recon_object",
    column("account", String()),
    column("kind", String()),
    column("object_id", String()),
    column("first_seen_at", DateTime(timezone=True)),
    column("status", String()),
    column("stage", String()),
    column("last_checked_at", DateTime(timezone=True)),
    column("next_check_at", DateTime(timezone=True)),
    column("checks", Integer()),
)


class AmbiguousObject(LookupError):
    """An object (kind, id) stored in several accounts, looked up without naming one."""

    def __init__(self, kind: str, object_id: str, accounts: Sequence[str]) -> None:
        super().__init__(f"{kind}:{object_id} is in accounts {', '.join(accounts)}")
        self.accounts = tuple(accounts)


def parse_object(text_: str) -> tuple[str | None, str, str]:
    """``kind:id`` (``payment:pay_123``), or ``account/kind:id`` as the event listings show an
    object of another account than the default: ``(account or None, kind, id)``. Raises
    ``ValueError`` saying what is expected."""
    value = text_.strip()
    account: str | None = None
    head, sep, rest = value.partition("/")
    if sep and ":" not in head and is_account_id(head):
        account, value = head, rest
    kind, sep, object_id = value.partition(":")
    if not sep or kind not in KINDS or not object_id:
        raise ValueError(
            f"{text_[:80]!r} is not an object: give it as kind:id (payment:pay_123), "
            f"kinds: {', '.join(KINDS)}"
        )
    return account, kind, object_id


@dataclass(frozen=True, kw_only=True, slots=True)
class Delivery:
    """One stored event of the object, with its ledger."""

    row: EventRow
    ledger: tuple[LedgerRow, ...]
    #: Deliveries of its event id with another body (``hookledger conflicts``).
    conflicts: int
    #: The reconcile run whose window holds its receipt (its sources only), if one does.
    run_id: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class StoryTransition:
    state: str
    at: datetime
    #: The event that dispatched it (0: recorded by adoption, nothing dispatched).
    event_pk: int
    #: ``webhook``, ``api``, ``reconcile``, ``recovered``, ``backfill``, ``replay``,
    #: ``adoption``, or ``pruned`` (its event is no longer stored).
    source: str
    event_id: str | None
    #: The status of that event now (``dead``: the state was reached, its handlers did not
    #: all succeed; ``None`` for adoption or a pruned event).
    event_status: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Followed:
    """The sweep's row for the object: what the processor said at its last check."""

    status: str
    stage: str | None
    first_seen_at: datetime
    last_checked_at: datetime
    next_check_at: datetime
    checks: int


@dataclass(frozen=True, kw_only=True, slots=True)
class RunLink:
    """A reconcile run that touched the object, and how we know."""

    id: int
    mode: str
    status: str
    started_at: datetime
    finished_at: datetime | None
    why: str


@dataclass(frozen=True, kw_only=True, slots=True)
class LastWord:
    """The newest state the processor reported for the object, and how."""

    status: str | None
    stage: str | None
    at: datetime
    #: An event's source, or ``sweep`` (the reconciler's last check by id).
    source: str
    event_pk: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Rejections:
    """Refused deliveries of the object's account while its deliveries arrived (the log
    names no object)."""

    count: int
    reasons: dict[str, int]
    since: datetime
    until: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectStory:
    account: str
    kind: str
    object_id: str
    object_key: str
    deliveries: tuple[Delivery, ...]
    #: More deliveries than :data:`MAX_DELIVERIES` are stored (the newest are cut).
    truncated: bool
    transitions: tuple[StoryTransition, ...]
    projection: ProjectionRow | None
    followed: Followed | None
    last_word: LastWord | None
    runs: tuple[RunLink, ...]
    rejections: Rejections | None
    #: Whether the reconciler's tables exist in this database.
    reconciler: bool

    @property
    def ref(self) -> str:
        """``kind:id``."""
        return f"{self.kind}:{self.object_id}"

    @property
    def last_recovered(self) -> EventRow | None:
        """The newest event the reconciler stored for the object (``reconcile``,
        ``recovered``, ``backfill``): the state it found at the processor, and when."""
        found = [d.row for d in self.deliveries if d.row.source in RECONCILER_SOURCES]
        return max(found, key=lambda r: (r.received_at, r.id)) if found else None


#: The accounts of the inbox and of the projections, one index probe per account
#: (``min(account) > previous``), then, per account, whether the object has an event (the
#: object index) or a projection (its primary key).
ACCOUNTS_OF_OBJECT = text(
    "WITH RECURSIVE ea(account, n) AS ("
    " SELECT (SELECT min(account) FROM hookledger_event), 1"
    " UNION ALL SELECT (SELECT min(e.account) FROM hookledger_event AS e"
    " WHERE e.account > ea.account), ea.n + 1 FROM ea"
    " WHERE ea.account IS NOT NULL AND ea.n < :limit"
    "), pa(account, n) AS ("
    " SELECT (SELECT min(account) FROM hookledger_projection), 1"
    " UNION ALL SELECT (SELECT min(p.account) FROM hookledger_projection AS p"
    " WHERE p.account > pa.account), pa.n + 1 FROM pa"
    " WHERE pa.account IS NOT NULL AND pa.n < :limit"
    "), a(account) AS ("
    " SELECT account FROM ea WHERE account IS NOT NULL"
    " UNION SELECT account FROM pa WHERE account IS NOT NULL"
    ") SELECT a.account FROM a WHERE EXISTS (SELECT 1 FROM hookledger_event AS e"
    " WHERE e.object_key = CASE WHEN a.account = :default THEN :base"
    " ELSE a.account || '/' || :base END)"
    " OR EXISTS (SELECT 1 FROM hookledger_projection AS p WHERE p.account = a.account"
    " AND p.object_kind = :kind AND p.object_id = :id)"
    " ORDER BY a.account"
)


def object_accounts(engine: Engine, kind: str, object_id: str) -> list[str]:
    """The accounts in which the object (kind, id) has an event or a projection."""
    params = {
        "limit": 100_000,
        "default": DEFAULT_ACCOUNT,
        "base": f"{kind}:{object_id}",
        "kind": kind,
        "id": object_id,
    }
    with deferred_begin(engine).connect() as conn:
        return [str(r[0]) for r in conn.execute(ACCOUNTS_OF_OBJECT, params)]


def object_story(
    engine: Engine,
    kind: str,
    object_id: str,
    *,
    account: str | None = None,
    keyring: Keyring | None = None,
    now: datetime | None = None,
) -> ObjectStory | None:
    """The story of the object (kind, id) of ``account``; without ``account``, of the one
    account that has it (:class:`AmbiguousObject` when several do). ``None``: no account
    has it. Error texts are opened with ``keyring`` and masked
    (:func:`receiver.storage.operator_reads.shown_error`)."""
    keyring = keyring or Keyring()
    if account is None:
        found = object_accounts(engine, kind, object_id)
        if len(found) > 1:
            raise AmbiguousObject(kind, object_id, found)
        if not found:
            return None
        account = found[0]
    key = object_key(account, kind, object_id)
    with deferred_begin(engine).connect() as conn:
        rows = conn.execute(
            select(*_LISTED)
            .where(E.c.object_key == key)
            .order_by(E.c.received_at, E.c.id)
            .limit(MAX_DELIVERIES + 1)
        ).all()
        truncated = len(rows) > MAX_DELIVERIES
        events = [_event_row(r, keyring) for r in rows[:MAX_DELIVERIES]]
        projection = _projection(conn, account, kind, object_id)
        transitions = _transitions(conn, account, kind, object_id, events)
        if not events and projection is None and not transitions:
            return None
        ledger = _ledger(conn, [e.id for e in events], keyring)
        conflicts = _conflicts(conn, account, [e.event_id for e in events])
        tables = set(inspect(conn).get_table_names())
        reconciler = "hookledger_recon_run" in tables
        followed = (
            _followed(conn, account, kind, object_id)
            if "hookledger_recon_object" in tables
            else None
        )
        runs, run_of = (
            _runs(conn, account, object_id, events, transitions, followed)
            if reconciler
            else ((), {})
        )
        rejections = _rejections(conn, account, events)
    deliveries = tuple(
        Delivery(
            row=e,
            ledger=ledger.get(e.id, ()),
            conflicts=conflicts.get(e.event_id, 0),
            run_id=run_of.get(e.id),
        )
        for e in events
    )
    return ObjectStory(
        account=account,
        kind=kind,
        object_id=object_id,
        object_key=key,
        deliveries=deliveries,
        truncated=truncated,
        transitions=tuple(transitions),
        projection=projection,
        followed=followed,
        last_word=_last_word(events, followed),
        runs=tuple(runs),
        rejections=rejections,
        reconciler=reconciler,
    )


def _projection(conn: Connection, account: str, kind: str, object_id: str) -> ProjectionRow | None:
    p = conn.execute(
        select(P).where(P.c.account == account, P.c.object_kind == kind, P.c.object_id == object_id)
    ).first()
    if p is None:
        return None
    return ProjectionRow(
        status=p.status,
        stage=p.stage,
        event_time=as_utc(p.event_time) if p.event_time is not None else None,
        event_pk=int(p.event_pk),
        updated_at=as_utc(p.updated_at),
    )


def _transitions(
    conn: Connection, account: str, kind: str, object_id: str, events: list[EventRow]
) -> list[StoryTransition]:
    found = conn.execute(
        select(T.c.state, T.c.event_pk, T.c.created_at)
        .where(T.c.account == account, T.c.object_kind == kind, T.c.object_id == object_id)
        .order_by(T.c.created_at, T.c.state)
    ).all()
    known = {e.id: e for e in events}
    missing = sorted({int(r.event_pk) for r in found} - set(known) - {0})
    others: dict[int, tuple[str, str, str]] = {}
    if missing:
        others = {
            int(r.id): (r.source, r.event_id, r.status)
            for r in conn.execute(
                select(E.c.id, E.c.source, E.c.event_id, E.c.status).where(E.c.id.in_(missing))
            )
        }
    out: list[StoryTransition] = []
    for r in found:
        pk = int(r.event_pk)
        status: str | None = None
        if pk == 0:
            source, event_id = "adoption", None
        elif pk in known:
            source, event_id, status = known[pk].source, known[pk].event_id, known[pk].status
        elif pk in others:
            source, event_id, status = others[pk]
        else:
            source, event_id = "pruned", None
        out.append(
            StoryTransition(
                state=r.state,
                at=as_utc(r.created_at),
                event_pk=pk,
                source=source,
                event_id=event_id,
                event_status=status,
            )
        )
    return out


def _ledger(conn: Connection, pks: list[int], keyring: Keyring) -> dict[int, tuple[LedgerRow, ...]]:
    out: dict[int, list[LedgerRow]] = {}
    if pks:
        for r in conn.execute(
            select(H).where(H.c.event_pk.in_(pks)).order_by(H.c.event_pk, H.c.handler)
        ):
            out.setdefault(int(r.event_pk), []).append(
                LedgerRow(
                    handler=r.handler,
                    status=r.status,
                    attempts=int(r.attempts),
                    updated_at=as_utc(r.updated_at),
                    last_error=shown_error(keyring, r.last_error),
                )
            )
    return {pk: tuple(rows) for pk, rows in out.items()}


def _conflicts(conn: Connection, account: str, event_ids: list[str]) -> dict[str, int]:
    if not event_ids:
        return {}
    return {
        str(r[0]): int(r[1])
        for r in conn.execute(
            select(C.c.event_id, func.count())
            .where(C.c.account == account, C.c.event_id.in_(sorted(set(event_ids))))
            .group_by(C.c.event_id)
        )
    }


def _followed(conn: Connection, account: str, kind: str, object_id: str) -> Followed | None:
    f = RECON_OBJECT
    row = conn.execute(
        select(f).where(f.c.account == account, f.c.kind == kind, f.c.object_id == object_id)
    ).first()
    if row is None:
        return None
    return Followed(
        status=row.status,
        stage=row.stage,
        first_seen_at=as_utc(row.first_seen_at),
        last_checked_at=as_utc(row.last_checked_at),
        next_check_at=as_utc(row.next_check_at),
        checks=int(row.checks),
    )


def _runs(
    conn: Connection,
    account: str,
    object_id: str,
    events: list[EventRow],
    transitions: list[StoryTransition],
    followed: Followed | None,
) -> tuple[list[RunLink], dict[int, int]]:
    """The runs of ``account`` that inserted one of ``events`` (the run whose window holds
    its receipt), and those whose report names ``object_id`` in a sample; and which run
    inserted which event."""
    r = RECON_RUN
    times = [e.received_at for e in events] + [t.at for t in transitions]
    if followed is not None:
        times.append(followed.first_seen_at)
    if not times:
        return [], {}
    since = min(times) - timedelta(days=1)
    found = conn.execute(
        select(r.c.id, r.c.mode, r.c.status, r.c.started_at, r.c.finished_at, r.c.report)
        .where(r.c.account == account, r.c.started_at >= since)
        .order_by(r.c.id.desc())
        .limit(MAX_REPORTS)
    ).all()
    runs = {int(x.id): x for x in found}
    why: dict[int, list[str]] = {}
    run_of: dict[int, int] = {}
    for e in events:
        if e.source not in RECONCILER_SOURCES:
            continue
        for x in found:
            start = as_utc(x.started_at)
            end = as_utc(x.finished_at) if x.finished_at is not None else None
            if start <= e.received_at and (end is None or e.received_at <= end):
                run_of[e.id] = int(x.id)
                why.setdefault(int(x.id), []).append(f"stored #{e.id} ({e.source})")
                break
    for x in found:
        if _report_names(x.report, object_id):
            why.setdefault(int(x.id), []).append("its report names the object")
    links = [
        RunLink(
            id=run_id,
            mode=runs[run_id].mode,
            status=runs[run_id].status,
            started_at=as_utc(runs[run_id].started_at),
            finished_at=as_utc(runs[run_id].finished_at)
            if runs[run_id].finished_at is not None
            else None,
            why="; ".join(reasons),
        )
        for run_id, reasons in sorted(why.items())
    ]
    return links, run_of


def _report_names(report: str | None, object_id: str) -> bool:
    """Whether a stored report's samples name ``object_id`` (as ``<id>: ...`` or ``<kind>
    <id>: ...``; an id with characters a report escapes is not matched)."""
    if not report or object_id not in report:
        return False
    try:
        data = json.loads(report)
    except ValueError:
        return False
    marks = (f"{object_id}:", f"{object_id} ")
    stack: list[Any] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and (
            item == object_id
            or item.startswith(marks)
            or f" {object_id}:" in item
            or f" {object_id} " in item
        ):
            return True
    return False


def _rejections(conn: Connection, account: str, events: list[EventRow]) -> Rejections | None:
    webhooks = [e.received_at for e in events if e.source == Source.WEBHOOK] or [
        e.received_at for e in events
    ]
    if not webhooks:
        return None
    since, until = min(webhooks) - timedelta(hours=1), max(webhooks) + timedelta(hours=1)
    reasons = {
        str(reason): int(n)
        for reason, n in conn.execute(
            select(R.c.reason, func.sum(1 + R.c.suppressed))
            .where(
                R.c.received_at >= since,
                R.c.received_at <= until,
                or_(R.c.account == account, R.c.account.is_(None)),
            )
            .group_by(R.c.reason)
        )
    }
    return Rejections(count=sum(reasons.values()), reasons=reasons, since=since, until=until)


def _last_word(events: list[EventRow], followed: Followed | None) -> LastWord | None:
    """The newest state the processor reported: a delivery's (when it was stored; replays
    are copies, not news) or the sweep's last check."""
    heard = [e for e in events if e.source != Source.REPLAY and e.object_status]
    best: LastWord | None = None
    if heard:
        e = max(heard, key=lambda x: (x.received_at, x.id))
        best = LastWord(
            status=e.object_status,
            stage=e.object_stage,
            at=e.received_at,
            source=e.source,
            event_pk=e.id,
        )
    # (``unknown``: the sweep could not fetch it, not found, say: the processor said nothing.)
    if (
        followed is not None
        and followed.status != "unknown"
        and (best is None or followed.last_checked_at >= best.at)
    ):
        best = LastWord(
            status=followed.status,
            stage=followed.stage,
            at=followed.last_checked_at,
            source="sweep",
            event_pk=None,
        )
    return best


__all__ = [
    "KINDS",
    "AmbiguousObject",
    "Delivery",
    "Followed",
    "LastWord",
    "ObjectStory",
    "Rejections",
    "RunLink",
    "StoryTransition",
    "object_accounts",
    "object_story",
    "parse_object",
]
