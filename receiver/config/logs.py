"""Log output for hookledger's processes: one line per record, text or JSON.

hookledger's log calls put what a line is about in ``extra`` fields (``action``,
``event_id``, ``event_type``, ``handler``, ``reason``, ``worker``, ``run_id``...). The
formatters here show them: the text format as ``key=value`` after the message, the JSON format
as keys of one object per line (for Loki, Elasticsearch, CloudWatch...). Tracebacks stay on
the record's own line in JSON (``exc_info``), and after it in text.

The commands set this up from ``--log-level`` / ``--log-format`` (or ``HOOKLEDGER_LOG_LEVEL``
/ ``HOOKLEDGER_LOG_FORMAT``); a web process sets it up itself, for example in its app
factory::

    from receiver.config.logs import configure_logging
    configure_logging(level="info", fmt="json")
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any, Final

LEVELS: Final = ("debug", "info", "warning", "error")
FORMATS: Final = ("text", "json")

#: Attributes every ``LogRecord`` has: anything else on a record came from ``extra``.
_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName"}
)
#: Fields shown first, in this order.
_FIRST = ("action", "event_id", "event_type")
#: Marks the handler :func:`configure_logging` installed (replaced, never stacked).
_MARK = "_hookledger_handler"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    fields = {k: v for k, v in record.__dict__.items() if k not in _STANDARD and k[0] != "_"}
    ordered = {k: fields.pop(k) for k in _FIRST if k in fields}
    ordered.update(sorted(fields.items()))
    return ordered


def _scalar(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text == "" or any(c in text for c in ' "=\n'):
        return json.dumps(text)
    return text


class TextFormatter(logging.Formatter):
    """``2026-11-23T10:00:00.123Z INFO receiver.worker event dispatched action=...
    event_id=...``"""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        line = f"{when[:-6]}Z {record.levelname} {record.name} {record.getMessage()}"
        fields = " ".join(f"{k}={_scalar(v)}" for k, v in _extras(record).items() if v is not None)
        if fields:
            line = f"{line} {fields}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, the extra
    fields, and ``exc_info`` (the traceback as one string) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            data.setdefault(key, value)
        if record.exc_info:
            data["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, ensure_ascii=False)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted (a test runner or a
    CLI runner swaps it; a handler bound to the old one would write to a closed file)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, _value: IO[str]) -> None:
        pass


def configure_logging(
    level: str = "info", fmt: str = "text", *, stream: IO[str] | None = None
) -> logging.Handler:
    """Send every log record at ``level`` or above to ``stream`` (stderr), one per line.

    Replaces a handler installed by an earlier call (never stacks them) and leaves handlers
    installed by others alone. Returns the handler.
    """
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    if fmt.lower() not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler: logging.Handler = (
        logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    )
    handler.setFormatter(JsonFormatter() if fmt.lower() == "json" else TextFormatter())
    setattr(handler, _MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Alembic says "Context impl SQLiteImpl." at INFO whenever a schema is checked.
    logging.getLogger("alembic").setLevel(
        logging.NOTSET if level.lower() == "debug" else logging.WARNING
    )
    return handler


__all__ = ["FORMATS", "LEVELS", "JsonFormatter", "TextFormatter", "configure_logging"]
