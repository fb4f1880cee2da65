"""The reconciler's storage: watermarks, run records and reports, the run lock, seen ids."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    and_,
    case,
    cast,
    delete,
    except_,
    func,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB

from receiver.core.accounts import DEFAULT_ACCOUNT, object_key
from receiver.core.clock import Clock, as_utc, utcnow
from receiver.core.guard import CutOver
from receiver.core.transitions import State, make_state, read_event
from receiver.storage.database import MigrationTree, deferred_begin
from receiver.storage.sql import statements_for
from receiver.storage.tables import EventStatus, InboxEvent, Projection, Source
from reconcile.core.diff import Local
from reconcile.core.errors import ReconcileLocked
from reconcile.storage.tables import Adoption, ReconcileRun, RunLock, SeenBatch, Watermark

if TYPE_CHECKING:
    from receiver.store import Store

log = logging.getLogger("reconcile.store")

RECONCILE_MIGRATIONS = MigrationTree(
    Path(__file__).with_name("migrations"), "hookledger_reconcile_alembic_version"
)

W: Table = Watermark.__table__  # type: ignore[attr-defined]
R: Table = ReconcileRun.__table__  # type: ignore[attr-defined]
K: Table = RunLock.__table__  # type: ignore[attr-defined]
S: Table = SeenBatch.__table__  # type: ignore[attr-defined]
P: Table = Projection.__table__  # type: ignore[attr-defined]
E: Table = InboxEvent.__table__  # type: ignore[attr-defined]

LOCK_NAME = "reconcile"

#: PostgreSQL, one chunk in one statement: mark its ids seen (one row, the ids as a JSON
#: array) and return the listed objects whose projected state (status and stage) is not the
#: remote one, or whose projection was reached by a dead-lettered event, with the projection
#: (NULLs when there is none). The ids, remote statuses and stages are three JSON arrays,
#: zipped. The lookup is one primary-key probe per id, and one more for the projection's
#: event (``LATERAL ... LIMIT 1`` keeps the planner from hashing the whole projection
#: instead, which it prefers for a small table and which then costs a full scan per chunk).
_OBSERVE_PG = text(
    "WITH marked AS ("
    "INSERT INTO hookledger_recon_seen_batch (run_id, kind, object_ids) "
    "VALUES (:run_id, :kind, :ids)) "
    "SELECT listed.object_id, p.status, p.stage, p.event_pk, p.dead "
    "FROM ROWS FROM (jsonb_array_elements_text(CAST(:ids AS jsonb)), "
    "jsonb_array_elements_text(CAST(:statuses AS jsonb)), "
    "jsonb_array_elements_text(CAST(:stages AS jsonb))) "
    "AS listed(object_id, remote_status, remote_stage) "
    "LEFT JOIN LATERAL (SELECT pr.status, pr.stage, pr.event_pk, "
    "coalesce(ev.status = 'dead', false) AS dead FROM hookledger_projection AS pr "
    "LEFT JOIN hookledger_event AS ev ON ev.id = pr.event_pk "
    "WHERE pr.account = :account AND pr.object_kind = :kind "
    "AND pr.object_id = listed.object_id LIMIT 1) AS p ON true "
    "WHERE p.status IS DISTINCT FROM listed.remote_status "
    "OR p.stage IS DISTINCT FROM listed.remote_stage OR p.dead"
)

#: A chunk of remote objects: ``(object id, remote state)`` (``None``: no usable status).
Listed = Sequence[tuple[str, State | None]]
#: ``{object id: projection}`` of the objects whose projected state is not the remote one,
#: or was reached by a dead-lettered event (``None``: none projected); the others are
#: projected exactly as the remote state, by an event that is not dead.
Differing = dict[str, Local | None]


def _ids_json(object_ids: Iterable[str]) -> str:
    """Ids as a JSON array (how a chunk of seen ids is stored, and bound as one parameter)."""
    return json.dumps(list(object_ids), separators=(",", ":"))


class ReconcileStore:
    """Watermarks, runs and seen ids on the receiver's database."""

    def __init__(
        self, engine: Engine, *, clock: Clock = utcnow, account: str = DEFAULT_ACCOUNT
    ) -> None:
        self.engine = engine
        self.clock = clock
        #: The processor account whose projections this store compares with the processor.
        self.account = account
        self._pg = engine.dialect.name == "postgresql"
        self._sql = statements_for(engine)
        self.reader = deferred_begin(engine)

    def __repr__(self) -> str:
        return f"ReconcileStore(dialect={self.engine.dialect.name!r}, account={self.account!r})"

    def now(self) -> datetime:
        return as_utc(self.clock())

    def _insert(self, table: Table) -> Any:
        return (postgresql.insert if self._pg else sqlite.insert)(table)

    # -- watermarks ------------------------------------------------------------------------

    def watermark(self, kind: str) -> datetime | None:
        with self.reader.connect() as conn:
            value = conn.execute(
                select(W.c.high_water).where(W.c.account == self.account, W.c.kind == kind)
            ).scalar()
        return as_utc(value) if value is not None else None

    def set_watermark(self, kind: str, high_water: datetime) -> None:
        """Move the watermark forward (never backwards: a wide run over an old window must not
        undo the progress of the incremental runs)."""
        now = self.now()
        high_water = as_utc(high_water)
        with self.engine.begin() as conn:
            conn.execute(
                self._insert(W)
                .values(account=self.account, kind=kind, high_water=high_water, updated_at=now)
                .on_conflict_do_update(
                    index_elements=["account", "kind"],
                    set_={"high_water": high_water, "updated_at": now},
                    where=W.c.high_water < high_water,
                )
            )

    # -- runs ------------------------------------------------------------------------------

    def start_run(self, mode: str, owner: str) -> int:
        with self.engine.begin() as conn:
            run_id = conn.execute(
                R.insert()
                .values(
                    account=self.account,
                    mode=mode,
                    owner=owner,
                    started_at=self.now(),
                    status="running",
                    report="{}",
                )
                .returning(R.c.id)
            ).scalar_one()
        return int(run_id)

    def finish_run(self, run_id: int, status: str, report: dict[str, Any]) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(R)
                .where(R.c.id == run_id)
                .values(
                    status=status, finished_at=self.now(), report=json.dumps(report, default=str)
                )
            )
            conn.execute(delete(S).where(S.c.run_id == run_id))

    def runs(self, limit: int = 10) -> list[ReconcileRun]:
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(R).where(R.c.account == self.account).order_by(R.c.id.desc()).limit(limit)
            ).all()
        return [ReconcileRun(**row._mapping) for row in rows]

    def running(self) -> ReconcileRun | None:
        with self.reader.connect() as conn:
            row = conn.execute(
                select(R)
                .where(R.c.account == self.account, R.c.status == "running")
                .order_by(R.c.id.desc())
                .limit(1)
            ).first()
        return ReconcileRun(**row._mapping) if row is not None else None

    # -- seen ids and local-only objects ---------------------------------------------------

    def mark_seen(self, run_id: int, kind: str, object_ids: Iterable[str]) -> None:
        ids = list(object_ids)
        if not ids:
            return
        with self.engine.begin() as conn:
            conn.execute(S.insert().values(run_id=run_id, kind=kind, object_ids=_ids_json(ids)))

    def observe(
        self,
        run_id: int | None,
        kind: str,
        listed: Listed,
        *,
        also: Callable[[Connection], None] | None = None,
    ) -> Differing:
        """Mark a chunk of ``listed`` ids seen by the run (unless ``run_id`` is ``None``) and
        return those whose projected state is not the remote one (or was reached by a
        dead-lettered event), with their projection (``None``: not projected); the others
        are projected exactly as the remote state.

        On PostgreSQL one statement does it all (one round trip, atomic), and only the
        objects out of step come back. Elsewhere: the read, then the marks in a short write
        transaction. ``also`` writes more in the same transaction (one commit a chunk).
        """
        if not listed:
            return {}
        ids = [object_id for object_id, _ in listed]
        if not self._pg or run_id is None:
            local = self.local_states(kind, ids)
            if run_id is not None or also is not None:
                with self.engine.begin() as conn:
                    if run_id is not None:
                        conn.execute(
                            S.insert().values(run_id=run_id, kind=kind, object_ids=_ids_json(ids))
                        )
                    if also is not None:
                        also(conn)
            return {
                object_id: local.get(object_id)
                for object_id, remote in listed
                if _differs(local.get(object_id), remote)
            }
        params = {
            "run_id": run_id,
            "account": self.account,
            "kind": kind,
            "ids": _ids_json(ids),
            "statuses": json.dumps(
                [state.status if state else None for _, state in listed], separators=(",", ":")
            ),
            "stages": json.dumps(
                [state.stage if state else None for _, state in listed], separators=(",", ":")
            ),
        }
        with self.engine.begin() as conn:
            rows = conn.execute(_OBSERVE_PG, params).all()
            if also is not None:
                also(conn)
        return {
            object_id: (
                None
                if status is None
                else Local(make_state(kind, status, stage), int(event_pk), dead=bool(dead))
            )
            for object_id, status, stage, event_pk, dead in rows
        }

    def local_states(self, kind: str, object_ids: Sequence[str]) -> dict[str, Local]:
        """The projection of each of ``object_ids`` that has one (and whether the event that
        put it there is dead-lettered)."""
        if not object_ids:
            return {}
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(P.c.object_id, P.c.status, P.c.stage, P.c.event_pk, E.c.status)
                .select_from(P.outerjoin(E, E.c.id == P.c.event_pk))
                .where(
                    P.c.account == self.account,
                    P.c.object_kind == kind,
                    P.c.object_id.in_(list(object_ids)),
                )
            ).all()
        return {
            r[0]: Local(make_state(kind, r[1], r[2]), int(r[3]), dead=r[4] == EventStatus.DEAD)
            for r in rows
        }

    def waiting_states(self, kind: str, object_ids: Sequence[str]) -> dict[str, list[State]]:
        """The states the events waiting in the inbox (pending or being processed) report,
        for those of ``object_ids`` that have any."""
        if not object_ids:
            return {}
        keys = {object_key(self.account, kind, object_id): object_id for object_id in object_ids}
        found: dict[str, list[State]] = {}
        with self.reader.connect() as conn:
            # Only the object index: an object has few events, the inbox may hold a backlog
            # (a status term would tempt SQLite's planner to read every open event).
            rows = conn.execute(
                self._sql.events_of_objects(
                    (
                        E.c.object_key,
                        E.c.status,
                        E.c.event_type,
                        E.c.object_status,
                        E.c.object_stage,
                    ),
                    list(keys),
                )
            ).all()
        for key, event_status, event_type, status, stage in rows:
            if event_status not in EventStatus.OPEN:
                continue
            reading = read_event(kind, event_type, status, stage)
            if reading.state is not None:
                found.setdefault(keys[key], []).append(reading.state)
        return found

    def with_history(self, kind: str, object_ids: Iterable[str]) -> set[str]:
        """Those of ``object_ids`` hookledger has a projection or any stored event of."""
        ids = list(object_ids)
        if not ids:
            return set()
        keys = {object_key(self.account, kind, object_id): object_id for object_id in ids}
        with self.reader.connect() as conn:
            projected = conn.execute(
                select(P.c.object_id).where(
                    P.c.account == self.account, P.c.object_kind == kind, P.c.object_id.in_(ids)
                )
            ).scalars()
            found = set(projected)
            events = conn.execute(self._sql.events_of_objects((E.c.object_key,), list(keys)))
            found.update(keys[key] for (key,) in events)
        return found

    def own_history(
        self, kind: str, object_ids: Iterable[str], cutover: CutOver
    ) -> tuple[set[str], dict[str, set[int]]]:
        """Which of ``object_ids`` have history of hookledger's own, for adoption.

        Returns ``(own, written_off)``: ``own`` are the objects with a stored event that is
        not a write-off of the earlier system's history, or a projection no such write-off
        set (adoption's own, from an earlier run, included); ``written_off`` maps each other
        object that has events to their ids (all records of what happened before the
        cut-over: a processor retry of an old delivery stored while adoption ran). The
        write-off test is the guard's: an event of a historical source (or an API
        observation) received once the cut-over was recorded, that happened before
        :attr:`~receiver.core.guard.CutOver.history_ends`.
        """
        ids = list(object_ids)
        if not ids:
            return set(), {}
        keys = {object_key(self.account, kind, object_id): object_id for object_id in ids}
        off = and_(
            E.c.source.in_([*Source.HISTORICAL, Source.API]),
            E.c.received_at >= cutover.recorded_at,
            E.c.event_time < cutover.history_ends,
        )
        own: set[str] = set()
        written_off: dict[str, set[int]] = {}
        with self.reader.connect() as conn:
            for key, pk, is_off in conn.execute(
                self._sql.events_of_objects(
                    (E.c.object_key, E.c.id, case((off, True), else_=False).label("off")),
                    list(keys),
                )
            ):
                if is_off:
                    written_off.setdefault(keys[key], set()).add(int(pk))
                else:
                    own.add(keys[key])
            for object_id, event_pk in conn.execute(
                select(P.c.object_id, P.c.event_pk).where(
                    P.c.account == self.account, P.c.object_kind == kind, P.c.object_id.in_(ids)
                )
            ):
                if int(event_pk) not in written_off.get(object_id, set()):
                    own.add(object_id)
        return own, {oid: pks for oid, pks in written_off.items() if oid not in own}

    def local_only(
        self, run_id: int, kind: str, start: datetime, end: datetime, *, sample: int = 20
    ) -> tuple[int, list[str]]:
        """Objects the projection knows, created in the window, that the processor did not
        list: their count and a sample of ``sample`` ids (the first ones, sorted).

        A set difference (``EXCEPT``), which the database computes by hashing or sorting
        both sides once, whatever its statistics say about the seen ids."""
        seen = S.alias("seen")
        if self._pg:
            listed: Any = func.jsonb_array_elements_text(cast(seen.c.object_ids, JSONB))
            seen_ids = select(listed.label("object_id")).select_from(seen)
        else:
            each = func.json_each(seen.c.object_ids).table_valued("value")
            seen_ids = select(each.c.value.label("object_id")).select_from(seen.join(each, true()))
        unseen = except_(
            select(P.c.object_id).where(
                P.c.account == self.account,
                P.c.object_kind == kind,
                P.c.object_created_at >= as_utc(start),
                P.c.object_created_at <= as_utc(end),
            ),
            seen_ids.where(seen.c.run_id == run_id, seen.c.kind == kind),
        ).subquery("unseen")
        with self.reader.connect() as conn:
            count = int(conn.execute(select(func.count()).select_from(unseen)).scalar_one())
            if not count:
                return 0, []
            ids = conn.execute(
                select(unseen.c.object_id).order_by(unseen.c.object_id).limit(sample)
            ).scalars()
            return count, sorted(ids)

    def has_history(self) -> bool:
        """True when reconcile has run on this database before (a run or a watermark)."""
        with self.reader.connect() as conn:
            runs = conn.execute(
                select(R.c.id).where(R.c.account == self.account, R.c.status != "running").limit(1)
            ).first()
            marks = conn.execute(
                select(W.c.kind).where(W.c.account == self.account).limit(1)
            ).first()
        return runs is not None or marks is not None

    # -- lock ------------------------------------------------------------------------------

    def lock(self, owner: str, *, lease_seconds: float = 60.0) -> RunLease:
        return RunLease(self, owner, lease_seconds=lease_seconds)


