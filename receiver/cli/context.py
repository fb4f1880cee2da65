"""What the ``hookledger`` commands share: the app's receiver state, a failure said in one
line with its exit code, the schema checked before a command touches the tables, and UTC
for the ``--since``/``--until`` options.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

import click
from flask import current_app
from sqlalchemy.exc import DBAPIError

import receiver.storage.database as db
from receiver.cli.common import (
    EXIT_USAGE,
    describe_error,
)
from receiver.core.errors import HookledgerError
from receiver.web.state import ReceiverState, receiver_state


def app_state() -> ReceiverState:
    return receiver_state(current_app)


def fail(message: str, code: int = EXIT_USAGE) -> None:
    click.echo(f"hookledger: {message}", err=True)
    sys.exit(code)


def checked_engine(*, schema: bool = True) -> Any:
    """The receiver's engine; with ``schema``, first check it is migrated (one line and exit
    2 when it is not, exit 5 when the database cannot be reached)."""
    engine = app_state().store.engine
    if schema:
        try:
            db.check_schema(engine)
        except (HookledgerError, DBAPIError) as exc:
            message, code = describe_error(exc)
            fail(message, code)
    return engine


def utc_option(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value
