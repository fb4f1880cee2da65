"""The pure cores import without Flask, SQLAlchemy or requests (docs/architecture.md).

import-linter's contracts check the imports as written; this checks them as run: a fresh
interpreter in which those libraries (and the other frameworks) cannot be imported at all
imports every module of ``receiver.core`` and ``reconcile.core`` and uses them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

BLOCKED = ["flask", "werkzeug", "sqlalchemy", "sqlmodel", "alembic", "requests", "click"]

SCRIPT = f"""
import importlib, pkgutil, sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is blocked: the pure core must not need it")
        return None

sys.meta_path.insert(0, Blocked())
try:
    import flask  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("the blocker does not work")

imported = []
for package in ("receiver.core", "reconcile.core"):
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__, package + "."):
        importlib.import_module(info.name)
        imported.append(info.name)

from receiver.core.signature import sign, verify, Secret
"""


def test_the_pure_cores_import_and_work_without_flask_sqlalchemy_or_requests() -> None:
    script = (
        SCRIPT
        + """
secret = Secret(id="s1", value=b"hmac_secret_1234")
body = b'{"type":"payment_intent"}'
assert verify(body, sign(body, secret.value), [secret]) == "s1"
blocked = sorted(m for m in sys.modules if m.split(".")[0] in """
        + repr(BLOCKED)
        + """)
assert not blocked, blocked
print(len(imported))
"""
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) >= 20  # every module of both cores was imported


def test_the_blocker_catches_a_core_module_that_needs_a_framework(tmp_path: Path) -> None:
    """The check above can fail: a module importing SQLAlchemy is refused by the blocker."""
    (tmp_path / "needs_sqlalchemy.py").write_text("import sqlalchemy\n")
    script = SCRIPT.split("imported = []")[0] + "import needs_sqlalchemy\n"
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode != 0
    assert "blocked" in result.stderr
