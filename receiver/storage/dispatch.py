"""Dispatch: the guard, the handlers, the ledger and the outcomes of claimed events, in one
transaction per batch.

For each claimed event the guard decides first (:func:`receiver.core.guard.decide`, pure); then
each handler that has not yet succeeded runs, a handler that takes the session inside a
savepoint of its own, with a session that cannot end the transaction
(:mod:`receiver.storage.handler_session`); the ledger rows, transitions, projections and the
events' outcomes are written in the same transaction, only while the worker still holds the
events' leases.
"""

from __future__ import annotations

import logging
import random
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, select
from sqlalchemy.exc import DisconnectionError, SQLAlchemyError, StatementError
from sqlalchemy.orm import Session

import receiver.core.guard as guard
from receiver.core.clock import as_utc
from receiver.core.defer import Defer
from receiver.core.errors import HandlerTransactionError
from receiver.core.retry import RetryPolicy
from receiver.core.transitions import Reading, make_state, read_event
from receiver.storage.bounds import bounds_of
from receiver.storage.context import (
    Storage,
    describe_database_error,
    is_database_error,
    is_transient_conflict,
    sqlstate,
)
from receiver.storage.handler_session import (
    TransactionEnded,
    TransactionGuard,
    running_handler,
)
from receiver.storage.operator_actions import read_cutovers
from receiver.storage.queue import Claimed
from receiver.storage.sealed_columns import seal_outcomes
from receiver.storage.sql import Outcomes
from receiver.storage.sql.tables import EVENT, LEASE
from receiver.storage.tables import DEFERRED_PREFIX, EventStatus, Source

log = logging.getLogger("receiver.store")

#: A handler whose only failures were conflicts with other transactions (a deadlock, a lock
#: or statement timeout, SQLite busy) is tried again within this many seconds; the attempt
#: still counts, so a conflict that never clears ends in the dead-letter like any failure.
TRANSIENT_RETRY_SECONDS = 1.0

#: A handler as the store runs it: (ledger name, call with the session, needs the session).
HandlerCall = tuple[str, Callable[[Session], None], bool]


class _LeaseLost(Exception):
    """Another worker holds the lease now: roll back."""


#: PostgreSQL ended a session that sat idle in its transaction too long
#: (``idle_in_transaction_session_timeout``).
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
#: A handler that ran at least this long before PostgreSQL ended the transaction for
#: sitting idle is taken for the cause when the timeout's value is not known (hookledger's
#: own pauses between statements are a few milliseconds).
STALLED_HANDLER_SECONDS = 1.0


class HandlerStalled(Exception):
    """A handler ran so long that PostgreSQL ended its transaction for sitting idle
    (``idle_in_transaction_session_timeout``, SQLSTATE 25P03): that handler's failure."""


class _HandlerEndedTransaction(Exception):
    """A handler ended the batch's transaction (on the driver's connection), or let it sit
    idle until PostgreSQL ended it: roll back, fail that handler, run the batch's events
    again one by one."""

    def __init__(self, event_pk: int, handler: str, error: Exception) -> None:
        super().__init__(str(error))
        self.event_pk = event_pk
        self.handler = handler
        self.error = error


