"""A merchant app for process-level tests (gunicorn web, worker processes).

Configured only from the environment (HOOKLEDGER_DATABASE_URL, HOOKLEDGER_SECRETS, ...).
Handlers write their side effect through the ledger's session, so a side effect that exists
was committed together with the handler's ledger row. An event whose payment metadata has
``hold_file`` blocks its first handler until that file is removed (to kill a worker mid-handler).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from receiver import Event, WebhookReceiver

hooks = WebhookReceiver()

EFFECT_TABLE = "proc_effect"


def _effect(session: Session, event: Event, handler: str) -> None:
    session.execute(
        sa.text(f"INSERT INTO {EFFECT_TABLE} (event_id, handler, pid) VALUES (:e, :h, :p)"),
        {"e": event.event_id, "h": handler, "p": os.getpid()},
    )


@hooks.on_any(name="first")
def first(event: Event, session: Session) -> None:
    metadata = (event.raw.get("content") or {}).get("object", {}).get("metadata") or {}
    hold = metadata.get("hold_file")
    if hold:
        Path(hold + ".started").write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while Path(hold).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    _effect(session, event, "first")


@hooks.on_any(name="second")
def second(event: Event, session: Session) -> None:
    _effect(session, event, "second")


def create_app() -> Flask:
    app = Flask(__name__)
    hooks.init_app(app)
    return app


def create_effect_table(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE TABLE IF NOT EXISTS {EFFECT_TABLE} "
                "(event_id VARCHAR(255), handler VARCHAR(32), pid INTEGER)"
            )
        )
