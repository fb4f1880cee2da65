"""Log lines carry what they are about (event id and type), in text or JSON."""

from __future__ import annotations

import io
import json
import logging

import pytest

from receiver.config.logs import configure_logging


@pytest.fixture
def restore_root() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_text_lines_show_the_extra_fields(restore_root: object) -> None:
    out = io.StringIO()
    configure_logging("info", "text", stream=out)
    logging.getLogger("hookledger.test.logs").warning(
        "handler failed: %s",
        "boom",
        extra={
            "action": "handler_failed",
            "event_id": "evt_1",
            "event_type": "payment_succeeded",
            "handler": "h x",
        },
    )
    line = out.getvalue().strip()
    assert "WARNING hookledger.test.logs handler failed: boom" in line
    assert line.endswith(
        'action=handler_failed event_id=evt_1 event_type=payment_succeeded handler="h x"'
    )


def test_json_lines_are_one_object_each_with_the_traceback(restore_root: object) -> None:
    out = io.StringIO()
    configure_logging("debug", "json", stream=out)
    configure_logging("debug", "json", stream=out)  # replaced, never stacked
    try:
        raise ValueError("bad")
    except ValueError:
        logging.getLogger("hookledger.test.json").exception("failed", extra={"event_id": "evt_2"})
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert data["level"] == "error" and data["event_id"] == "evt_2"
    assert "ValueError: bad" in data["exc_info"]


def test_levels_and_formats_are_checked(restore_root: object) -> None:
    with pytest.raises(ValueError, match="log level"):
        configure_logging("loud")
    with pytest.raises(ValueError, match="log format"):
        configure_logging("info", "xml")
