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
from dataclasses import dataclass
from functools import partial

from sqlalchemy.exc import SQLAlchemyError

from receiver.dispatch import Outcome, Work
from receiver.errors import BodyRedacted, DataUnavailable, MalformedEvent
from receiver.events import parse_event
from receiver.models import EventStatus
from receiver.queue import Claimed
from receiver.registry import Registry
from receiver.store import Store

log = logging.getLogger("receiver.worker")

#: Longer than SQLite's longest busy-handler sleep (100 ms).
SQLITE_LONG_PAUSE = 0.11


def worker_name() -> str:
    """``host:pid:random``: unique per worker process, readable in the lease columns."""
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerConfig:
    lease_seconds: float = 60.0
    poll_interval: float = 0.5
    #: Events (of distinct objects) leased per claim transaction.
    batch_size: int = 64


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

    def __repr__(self) -> str:
        return f"Worker(name={self.name!r})"

    def stop(self) -> None:
        """Finish the current event, then return from :meth:`run`."""
        self.stopping.set()

    def run(self, *, burst: bool = False) -> int:
        """Process events until :meth:`stop` (or, with ``burst``, until none is due).

        Storage failures (database down, network cut) do not end the worker: it logs them,
        backs off and carries on; its leases expire and nothing is lost meanwhile.
        """
        log.info("worker started", extra={"action": "worker_start", "worker": self.name})
        pause = self.config.poll_interval
        while not self.stopping.is_set():
            try:
                worked = self.run_once()
            except SQLAlchemyError as exc:  # the database went away mid-batch, for example
                log.error(
                    "storage unavailable, retrying in %.1f s: %s",
                    pause,
                    type(getattr(exc, "orig", None) or exc).__name__,
                    extra={"action": "worker_storage_error", "worker": self.name},
                )
                self.stopping.wait(pause)
                pause = min(pause * 2, 10.0)
                continue
            pause = self.config.poll_interval
            if worked:
                continue
            if burst:
                break
            self.stopping.wait(self.config.poll_interval)
        log.info(
            "worker stopped",
            extra={"action": "worker_stop", "worker": self.name, "processed": self.processed},
        )
        return self.processed

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
        batch = self.store.claim_batch(
            self.name, self.config.lease_seconds, limit=self.config.batch_size
        )
        if not batch:
            return 0
        if self.stopping.is_set():
            for claimed in batch:
                self.store.release(claimed)
            return 0
        heartbeat = _Heartbeat(self.store, batch, self.config.lease_seconds)
        heartbeat.start()
        try:
            works = [work for claimed in batch if (work := self._work(claimed)) is not None]
            if self.store.single_writer:
                outcomes = self._dispatch_yielding(works)
            else:
                outcomes = self.store.dispatch_many(works)
        finally:
            heartbeat.stop()
        for work, outcome in zip(works, outcomes, strict=True):
            self._log(work.claimed, outcome)
        self.processed += len(batch)
        return len(batch)

    def _dispatch_yielding(self, works: list[Work]) -> list[Outcome]:
        """SQLite has one writer at a time, and a writer waiting for the lock (a webhook being
        stored) sleeps between attempts, up to 100 ms: a worker committing back to back would
        starve it into a 503. So on SQLite each event gets its own transaction, and the
        worker then leaves the lock free: as long as the transaction took (at least 2 ms), or
        110 ms after a transaction of 50 ms or more, so that any waiter's next attempt lands
        in the gap."""
        outcomes: list[Outcome] = []
        for work in works:
            started = time.monotonic()
            outcomes.extend(self.store.dispatch_many([work]))
            held = time.monotonic() - started
            self.stopping.wait(SQLITE_LONG_PAUSE if held >= 0.05 else max(0.002, held))
        return outcomes

    def process(self, claimed: Claimed) -> str:
        """Guard ``claimed`` and run its pending handlers; return the status written."""
        work = self._work(claimed)
        if work is None:  # closed without dispatch: dead, or failed and waiting for a retry
            return self.store.status_of(claimed.pk) or EventStatus.DEAD
        outcome = self.store.dispatch(work.claimed, work.handlers)
        self._log(claimed, outcome)
        return outcome.status

    def process_object(self, object_key: str, event_pk: int, *, wait: float = 2.0) -> str | None:
        """Process one object's events inline, in order, up to and including ``event_pk``;
        return that event's status, or ``None`` when it could not be reached within ``wait``
        seconds (another worker holds the object, or an earlier event of it waits for a
        retry): it is then queued, and a worker dispatches it.
        """
        deadline = time.monotonic() + wait
        for _ in range(1000):
            claimed = self.store.claim_object(self.name, object_key, self.config.lease_seconds)
            if claimed is None:
                status = self.store.status_of(event_pk)
                if status not in EventStatus.OPEN or time.monotonic() >= deadline:
                    return status if status not in EventStatus.OPEN else None
                self.stopping.wait(0.02)
                continue
            status = self.process(claimed)
            if claimed.pk == event_pk:
                return status
        return None

    def _work(self, claimed: Claimed) -> Work | None:
        try:
            event = parse_event(self.store.open_body(claimed.body, claimed.event_id))
        except MalformedEvent as exc:  # stored by an older version, or edited by hand
            self.store.finish(claimed, status=EventStatus.DEAD, error=str(exc))
            return None
        except BodyRedacted as exc:  # never dispatch what retention emptied
            self.store.finish(claimed, status=EventStatus.DEAD, error=exc.message)
            return None
        except DataUnavailable as exc:  # a data key missing here: retried, then dead-lettered
            log.error(
                "event body cannot be opened: %s",
                exc.message,
                extra={"action": "data_key_error", "event_id": claimed.event_id},
            )
            self.store.finish(claimed, status="failed", error=f"body {exc.message}")
            return None
        handlers = [
            (spec.name, partial(spec.call, event), spec.wants_session)
            for spec in self.registry.handlers_for(event.event_type)
        ]
        return Work(claimed=claimed, handlers=handlers)

    @staticmethod
    def _log(claimed: Claimed, outcome: Outcome) -> None:
        extra = {"event_id": claimed.event_id, "event_type": claimed.event_type}
        if outcome.status in (EventStatus.STALE, EventStatus.DUPLICATE):
            log.info("event not dispatched", extra={"action": outcome.status, **extra})
        for failure in outcome.failures:
            log.warning(
                "handler failed: %s",
                failure.split("\n", 1)[0][:200],
                extra={"action": "handler_failed", **extra},
            )


class _Heartbeat:
    """Renews the leases of a claimed batch every third of the lease while it is processed."""

    def __init__(self, store: Store, batch: list[Claimed], lease_seconds: float) -> None:
        self._store = store
        self._held = {c.pk: c for c in batch}
        self._lease = lease_seconds
        self._lock = threading.Lock()
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
                kept = self._store.renew(held, self._lease)
            except Exception:  # noqa: BLE001 - keep trying; the lease may still hold
                log.exception("could not renew the lease", extra={"action": "lease_renew"})
                continue
            if kept < len(held):
                log.warning(
                    "%d lease(s) lost while handlers ran",
                    len(held) - kept,
                    extra={"action": "lease_lost"},
                )
