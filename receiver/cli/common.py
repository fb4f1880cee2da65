"""What ``hookledger`` and ``reconcile`` share as command-line programs.

- Every configuration or database mistake ends the command with one line on stderr and a
  documented exit code, never a traceback (:func:`run_main`, :func:`describe_error`).
- ``--log-level`` and ``--log-format`` on every command (:func:`add_log_options`), also read
  from ``HOOKLEDGER_LOG_LEVEL`` / ``HOOKLEDGER_LOG_FORMAT``.
- Commands that never verify a signature load the app without ``HOOKLEDGER_SECRETS``
  (:func:`read_only`).
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any, Final, NoReturn, TypeVar

import click

from receiver.config.logs import FORMATS, LEVELS, configure_logging
from receiver.config.settings import SECRETS_OPTIONAL
from receiver.core.errors import (
    ConfigurationError,
    HookledgerError,
    StorageBusy,
    StorageUnavailable,
)

F = TypeVar("F", bound=Callable[..., Any])

#: Exit codes shared by both programs (``reconcile`` has more: see its ``--help``).
EXIT_OK: Final = 0
#: ``hookledger status`` found a problem; ``hookledger show`` found no such event.
EXIT_PROBLEM: Final = 1
#: Usage or configuration error (a missing secret, a bad URL, a missing driver, the schema
#: missing or behind: run ``db upgrade``).
EXIT_USAGE: Final = 2
#: The database is unreachable.
EXIT_DATABASE: Final = 5

log = logging.getLogger("receiver.cli")

_DEFAULT_LEVEL_ATTR = "hookledger_log_default"
_META = "hookledger_log"


def _first_line(text: str, limit: int = 200) -> str:
    lines = text.strip().splitlines()
    return lines[0][:limit] if lines else ""


def describe_error(
    exc: BaseException, *, upgrade: str = "hookledger db upgrade"
) -> tuple[str, int]:
    """One line and an exit code for an error that ended a command.

    Driver messages are cut to their first line: SQLAlchemy's own text repeats the statement
    and its parameters, which must not reach a terminal or a log."""
    from sqlalchemy.exc import (
        ArgumentError,
        DBAPIError,
        InterfaceError,
        NoSuchModuleError,
        OperationalError,
        ProgrammingError,
    )

    if isinstance(exc, ConfigurationError):
        return exc.message, EXIT_USAGE
    if isinstance(exc, StorageBusy):
        return "the database is busy (a lock stayed held past the timeout)", EXIT_DATABASE
    if isinstance(exc, StorageUnavailable):
        return "the database is unreachable", EXIT_DATABASE
    if isinstance(exc, HookledgerError):
        return exc.message, EXIT_USAGE
    if isinstance(exc, (NoSuchModuleError, ModuleNotFoundError)):
        name = getattr(exc, "name", None) or _first_line(str(exc))
        if "psycopg" in str(name) or "postgres" in str(exc):
            return (
                "PostgreSQL needs the psycopg driver: pip install 'hookledger[postgres]'",
                EXIT_USAGE,
            )
        return f"a module is missing: {_first_line(str(exc))}", EXIT_USAGE
    if isinstance(exc, ArgumentError):
        return "HOOKLEDGER_DATABASE_URL is not a valid database URL", EXIT_USAGE
    if isinstance(exc, ProgrammingError) or (
        isinstance(exc, OperationalError) and "no such table" in str(exc.orig)
    ):
        return f"hookledger's tables are missing or outdated: run `{upgrade}`", EXIT_USAGE
    if isinstance(exc, (OperationalError, InterfaceError)) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        original = getattr(exc, "orig", None) or exc
        detail = _first_line(str(original))
        return (
            f"the database is unreachable ({type(original).__name__}: {detail})",
            EXIT_DATABASE,
        )
    from flask.cli import NoAppException

    if isinstance(exc, NoAppException):
        return _first_line(exc.format_message(), 400), EXIT_USAGE
    return (
        f"unexpected error: {type(exc).__name__}: {_first_line(str(exc))} "
        "(--log-level debug shows the traceback)",
        EXIT_PROBLEM,
    )


def fail(prog: str, message: str, code: int = EXIT_USAGE) -> NoReturn:
    """End the command: ``prog: message`` on stderr, exit ``code``."""
    click.echo(f"{prog}: {message}", err=True)
    sys.exit(code)


def run_main(
    prog: str, command: click.Command, *, upgrade: str = "hookledger db upgrade", **kwargs: Any
) -> NoReturn:
    """Run a click command as a program: errors become one line and an exit code."""
    global _PROGRAM
    _PROGRAM = True
    try:
        command.main(prog_name=prog, **kwargs)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - every error ends as one line, never a traceback
        message, code = describe_error(exc, upgrade=upgrade)
        log.debug("%s failed", prog, exc_info=True, extra={"action": "command_failed"})
        fail(prog, message, code)
    sys.exit(0)  # pragma: no cover - click's main exits itself


#: Set by :func:`run_main`: hookledger's own programs set up logging even without options.
_PROGRAM = False


@contextmanager
def stopped_by_signals(stop: Callable[[int], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call ``stop(signum)`` while the block runs; the handlers in place
    before are put back after it (a command run in-process, a shop's test suite invoking it
    through click's runner, keeps its own Ctrl-C)."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for number in previous:
        signal.signal(number, lambda signum, _frame: stop(signum))
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def running_as_program() -> bool:
    """Whether :func:`run_main` runs this process's command (not ``flask ...`` or a test's
    CLI runner, where the app's own logging setup is left alone)."""
    return _PROGRAM


