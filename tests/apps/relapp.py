"""A merchant app for the reliability suite (tests/reliability): storms, crashes, outages.

Configured only from the environment. Three catch-all handlers run in this order:

- ``effect_a`` (takes the session): inserts a row into ``rel_effect`` through the ledger's
  session, then sleeps ``RELAPP_SLEEP`` seconds *inside* the transaction, so a SIGKILL during
  the sleep lands after the side effect was written and before it was committed;
- ``runlog`` (no session, at-least-once): appends ``<event_id> <pid> <failed_before>`` to the
  file ``RELAPP_RUNLOG`` (one ``O_APPEND`` write per run), then sleeps ``RELAPP_SLEEP``;
  ``failed_before`` is 1 when ``effect_b`` had already failed for the event (see below);
- ``effect_b`` (takes the session): like ``effect_a``.

``rel_effect`` deliberately has no unique constraint: a second run would show up as a second
row. With ``RELAPP_PROGRESS_DIR`` set, every handler appends ``start <event> <handler>`` and
``end <event> <handler>`` lines to ``<dir>/<pid>.log``, so a test can tell that a worker is
in the middle of a handler before it kills it.

With ``RELAPP_FAIL_DIR`` set, ``effect_b`` raises at its first run for an event whose id
contains ``_failfirst`` (it leaves a marker file ``<dir>/<event_id>`` to know), so that event
is retried with ``effect_a`` and ``runlog`` already recorded as succeeded.
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

EFFECT_TABLE = "rel_effect"
HANDLERS = ("effect_a", "runlog", "effect_b")
SESSION_HANDLERS = ("effect_a", "effect_b")


def _sleep() -> None:
    seconds = float(os.environ.get("RELAPP_SLEEP") or 0)
    if seconds > 0:
        time.sleep(seconds)


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _progress(what: str, event: Event, handler: str) -> None:
    folder = os.environ.get("RELAPP_PROGRESS_DIR")
    if folder:
        _append(os.path.join(folder, f"{os.getpid()}.log"), f"{what} {event.event_id} {handler}\n")


def _effect(session: Session, event: Event, handler: str) -> None:
    _progress("start", event, handler)
    session.execute(
        sa.text(f"INSERT INTO {EFFECT_TABLE} (event_id, handler, pid) VALUES (:e, :h, :p)"),
        {"e": event.event_id, "h": handler, "p": os.getpid()},
    )
    _sleep()
    _progress("end", event, handler)


@hooks.on_any(name="effect_a")
def effect_a(event: Event, session: Session) -> None:
    _effect(session, event, "effect_a")


@hooks.on_any(name="runlog")
def runlog(event: Event) -> None:
    _progress("start", event, "runlog")
    path = os.environ.get("RELAPP_RUNLOG")
    if path:
        fail_dir = os.environ.get("RELAPP_FAIL_DIR")
        failed_before = int(
            fail_dir is not None and os.path.exists(os.path.join(fail_dir, event.event_id))
        )
        _append(path, f"{event.event_id} {os.getpid()} {failed_before}\n")
    _sleep()
    _progress("end", event, "runlog")


@hooks.on_any(name="effect_b")
def effect_b(event: Event, session: Session) -> None:
    fail_dir = os.environ.get("RELAPP_FAIL_DIR")
    if fail_dir and "_failfirst" in event.event_id:
        try:
            os.close(os.open(os.path.join(fail_dir, event.event_id), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            _progress("fail", event, "effect_b")
            raise RuntimeError(f"effect_b fails the first time for {event.event_id}")
    _effect(session, event, "effect_b")


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


def read_runlog(path: Path) -> list[tuple[str, bool]]:
    """``(event_id, failed_before)``, one per run of ``runlog`` (in append order)."""
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(parts[0], parts[2] == "1") for parts in lines]