@dataclass(slots=True)
class _Idle:
    """How long a batch's transaction has been quiet, and the handler that ran last
    (event pk, name, seconds): see :meth:`Dispatcher._stalled_handler`."""

    quiet_since: float
    last: tuple[int, str, float] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Work:
    """A claimed event and the handlers to run for it."""

    claimed: Claimed
    handlers: Sequence[HandlerCall]


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What :meth:`Dispatcher.dispatch` did: the status written (or ``lease_lost``)."""

    status: str
    ran: tuple[str, ...]
    failures: tuple[str, ...]
    #: Handlers failed by the dispatcher although they returned (a refused commit the
    #: handler caught, a transaction it ended), with their errors.
    refused: tuple[tuple[str, BaseException], ...] = ()


GuardState = tuple[
    dict[tuple[Any, Any, Any, Any], int],
    dict[tuple[Any, Any, Any], guard.Projected],
    dict[int, set[str]],
]


class Dispatcher:
    """Runs claimed events' handlers and records what happened, on one :class:`Storage`."""

    def __init__(
        self, storage: Storage, *, retry: RetryPolicy, rng: random.Random | None = None
    ) -> None:
        self.storage = storage
        self.retry = retry
        self._rng = rng or random.Random()
        self._sql = storage.sql

    def __repr__(self) -> str:
        return f"Dispatcher(dialect={self._sql.name!r})"

    def dispatch(
        self,
        claimed: Claimed,
        handlers: Sequence[HandlerCall],
        *,
        writing: AbstractContextManager[object] | None = None,
    ) -> Outcome:
        """Process one claimed event (see :meth:`dispatch_many`)."""
        return self.dispatch_many([Work(claimed=claimed, handlers=handlers)], writing=writing)[0]

    def dispatch_many(
        self, works: Sequence[Work], *, writing: AbstractContextManager[object] | None = None
    ) -> list[Outcome]:
        """Process claimed events (of distinct objects) in ONE transaction.

        For each event the guard decides first (:func:`receiver.core.guard.decide`); then each
        handler that has not yet succeeded runs, a handler that takes the session inside a
        savepoint of its own; the ledger rows, transitions, projections and the events'
        outcomes are written in the same transaction. A handler's writes through the session
        therefore commit exactly once, together with its ledger row. If any lease was lost
        meanwhile (another worker took over after expiry), the transaction is rolled back
        and the events are retried one by one, so only the event whose lease was lost is
        dropped (it belongs to the other worker now).

        ``writing`` is held from the outcomes' write to the commit: the lock the worker's
        lease renewals take (:class:`receiver.worker.runner.Worker`). The write locks the
        events' rows, then their object leases; a renewal locks the leases, then the events.
        Run at the same moment they deadlocked on PostgreSQL, and the database aborted one:
        the batch, whose handlers then ran again, or the renewal, whose lease then expired.
        """
        if not works:
            return []
        track = _Idle(quiet_since=time.monotonic())
        try:
            try:
                return self._dispatch_together(works, writing or nullcontext(), track)
            except SQLAlchemyError as exc:
                stalled = self._stalled_handler(exc, track)
                if stalled is None:
                    raise  # the database's failure, not a handler's: the caller retries
                raise stalled from exc
        except _HandlerEndedTransaction as ended:
            # Nothing of the transaction was kept (or, if the handler committed on the
            # driver's connection, what was kept has no ledger rows): the handler that ended
            # it fails alone, without running again, and every event of the batch is
            # dispatched again on its own.
            stalled_ = isinstance(ended.error, HandlerStalled)
            log.error(
                "%s: %s",
                "a handler stalled hookledger's transaction"
                if stalled_
                else "a handler ended hookledger's transaction",
                str(ended.error),
                extra={
                    "action": "handler_stalled" if stalled_ else "handler_ended_transaction",
                    "handler": ended.handler,
                },
            )
            return [
                self.dispatch_many([_failing(work, ended)], writing=writing)[0] for work in works
            ]
        except _LeaseLost:
            if len(works) == 1:
                log.warning(
                    "lease lost before the event was finished; its work is rolled back",
                    extra={
                        "action": "lease_lost",
                        "event_id": works[0].claimed.event_id,
                        "event_type": works[0].claimed.event_type,
                    },
                )
                return [Outcome(status="lease_lost", ran=(), failures=())]
            return [self.dispatch_many([work], writing=writing)[0] for work in works]

    def _stalled_handler(
        self, exc: SQLAlchemyError, track: _Idle
    ) -> _HandlerEndedTransaction | None:
        """When PostgreSQL ended the batch's transaction for sitting idle (25P03) while a
        handler ran past the timeout, that handler is the cause: its failure (attempt
        counted, retried with backoff). A stall of hookledger's own is the database's
        (``None``: the caller gives the leases back, no attempt counted)."""
        if sqlstate(exc) != IDLE_IN_TRANSACTION_TIMEOUT or track.last is None:
            return None
        event_pk, name, seconds = track.last
        idle = self._idle_timeout()
        # The transaction is never left quiet for over a third of the timeout between
        # handlers (see _keep_awake): the one that ran over half of it is the cause.
        if seconds < (idle / 2 if idle > 0 else STALLED_HANDLER_SECONDS):
            return None
        limit = f" of {idle:g} s (HOOKLEDGER_IDLE_IN_TRANSACTION_TIMEOUT)" if idle > 0 else ""
        return _HandlerEndedTransaction(
            event_pk,
            name,
            HandlerStalled(
                f"the handler ran {seconds:.1f} s, past the database's idle-in-transaction "
                f"timeout{limit}: its transaction was ended (SQLSTATE 25P03)"
            ),
        )

    def _idle_timeout(self) -> float:
        bounds = bounds_of(self.storage.engine)
        return bounds.idle_in_transaction_timeout if bounds is not None else 0.0

    def _keep_awake(self, conn: Connection, track: _Idle) -> None:
        """After a handler: if the transaction has been quiet (handlers that do not use the
        session, one after the other) for over a third of the idle-in-transaction timeout,
        one round trip, so that only a single handler that runs that long ends it, never a
        batch of short ones."""
        idle = self._idle_timeout()
        if idle > 0 and time.monotonic() - track.quiet_since > idle / 3:
            conn.exec_driver_sql("SELECT 1").scalar()
            track.quiet_since = time.monotonic()

    def finish(
        self,
        claimed: Claimed,
        *,
        status: str,
        error: str | None = None,
        writing: AbstractContextManager[object] | None = None,
    ) -> str | None:
        """Close a claimed event outside :meth:`dispatch` (an unparseable body, for example);
        returns the status written, or ``None`` when the lease was lost. ``writing``: as
        for :meth:`dispatch_many`."""
        now = self.storage.now()
        final = self._final(claimed, status, error, now)
        try:
            with writing or nullcontext(), self.storage.engine.begin() as conn:
                written = seal_outcomes(self.storage.keyring, Outcomes(finals=[final]))
                if not self._sql.write_outcomes(conn, written, now):
                    raise _LeaseLost()
        except _LeaseLost:
            return None
        return str(final["b_status"])

    # -- one batch ------------------------------------------------------------------------

    def _dispatch_together(
        self,
        works: Sequence[Work],
        writing: AbstractContextManager[object],
        track: _Idle,
    ) -> list[Outcome]:
        now = self.storage.now()
        outcomes: list[Outcome] = []
        transitions: list[dict[str, Any]] = []
        projections: list[dict[str, Any]] = []
        ledger: list[dict[str, Any]] = []
        finals: list[dict[str, Any]] = []
        # ``writing`` is entered on the stack below the transaction: it is let go after the
        # commit (or the rollback), not before.
        with ExitStack() as stack, self.storage.engine.begin() as conn:
            guards: list[TransactionGuard] = []

            def handler_guard() -> TransactionGuard:
                """The handlers' sessions' guard, made for the first handler that needs one."""
                if not guards:
                    guards.append(TransactionGuard(conn))
                return guards[0]

            if not self._still_held(conn, works, now):
                raise _LeaseLost()  # before any handler ran: retried one by one
            owners, currents, done = self._load_guard_state(conn, works)
            cutovers = read_cutovers(conn, {w.claimed.account for w in works})
            for work in works:
                c = work.claimed
                reading = _reading(c)
                key = reading.state.key if reading.state is not None else None
                verdict = guard.decide(
                    event_pk=c.pk,
                    incoming=reading.state,
                    event_time=c.event_time,
                    replay=c.replay_of is not None,
                    transition_owner=owners.get((c.account, c.object_kind, c.object_id, key)),
                    current=currents.get((c.account, c.object_kind, c.object_id)),
                    note=reading.note,
                    cutover=cutovers.get(c.account),
                    arrival=guard.Arrival(
                        source=c.source,
                        received_at=as_utc(c.received_at),
                        historical=c.source in Source.HISTORICAL,
                        observed=c.source == Source.API,
                        object_created=as_utc(c.object_created_at)
                        if c.object_created_at is not None
                        else None,
                    ),
                )
                owner = c.pk if verdict.owner is None else verdict.owner
                if verdict.claim is not None:
                    transitions.append(
                        {
                            "account": c.account,
                            "object_kind": c.object_kind,
                            "object_id": c.object_id,
                            "state": verdict.claim,
                            "event_pk": owner,
                            "created_at": now,
                        }
                    )
                if verdict.projection is not None:
                    projections.append(
                        {
                            "account": c.account,
                            "object_kind": c.object_kind,
                            "object_id": c.object_id,
                            "status": verdict.projection.status,
                            "stage": verdict.projection.stage,
                            "event_time": c.event_time,
                            "object_created_at": c.object_created_at,
                            "event_pk": owner,
                            "updated_at": now,
                        }
                    )
                if verdict.decision != "dispatch":
                    finals.append(self._final(c, verdict.decision, verdict.reason, now))
                    outcomes.append(Outcome(status=verdict.decision, ran=(), failures=()))
                    continue
                ran, failures, deferrals, only_conflicts, refused = self._run_handlers(
                    conn, handler_guard, c, work.handlers, done.get(c.pk, set()), ledger, now, track
                )
                if failures:
                    final = self._final(c, "failed", "\n".join(failures), now, soon=only_conflicts)
                elif deferrals:
                    final = self._deferred(c, deferrals, now)
                else:
                    final = self._final(c, EventStatus.DONE, None, now)
                finals.append(final)
                label = "deferred" if deferrals and not failures else final["b_status"]
                if label == "deferred" and final["b_status"] == EventStatus.DEAD:
                    label = EventStatus.DEAD
                outcomes.append(Outcome(status=label, ran=ran, failures=failures, refused=refused))
            written = Outcomes(
                transitions=transitions,
                projections=projections,
                ledger=ledger,
                finals=finals,
            )
            if guards:  # the settings the handlers may have changed, before our writes
                guards[0].restore()
            written = seal_outcomes(self.storage.keyring, written)  # error texts
            stack.enter_context(writing)
            if not self._sql.write_outcomes(conn, written, self.storage.now()):
                raise _LeaseLost()  # rolls back the handlers' writes too
        return outcomes

    def _still_held(self, conn: Connection, works: Sequence[Work], now: datetime) -> bool:
        """Whether the worker still holds every event of the batch (the event's lease and
        its object's lease name it), checked before any handler runs, so that a worker whose
        lease was taken over does not run the handlers the new owner runs.

        On SQLite the transaction holds the database's only write lock from here to its
        commit, and an expired lease that still names the worker is still its own (taking
        a lease writes the taker's name): its handlers may take longer than the lease, and
        the commit accepts it (:data:`receiver.storage.sql.sqlite.CLOSE_EVENT`). On
        PostgreSQL another worker may take an expired lease at any time, so it must be
        unexpired (the worker's heartbeat renews it while the handlers run); the commit
        checks again, under row locks."""
        pks = [w.claimed.pk for w in works]
        rows = conn.execute(
            select(EVENT.c.id, EVENT.c.lease_owner, LEASE.c.owner, LEASE.c.expires_at)
            .select_from(EVENT.join(LEASE, LEASE.c.object_key == EVENT.c.object_key))
            .where(self._sql.among(EVENT.c.id, pks))
        ).all()
        found = {int(r[0]): r for r in rows}
        for work in works:
            row = found.get(work.claimed.pk)
            if row is None or row[1] != work.claimed.owner or row[2] != work.claimed.owner:
                return False
            if not self._sql.single_writer and as_utc(row[3]) < now:
                return False
        return True

    def _load_guard_state(self, conn: Connection, works: Sequence[Work]) -> GuardState:
        """What the guard needs of a batch's objects: the owners of the incoming states'
        transitions, the objects' projections, and each event's handlers that succeeded."""
        guarded = [w.claimed for w in works if w.claimed.object_kind and w.claimed.object_id]
        wanted: set[tuple[str, str, str, str]] = {
            (c.account, c.object_kind or "", c.object_id or "", reading.state.key)
            for c in guarded
            if (reading := _reading(c)).state is not None
        }
        owners: dict[tuple[Any, Any, Any, Any], int] = dict(
            self._sql.transition_owners(conn, wanted)
        )
        objects = {(c.account, c.object_kind or "", c.object_id or "") for c in guarded}
        currents: dict[tuple[Any, Any, Any], guard.Projected] = {
            (r[0], r[1], r[2]): guard.Projected(
                state=make_state(r[1], r[3], r[4]), event_time=r[5], event_pk=int(r[6])
            )
            for r in self._sql.projections(conn, objects)
        }
        done = self._sql.succeeded_handlers(conn, [w.claimed.pk for w in works])
        return owners, currents, done

    def _run_handlers(
        self,
        conn: Connection,
        handler_guard: Callable[[], TransactionGuard],
        claimed: Claimed,
        handlers: Sequence[HandlerCall],
        done: set[str],
        ledger: list[dict[str, Any]],
        now: datetime,
        track: _Idle,
    ) -> tuple[
        tuple[str, ...],
        tuple[str, ...],
        tuple[Defer, ...],
        bool,
        tuple[tuple[str, BaseException], ...],
    ]:
        ran: list[str] = []
        failures: list[str] = []
        deferrals: list[Defer] = []
        transient: list[str] = []
        refused: list[tuple[str, BaseException]] = []
        for name, call, needs_session in handlers:
            if name in done:
                continue
            started = time.monotonic()
            try:
                if needs_session:
                    # In a savepoint of its own, with a session that cannot end the
                    # transaction; raises when the database was lost (the batch is aborted)
                    # or when the handler ended the transaction (the batch is dispatched
                    # again, one by one).
                    try:
                        with running_handler():
                            failure = handler_guard().run(call)
                    except TransactionEnded as ended:
                        raise _HandlerEndedTransaction(claimed.pk, name, ended.error) from ended
                else:
                    # No session, no savepoint: nothing of the handler's is in the transaction.
                    failure = None
                    try:
                        with running_handler():
                            call(cast(Session, None))
                    except Exception as exc:  # noqa: BLE001 - a handler may raise anything
                        failure = exc
            finally:
                # What the transaction sat idle on last (see Dispatcher._stalled_handler).
                track.last = (claimed.pk, name, time.monotonic() - started)
            if needs_session:  # its savepoint's release or rollback: the transaction is awake
                track.quiet_since = time.monotonic()
            else:
                self._keep_awake(conn, track)
            if failure is None:
                ledger.append(_ledger_row(claimed.pk, name, "succeeded", None, now))
                ran.append(name)
                continue
            # Judged by the connection, not the exception's class (SQLite reports almost
            # every SQL error as OperationalError, PostgreSQL a deadlock too): once the
            # handler's savepoint is rolled back, if the connection still answers, the
            # handler failed; otherwise the database did, and the batch is aborted.
            if is_database_error(failure) and not _answers(conn):
                if isinstance(failure, SQLAlchemyError):
                    raise failure
                raise DisconnectionError("the database stopped answering") from failure
            if isinstance(failure, HandlerTransactionError):
                refused.append((name, failure))
            if isinstance(failure, Defer):
                ledger.append(_ledger_row(claimed.pk, name, "deferred", failure.reason, now))
                deferrals.append(failure)
                continue
            if is_database_error(failure):
                _hide_parameters(failure)
                if is_transient_conflict(failure):
                    transient.append(name)
            ledger.append(_ledger_row(claimed.pk, name, "failed", _describe(failure), now))
            failures.append(f"{name}: {type(failure).__name__}: {_first_line(failure)}")
        only_conflicts = len(transient) == len(failures) > 0
        return tuple(ran), tuple(failures), tuple(deferrals), only_conflicts, tuple(refused)

    # -- how a claimed event is closed ----------------------------------------------------

    def _deferred(
        self, claimed: Claimed, deferrals: Sequence[Defer], now: datetime
    ) -> dict[str, Any]:
        """Close an event a handler deferred: due again later, the attempt given back; past
        the deferral limit (from its receipt), dead-lettered with the reason."""
        reason = "; ".join(dict.fromkeys(d.reason for d in deferrals))
        due = now + timedelta(seconds=max(d.seconds for d in deferrals))
        limit = as_utc(claimed.received_at) + timedelta(seconds=self.retry.defer_limit_seconds)
        if due > limit:
            log.error(
                "event dead-lettered: still deferred after the limit of %g s",
                self.retry.defer_limit_seconds,
                extra={
                    "action": "dead_letter",
                    "event_id": claimed.event_id,
                    "event_type": claimed.event_type,
                },
            )
            final = self._final(claimed, EventStatus.DEAD, None, now)
            final["b_error"] = (
                f"deferred past the limit of {self.retry.defer_limit_seconds:g} s: {reason}"
            )
            return final
        final = self._final(claimed, EventStatus.PENDING, f"{DEFERRED_PREFIX}{reason}", now)
        final.update(b_next=due, b_undo=1)
        return final

    def _final(
        self,
        claimed: Claimed,
        status: str,
        error: str | None,
        now: datetime,
        *,
        soon: bool = False,
    ) -> dict[str, Any]:
        """The row update that closes a claimed event (``b_`` keys, see
        :class:`receiver.storage.sql.Outcomes`)."""
        next_attempt = now
        if status == "failed":
            if claimed.attempts >= self.retry.max_attempts:
                status = EventStatus.DEAD
                log.error(
                    "event dead-lettered after %d attempts",
                    claimed.attempts,
                    extra={
                        "action": "dead_letter",
                        "event_id": claimed.event_id,
                        "event_type": claimed.event_type,
                    },
                )
            else:
                status = EventStatus.PENDING
                delay = self.retry.delay(claimed.attempts, self._rng)
                if soon:  # a conflict with another transaction: again soon, still counted
                    delay = min(delay, TRANSIENT_RETRY_SECONDS * self._rng.uniform(0.5, 1.0))
                next_attempt = now + timedelta(seconds=delay)
        finished = status in EventStatus.TERMINAL and status != EventStatus.DEAD
        return {
            "b_id": claimed.pk,
            "b_owner": claimed.owner,
            "b_key": claimed.object_key,
            "b_status": status,
            "b_error": error,
            "b_next": next_attempt,
            "b_processed": now if finished else None,
            "b_undo": 0,
        }


