"""The shop of the world model: a Flask app with hookledger's receiver, and handlers written
the way shops write them.

``shop.fulfil`` takes the session and writes a row to the shop's own table
(``model_shop_dispatch``) for every transition it handles: the rows that commit are the
dispatches that counted (a handler whose work rolled back did not ship anything). How the
next calls behave is the model's choice, one *mood* per call: ``ok``, ``raise`` (an
exception), ``defer`` (:class:`receiver.Defer`), ``rollback`` (the ``except IntegrityError:
session.rollback()`` idempotency pattern, then it goes on), ``commit``
(``session.commit()`` after its write), ``slow``
(runs longer than the lease: the clock moves on while it runs; on PostgreSQL another worker
takes the expired lease over meanwhile) or ``kill`` (the worker dies mid-batch: nothing
after this point runs, its leases stay until they expire). ``shop.notify`` takes no
session and fails now and then on its own (a mood of its own), so that events end with one
handler done and one to retry.

Every call is journaled with what the handler saw, and checked against the processor's
truth: the account's own merchant, profile and object.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from receiver import Defer, Event, WebhookReceiver
from receiver.core.transitions import read_event
from receiver.store import Store
from receiver.worker.runner import Worker

MOODS = ("ok", "raise", "defer", "rollback", "commit", "slow", "kill")

METADATA = sa.MetaData()
SHOP = sa.Table(
    "model_shop_dispatch",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("account", sa.String(64), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("object_id", sa.String(128), nullable=False),
    sa.Column("state", sa.String(128), nullable=False),
    sa.Column("event_id", sa.String(255), nullable=False),
)
#: The shop's idempotency keys: one is taken before every example (the mood ``rollback``
#: inserts it again, gets the ``IntegrityError``, and rolls back, as shops do).
TAKEN = sa.Table(
    "model_shop_key",
    METADATA,
    sa.Column("key", sa.String(64), primary_key=True),
)


class WorkerKilled(BaseException):  # noqa: N818 - not an error: the process is gone
    """Raised inside a handler to stop its worker dead, mid-batch (no ``except Exception``
    catches it: the batch's transaction rolls back and its leases stay held)."""


@dataclass(frozen=True)
class Call:
    """One handler call, as the handler saw it."""

    account: str
    kind: str
    object_id: str
    state: str
    merchant_id: str | None
    profile_id: str | None
    event_id: str
    mood: str


def transition_of(event: Event) -> tuple[str, str, str] | None:
    ref = event.object_ref
    if ref is None:
        return None
    reading = read_event(ref.kind, event.event_type, ref.status, ref.stage)
    if reading.state is None:
        return None
    return ref.kind, ref.object_id, reading.state.key


class Shop:
    """The shop's app, its handlers and their journal (see the module docstring)."""

    def __init__(
        self,
        app: Flask,
        hooks: WebhookReceiver,
        *,
        frozen: Any,
        lease_seconds: float,
        takeover: bool,
        check: Callable[[Call], str | None],
    ) -> None:
        self.app = app
        self.hooks = hooks
        self.frozen = frozen
        self.lease_seconds = lease_seconds
        #: PostgreSQL: a slow handler's expired lease is taken over by another worker.
        self.takeover = takeover
        self._check = check
        self.moods: deque[str] = deque()
        self.notify_moods: deque[str] = deque()
        self.calls: list[Call] = []
        self.violations: list[str] = []
        self._rival = threading.local()
        self._workers = 0
        hooks.on_any(name="shop.fulfil")(self._fulfil)
        hooks.on_any(name="shop.notify")(self._notify)

    @property
    def store(self) -> Store:
        return WebhookReceiver.state(self.app).store

    def worker(self) -> Worker:
        self._workers += 1
        return WebhookReceiver.state(self.app).worker(name=f"model-worker-{self._workers}")

    # -- the handlers ---------------------------------------------------------------------

    def _fulfil(self, event: Event, session: Session) -> None:
        moved = transition_of(event)
        if moved is None:
            return
        kind, object_id, state = moved
        rival = getattr(self._rival, "active", False)
        mood = "ok" if rival or not self.moods else self.moods.popleft()
        call = Call(
            account=event.account,
            kind=kind,
            object_id=object_id,
            state=state,
            merchant_id=event.merchant_id,
            profile_id=event.profile_id,
            event_id=event.event_id,
            mood=mood,
        )
        self.calls.append(call)
        problem = self._check(call)
        if problem is not None:
            self.violations.append(problem)
        if mood == "slow":
            self.frozen.tick(timedelta(seconds=self.lease_seconds * 1.5))
            if self.takeover:
                self._take_over()
        if mood == "rollback":
            try:  # the usual idempotency pattern, then the handler goes on
                session.execute(TAKEN.insert().values(key="taken"))
                session.flush()
            except IntegrityError:
                session.rollback()
        session.execute(
            SHOP.insert().values(
                account=event.account,
                kind=kind,
                object_id=object_id,
                state=state,
                event_id=event.event_id,
            )
        )
        if mood == "raise":
            raise RuntimeError("the shop could not reserve stock")
        if mood == "defer":
            raise Defer(120, "the order is not written yet")
        if mood == "commit":
            session.commit()  # the shop commits its own work
        elif mood == "kill":
            raise WorkerKilled()

    def _notify(self, event: Event) -> None:
        if self.notify_moods and not getattr(self._rival, "active", False):
            if self.notify_moods.popleft() == "raise":
                raise RuntimeError("the mail server did not answer")

    def _take_over(self) -> None:
        """Another worker, in another thread, claims what this one's expired lease held and
        runs it (its handler calls are plain ``ok``)."""
        rival = self.worker()
        failure: list[BaseException] = []

        def run() -> None:
            self._rival.active = True
            try:
                rival.drain()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                failure.append(exc)

        thread = threading.Thread(target=run, name="model-rival-worker")
        thread.start()
        thread.join(timeout=60)
        if failure:
            raise failure[0]

    # -- what committed -------------------------------------------------------------------

    def dispatched(self) -> dict[tuple[str, str, str, str], int]:
        """(account, kind, object id, state) -> how many committed dispatches."""
        with self.store.engine.connect() as conn:
            rows = conn.execute(
                sa.select(SHOP.c.account, SHOP.c.kind, SHOP.c.object_id, SHOP.c.state)
            ).all()
        found: dict[tuple[str, str, str, str], int] = {}
        for row in rows:
            key = (row[0], row[1], row[2], row[3])
            found[key] = found.get(key, 0) + 1
        return found

    def event_ids(self, key: tuple[str, str, str, str]) -> list[str]:
        """The events whose dispatch of ``key`` committed."""
        account, kind, object_id, state = key
        with self.store.engine.connect() as conn:
            return list(
                conn.execute(
                    sa.select(SHOP.c.event_id).where(
                        SHOP.c.account == account,
                        SHOP.c.kind == kind,
                        SHOP.c.object_id == object_id,
                        SHOP.c.state == state,
                    )
                ).scalars()
            )