def _configure(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    root = ctx.find_root()
    chosen: dict[str, str] = root.meta.setdefault(_META, {})
    if value is not None:
        chosen[str(param.name)] = value
    elif str(param.name) in chosen or not (_PROGRAM or chosen):
        # Under `flask hookledger ...` (or a test's CLI runner) without a log option, the
        # app's own logging setup stays as it is.
        return
    default = getattr(ctx.command, _DEFAULT_LEVEL_ATTR, "warning")
    configure_logging(chosen.get("log_level", default), chosen.get("log_format", "text"))


def log_options() -> list[click.Option]:
    """``--log-level`` and ``--log-format`` (eager, applied before the app is loaded)."""
    return [
        click.Option(
            ["--log-level"],
            type=click.Choice(LEVELS, case_sensitive=False),
            default=None,
            envvar="HOOKLEDGER_LOG_LEVEL",
            expose_value=False,
            is_eager=True,
            callback=_configure,
            help="Log records at this level or above to stderr (HOOKLEDGER_LOG_LEVEL; "
            "default warning, info for long-running commands).",
        ),
        click.Option(
            ["--log-format"],
            type=click.Choice(FORMATS, case_sensitive=False),
            default=None,
            envvar="HOOKLEDGER_LOG_FORMAT",
            expose_value=False,
            is_eager=True,
            callback=_configure,
            help="text (key=value fields) or json (one object per line) "
            "(HOOKLEDGER_LOG_FORMAT; default text).",
        ),
    ]


def add_log_options(command: click.Command, *, default_level: str = "warning") -> None:
    """Add the log options to ``command`` and, for a group, to every command below it."""
    names = {p.name for p in command.params}
    if "log_level" not in names:
        command.params.extend(log_options())
    if getattr(command, _DEFAULT_LEVEL_ATTR, None) is None:
        setattr(command, _DEFAULT_LEVEL_ATTR, default_level)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_log_options(sub, default_level=default_level)


def long_running(command: click.Command) -> click.Command:
    """Mark a command (a worker, a scheduler) whose default log level is info."""
    setattr(command, _DEFAULT_LEVEL_ATTR, "info")
    return command


def walk(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, click.Command]]:
    """Every command below ``command`` (itself included) with its full name."""
    found = [(" ".join(path), command)]
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            found += walk(sub, (*path, name))
    return found


__all__ = [
    "EXIT_DATABASE",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "add_log_options",
    "describe_error",
    "fail",
    "log_options",
    "long_running",
    "run_main",
    "walk",
]


def read_only(func: F) -> F:
    """Decorate a command (outside ``with_appcontext``) that never verifies a signature: the
    app is loaded without requiring HOOKLEDGER_SECRETS."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        token = SECRETS_OPTIONAL.set(True)
        try:
            return func(*args, **kwargs)
        finally:
            SECRETS_OPTIONAL.reset(token)

    return wrapper  # type: ignore[return-value]
