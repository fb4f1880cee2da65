"""Every Procfile line really starts, serves or works, and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from reconcile.sandbox import SandboxServer
from tests.conftest import SECRETS_SPEC

pytestmark = [pytest.mark.storage, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "snd_procfile_test_0001"


def _procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line.strip() and not line.startswith("#"))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_procfile_has_web_worker_and_scheduler() -> None:
    assert set(_procfile()) == {"web", "worker", "scheduler"}


def test_the_scheduler_refuses_a_database_without_adoption(database_url: str) -> None:
    env = dict(
        os.environ,
        HOOKLEDGER_DATABASE_URL=database_url,
        HOOKLEDGER_PROCESSOR_URL="http://127.0.0.1:9",
        HOOKLEDGER_API_KEY=API_KEY,
    )
    upgrade = subprocess.run(
        [sys.executable, "-m", "reconcile", "db", "upgrade"], env=env, cwd=ROOT, capture_output=True
    )
    assert upgrade.returncode == 0
    done = subprocess.run(
        [sys.executable, "-m", "reconcile", "schedule"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 6
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "reconcile adopt" in lines[0] and "--new-account" in lines[0]


#: What each process prints once SIGTERM stops it cleanly (its handler is set): a SIGTERM
#: before that ends it by the signal (-15), which says nothing of its graceful stop (seen
#: on a loaded machine, where the scheduler was still starting when the web answered).
READY = {"worker": " started", "scheduler": "reconcile schedule: "}


def test_every_procfile_process_starts_and_stops(database_url: str, tmp_path: Path) -> None:
    port = _port()
    with SandboxServer(API_KEY) as sandbox:
        env = dict(
            os.environ,
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            PORT=str(port),
            PYTHONPATH=str(ROOT),
            HOOKLEDGER_DATABASE_URL=database_url,
            HOOKLEDGER_SECRETS=SECRETS_SPEC,
            HOOKLEDGER_PROCESSOR_URL=sandbox.base_url,
            HOOKLEDGER_API_KEY=API_KEY,
        )
        for setup in (
            ["flask", "--app", "examples.shop.app:create_app", "init-db"],
            ["reconcile", "db", "upgrade"],
            # The scheduler refuses a database without an adoption record (see below).
            ["reconcile", "adopt", "--new-account"],
        ):
            done = subprocess.run(setup, env=env, cwd=ROOT, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
        logs = {name: tmp_path / f"{name}.log" for name in _procfile()}
        procs = {
            name: subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=logs[name].open("wb"),
            )
            for name, command in _procfile().items()
        }
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    health = requests.get(f"http://127.0.0.1:{port}/webhooks/health", timeout=1)
                    if health.ok:
                        break
                except requests.RequestException:
                    pass
                assert time.monotonic() < deadline, "web did not answer"
                time.sleep(0.2)
            for name, marker in READY.items():
                while marker not in logs[name].read_text(errors="replace"):
                    assert procs[name].poll() is None, f"{name} exited: {logs[name].read_text()}"
                    assert time.monotonic() < deadline + 30, f"{name} did not start"
                    time.sleep(0.1)
            time.sleep(1.0)
            for name, proc in procs.items():
                assert proc.poll() is None, f"{name} exited: {logs[name].read_text()}"
        finally:
            codes = {}
            for proc in procs.values():
                proc.send_signal(signal.SIGTERM)
            for name, proc in procs.items():
                try:
                    codes[name] = proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    codes[name] = proc.wait()
    assert codes == {"web": 0, "worker": 0, "scheduler": 0}, {
        name: log.read_text(errors="replace")[-2000:] for name, log in logs.items()
    }
