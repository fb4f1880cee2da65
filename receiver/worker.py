"""The worker: claim an event under a lease, guard it, run its handlers, record the outcome.

Run it as its own process (``hookledger worker`` / ``flask hookledger worker``), as many
as you like on as many hosts as you like; or inline in tests (:meth:`Worker.drain`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from functools import partial

from receiver.errors import MalformedEvent
from receiver.events import parse_event
from receiver.models import EventStatus
from receiver.registry import Registry
from receiver.store import Claimed, Store

log = logging.getLogger("receiver.worker")


def worker_name() -> str:
    """``host:pid:random``: unique per worker process, readable in the lease columns."""
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerConfig:
    lease_seconds: float = 60.0
    poll_interval: float = 0.5


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
        """Process events until :meth:`stop` (or, with ``burst``, until none is due)."""
        log.info("worker started", extra={"action": "worker_start", "worker": self.name})
        while not self.stopping.is_set():
            if self.run_once():
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
        while count < max_events and self.run_once():
            count += 1
        return count

    def run_once(self) -> bool:
        """Claim and process one event; ``False`` when nothing was due."""
        claimed = self.store.claim(self.name, self.config.lease_seconds)
        if claimed is None:
            return False
        if self.stopping.is_set():
            self.store.release(claimed)
            return False
        heartbeat = _Heartbeat(self.store, claimed, self.config.lease_seconds)
        heartbeat.start()
        try:
            self.process(claimed)
        finally:
            heartbeat.stop()
        self.processed += 1
        return True

    def process(self, claimed: Claimed) -> str:
        """Guard ``claimed`` and run its pending handlers; return the status written."""
        extra = {"event_id": claimed.event_id, "event_type": claimed.event_type}
        try:
            event = parse_event(claimed.body)
        except MalformedEvent as exc:
            return self.store.finish(claimed, status=EventStatus.DEAD, error=str(exc))
        decision, reason = self.store.decide(claimed)
        if decision != "dispatch":
            log.info("event not dispatched: %s", reason, extra={"action": decision, **extra})
            return self.store.finish(claimed, status=decision, error=reason)
        done = self.store.succeeded_handlers(claimed.pk)
        failures: list[str] = []
        for spec in self.registry.handlers_for(event.event_type):
            if spec.name in done:
                continue
            error = self.store.run_handler(claimed, spec.name, partial(spec.call, event))
            if error is None:
                log.debug("handler succeeded", extra={"action": "handled", "handler": spec.name})
            else:
                failures.append(f"{spec.name}: {type(error).__name__}: {error}")
                log.warning(
                    "handler failed: %s",
                    type(error).__name__,
                    extra={"action": "handler_failed", "handler": spec.name, **extra},
                )
        if failures:
            return self.store.finish(claimed, status="failed", error="\n".join(failures))
        return self.store.finish(claimed, status=EventStatus.DONE)


class _Heartbeat:
    """Renews the current event's leases every third of the lease while handlers run."""

    def __init__(self, store: Store, claimed: Claimed, lease_seconds: float) -> None:
        self._store = store
        self._claimed = claimed
        self._lease = lease_seconds
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hookledger-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=self._lease)

    def _run(self) -> None:
        while not self._done.wait(self._lease / 3):
            try:
                if not self._store.renew(self._claimed, self._lease):
                    log.warning(
                        "lease lost while handlers ran",
                        extra={"action": "lease_lost", "event_id": self._claimed.event_id},
                    )
                    return
            except Exception:  # noqa: BLE001 - keep trying; the lease may still hold
                log.exception("could not renew the lease", extra={"action": "lease_renew"})
