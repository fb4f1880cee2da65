"""The worker: claim an event under a lease, guard it, run its handlers, record the outcome.

Run it as its own process (``hookledger worker`` / ``flask hookledger worker``), as many
as you like on as many hosts as you like; or inline in tests (:meth:`Worker.drain`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

import receiver.core.signals as signals
from receiver.core.clock import as_utc
from receiver.core.defer import Defer
from receiver.core.errors import (
    BodyRedacted,
    DataUnavailable,
    MalformedEvent,
    StorageUnavailable,
)
from receiver.core.events import parse_event
from receiver.core.registry import Registry
from receiver.storage.bounds import answer_watch, phase
from receiver.storage.context import describe_database_error, is_busy, is_database_error
from receiver.storage.dispatch import HandlerCall, Outcome, Work
from receiver.storage.filelock import WritersLock
from receiver.storage.inbox import WRITERS_LOCK_SUFFIX
from receiver.storage.intake import IntakeUnreadable
from receiver.storage.queue import Claimed
from receiver.storage.tables import EventStatus, InboxEvent
from receiver.store import Store
from receiver.worker.heartbeat import Beater

log = logging.getLogger("receiver.worker")

#: Longer than SQLite's longest busy-handler sleep (100 ms).
SQLITE_LONG_PAUSE = 0.11
#: SQLite: how long one of the worker's transactions should hold the write lock; the events
#: of a batch are committed in turns of as many as fit (see :meth:`Worker._dispatch_in_turns`).
SQLITE_TURN_SECONDS = 0.02
#: SQLite: the worker leaves the lock free this long after each turn: more than the writers'
#: lock's polling interval, so a web process waiting on it gets in.
SQLITE_GAP_SECONDS = 0.001
#: SQLite: after holding the lock for this long in all (turns and short gaps), one gap of
#: :data:`SQLITE_LONG_PAUSE`, for writers that wait in SQLite's busy handler (the reconciler,
#: operators' commands) rather than on the writers' lock.
SQLITE_LONG_PAUSE_EVERY = 2.0
#: The first pause when the queue is found empty; each empty poll doubles it, up to
#: ``poll_interval``: under steady load the worker is back within milliseconds.
FIRST_IDLE_PAUSE = 0.01


def worker_name() -> str:
    """``host:pid:random``: unique per worker process, readable in the lease columns."""
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerConfig:
    lease_seconds: float = 60.0
    poll_interval: float = 0.5
    #: Events (of distinct objects) leased per claim transaction.
    batch_size: int = 64
    #: ``run(burst=True)``: give up (:attr:`Worker.gave_up`) once the database has not
    #: answered a round for this many seconds (``None``: never, it waits for it).
    give_up_after: float | None = None


class Worker:
    """Processes events one at a time. Thread-safe to stop from a signal handler."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        config: WorkerConfig | None = None,
        *,
        name: str | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.config = config or WorkerConfig()
        self.name = name or worker_name()
        self.stopping = threading.Event()
        self.processed = 0
        #: Write a heartbeat row while :meth:`run` runs (``hookledger status``, readiness).
        self.heartbeat = True
        #: SQLite file: the web processes' writers' lock, which the worker's transactions
        #: take too (see :meth:`_dispatch_in_turns`).
        self._writers = writers_lock(store)
        #: SQLite: events per transaction, adapted to :data:`SQLITE_TURN_SECONDS`.
        self._turn = 1
        self._held_since_long_pause = 0.0
        #: Claimed events of a batch the database failed under, to give back when it answers.
        self._stranded: list[Claimed] = []
        #: When the next error about an unreadable intake may be logged (one a minute).
        self._intake_error_quiet_until = 0.0
        #: ``run(burst=True)`` ended with webhooks left in SQLite's intake, or an intake it
        #: could not read: why (the ``worker`` command exits 1).
        self.intake_left: str | None = None
        #: ``run(burst=True)`` gave up: the database did not answer (PostgreSQL), or its lock
        #: stayed taken (SQLite), for :attr:`WorkerConfig.give_up_after` (the ``worker``
        #: command exits 5); :attr:`gave_up_because` says which.
        self.gave_up = False
        self.gave_up_because = ""
        #: The last round could not claim: another writer kept SQLite's writers' lock past
        #: the busy timeout (:meth:`run_once`).
        self._writers_were_busy = False
        #: Since when (monotonic) the database has not answered, on what it was waiting
        #: (reported by :meth:`stalled`, or a storage error), and whether a stall was logged
        #: meanwhile (once per outage): ``action=resumed`` ends it.
        self._trouble: tuple[float, str, bool] | None = None
        self._trouble_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Worker(name={self.name!r})"

    def stop(self) -> None:
        """Finish the current event, then return from :meth:`run`."""
        self.stopping.set()

    def run(self, *, burst: bool = False) -> int:
        """Process events until :meth:`stop` (or, with ``burst``, until none is due).

        Storage failures (database down, network cut) do not end the worker: it logs them,
        backs off and carries on, and nothing is lost meanwhile. The leases of the batch it
        was working on are given back (attempt returned) as soon as the database answers
        again, so those events need not wait for their leases to expire; ``burst`` does not
        return while it still holds one, unless the database has not answered for
        :attr:`WorkerConfig.give_up_after` seconds: then it gives up (:attr:`gave_up`; the
        leases expire). On PostgreSQL (:mod:`receiver.storage.bounds`) a wait that outlasts
        the statement timeout is logged (``action=stalled``), and the first round the
        database answers after a stall or a storage error is logged ``action=resumed``.
        """
        log.info("worker started", extra={"action": "worker_start", "worker": self.name})
        beater = Beater(self.store.engine, self.name) if self.heartbeat else None
        watch = answer_watch(self.store.engine)
        if watch is not None:
            watch.add_listener(self)
        pause = self.config.poll_interval
        idle = min(FIRST_IDLE_PAUSE, self.config.poll_interval)
        answered_at = time.monotonic()  # the end of the last round the database answered
        try:
            while not self.stopping.is_set():
                if beater is not None:
                    with phase("heartbeat"):
                        beater.beat(self.processed, monotonic=time.monotonic())
                try:
                    with phase("giving back leases"):
                        self._give_back_stranded()
                    worked = self.run_once()
                except SQLAlchemyError as exc:  # the database went away mid-batch, say
                    self._troubled(describe_database_error(exc))
                    if burst and self._give_up(answered_at, exc):
                        break
                    log.error(
                        "storage unavailable, retrying in %.1f s: %s",
                        pause,
                        describe_database_error(exc),
                        extra={"action": "worker_storage_error", "worker": self.name},
                    )
                    self.stopping.wait(pause)
                    pause = min(pause * 2, 10.0)
                    continue
                if self._writers_were_busy and burst:
                    # Not "no event is due": another writer kept the lock; try again, until
                    # the bound (on SQLite the lease).
                    if self._give_up(answered_at, None):
                        break
                    continue
                answered_at = time.monotonic()
                self._resumed()
                pause = self.config.poll_interval
                if worked:
                    idle = min(FIRST_IDLE_PAUSE, self.config.poll_interval)
                    continue
                if burst and not self._stranded:
                    self._warn_intake_left()
                    break
                self.stopping.wait(idle)
                idle = min(idle * 2, self.config.poll_interval)
        finally:
            if watch is not None:
                watch.remove_listener(self)
        if beater is not None:
            beater.stop()
        log.info(
            "worker stopped",
            extra={"action": "worker_stop", "worker": self.name, "processed": self.processed},
        )
        return self.processed

    def _give_up(self, answered_at: float, exc: SQLAlchemyError | None) -> bool:
        """``--burst``: whether to give up now, the database not having let a round through
        since ``answered_at`` (``exc``: its error; ``None``: SQLite's writers' lock stayed
        taken by another writer) for :attr:`WorkerConfig.give_up_after`; logged."""
        give_up = self.config.give_up_after
        waited = time.monotonic() - answered_at
        if give_up is None or waited < give_up:
            return False
        self.gave_up = True
        if exc is None:
            self.gave_up_because = (
                f"the database stayed locked for {waited:.1f} s (another writer kept its "
                "writers' lock)"
            )
        elif self.store.single_writer and is_busy(exc):
            self.gave_up_because = (
                f"the database stayed locked for {waited:.1f} s ({describe_database_error(exc)})"
            )
        else:
            self.gave_up_because = f"the database did not answer within {give_up:g} s"
        log.error(
            "%s, giving up (--burst)%s",
            self.gave_up_because
            if exc is None
            else f"storage unavailable for {waited:.1f} s: {describe_database_error(exc)}",
            f"; the leases of {len(self._stranded)} event(s) expire in "
            f"{self.config.lease_seconds:g} s"
            if self._stranded
            else "",
            extra={"action": "worker_gave_up", "worker": self.name},
        )
        return True

    # -- the watchdog (receiver.storage.bounds.StallListener) -----------------------------

    def stalled(self, waiting_on: str, phase: str, seconds: float) -> None:
        """The database has not answered one of this worker's statements for ``seconds``
        (called from the watch's thread): say on what it waits, once per stall."""
        what = f"{waiting_on} ({phase})" if phase else waiting_on
        if self._troubled(what, since=time.monotonic() - seconds, stall=True):
            log.warning(
                "the database has not answered for %.1f s: waiting on %s",
                seconds,
                what,
                extra={
                    "action": "stalled",
                    "worker": self.name,
                    "phase": phase,
                    "waiting_on": waiting_on,
                },
            )

    def answered(self, waiting_on: str, phase: str, seconds: float) -> None:
        """A stalled statement got its answer after all (its round then ends as usual)."""

    def _troubled(self, what: str, *, since: float | None = None, stall: bool = False) -> bool:
        """Note that the database is not answering; ``True`` if that is news: the first
        trouble since it last answered, or (``stall``) its first stall, after a storage
        error say (a connection that failed, then a reconnect that the server never
        answers)."""
        with self._trouble_lock:
            if self._trouble is not None:
                started, _what, stalled_before = self._trouble
                if not stall or stalled_before:
                    return False
                self._trouble = (started, what, True)
                return True
            self._trouble = (time.monotonic() if since is None else since, what, stall)
            return True

    def _resumed(self) -> None:
        with self._trouble_lock:
            trouble, self._trouble = self._trouble, None
        if trouble is None:
            return
        since, what, _stalled = trouble
        log.warning(
            "the database answers again after %.1f s (it was waiting on %s)",
            time.monotonic() - since,
            what,
            extra={"action": "resumed", "worker": self.name},
        )

    def _give_back_stranded(self) -> None:
        """Give back the leases of a batch the database failed under, once it answers again:
        each event that is still ours is pending again with its attempt returned (the outage
        was not the event's failure); one that was finished meanwhile is left alone."""
        while self._stranded:
            self.store.queue.release(self._stranded[-1])
            self._stranded.pop()

    def drain(self, *, max_events: int = 100_000) -> int:
        """Process every due event inline, then return how many were processed."""
        count = 0
        while count < max_events:
            done = self.run_once()
            if not done:
                break
            count += done
        return count

    def run_once(self) -> int:
        """Claim a batch of due events and process them; return how many were processed."""
        self._writers_were_busy = False
        waiting = self._intake_waits()
        if self.store.single_writer and not waiting and not self.store.queue.any_due():
            return 0  # found without taking the write lock
        entered = False
        try:
            with phase("claim"), self._writing():
                entered = True
                # Under the claim's writers' lock: no claim without the move before it, so an
                # object's earlier event waiting in the intake is its head, as in the inbox.
                if waiting:
                    self._move_intake()
                batch = self.store.queue.claim_batch(
                    self.name, self.config.lease_seconds, limit=self.config.batch_size
                )
        except TimeoutError:
            if entered:
                raise
            # Another writer held the writers' lock past the busy timeout (another worker's
            # handler running in its turn, say): nothing claimed, the next round tries again.
            self._writers_were_busy = True
            self._writers_busy("claiming again next round")
            return 0
        if not batch:
            return 0
        if self.stopping.is_set():
            for claimed in batch:
                self.store.queue.release(claimed)
            return 0
        heartbeat = _Heartbeat(self.store, batch, self.config.lease_seconds)
        heartbeat.start()
        timings: dict[int, _Timings] = {}
        try:
            with phase(f"dispatching {len(batch)} event(s)"):
                works = [
                    work
                    for claimed in batch
                    if (work := self._work(claimed, timings, heartbeat.writing)) is not None
                ]
                if self.store.single_writer and self._writers is not None:
                    outcomes = self._dispatch_in_turns(works, heartbeat.writing)
                elif self.store.single_writer:
                    outcomes = self._dispatch_yielding(works, heartbeat.writing)
                else:
                    outcomes = self.store.dispatcher.dispatch_many(works, writing=heartbeat.writing)
        except SQLAlchemyError:
            # The database failed under the batch (a handler's own failure is recorded, not
            # raised): its events stay ours until given back (see _give_back_stranded).
            self._stranded.extend(batch)
            raise
        finally:
            heartbeat.stop()
        self._report(works, outcomes, timings)
        self.processed += len(batch)
        return len(batch)

    def _intake_waits(self) -> bool:
        """SQLite file: whether webhooks wait in the intake (a read, no lock); an intake that
        cannot be read is logged by the move."""
        intake = self.store.inbox.intake
        try:
            return intake is not None and intake.any()
        except (SQLAlchemyError, StorageUnavailable):
            return True  # the move says what is wrong

    def _move_intake(self) -> None:
        """SQLite file: move the webhooks stored in the intake while the database's lock was
        held for long (by this worker's handlers, say) into the inbox, before claiming, under
        the claim's writers' lock (see :mod:`receiver.storage.intake`). The intake's lock
        staying taken only delays them to the next claim; the database's failure is the
        worker's (logged, backed off)."""
        try:
            moved = self.store.inbox.move_intake(writers_held=self._writers is not None)
        except TimeoutError:
            return
        except IntakeUnreadable as exc:
            # The intake file alone is broken: the inbox's events are dispatched meanwhile
            # (`hookledger status` names the problem; the web processes refuse webhooks).
            now = time.monotonic()
            if now >= self._intake_error_quiet_until:
                self._intake_error_quiet_until = now + 60.0
                log.error(
                    "the intake %s cannot be read (%s): its webhooks wait, the inbox's "
                    "events are dispatched",
                    self.store.inbox.intake.path if self.store.inbox.intake else "",
                    describe_database_error(exc.__cause__ or exc),
                    extra={"action": "intake_unreadable", "worker": self.name},
                )
            return
        except StorageUnavailable as exc:
            cause = exc.__cause__
            if isinstance(cause, SQLAlchemyError):
                raise cause from exc
            return  # the intake's lock stayed taken: the next claim tries again
        if moved:
            log.debug(
                "%d webhook(s) moved from the intake into the inbox",
                moved,
                extra={"action": "intake_moved", "worker": self.name},
            )

    def _warn_intake_left(self) -> None:
        """``--burst`` ends with webhooks still in the intake only when the database's lock
        stayed taken past the busy timeout while it tried to move them: say so."""
        intake = self.store.inbox.intake
        try:
            left = intake is not None and intake.any()
        except (SQLAlchemyError, StorageUnavailable) as exc:
            # An unreadable intake (or one of another database) holds webhooks nobody can
            # count: ``--burst`` must not end as if every due event was dispatched.
            self.intake_left = f"the intake cannot be read ({describe_database_error(exc)})"
            return
        if left:
            self.intake_left = "webhooks are still in the intake"
            log.warning(
                "webhooks are still in the intake (the intake's lock stayed taken, the intake "
                "cannot be read, or a row the inbox refuses): the next worker run moves them",
                extra={"action": "intake_left", "worker": self.name},
            )

    def _writers_busy(self, what: str) -> None:
        """Say that the writers' lock stayed held past the busy timeout by another writer."""
        log.info(
            "the writers' lock stayed taken for %g s (another writer: a worker's handler "
            "running, say); %s",
            self.store.busy_timeout,
            what,
            extra={"action": "writers_busy", "worker": self.name},
        )

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """SQLite file: hold the writers' lock for the block (the web processes queue on it
        rather than in SQLite's busy handler, which sleeps up to 100 ms between tries)."""
        if self._writers is None:
            yield
            return
        with self._writers.hold(self.store.busy_timeout):
            yield

    def _dispatch_in_turns(self, works: list[Work], writing: threading.Lock) -> list[Outcome]:
        """SQLite file: commit the batch in turns, each one transaction of as many events as
        fit in about :data:`SQLITE_TURN_SECONDS` (one event at first; twice as many after a
        quicker turn, half as many after one over twice that), each under the writers' lock the web
        processes queue on, with a gap after each so that a waiting web process gets in
        within a turn. A turn is one fsync for all its events, where one transaction per
        event made the worker wait on the disk once per event."""
        outcomes: list[Outcome] = []
        done = 0
        while done < len(works):
            turn = works[done : done + self._turn]
            entered = False
            try:
                with self._writing():
                    entered = True
                    started = time.monotonic()
                    outcomes.extend(self.store.dispatcher.dispatch_many(turn, writing=writing))
            except TimeoutError:
                if entered:
                    raise
                # Another writer (another worker's long handler) held the writers' lock past
                # the busy timeout: this batch's events are leased to us, wait for our turn.
                self._writers_busy("this batch's next turn waits for it")
                continue
            held = time.monotonic() - started
            done += len(turn)
            # A turn's time is mostly its commit (an fsync) until its handlers take longer.
            if held < SQLITE_TURN_SECONDS:
                self._turn = min(self._turn * 2, max(1, self.config.batch_size))
            elif held > 2 * SQLITE_TURN_SECONDS:
                self._turn = max(1, self._turn // 2)
            self._held_since_long_pause += held + SQLITE_GAP_SECONDS
            if self._held_since_long_pause >= SQLITE_LONG_PAUSE_EVERY:
                self._held_since_long_pause = 0.0
                self.stopping.wait(SQLITE_LONG_PAUSE)
            else:
                self.stopping.wait(SQLITE_GAP_SECONDS)
        return outcomes

    def _dispatch_yielding(self, works: list[Work], writing: threading.Lock) -> list[Outcome]:
        """SQLite has one writer at a time, and a writer waiting for the lock (a webhook being
        stored) sleeps between attempts, up to 100 ms: a worker committing back to back would
        starve it into a 503. So on SQLite each event gets its own transaction, and the
        worker then leaves the lock free: as long as the transaction took (at least 2 ms), or
        110 ms after a transaction of 50 ms or more, so that any waiter's next attempt lands
        in the gap."""
        outcomes: list[Outcome] = []
        for work in works:
            started = time.monotonic()
            outcomes.extend(self.store.dispatcher.dispatch_many([work], writing=writing))
            held = time.monotonic() - started
            self.stopping.wait(SQLITE_LONG_PAUSE if held >= 0.05 else max(0.002, held))
        return outcomes

    def process(self, claimed: Claimed, *, writing: threading.Lock | None = None) -> str:
        """Guard ``claimed`` and run its pending handlers; return the status written.
        ``writing``: the lock the lease's renewals take (:class:`_Heartbeat`), if any."""
        timings: dict[int, _Timings] = {}
        work = self._work(claimed, timings, writing)
        if work is None:  # closed without dispatch: dead, or failed and waiting for a retry
            return self.store.queue.status_of(claimed.pk) or EventStatus.DEAD
        outcome = self.store.dispatcher.dispatch(work.claimed, work.handlers, writing=writing)
        self._report([work], [outcome], timings)
        return outcome.status

    def process_object(self, object_key: str, event_pk: int, *, wait: float = 2.0) -> str | None:
        """Process one object's events inline, in order, up to and including ``event_pk``;
        return that event's status, or ``None`` when it could not be reached within ``wait``
        seconds (another worker holds the object, or an earlier event of it waits for a
        retry), or when this call lost its lease to another worker while the handlers ran
        (their writes through the session are rolled back): it is then queued, and a worker
        dispatches it.

        The lease is renewed while the handlers run, as :meth:`run_once` renews a batch's,
        so a handler slower than the lease runs once.
        """
        deadline = time.monotonic() + wait
        for _ in range(1000):
            claimed = self.store.queue.claim_object(
                self.name, object_key, self.config.lease_seconds
            )
            if claimed is None:
                status = self.store.queue.status_of(event_pk)
                if status not in EventStatus.OPEN or time.monotonic() >= deadline:
                    return status if status not in EventStatus.OPEN else None
                self.stopping.wait(0.02)
                continue
            heartbeat = _Heartbeat(self.store, [claimed], self.config.lease_seconds)
            heartbeat.start()
            try:
                status = self.process(claimed, writing=heartbeat.writing)
            finally:
                heartbeat.stop()
            if claimed.pk == event_pk:
                # Lost to another worker (or closed by it): that worker's answer, not ours.
                return None if status in _TAKEN_OVER else status
        return None

    def _work(
        self, claimed: Claimed, timings: dict[int, _Timings], writing: threading.Lock | None
    ) -> Work | None:
        try:
            event = parse_event(self.store.open_body(claimed.body, claimed.event_id))
            if claimed.account != event.account:
                event = replace(event, account=claimed.account)
        except MalformedEvent as exc:  # stored by an older version, or edited by hand
            if self.store.dispatcher.finish(
                claimed, status=EventStatus.DEAD, error=str(exc), writing=writing
            ):
                log.error(
                    "event dead-lettered: its stored body cannot be parsed",
                    extra=_about(claimed, action="dead_letter"),
                )
                signals.send(
                    signals.event_dead_lettered,
                    **_info(claimed),
                    reason=f"unparseable body: {exc}",
                    attempts=claimed.attempts,
                )
            return None
        except BodyRedacted as exc:  # never dispatch what retention emptied
            if self.store.dispatcher.finish(
                claimed, status=EventStatus.DEAD, error=exc.message, writing=writing
            ):
                log.error(
                    "event dead-lettered: its body was redacted",
                    extra=_about(claimed, action="dead_letter"),
                )
                signals.send(
                    signals.event_dead_lettered,
                    **_info(claimed),
                    reason="body redacted",
                    attempts=claimed.attempts,
                )
            return None
        except DataUnavailable as exc:  # a data key missing here: retried, then dead-lettered
            log.error(
                "event body cannot be opened: %s",
                exc.message,
                extra=_about(claimed, action="data_key_error"),
            )
            written = self.store.dispatcher.finish(
                claimed, status="failed", error=f"body {exc.message}", writing=writing
            )
            if written == EventStatus.DEAD:
                signals.send(
                    signals.event_dead_lettered,
                    **_info(claimed),
                    reason=f"body {exc.message}",
                    attempts=claimed.attempts,
                )
            return None
        timed = timings.setdefault(claimed.pk, _Timings())
        handlers: list[HandlerCall] = [
            (spec.name, timed.wrap(spec.name, partial(spec.call, event)), spec.wants_session)
            for spec in self.registry.handlers_for(event.event_type)
        ]
        return Work(claimed=claimed, handlers=handlers)

    def _report(
        self, works: list[Work], outcomes: list[Outcome], timings: dict[int, _Timings]
    ) -> None:
        """Log each outcome (every line with the event's id and type) and send the signals,
        after the outcomes were committed."""
        reasons = self._reasons(
            [w.claimed.pk for w, o in zip(works, outcomes, strict=True) if o.status in _GUARDED]
        )
        now = self.store.now()
        for work, outcome in zip(works, outcomes, strict=True):
            claimed = work.claimed
            info = _info(claimed)
            timed = timings.get(claimed.pk, _Timings())
            for name, error in outcome.refused:  # failed although it returned
                timed.fail(name, error)
            for name, status, seconds, error in timed.runs():
                signals.send(
                    signals.handler_finished,
                    **info,
                    handler=name,
                    status=status,
                    duration_seconds=seconds,
                )
                if status == "failed":
                    log.warning(
                        "handler failed: %s: %s",
                        type(error).__name__,
                        describe_database_error(error)
                        if is_database_error(error)
                        else _first_line(str(error)),
                        extra=_about(claimed, action="handler_failed", handler=name),
                    )
                    signals.send(
                        signals.handler_failed,
                        **info,
                        handler=name,
                        error=error,
                        attempts=claimed.attempts,
                        will_retry=outcome.status != EventStatus.DEAD,
                    )
            if outcome.status in _GUARDED:
                reason = reasons.get(claimed.pk) or ""
                log.info(
                    "event not dispatched (%s): %s",
                    outcome.status,
                    reason,
                    extra=_about(claimed, action=outcome.status),
                )
                signal = (
                    signals.event_stale
                    if outcome.status == EventStatus.STALE
                    else signals.event_duplicate
                )
                signals.send(signal, **info, reason=reason)
            elif outcome.status == EventStatus.DONE:
                latency = max(0.0, (now - as_utc(claimed.received_at)).total_seconds())
                log.debug(
                    "event dispatched",
                    extra=_about(claimed, action="dispatched", latency_seconds=round(latency, 3)),
                )
                signals.send(
                    signals.event_dispatched,
                    **info,
                    handlers=outcome.ran,
                    attempts=claimed.attempts,
                    latency_seconds=latency,
                )
            elif outcome.status == EventStatus.DEAD:
                reason = (
                    f"out of attempts ({claimed.attempts}): {_first_line(outcome.failures[0])}"
                    if outcome.failures
                    else "deferred past the deferral limit"
                )
                signals.send(
                    signals.event_dead_lettered, **info, reason=reason, attempts=claimed.attempts
                )

    def _reasons(self, pks: list[int]) -> dict[int, str]:
        """The guard's reasons (kept in ``last_error``) of the events it did not dispatch."""
        if not pks:
            return {}
        table = InboxEvent.__table__  # type: ignore[attr-defined]
        try:
            with self.store.deferred.connect() as conn:
                rows = conn.execute(
                    select(table.c.id, table.c.last_error).where(table.c.id.in_(pks))
                )
                return {int(r.id): r.last_error or "" for r in rows}
        except SQLAlchemyError:  # only the reasons are missing from the logs
            return {}


def writers_lock(store: Store) -> WritersLock | None:
    """The writers' lock of a SQLite database file (the one its web processes queue on, see
    :mod:`receiver.storage.filelock`); ``None`` on PostgreSQL or an in-memory database."""
    if not store.single_writer:
        return None
    database = store.engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return WritersLock(database + WRITERS_LOCK_SUFFIX)


#: What :meth:`Worker.process` answers when another worker took the event over.
_TAKEN_OVER = ("lease_lost", EventStatus.PROCESSING)

#: Outcomes the guard decided (the event was recorded, not dispatched).
_GUARDED = (EventStatus.STALE, EventStatus.DUPLICATE)


def _info(claimed: Claimed) -> dict[str, Any]:
    """The keyword arguments every event signal carries."""
    return {
        "event_id": claimed.event_id,
        "event_type": claimed.event_type,
        "account": claimed.account,
        "source": claimed.source,
        "object_key": claimed.object_key,
    }


def _about(claimed: Claimed, **extra: Any) -> dict[str, Any]:
    """The ``extra`` of a log line about an event: always its id and type."""
    return {"event_id": claimed.event_id, "event_type": claimed.event_type, **extra}


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0][:200]