def _differs(local: Local | None, remote: State | None) -> bool:
    if local is None or remote is None:
        return local is not None or remote is not None
    return local.state.key != remote.key or local.dead


class RunLease:
    """One reconcile run at a time across processes and hosts.

    PostgreSQL: a session-level advisory lock on a connection held for the run (released by
    the server if the process dies). SQLite: a lease row taken with a conditional upsert and
    renewed by a heartbeat thread (a dead process's lease expires).
    """

    def __init__(self, store: ReconcileStore, owner: str, *, lease_seconds: float) -> None:
        self.store = store
        self.owner = owner
        self.lease_seconds = lease_seconds
        #: One run at a time per account: the default account keeps the lock it always had.
        self._name = (
            LOCK_NAME if store.account == DEFAULT_ACCOUNT else f"{LOCK_NAME}/{store.account}"
        )
        self._conn: Connection | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def acquire(self, *, wait: float = 0.0, poll: float = 0.5) -> None:
        """Take the lock, waiting up to ``wait`` seconds; raise :class:`ReconcileLocked`."""
        deadline = self.store.now() + timedelta(seconds=wait)
        stop = threading.Event()
        while not self._try():
            if self.store.now() >= deadline:
                running = self.store.running()
                detail = (
                    f" (run #{running.id} by {running.owner}, started {running.started_at})"
                    if running
                    else ""
                )
                raise ReconcileLocked(f"another reconcile run is in progress{detail}")
            stop.wait(poll)

    def _try(self) -> bool:
        if self.store._pg:
            conn = self.store.engine.connect()
            got = conn.execute(
                text(f"SELECT pg_try_advisory_lock({_LOCK_KEY_SQL})"), {"lock_name": self._name}
            ).scalar()
            conn.commit()
            if got:
                self._conn = conn
                return True
            conn.close()
            return False
        now = self.store.now()
        expires = now + timedelta(seconds=self.lease_seconds)
        with self.store.engine.begin() as conn:
            taken = conn.execute(
                self.store._insert(K)
                .values(
                    account=self.store.account, name=LOCK_NAME, owner=self.owner, expires_at=expires
                )
                .on_conflict_do_update(
                    index_elements=["account", "name"],
                    set_={"owner": self.owner, "expires_at": expires},
                    where=K.c.expires_at < now,
                )
                .returning(K.c.name)
            ).first()
        if taken is None:
            return False
        self._heartbeat = threading.Thread(target=self._renew, name="reconcile-lock", daemon=True)
        self._heartbeat.start()
        return True

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_seconds / 3):
            expires = self.store.now() + timedelta(seconds=self.lease_seconds)
            try:
                with self.store.engine.begin() as conn:
                    conn.execute(
                        update(K)
                        .where(
                            K.c.account == self.store.account,
                            K.c.name == LOCK_NAME,
                            K.c.owner == self.owner,
                        )
                        .values(expires_at=expires)
                    )
            except Exception:  # noqa: BLE001 - retry at the next beat
                log.exception("could not renew the reconcile lock", extra={"action": "lock"})

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.execute(
                    text(f"SELECT pg_advisory_unlock({_LOCK_KEY_SQL})"), {"lock_name": self._name}
                )
                self._conn.commit()
            finally:
                self._conn.close()
                self._conn = None
            return
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        with self.store.engine.begin() as conn:
            conn.execute(
                delete(K).where(
                    K.c.account == self.store.account,
                    K.c.name == LOCK_NAME,
                    K.c.owner == self.owner,
                )
            )

    def __enter__(self) -> RunLease:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


