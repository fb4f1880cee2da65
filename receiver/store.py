"""The durable inbox, as one object: :class:`Store` builds the parts of the store on one
engine and holds them; callers use the part that does the job (``store.inbox.insert``,
``store.queue.claim_batch``, ``store.dispatcher.dispatch_many``, ``store.operations.requeue``):

- ``inbox`` (:class:`receiver.storage.inbox.Inbox`): insert-or-ignore of deliveries;
- ``queue`` (:class:`receiver.storage.queue.Queue`): claims under object leases, renewals;
- ``dispatcher`` (:class:`receiver.storage.dispatch.Dispatcher`): the guard, the handlers,
  the ledger and the outcomes;
- ``operations`` (:class:`receiver.storage.operator_actions.Operations`): requeue, replay,
  prune, listings, counts, cut-over;
- ``accounts`` (:class:`receiver.storage.account_table.AccountTable`): the accounts kept in
  ``hookledger_account``, sealed;
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
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import Engine

from receiver.atrest.key_rotation import KeyRotation
from receiver.atrest.rejected_deliveries import RejectionLog
from receiver.atrest.retention import Retention
from receiver.config.data_at_rest import RejectionPolicy
from receiver.core.clock import Clock, utcnow
from receiver.core.headers import (
    stored_headers,
)
from receiver.core.keyring import Keyring
from receiver.core.order_refs import OrderFields
from receiver.core.retry import RetryPolicy
from receiver.storage.account_table import AccountTable
from receiver.storage.context import Storage
from receiver.storage.dispatch import Dispatcher
from receiver.storage.inbox import Inbox
from receiver.storage.intake import Intake, register, resolve
from receiver.storage.operator_actions import Operations
from receiver.storage.queue import Queue
from receiver.storage.sealed_columns import open_body, open_headers


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
        order_fields: OrderFields | None = None,
        intake: str | None = None,
    ) -> None:
        """``write_wait``: on SQLite, how long a delivery waits for this process's other
        threads' inserts before it gives up with :class:`StorageUnavailable` (use the busy
        timeout). ``headers``: request header names stored with each delivery besides
        :data:`receiver.core.headers.DEFAULT_STORED_HEADERS` (every other header is dropped).
        ``keyring``: the data keys payloads are sealed with (none: stored in the clear).
        ``rejections``: how rejected deliveries are recorded. ``order_fields``: the shop's
        order reference fields each stored event is indexed by (default
        :data:`receiver.core.order_refs.DEFAULT_ORDER_FIELDS`). ``intake``: a SQLite file's
        intake (:mod:`receiver.storage.intake`): its path, ``"off"`` for none, ``None`` for
        the default (``<database>-intake``)."""
        self.storage = Storage(engine, clock=clock, keyring=keyring, order_fields=order_fields)
        self._write_wait = write_wait
        self.retry = retry or RetryPolicy()
        intake_path = resolve(engine, intake)
        register(engine, intake_path)
        self.inbox = Inbox(
            self.storage,
            write_wait=write_wait,
            headers=stored_headers(headers),
            intake=Intake(intake_path, busy_timeout=write_wait, database=engine.url.database)
            if intake_path
            else None,
        )
        self.queue = Queue(self.storage, retry=self.retry)
        self.dispatcher = Dispatcher(self.storage, retry=self.retry, rng=rng)
        self.operations = Operations(self.storage, inbox=self.inbox)
        self.retention = Retention(self.storage)
        self.rotation = KeyRotation(self.storage)
        self.rejections = RejectionLog(self.storage, rejections)
        self.accounts = AccountTable(self.storage)

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

    @property
    def busy_timeout(self) -> float:
        """SQLite: how long a write waits for the lock (the ``write_wait`` given)."""
        return self._write_wait


__all__ = ["Store"]
