"""What ``init_app`` leaves on the app, and how the blueprint and the commands find it.

The blueprint (:mod:`receiver.web.blueprint`), the console and the commands
(:mod:`receiver.cli.commands`) depend on this module, never on the extension
(:mod:`receiver.extension`), which depends on all of them: the imports point one way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, current_app, has_app_context

from receiver.config.settings import Settings
from receiver.core import signals
from receiver.core.accounts import Account, AccountSource, StaticAccounts, is_account_id
from receiver.core.errors import ConfigurationError
from receiver.core.registry import Registry
from receiver.store import Store
from receiver.worker.runner import Worker, WorkerConfig


def current_app_or_none() -> Any:
    """The current Flask app when an application context is active, else ``None``: the
    sender of a signal sent without one (see :mod:`receiver.core.signals`)."""
    if has_app_context():
        return current_app._get_current_object()  # type: ignore[attr-defined]
    return None


signals.set_sender_finder(current_app_or_none)

#: The key of the receiver's state in ``app.extensions``.
EXTENSION_KEY = "hookledger"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReceiverState:
    """What ``init_app`` leaves in ``app.extensions["hookledger"]``."""

    settings: Settings
    store: Store
    registry: Registry
    #: Every account this installation serves (configuration, then the merchant's source).
    accounts: AccountSource = field(default_factory=lambda: StaticAccounts(()))
    #: The one account when it is the only one there can be (configuration only, one
    #: account): the shared URL takes every delivery as its, as before accounts existed.
    single: Account | None = None
    #: The worker process's store for its lease (PostgreSQL: an engine of its own, every
    #: wait bounded, see :mod:`receiver.storage.bounds`); ``None``: :attr:`store`.
    worker_store: Callable[[float], Store] | None = None

    def account(self, account_id: str) -> Account:
        """The account ``account_id``, or :class:`ConfigurationError` if there is none."""
        found = self.accounts.get(account_id) if is_account_id(account_id) else None
        if found is None:
            raise ConfigurationError(f"unknown account {str(account_id)[:80]!r}")
        return found

    def worker(
        self,
        *,
        name: str | None = None,
        bounded: bool = False,
        lease_seconds: float | None = None,
        poll_interval: float | None = None,
        batch_size: int | None = None,
    ) -> Worker:
        """A worker on the app's store; ``bounded`` (the ``worker`` command): on the
        worker's own, whose every wait for PostgreSQL is bounded, and which ``--burst``
        gives up on after :attr:`WorkerConfig.give_up_after`: on PostgreSQL the client-side
        bound on an answer, on SQLite (whose waits are for the write lock: the statement
        timeout does not apply) the lease."""
        lease = self.settings.lease_seconds if lease_seconds is None else lease_seconds
        answer = None if self.store.single_writer else self.settings.bounds(lease).answer_timeout
        config = WorkerConfig(
            lease_seconds=lease,
            poll_interval=self.settings.poll_interval if poll_interval is None else poll_interval,
            batch_size=self.settings.batch_size if batch_size is None else batch_size,
            give_up_after=answer if answer is not None else lease,
        )
        store = self.store
        if bounded and self.worker_store is not None:
            store = self.worker_store(lease)
        return Worker(store, self.registry, config, name=name)


def receiver_state(app: Flask | None = None) -> ReceiverState:
    """The receiver state of ``app`` (or of the current app)."""
    target = app if app is not None else current_app
    try:
        state: ReceiverState = target.extensions[EXTENSION_KEY]
    except KeyError:
        raise RuntimeError("WebhookReceiver.init_app(app) was not called") from None
    return state
