"""The shipped rules file read as text (no YAML library is a dependency): its alerts, the
metric names they read, the README sections their runbooks name; a copy with shorter
``for:`` durations for the end-to-end test; and where promtool and prometheus are."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from receiver.alerts import RULES_FILE
from tests.support import unavailable

HERE = Path(__file__).resolve().parent
#: promtool's unit tests of the rules (a week of history has a file of its own).
UNIT_TESTS = sorted(HERE.glob("hookledger.rules*.test.yml"))

_FOR = re.compile(r"^(\s+for: )(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Alert:
    name: str
    text: str  # the rule's block, from its "- alert:" line to the next

    def field(self, name: str) -> str | None:
        found = re.search(rf"^\s+{name}: (.+)$", self.text, re.MULTILINE)
        return found.group(1).strip().strip('"') if found else None


def alerts(text: str | None = None) -> list[Alert]:
    """The alerts of the rules file, in order."""
    text = RULES_FILE.read_text() if text is None else text
    blocks = re.split(r"^(?=[ ]+- alert: )", text, flags=re.MULTILINE)[1:]
    return [Alert(re.search(r"- alert: (\w+)", b).group(1), b) for b in blocks]  # type: ignore[union-attr]


def expressions(alert: Alert) -> str:
    """The rule's PromQL (its ``expr:``, one line or a ``|`` block), comments excluded."""
    lines = alert.text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("expr:"))
    first = lines[start].split("expr:", 1)[1].strip()
    if first != "|":
        return first
    body = []
    for line in lines[start + 1 :]:
        if line.startswith(" " * 10):
            body.append(line)
        else:
            break
    return "\n".join(body)


def with_for(text: str, duration: str) -> str:
    """The rules with every ``for:`` set to ``duration``; nothing else changes (the
    expressions Prometheus evaluates are the shipped ones)."""
    shortened = _FOR.sub(lambda m: m.group(1) + duration, text)
    before, after = text.splitlines(), shortened.splitlines()
    assert len(before) == len(after)
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert all(a.strip().startswith("for: ") for a, _ in changed), changed
    return shortened


def tool(name: str) -> str:
    """The path of ``name`` (promtool, prometheus): skipped without it, failed under CI."""
    found = shutil.which(name)
    if found is None:
        unavailable(
            fail=f"{name} is missing under CI=true: .ci/run installs Debian's prometheus package",
            skip=f"{name} is not installed (apt-get install prometheus)",
        )
    return found
