"""Sandbox processor: ``python -m reconcile.sandbox``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
import requests

from reconcile.sandbox.__main__ import build_parser, main

KEY = "snd_cli_key_secret_value"
SECRET = "cli_webhook_secret_value"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--api-key", KEY, "--host", "0.0.0.0"], "not loopback"),
        (["--api-key", ""], "api key is required"),
        (["--api-key", KEY, "--webhook-url", "http://127.0.0.1:1/"], "webhook secret"),
        (["--api-key", "prd_live", "--port", "0"], "snd_"),
    ],
)
def test_refuses_bad_configuration(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("SANDBOX_API_KEY", "SANDBOX_WEBHOOK_SECRET", "SANDBOX_HOST"):
        monkeypatch.delenv(name, raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and KEY not in err


@pytest.mark.slow
def test_serves_until_sigterm() -> None:
    env = {
        **os.environ,
        "SANDBOX_API_KEY": KEY,
        "SANDBOX_WEBHOOK_SECRET": SECRET,
        "SANDBOX_WEBHOOK_URL": "http://127.0.0.1:9/hooks",
        "SANDBOX_RETRY_SCHEDULE": "none",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "reconcile.sandbox", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout=30)
    try:
        assert lines and lines[0].startswith("http://127.0.0.1:"), lines
        base_url = lines[0].strip()
        with requests.Session() as session:
            health = session.get(base_url + "/health", headers={"api-key": KEY}, timeout=5)
            assert health.status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=15)
    assert process.returncode == 0
    assert KEY not in out + err and SECRET not in out + err
    assert "GET /health" in err  # the access log, without headers


def test_admin_api_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_ADMIN_API_KEY", "admin_from_env")
    args = build_parser().parse_args(["--api-key", KEY])
    assert args.admin_api_key == "admin_from_env"
    assert "SANDBOX_ADMIN_API_KEY" in build_parser().format_help()
