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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from flask import Flask, current_app

from receiver import db
from receiver.blueprint import make_blueprint
from receiver.registry import Registry
from receiver.settings import Settings
from receiver.store import RetryPolicy, Store
from receiver.worker import Worker, WorkerConfig

F = TypeVar("F", bound=Callable[..., Any])

EXTENSION_KEY = "hookledger"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReceiverState:
    """What ``init_app`` leaves in ``app.extensions["hookledger"]``."""

    settings: Settings
    store: Store
    registry: Registry

    def worker(self, *, name: str | None = None, **overrides: float) -> Worker:
        config = WorkerConfig(
            lease_seconds=overrides.get("lease_seconds", self.settings.lease_seconds),
            poll_interval=overrides.get("poll_interval", self.settings.poll_interval),
            batch_size=int(overrides.get("batch_size", self.settings.batch_size)),
        )
        return Worker(self.store, self.registry, config, name=name)


class WebhookReceiver:
    """Verified, durable, deduplicated webhook inbox with typed dispatch, as a Flask extension.

    Keyword arguments override the ``HOOKLEDGER_*`` settings (see :mod:`receiver.settings`).
    """

    def __init__(self, app: Flask | None = None, **overrides: Any) -> None:
        self.registry = Registry()
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
        settings = Settings.resolve(app.config, self._overrides, default_database_url=default_db)
        if settings.database_url == default_db:
            os.makedirs(app.instance_path, exist_ok=True)
        engine = db.make_engine(
            settings.database_url, sqlite_busy_timeout=settings.sqlite_busy_timeout
        )
        store = Store(
            engine,
            write_wait=settings.sqlite_busy_timeout,
            retry=RetryPolicy(
                max_attempts=settings.max_attempts,
                base_seconds=settings.backoff_base,
                max_seconds=settings.backoff_max,
            ),
        )
        if settings.auto_migrate:
            db.upgrade(engine)
        state = ReceiverState(settings=settings, store=store, registry=self.registry)
        app.extensions[EXTENSION_KEY] = state
        app.register_blueprint(make_blueprint(), url_prefix=settings.url_prefix)
        from receiver.cli import hookledger_group

        if "hookledger" not in app.cli.commands:
            app.cli.add_command(hookledger_group)

    @staticmethod
    def state(app: Flask | None = None) -> ReceiverState:
        """The receiver state of ``app`` (or of the current app)."""
        target = app if app is not None else current_app
        try:
            state: ReceiverState = target.extensions[EXTENSION_KEY]
        except KeyError:
            raise RuntimeError("WebhookReceiver.init_app(app) was not called") from None
        return state

    def drain(self, app: Flask) -> int:
        """Run every due event's handlers inline (tests, scripts); return how many ran."""
        return self.state(app).worker(name="inline").drain()
