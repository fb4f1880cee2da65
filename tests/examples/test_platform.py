"""The platform example (``python -m examples.platform``): two sellers, two processor
accounts on one multi-merchant sandbox, the same payment ids in both, webhooks lost; after
``reconcile run --all-accounts`` every object of each account equals the processor."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_platform_ends_with_both_accounts_equal_to_the_processor() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.platform", "--payments", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "platform: both accounts equal the processor" in out
    for seller in ("seller_a", "seller_b"):
        assert f"== {seller}: reconcile ok" in out
        assert f"{seller}: every object equals the processor" in out
    # The same payment ids in both accounts, with opposite outcomes.
    tables = out.split("== seller_b")
    assert "payment pay_000" in tables[0] and "payment pay_000" in tables[1]
    first = next(line for line in tables[0].splitlines() if line.startswith("payment pay_000"))
    second = next(line for line in tables[1].splitlines() if line.startswith("payment pay_000"))
    assert "succeeded" in first and "failed" in second
    # Webhooks were lost (two at least per seller), and reconciliation recovered them.
    assert out.count("drop ") >= 2 and "BEHIND" not in out and "MISMATCH" not in out
    paths = re.findall(r"recovered by path: lists (\d+), sweep (\d+), events (\d+)", out)
    assert len(paths) == 2 and all(sum(map(int, counts)) >= 2 for counts in paths), paths
    assert "pay_000 in the default account: none" in out
