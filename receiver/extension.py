"""The Flask extension: ``WebhookReceiver`` owns handlers and wires the blueprint and CLI.

::

    hooks = WebhookReceiver()

    @hooks.on("payment_succeeded")
    def fulfil(event): ...

    def create_app():
        app = Flask(__name__)
        hooks.init_app(app)          # reads HOOKLEDGER_* from app.config / environment
        return app
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click
from flask import Flask
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import receiver.storage.database as db
from receiver.cli.commands import hookledger_group
from receiver.config.settings import Settings
from receiver.core.accounts import (
    AccountSource,
    ChainedAccounts,
    StaticAccounts,
    object_key,
    owner_of_object,
)
from receiver.core.registry import Registry
from receiver.core.retry import RetryPolicy
from receiver.storage.account_table import StoredAccounts
from receiver.storage.handler_session import in_handler, running_session
from receiver.store import Store
from receiver.web.blueprint import make_blueprint
from receiver.web.state import EXTENSION_KEY, ReceiverState, receiver_state

if TYPE_CHECKING:
    from receiver.core.observe import Observation

F = TypeVar("F", bound=Callable[..., Any])


class WebhookReceiver:
    """Verified, durable, deduplicated webhook inbox with typed dispatch, as a Flask extension.

    Keyword arguments override the ``HOOKLEDGER_*`` settings (see :mod:`receiver.config.settings`).
    """

    def __init__(
        self, app: Flask | None = None, *, accounts: AccountSource | None = None, **overrides: Any
    ) -> None:
        """``accounts``: the merchant's own source of processor accounts (any object with
        ``get``, ``for_body`` and ``ids``, see :class:`receiver.core.accounts.AccountSource`),
        asked per delivery, after those of the configuration (``HOOKLEDGER_ACCOUNTS``) and of
        hookledger's own table (``hookledger accounts add``)."""
        self.registry = Registry()
        if accounts is not None and not isinstance(accounts, AccountSource):
            raise TypeError("accounts must have get(), for_body() and ids() (an AccountSource)")
        self._accounts = accounts
        self._overrides = overrides
        if app is not None:
            self.init_app(app)

    # Handler registration is delegated to the registry (import-time validation).
    def on(self, *event_types: str, name: str | None = None) -> Callable[[F], F]:
        """Register a handler for event types: ``@hooks.on("payment_succeeded")``."""
        return self.registry.on(*event_types, name=name)

    def on_class(self, *classes: str, name: str | None = None) -> Callable[[F], F]:
        """Register a handler for event classes: ``@hooks.on_class("refunds")``."""
        return self.registry.on_class(*classes, name=name)

    def on_any(self, name: str | None = None) -> Callable[[F], F]:
        """Register a catch-all handler."""
        return self.registry.on_any(name=name)

    def init_app(self, app: Flask) -> None:
        default_db = "sqlite:///" + os.path.join(app.instance_path, "hookledger.sqlite3")
        settings = Settings.resolve(
            app.config,
            self._overrides,
            default_database_url=default_db,
            external_accounts=self._accounts is not None,
        )
        if settings.database_url == default_db:
            os.makedirs(app.instance_path, exist_ok=True)
        engine = db.make_engine(
            settings.database_url, sqlite_busy_timeout=settings.sqlite_busy_timeout
        )

        def build_store(engine: Engine) -> Store:
            return Store(
                engine,
                write_wait=settings.sqlite_busy_timeout,
                headers=settings.stored_headers,
                keyring=settings.data.keyring,
                rejections=settings.data.rejections,
                order_fields=settings.data.order_fields,
                intake=settings.sqlite_intake_path or None,
                retry=RetryPolicy(
                    max_attempts=settings.max_attempts,
                    base_seconds=settings.backoff_base,
                    max_seconds=settings.backoff_max,
                    defer_limit_seconds=settings.defer_limit,
                ),
            )

        store = build_store(engine)

        worker_stores: dict[float, Store] = {}
        worker_stores_lock = threading.Lock()

        def worker_store(lease_seconds: float) -> Store:
            """PostgreSQL: the worker's own engine, every wait under its bounds
            (:mod:`receiver.storage.bounds`), one per lease for the app's life (each call
            made a new engine, whose connections stayed open until the garbage collector
            found it: one more server connection per ``worker`` command run in-process);
            SQLite: the app's store (its busy timeout bounds every wait)."""
            if db.is_sqlite(engine):
                return store
            with worker_stores_lock:
                made = worker_stores.get(lease_seconds)
                if made is None:
                    made = worker_stores[lease_seconds] = build_store(
                        db.make_engine(settings.database_url, bounds=settings.bounds(lease_seconds))
                    )
                return made

        if click.get_current_context(silent=True) is None:  # a web process, not a command
            settings.data.warn(f"hookledger ({app.name})")  # (the worker warns for itself)
        if settings.auto_migrate:
            db.upgrade(engine)
        configured = StaticAccounts(settings.accounts)
        # Configuration first, then hookledger's own table (``hookledger accounts``), then the
        # merchant's source: each read per delivery, so accounts come without a restart.
        stored: AccountSource = StoredAccounts(store.accounts)
        if self._accounts is not None:
            stored = ChainedAccounts(stored, self._accounts)
        source: AccountSource = ChainedAccounts(configured, stored)
        single = settings.accounts[0] if self._accounts is None and len(configured) == 1 else None
        state = ReceiverState(
            settings=settings,
            store=store,
            registry=self.registry,
            accounts=source,
            single=single,
            worker_store=worker_store,
        )
        app.extensions[EXTENSION_KEY] = state
        app.register_blueprint(make_blueprint(), url_prefix=settings.url_prefix)
        if "hookledger" not in app.cli.commands:
            app.cli.add_command(hookledger_group)

    @staticmethod
    def state(app: Flask | None = None) -> ReceiverState:
        """The receiver state of ``app`` (or of the current app)."""
        return receiver_state(app)

    def observe(
        self,
        resource: Mapping[str, Any],
        *,
        kind: str | None = None,
        session: Session | None = None,
        dispatch: bool = False,
        wait: float = 2.0,
        app: Flask | None = None,
        account: str | None = None,
    ) -> Observation:
        """Feed an object exactly as the processor's API returned it through the inbox.

        Its transition goes through the same guard and transition-once rule as webhooks
        (source ``api``): whichever of this response, the webhook and the reconciler comes
        first dispatches it; the others are recorded as duplicates.

        - ``session``: store the observation inside the caller's own transaction (a
          SQLAlchemy session on hookledger's database): it exists if and only if the caller
          commits. A worker dispatches it afterwards.
        - ``dispatch=True`` (without ``session``): run the handlers inline, now, in this
          process, after any earlier event of the object; the result's ``status`` says
          whether this call dispatched the transition (``done``) or found it dispatched
          already (``duplicate``); see the README ("Your own API calls") for every value.
          ``None`` means another worker holds the object, or an earlier event of it waits
          for a retry, for longer than ``wait`` seconds, or that this call's lease was taken
          over while the handlers ran (their session writes rolled back): it is queued, and
          a worker dispatches it. The lease is renewed while the handlers run.
        - ``account``: the processor account the object belongs to (see "Several
          accounts" in the README); an unknown account is a :class:`ConfigurationError`,
          and one that does not own the object (its ``merchant_id`` or ``profile_id`` is
          another account's) is refused with :class:`receiver.errors.NotTheAccounts`.
          Without it, the object goes to the account the shared URL would route its
          webhook to, by its merchant and profile
          (:func:`receiver.core.accounts.owner_of_object`); ``NotTheAccounts`` when no
          single account owns it.
        """
        from receiver.core.clock import utcnow
        from receiver.core.observe import Observation, build
        from receiver.storage.tables import Source

        state = self.state(app)
        if account is not None:
            state.account(account)  # raises for an unknown account, before reading
        kind, object_id, obj_state, event, body = build(resource, kind=kind, now=utcnow())
        key = obj_state.key if obj_state is not None else None
        if event is None or body is None:
            return Observation(
                kind=kind,
                object_id=object_id,
                state=key,
                event_type=None,
                event_id=None,
                stored="no_event",
            )
        # Called from a handler on SQLite: its worker holds the only write lock, so a write
        # of its own waited for it until the handler failed (StorageBusy, at every attempt:
        # a refund the handler made before it made again each time). Stored in the
        # handler's transaction when it took the session (kept if it succeeds), else in
        # the intake; a worker dispatches it (``status`` None).
        staged = False
        if session is None and in_handler() and db.is_sqlite(state.store.engine):
            running = running_session()
            if running is not None and running.bind_url == state.store.engine.url:
                session = running
            else:
                staged = True
            dispatch = False
        if session is not None and dispatch:
            raise ValueError(
                "dispatch=True runs the handlers after the observation is committed: call "
                "observe() after your commit, or without session="
            )
        account = owner_of_object(
            state.accounts,
            event.merchant_id,
            event.profile_id,
            account_id=account,
            single=state.single,
            about=f"the {kind} {object_id!r}",
        ).id
        if session is not None:
            inserted = state.store.inbox.insert_on(
                session.connection(), event, body, source=Source.API, account=account
            )
        else:
            inserted = state.store.inbox.insert(
                event, body, source=Source.API, account=account, may_stage=staged
            )
        status = None
        if dispatch and inserted.result != "conflict":
            # A name of its own per call: a lease names its holder, and two threads of one
            # process observing one object must not pass for one another.
            worker = state.worker(name=f"inline:{os.getpid()}:{uuid.uuid4().hex[:8]}")
            status = worker.process_object(
                object_key(account, kind, object_id), inserted.pk, wait=wait
            )
        return Observation(
            kind=kind,
            object_id=object_id,
            state=key,
            event_type=event.event_type,
            event_id=event.event_id,
            stored=inserted.result,
            status=status,
            pk=inserted.pk,
        )

    def drain(self, app: Flask) -> int:
        """Run every due event's handlers inline (tests, scripts); return how many ran."""
        return self.state(app).worker(name="inline").drain()


__all__ = ["EXTENSION_KEY", "ReceiverState", "WebhookReceiver"]
