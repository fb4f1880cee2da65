"""The README's five-minute app passes ``mypy --strict`` (the wheel smoke test runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MARKER = "<!-- five-minutes: myshop.py -->"


def readme_app() -> str:
    text = (ROOT / "README.md").read_text()
    block = text.split(MARKER, 1)[1].split("```python\n", 1)[1]
    return block.split("```", 1)[0]


def test_the_five_minute_app_is_where_the_smoke_test_takes_it() -> None:
    app = readme_app()
    assert "def create_app() -> Flask:" in app and '@hooks.on("payment_succeeded")' in app
    assert MARKER in (ROOT / ".ci" / "wheel-smoke").read_text()


@pytest.mark.slow
def test_the_five_minute_app_passes_mypy_strict(tmp_path: Path) -> None:
    (tmp_path / "myshop.py").write_text(readme_app())
    env = dict(os.environ, MYPYPATH=str(ROOT))  # the editable install is invisible to mypy
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "myshop.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
