"""The operator's views open what is sealed at rest: ``hookledger show`` and ``events``, and
the ops console's event and conflict pages show the plaintext (masked as before) to an
operator whose app has the data key, while the database holds none of it."""

from __future__ import annotations

import base64
import json

import pytest

from receiver import Event, WebhookReceiver
from receiver.testing import WebhookTestClient
from receiver.testing.factories import build_event, encode
from receiver.web.console import Console
from tests.conftest import AppFactory
from tests.receiver.atrest.test_sealed_at_rest import CANARY, plaintext_found

pytestmark = pytest.mark.storage

KEY = base64.b64encode(b"v" * 32).decode()
PASSWORD = "correct horse battery"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()}


def test_show_events_and_the_console_open_sealed_data(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()

    @hooks.on("payment_failed", name="notify")
    def notify(event: Event) -> None:
        raise RuntimeError(f"no customer {CANARY}")

    app, _ = make_app(hooks, data_keys=f"k1:{KEY}", max_attempts=1, stored_headers="X-Tenant")
    app.secret_key = "console-test-secret"
    Console(app, password=PASSWORD)
    client = WebhookTestClient(app)
    sent = build_event("payment_failed", event_id="evt_seal", metadata={"note": CANARY})
    assert client.post(sent, headers={"X-Tenant": f"t-{CANARY}"}).status_code == 200
    other = build_event("payment_failed", event_id="evt_seal", metadata={"note": f"2-{CANARY}"})
    assert client.post(other).json["status"] == "conflict"  # type: ignore[index]
    client.drain()
    store = WebhookReceiver.state(app).store
    assert plaintext_found(store.engine, CANARY, files=False) == []

    runner = app.test_cli_runner()
    shown = runner.invoke(args=["hookledger", "show", "evt_seal", "--body", "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert CANARY in data["body"] and data["headers"]["X-Tenant"] == f"t-{CANARY}"
    assert CANARY in data["last_error"] and CANARY in data["ledger"][0]["last_error"]
    listed = runner.invoke(args=["hookledger", "events", "--status", "dead"])
    assert CANARY in listed.output

    http = app.test_client()
    page = http.get("/hookledger/events/1", headers=AUTH).get_data(as_text=True)
    assert CANARY in page and "enc1" not in page
    conflict = http.get("/hookledger/conflicts/1", headers=AUTH)
    assert conflict.status_code == 200 and f"2-{CANARY}" in conflict.get_data(as_text=True)

    # Without the key, the same views say why instead of showing ciphertext.
    blind, _ = make_app(data_keys=f"k2:{base64.b64encode(b'w' * 32).decode()}")
    shown = blind.test_cli_runner().invoke(
        args=["hookledger", "show", "evt_seal", "--body", "--json"]
    )
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert "not configured" in data["body"] and "not configured" in data["last_error"]
    assert encode(sent) not in shown.output.encode()