@dataclass(slots=True)
class _Timings:
    """How long each handler of one event took and how it ended (the latest run of each:
    a batch retried one by one after a lost lease runs its handlers again)."""

    _runs: dict[str, tuple[str, float, Any]] = field(default_factory=dict)

    def wrap(self, name: str, call: Callable[[Session], None]) -> Callable[[Session], None]:
        def timed(session: Session) -> None:
            started = time.perf_counter()
            try:
                call(session)
            except Defer as exc:
                self._runs[name] = ("deferred", time.perf_counter() - started, exc)
                raise
            except Exception as exc:
                self._runs[name] = ("failed", time.perf_counter() - started, exc)
                raise
            self._runs[name] = ("succeeded", time.perf_counter() - started, None)

        return timed

    def fail(self, name: str, error: BaseException) -> None:
        """The dispatcher failed ``name`` although it returned (a refused commit it caught)."""
        _status, seconds, _error = self._runs.get(name, ("failed", 0.0, None))
        self._runs[name] = ("failed", seconds, error)

    def runs(self) -> list[tuple[str, str, float, Any]]:
        return [(name, status, secs, err) for name, (status, secs, err) in self._runs.items()]


class _Heartbeat:
    """Renews the leases of a claimed batch every third of the lease while it is processed.

    A renewal and the batch's outcome write never run at the same time: both take
    :attr:`writing` (see :meth:`receiver.storage.dispatch.Dispatcher.dispatch_many`, where
    the write holds it to its commit). They lock the same rows in opposite orders, and on
    PostgreSQL they deadlocked. (On SQLite a renewal waits for the write lock the dispatch
    holds to its commit, so it takes no lock of its own: waiting for each other there would
    last until SQLite's busy timeout.)"""

    def __init__(self, store: Store, batch: list[Claimed], lease_seconds: float) -> None:
        self._store = store
        self._held = {c.pk: c for c in batch}
        self._lease = lease_seconds
        self._lock = threading.Lock()
        self.writing = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hookledger-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def forget(self, claimed: Claimed) -> None:
        with self._lock:
            self._held.pop(claimed.pk, None)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=self._lease)

    def _run(self) -> None:
        while not self._done.wait(self._lease / 3):
            with self._lock:
                held = list(self._held.values())
            if not held:
                return
            try:
                with phase("renewing leases"):
                    with nullcontext() if self._store.single_writer else self.writing:
                        kept = self._store.queue.renew(held, self._lease)
            except Exception as exc:  # noqa: BLE001 - keep trying; the lease may still hold
                # Named, not traced: a database error's text carries the statement's
                # parameters. On SQLite a renewal waits for (and may time out on) the write
                # lock the dispatch holds while its handlers run; the lease needs no renewal
                # meanwhile, since nobody else can take it (see Dispatcher._still_held).
                log.log(
                    logging.DEBUG if self._store.single_writer else logging.WARNING,
                    "could not renew the lease: %s",
                    type(getattr(exc, "orig", None) or exc).__name__,
                    extra={"action": "lease_renew"},
                )
                continue
            if kept < len(held):
                log.warning(
                    "%d lease(s) lost while handlers ran",
                    len(held) - kept,
                    extra={"action": "lease_lost"},
                )
