"""What the ``hookledger`` commands share: the app's receiver state, a failure said in one
line with its exit code, the schema checked before a command touches the tables, and UTC
for the ``--since``/``--until`` options, and the repeatable ``--account`` option.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from flask import current_app
from sqlalchemy.exc import DBAPIError

import receiver.storage.database as db
from receiver.cli.common import (
    EXIT_USAGE,
    describe_error,
)
from receiver.core.accounts import is_account_id
from receiver.core.errors import HookledgerError
from receiver.web.state import ReceiverState, receiver_state

F = TypeVar("F", bound=Callable[..., Any])


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


def _account_ids(
    _ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    bad = [v for v in value if not is_account_id(v)]
    if bad:
        raise click.BadParameter(
            f"{bad[0][:80]!r} is not an account id (a-z, 0-9, '_' and '-', up to 64)"
        )
    return tuple(dict.fromkeys(value))


def account_option(help: str = "Processor account (repeatable).") -> Callable[[F], F]:
    """``--account ID`` (repeatable; the parameter ``accounts``, a tuple, empty when not
    given). Any well-formed id is taken, configured or not: a removed account's rows are
    still there to be listed, shown or pruned."""
    return click.option(
        "--account", "accounts", multiple=True, callback=_account_ids, metavar="ID", help=help
    )
