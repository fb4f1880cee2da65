"""A merchant app with hookledger's metrics (and, with HOOKLEDGER_CONSOLE_PASSWORD, the ops
console) mounted, configured from the environment, for process-level tests."""

from __future__ import annotations

import os

from flask import Flask

from receiver import Event, WebhookReceiver
from receiver.web.metrics import Metrics

hooks = WebhookReceiver()
metrics = Metrics()


@hooks.on("payment_succeeded")
def ship(event: Event) -> None:
    pass


@hooks.on("payment_failed")
def notify(event: Event) -> None:
    raise RuntimeError("mail server down")


def create_app() -> Flask:
    app = Flask(__name__)
    hooks.init_app(app)
    metrics.init_app(app)
    if os.environ.get("HOOKLEDGER_CONSOLE_PASSWORD"):
        from receiver.web.console import Console

        app.secret_key = os.environ.get("OPSAPP_SECRET_KEY", "opsapp-test-secret-key")
        Console(app)
    return app
