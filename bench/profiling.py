"""Sampling profiles with py-spy (attached to running processes or wrapping a child), and a
summary of the collapsed stacks as Markdown: top functions by self and by inclusive samples.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bench.common import BIN, ROOT

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
#: Frames that are the machinery around the work, not the work.
_SKIP_INCLUSIVE = (
    "gunicorn/",
    "threading.py",
    "concurrent/futures",
    "<frozen runpy>",
    "click/",
    "flask/cli.py",
)


def py_spy() -> str | None:
    found = BIN / "py-spy"
    return str(found) if found.exists() else shutil.which("py-spy")


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3.11/", "/lib/python3.12/"):
        if marker in path:
            return path.split(marker, 1)[1]
    root = str(ROOT) + "/"
    return path[len(root) :] if path.startswith(root) else path


def _frame(raw: str) -> str:
    match = _FRAME.match(raw.strip())
    if match is None:
        return raw.strip()
    return f"{match['func']} ({_short(match['file'])})"


def summarize(
    path: Path,
    *,
    title: str,
    top: int = 14,
    focus: Sequence[str] = (),
    within: str | None = None,
    exclude: Sequence[str] = (),
    idle: bool = False,
) -> str:
    """Markdown: total samples, top self frames, top inclusive frames (package code first).

    ``within``: only stacks through a frame whose name contains it (percentages of those);
    ``exclude``: drop stacks with a frame containing any of these (idle helper threads);
    ``idle``: the profile includes waiting (wall clock), not only CPU."""
    self_counts: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame(f) for f in stack.split(";") if f and not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread (")]
        if not frames:
            continue
        if within is not None and not any(within in f for f in frames):
            continue
        if any(x in f for f in frames for x in exclude):
            continue
        total += count
        self_counts[frames[-1]] += count
        for frame in set(frames):
            incl[frame] += count
    if total == 0:
        return f"#### {title}\n\n(no samples)\n"

    def pct(n: int) -> str:
        return f"{100.0 * n / total:5.1f}%"

    kind = "wall clock, waiting included" if idle else "CPU, non-idle threads only"
    scope = f", stacks through `{within}`" if within else ""
    lines = [f"#### {title}", "", f"{total} samples (py-spy, {kind}{scope}).", ""]
    lines += ["Top self time:", "", "| self | function (file) |", "|---:|---|"]
    lines += [f"| {pct(n)} | `{name}` |" for name, n in self_counts.most_common(top)]
    inclusive = [
        (name, n)
        for name, n in incl.most_common()
        if not any(skip in name for skip in _SKIP_INCLUSIVE) and n < total * 0.97
    ]
    if focus:
        focused = [(name, n) for name, n in inclusive if any(f in name for f in focus)]
        lines += ["", "Inclusive time, package code:", "", "| incl. | function (file) |"]
        lines += ["|---:|---|"]
        lines += [f"| {pct(n)} | `{name}` |" for name, n in focused[:top]]
    lines += ["", "Inclusive time, all code:", "", "| incl. | function (file) |", "|---:|---|"]
    lines += [f"| {pct(n)} | `{name}` |" for name, n in inclusive[:top]]
    return "\n".join(lines) + "\n"


class Attach:
    """``py-spy record`` attached to a running process (and its children) for ``seconds``."""

    def __init__(
        self,
        pid: int,
        out: Path,
        seconds: float,
        *,
        subprocesses: bool = True,
        idle: bool = False,
    ):
        exe = py_spy()
        if exe is None:
            raise RuntimeError("py-spy is not installed (.venv/bin/pip install py-spy)")
        args = [exe, "record", "--pid", str(pid), "--nonblocking", "-r", "200"]
        args += ["-d", str(max(1, int(seconds))), "-f", "raw", "-o", str(out)]
        if subprocesses:
            args.append("--subprocesses")
        if idle:
            args.append("--idle")
        self.out = out
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # let it attach before the load starts

    def wait(self, timeout: float = 120.0) -> Path:
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}")
        return self.out


def wrap(args: Sequence[str], out: Path, *, idle: bool = False) -> list[str]:
    """The command line that runs ``args`` under ``py-spy record``."""
    exe = py_spy()
    if exe is None:
        raise RuntimeError("py-spy is not installed (.venv/bin/pip install py-spy)")
    flags = ["--idle"] if idle else []
    return [exe, "record", "-r", "200", *flags, "-f", "raw", "-o", str(out), "--", *args]


def summarize_worker(path: Path, *, title: str) -> str:
    """:func:`summarize` of a py-spy record of a ``hookledger worker``: stacks inside
    ``Worker.run``, its heartbeat thread left out, idle frames kept."""
    return summarize(
        path,
        title=title,
        focus=("receiver/", "bench/"),
        within="Worker.run",
        exclude=("_Heartbeat", "heartbeat"),
        idle=True,
    )