def _reading(claimed: Claimed) -> Reading:
    """The state a claimed event reports (see :func:`receiver.core.transitions.read_event`)."""
    if claimed.object_kind is None or claimed.object_id is None:
        return Reading(None)
    return read_event(
        claimed.object_kind, claimed.event_type, claimed.object_status, claimed.object_stage
    )


def _ledger_row(
    event_pk: int, handler: str, status: str, error: str | None, now: datetime
) -> dict[str, Any]:
    return {
        "event_pk": event_pk,
        "handler": handler,
        "status": status,
        "attempts": 1,
        "last_error": error,
        "updated_at": now,
    }


def _failing(work: Work, ended: _HandlerEndedTransaction) -> Work:
    """``work`` as it is dispatched again after a handler ended (or stalled) the batch's
    transaction:
    that handler (if it is one of this event's) fails with ``ended.error``, not run again."""
    if work.claimed.pk != ended.event_pk:
        return work

    def refuse(_session: Session) -> None:
        raise ended.error

    return Work(
        claimed=work.claimed,
        handlers=[
            (name, refuse, False) if name == ended.handler else (name, call, needs)
            for name, call, needs in work.handlers
        ],
    )


def _answers(conn: Connection) -> bool:
    """Whether the batch's connection still answers (after the handler's savepoint was rolled
    back, its transaction is usable again on both databases)."""
    try:
        conn.exec_driver_sql("SELECT 1").scalar()
    except SQLAlchemyError:
        return False
    return True


def _hide_parameters(exc: BaseException) -> None:
    """A handler's statement parameters (customer data, say) never reach the ledger or a log."""
    if isinstance(exc, StatementError):
        exc.hide_parameters = True


def _first_line(exc: BaseException) -> str:
    if is_database_error(exc):
        return describe_database_error(exc)
    return (str(exc).strip().splitlines() or [""])[0]


def _describe(exc: BaseException, limit: int = 4000) -> str:
    """The traceback a failed handler leaves in the ledger; a database error's last line
    names its class and SQLSTATE (its parameters are hidden, see :func:`_hide_parameters`)."""
    text_ = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if is_database_error(exc):
        text_ += describe_database_error(exc) + "\n"
    return text_[-limit:]
