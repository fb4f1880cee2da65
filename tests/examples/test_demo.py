"""The README's first command: the end-to-end demo runs and ends with every order right."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_ends_with_every_order_matching_and_nothing_shipped_twice() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--orders", "9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "9/9 orders match the processor (all agree)" in out
    assert "0 twice" in out
    assert "late change recovered by the sweep: 1 x dispute_opened" in out
    assert "recorded as already seen, nothing dispatched" in out
    assert "stored events sealed with data key 'demo', 0 in the clear" in out