#: One lock per database *and schema*: hookledger installs in different schemas of one
#: database (one per tenant, or per test run) must not block each other.
_LOCK_KEY_SQL = (
    "hashtextextended('hookledger-reconcile:' || current_database() || '/' "
    "|| current_schema() || '/' || :lock_name, 0)"
)


_ADOPTION: Table = Adoption.__table__  # type: ignore[attr-defined]

#: Whether a database may be reconciled (see :func:`adoption_state`).
AdoptionState = Literal["adopted", "new_account", "legacy", "adopting"]


def adoption_state(inbox: Store, store: ReconcileStore) -> AdoptionState | None:
    """Whether this database may be reconciled, and why.

    ``adopted`` / ``new_account``: recorded by ``reconcile adopt``; ``adopting``: an
    adoption has begun and not finished; ``legacy``: reconcile ran here before adoption
    existed (its watermarks are its own history); ``None``: none of these.
    """
    mode = inbox.operations.cutover_mode(account=store.account)
    if mode == "new_account":
        return "new_account"
    if mode == "adopted":
        with store.reader.connect() as conn:
            unfinished = conn.execute(
                select(_ADOPTION.c.kind)
                .where(_ADOPTION.c.account == store.account, _ADOPTION.c.finished_at.is_(None))
                .limit(1)
            ).first()
        return "adopting" if unfinished is not None else "adopted"
    return "legacy" if store.has_history() else None
