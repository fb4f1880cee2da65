"""Configuration errors stop the app at start-up, on one line (issue hole 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from receiver.core.errors import ConfigurationError
from receiver.extension import WebhookReceiver
from receiver.testing import WebhookTestClient
from tests.conftest import SECRETS, AppFactory

pytestmark = pytest.mark.storage

ROOT = Path(__file__).resolve().parents[3]


def test_a_secret_pasted_with_a_space_after_the_colon_verifies(make_app: AppFactory) -> None:
    # Before: the value kept its leading space, so every webhook got 401.
    spec = f"primary: {SECRETS['primary']} , previous :{SECRETS['previous']}"
    app, _ = make_app(WebhookReceiver(secrets=spec))
    client = WebhookTestClient(app, secret=SECRETS["primary"])
    response = client.send("payment_succeeded", event_id="evt_spaced")
    assert response.status_code == 200, response.get_json()
    row = WebhookReceiver.state(app).store.operations.get("evt_spaced")
    assert row is not None and row.secret_id == "primary"


def test_a_secret_id_over_64_characters_stops_init_app(make_app: AppFactory) -> None:
    # Before: the app started, then every webhook was a 500 on PostgreSQL (secret_id is a
    # 64-character column) and, on SQLite, stored an id nothing else accepts.
    with pytest.raises(ConfigurationError, match="ids are at most 64"):
        make_app(WebhookReceiver(secrets=f"{'k' * 65}:{SECRETS['primary']}"))


def test_the_cli_says_what_is_wrong_on_one_line(database_url: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "HOOKLEDGER_DATABASE_URL": database_url,
        "HOOKLEDGER_SECRETS": f"primary:{SECRETS['primary']},primary :{SECRETS['previous']}",
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "receiver.cli.commands",
            "--app",
            "tests.apps.procapp:create_app",
            "stats",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "hookledger: webhook secret ids must be unique: 'primary' repeated"
    ]
    assert SECRETS["primary"] not in result.stderr + result.stdout
