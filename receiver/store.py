"""The durable inbox, as one object: :class:`Store` composes the four parts of the store.

- :class:`receiver.storage.inbox.Inbox`: insert-or-ignore of deliveries (the receive path);
- :class:`receiver.storage.queue.Queue`: claims under object leases, renewals, releases;
- :class:`receiver.storage.dispatch.Dispatcher`: the guard, the handlers, the ledger and
  the outcomes;
- :class:`receiver.storage.operator_actions.Operations`: requeue, replay, prune, listings,
  counts, cut-over;
- data at rest: :class:`receiver.atrest.retention.Retention` (redact, prune by policy),
  :class:`receiver.atrest.key_rotation.KeyRotation` (``rotate-keys``) and
  :class:`receiver.atrest.rejected_deliveries.RejectionLog` (rejected deliveries); the data keys
  (:class:`receiver.core.keyring.Keyring`) seal what :mod:`receiver.storage.sealed_columns` lists.

They share one :class:`receiver.storage.context.Storage` (engine, clock, the dialect's
statements from :mod:`receiver.storage.sql`). Every operation is one short transaction;
correctness never depends on a check followed by a separate write.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine

import receiver.core.guard as guard
from receiver.atrest.key_rotation import KeyRotation
from receiver.atrest.rejected_deliveries import RejectionLog
from receiver.atrest.retention import Retention
from receiver.config.data_at_rest import RejectionPolicy
from receiver.core.clock import Clock, utcnow
from receiver.core.events import Event
from receiver.core.headers import (
    stored_headers,
)
from receiver.core.keyring import Keyring
from receiver.core.retry import RetryPolicy
from receiver.storage.context import Storage
from receiver.storage.dispatch import Dispatcher, HandlerCall, Outcome, Work
from receiver.storage.inbox import Inbox, Inserted
from receiver.storage.operator_actions import EventFilter, Operations
from receiver.storage.queue import Claimed, Queue
from receiver.storage.sealed_columns import open_body, open_headers
from receiver.storage.tables import (
    HandlerRun,
    InboxEvent,
    Projection,
    Source,
)


class Store:
    """The inbox and its ledgers on one SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Clock = utcnow,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
        write_wait: float = 5.0,
        headers: Iterable[str] = (),
        keyring: Keyring | None = None,
        rejections: RejectionPolicy | None = None,
    ) -> None:
        """``write_wait``: on SQLite, how long a delivery waits for this process's other
        threads' inserts before it gives up with :class:`StorageUnavailable` (use the busy
        timeout). ``headers``: request header names stored with each delivery besides
        :data:`receiver.core.headers.DEFAULT_STORED_HEADERS` (every other header is dropped).
        ``keyring``: the data keys payloads are sealed with (none: stored in the clear).
        ``rejections``: how rejected deliveries are recorded."""
        self.storage = Storage(engine, clock=clock, keyring=keyring)
        self._write_wait = write_wait
        self.retry = retry or RetryPolicy()
        self.inbox = Inbox(self.storage, write_wait=write_wait, headers=stored_headers(headers))
        self.queue = Queue(self.storage, retry=self.retry)
        self.dispatcher = Dispatcher(self.storage, retry=self.retry, rng=rng)
        self.operations = Operations(self.storage, inbox=self.inbox)
        self.retention = Retention(self.storage)
        self.rotation = KeyRotation(self.storage)
        self.rejections = RejectionLog(self.storage, rejections)

    def __repr__(self) -> str:
        return f"Store(dialect={self.engine.dialect.name!r})"

    @property
    def engine(self) -> Engine:
        return self.storage.engine

    @property
    def deferred(self) -> Engine:
        """The engine for reads (and write-first inserts): on SQLite a deferred ``BEGIN``."""
        return self.storage.deferred

    @property
    def clock(self) -> Clock:
        return self.storage.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self.storage.clock = clock

    @property
    def single_writer(self) -> bool:
        """SQLite: one writer at a time for the whole database (the worker yields to others)."""
        return self.storage.single_writer

    def now(self) -> datetime:
        return self.storage.now()

    @property
    def keyring(self) -> Keyring:
        """The data keys stored payloads are sealed with (see
        :mod:`receiver.storage.sealed_columns`)."""
        return self.storage.keyring

    def open_body(self, body: bytes, event_id: str) -> bytes:
        """The plaintext of a stored body (an :class:`InboxEvent`'s or a :class:`Claimed`'s
        ``body``, with its ``event_id``). Raises :class:`receiver.core.errors.BodyRedacted` for a
        redacted event, :class:`receiver.core.errors.DataUnavailable` when its key is missing."""
        return open_body(self.storage.keyring, body, event_id)

    def open_headers(self, headers: str, event_id: str) -> dict[str, str]:
        """The stored request headers of an event (``{}`` once redacted)."""
        return open_headers(self.storage.keyring, headers, event_id)

    # -- receive (receiver.storage.inbox) ---------------------------------------------------------

    def insert(
        self,
        event: Event,
        body: bytes,
        *,
        headers: Iterable[tuple[str, str]] = (),
        secret_id: str | None = None,
        source: str = Source.WEBHOOK,
        replay_of: int | None = None,
    ) -> Inserted:
        """See :meth:`receiver.storage.inbox.Inbox.insert`."""
        return self.inbox.insert(
            event, body, headers=headers, secret_id=secret_id, source=source, replay_of=replay_of
        )

    def insert_on(
        self,
        conn: Connection,
        event: Event,
        body: bytes,
        *,
        source: str,
        headers: Iterable[tuple[str, str]] = (),
        secret_id: str | None = None,
    ) -> Inserted:
        """See :meth:`receiver.storage.inbox.Inbox.insert_on`."""
        return self.inbox.insert_on(
            conn, event, body, source=source, headers=headers, secret_id=secret_id
        )

    def insert_synthesised(
        self,
        events: Sequence[tuple[Event, bytes]],
        *,
        source: str = Source.RECONCILE,
        unless_queued: bool = False,
    ) -> dict[str, str]:
        """See :meth:`receiver.storage.inbox.Inbox.insert_synthesised`."""
        return self.inbox.insert_synthesised(events, source=source, unless_queued=unless_queued)

    def waiting(self, object_keys: Iterable[str]) -> set[str]:
        """See :meth:`receiver.storage.inbox.Inbox.waiting`."""
        return self.inbox.waiting(object_keys)

    # -- claim and lease (receiver.storage.queue) -------------------------------------------------

    def claim(self, owner: str, lease_seconds: float) -> Claimed | None:
        """See :meth:`receiver.storage.queue.Queue.claim`."""
        return self.queue.claim(owner, lease_seconds)

    def claim_batch(
        self, owner: str, lease_seconds: float, *, limit: int = 16, scan: int | None = None
    ) -> list[Claimed]:
        """See :meth:`receiver.storage.queue.Queue.claim_batch`."""
        return self.queue.claim_batch(owner, lease_seconds, limit=limit, scan=scan)

    def any_due(self) -> bool:
        """See :meth:`receiver.storage.queue.Queue.any_due`."""
        return self.queue.any_due()

    @property
    def busy_timeout(self) -> float:
        """How long a write waits for the database's lock (the inbox's ``write_wait``)."""
        return self._write_wait

    def claim_object(self, owner: str, object_key: str, lease_seconds: float) -> Claimed | None:
        """See :meth:`receiver.storage.queue.Queue.claim_object`."""
        return self.queue.claim_object(owner, object_key, lease_seconds)

    def status_of(self, pk: int) -> str | None:
        """See :meth:`receiver.storage.queue.Queue.status_of`."""
        return self.queue.status_of(pk)

    def renew(self, claimed: Sequence[Claimed], lease_seconds: float) -> int:
        """See :meth:`receiver.storage.queue.Queue.renew`."""
        return self.queue.renew(claimed, lease_seconds)

    def release(self, claimed: Claimed) -> None:
        """See :meth:`receiver.storage.queue.Queue.release`."""
        self.queue.release(claimed)

    # -- dispatch (receiver.storage.dispatch) -----------------------------------------------------

    def dispatch(self, claimed: Claimed, handlers: Sequence[HandlerCall]) -> Outcome:
        """See :meth:`receiver.storage.dispatch.Dispatcher.dispatch`."""
        return self.dispatcher.dispatch(claimed, handlers)

    def dispatch_many(self, works: Sequence[Work]) -> list[Outcome]:
        """See :meth:`receiver.storage.dispatch.Dispatcher.dispatch_many`."""
        return self.dispatcher.dispatch_many(works)

    def finish(self, claimed: Claimed, *, status: str, error: str | None = None) -> str | None:
        """See :meth:`receiver.storage.dispatch.Dispatcher.finish`."""
        return self.dispatcher.finish(claimed, status=status, error=error)

    # -- operator (receiver.storage.operator_actions)
    # ---------------------------------------------------

    def select_events(self, flt: EventFilter) -> list[InboxEvent]:
        """See :meth:`receiver.storage.operator_actions.Operations.select_events`."""
        return self.operations.select_events(flt)

    def requeue(self, flt: EventFilter, *, dry_run: bool = False) -> list[InboxEvent]:
        """See :meth:`receiver.storage.operator_actions.Operations.requeue`."""
        return self.operations.requeue(flt, dry_run=dry_run)

    def replay(
        self, flt: EventFilter, *, dry_run: bool = False, parse: Callable[[bytes], Event]
    ) -> list[tuple[InboxEvent, str]]:
        """See :meth:`receiver.storage.operator_actions.Operations.replay`."""
        return self.operations.replay(flt, dry_run=dry_run, parse=parse)

    def prune(
        self, older_than: timedelta, *, include_dead: bool = False, dry_run: bool = False
    ) -> dict[str, int]:
        """See :meth:`receiver.storage.operator_actions.Operations.prune`."""
        return self.operations.prune(older_than, include_dead=include_dead, dry_run=dry_run)

    def stats(self) -> tuple[dict[str, int], float | None]:
        """See :meth:`receiver.storage.operator_actions.Operations.stats`."""
        return self.operations.stats()

    def health(self) -> tuple[dict[str, int], float | None]:
        """The same as :meth:`stats` (its former name)."""
        return self.operations.stats()

    def schema_revision(self) -> str | None:
        """See :meth:`receiver.storage.operator_actions.Operations.schema_revision`."""
        return self.operations.schema_revision()

    def counts(self) -> dict[str, int]:
        """See :meth:`receiver.storage.operator_actions.Operations.counts`."""
        return self.operations.counts()

    def get(self, event_id: str) -> InboxEvent | None:
        """See :meth:`receiver.storage.operator_actions.Operations.get`."""
        return self.operations.get(event_id)

    def handler_runs(self, event_pk: int) -> dict[str, HandlerRun]:
        """See :meth:`receiver.storage.operator_actions.Operations.handler_runs`."""
        return self.operations.handler_runs(event_pk)

    def projection(self, kind: str, object_id: str) -> Projection | None:
        """See :meth:`receiver.storage.operator_actions.Operations.projection`."""
        return self.operations.projection(kind, object_id)

    def cutover(self) -> guard.CutOver | None:
        """See :meth:`receiver.storage.operator_actions.Operations.cutover`."""
        return self.operations.cutover()

    def cutover_mode(self) -> str | None:
        """See :meth:`receiver.storage.operator_actions.Operations.cutover_mode`."""
        return self.operations.cutover_mode()

    def set_cutover(self, mode: str, at: datetime | None) -> None:
        """See :meth:`receiver.storage.operator_actions.Operations.set_cutover`."""
        self.operations.set_cutover(mode, at)


__all__ = ["Store"]
