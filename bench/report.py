"""The final table (stdout) and ``bench/RESULTS.md`` (regenerated whole by every full run)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from bench.common import ROOT, Row, Section, fmt


def _value(row: Row, value: float | None) -> str:
    if value is None:
        return "-"
    if row.unit == "s":
        return f"{value:.2f} s"
    if row.unit == "ms":
        return f"{fmt(value)} ms"
    if row.unit == "MB":
        return f"{value:.0f} MB"
    if row.unit == "%":
        return f"{value:.1f} %"
    return f"{fmt(value, 0)}/s"


def _ratio(row: Row) -> str:
    if row.ratio is None:
        return "-"
    prefix = ">= " if "lower bound" in row.note else ""
    return f"{prefix}{row.ratio:.2f}x"


def _met(row: Row) -> str:
    return "?" if row.met is None else ("yes" if row.met else "NO")


def table_rows(sections: Sequence[Section]) -> list[list[str]]:
    rows = []
    for section in sections:
        if section.error:
            rows.append([f"{section.name}: FAILED (see its section)", "-", "-", "-", "-", "-"])
        for row in section.rows:
            rows.append(
                [
                    f"{row.bench}: {row.case}",
                    _value(row, row.hookledger),
                    _value(row, row.yardstick),
                    _ratio(row),
                    row.target,
                    _met(row),
                ]
            )
    return rows


HEADER = ["bench", "hookledger", "yardstick", "ratio", "target", "met?"]


def text_table(sections: Sequence[Section]) -> str:
    rows = [HEADER, *table_rows(sections)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = []
    for n, r in enumerate(rows):
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(sections: Sequence[Section]) -> str:
    out = ["| " + " | ".join(HEADER) + " |", "|---|---:|---:|---:|---|---|"]
    out += ["| " + " | ".join(r) + " |" for r in table_rows(sections)]
    return "\n".join(out)


def code_state() -> str:
    """The commit and the package files that differ from it (others edit them concurrently)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "receiver", "reconcile"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.split("\n")
    except OSError:
        return "unknown"
    changed = sorted({line[3:] for line in dirty if line.strip()})
    return f"`{head}`" + (f" + uncommitted changes in {', '.join(changed)}" if changed else "")


METHOD = """\
- **Side by side**: each path and its yardstick run in the same invocation, alternating
  (A B A B ...; for receive A B, B A, ... so neither side always goes first) for several
  rounds; the table shows medians of the rounds and their ratio.
  The machine is shared and noisy (see the load averages), which is why only same-run ratios
  are meaningful; absolute figures move from run to run.
- **Receive**: both apps under the same gunicorn configuration on loopback; throughput with
  `wrk` (closed loop) posting pre-generated bodies, each with a unique `event_id` and its own
  HMAC-SHA512 (`bench/post.lua`), counting 2xx answers and checking that every acknowledged
  event is in the database; p99 with an open-loop multi-process Python client
  (`bench/loadgen.py`) at 50 % of the yardstick's median throughput, latency measured from each
  request's due time (no coordinated omission). Yardstick: `bench/yardstick.py` (read body,
  verify HMAC-SHA512, one `INSERT (event_id, body) ON CONFLICT DO NOTHING`, commit).
- **Dispatch**: PostgreSQL, an inbox pre-filled in one transaction, `hookledger worker`
  processes with one no-op handler; clock from the first worker's start to the last
  `processed_at`; every event must end `done`. Yardstick: a bare
  `SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1` + parse + `UPDATE` + `COMMIT` loop in the same
  number of processes (no ordering, no ledger: a floor, not a like-for-like design).
- **Slow handler**: the README's kind of app, gunicorn gthread (2 x 4) and one
  `hookledger worker`; one event's handler sleeps 10 s without the session; meanwhile 4
  clients each post a signed unique event every 0.2 s (latency from each request's due
  time). Non-2xx answers and the receive p99, on SQLite and PostgreSQL; every acknowledged
  event must then be dispatched, each handler once (`bench/slow_handler.py`).
- **Reconcile**: PostgreSQL; sandbox in its own process; every measurement in a fresh child
  process (peak RSS = `VmHWM` of that child). hookledger: `Reconciler.run(window, payments)`;
  yardstick: `for _ in client.iter_payments(...)` with the same client, window and page size.
  "Linear" allows 25 % more time per 1k objects at the larger size.
"""


#: The record of fixes with their before/after figures (hand-written; see its first lines).
HISTORY = Path(__file__).with_name("HISTORY.md")


def markdown(
    sections: Sequence[Section],
    *,
    facts: dict[str, str],
    command: str,
    seconds: float,
    load_end: str,
) -> str:
    lines = [
        "# hookledger benchmarks",
        "",
        f"Generated by `{command}`; do not edit by hand, run it again. Hand-written reading of "
        "these figures and the recommended fixes: [ANALYSIS.md](ANALYSIS.md).",
        "",
        "## Environment",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in facts.items()],
        f"| load average at end | {load_end} |",
        f"| code measured | {code_state()} |",
        f"| bench duration | {seconds / 60:.1f} min |",
        "",
        "## Results",
        "",
        markdown_table(sections),
        "",
        "Ratios: hookledger / yardstick (for times and latencies lower is better, for "
        "throughput higher is better). In the reconcile linearity and memory rows the yardstick "
        "column is the same path at the smaller size.",
        "",
        "## Method",
        "",
        METHOD,
    ]
    for section in sections:
        lines += [f"## {section.name.capitalize()}", "", f"({section.seconds:.0f} s)", ""]
        if section.error:
            lines += ["**This bench failed:**", "", "```", section.error, "```", ""]
        lines += section.details
        lines.append("")
    if HISTORY.exists():
        # Hand-written, carried into every regenerated report: what each fix changed.
        lines += [HISTORY.read_text(encoding="utf-8").rstrip(), ""]
    profiles = [p for s in sections for p in s.profiles]
    if profiles:
        lines += [
            "## Profiles",
            "",
            "Taken by the same command where a target was missed (py-spy sampling at 200 Hz).",
            "",
        ]
        for profile in profiles:
            lines += [profile, ""]
    return "\n".join(lines).rstrip() + "\n"


def write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
