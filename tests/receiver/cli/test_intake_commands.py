"""SQLite's intake seen and moved by an operator (issue 29 review): webhooks waiting in
``<database>-intake`` were counted by ``status`` but invisible to ``events``, the order
search, an object's story and replay until a worker moved them. ``status`` now says how many
wait there and the oldest one's age, ``intake list`` shows them (never a body) and ``intake
move`` moves them now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from receiver.extension import WebhookReceiver
from receiver.testing import WebhookTestClient
from tests.conftest import AppFactory, backend
from tests.receiver.storage.test_intake import another_process_holds_the_lock

pytestmark = [
    pytest.mark.storage,
    pytest.mark.skipif(backend() != "sqlite", reason="SQLite's intake (PostgreSQL has none)"),
]

#: In a body: never printed by `intake list`.
SECRET = "4111111111111111-cvv-123"


def _staged(make_app: AppFactory) -> tuple[object, Path]:
    """An app with two webhooks in the intake (stored while another process held the lock)."""
    app, _ = make_app(sqlite_busy_timeout=1)
    database = Path(str(WebhookReceiver.state(app).store.engine.url.database))
    client = WebhookTestClient(app)
    with another_process_holds_the_lock(database):
        for n in (1, 2):
            answer = client.send(
                "payment_succeeded",
                event_id=f"evt_wait_{n}",
                object_id=f"pay_wait_{n}",
                metadata={"note": SECRET},
            )
            assert answer.status_code == 200, answer.get_data(as_text=True)
    return app, database


def test_status_lists_and_moves_the_webhooks_waiting_in_the_intake(make_app: AppFactory) -> None:
    app, database = _staged(make_app)
    cli = app.test_cli_runner()  # type: ignore[attr-defined]

    events = cli.invoke(args=["hookledger", "events", "--json"])
    assert "evt_wait_1" not in events.output  # not in the inbox yet

    status = cli.invoke(args=["hookledger", "status", "--no-worker-ok", "--json"])
    found = json.loads(status.output)
    assert found["intake"] == 2 and found["intake_oldest_age_seconds"] is not None
    text = cli.invoke(args=["hookledger", "status", "--no-worker-ok"])
    assert "2 in the intake, oldest " in text.output, text.output

    listed = cli.invoke(args=["hookledger", "intake", "list"])
    assert listed.exit_code == 0, listed.output
    assert "evt_wait_1 payment_succeeded payment:pay_wait_1" in listed.output
    assert "evt_wait_2" in listed.output
    assert f"2 webhook(s) in the intake {database}-intake, oldest " in listed.output
    assert SECRET not in listed.output
    as_json = json.loads(cli.invoke(args=["hookledger", "intake", "list", "--json"]).output)
    assert [d["event_id"] for d in as_json["deliveries"]] == ["evt_wait_1", "evt_wait_2"]
    assert as_json["count"] == 2 and SECRET not in json.dumps(as_json)
    first = cli.invoke(args=["hookledger", "intake", "list", "--limit", "1"])
    assert "evt_wait_2" not in first.output and "(the first 1 shown)" in first.output

    moved = cli.invoke(args=["hookledger", "intake", "move"])
    assert moved.exit_code == 0, moved.output
    assert "2 webhook(s) moved from the intake into the inbox; 0 left" in moved.output
    events = cli.invoke(args=["hookledger", "events", "--json"])
    assert "evt_wait_1" in events.output and "evt_wait_2" in events.output
    assert "0 webhook(s) in the intake" in cli.invoke(args=["hookledger", "intake", "list"]).output
    found = json.loads(cli.invoke(args=["hookledger", "status", "--no-worker-ok", "--json"]).output)
    assert found["intake"] == 0 and found["intake_oldest_age_seconds"] is None
    assert found["open_events"]["pending"] == 2


def test_intake_move_exits_5_while_another_writer_keeps_the_lock(make_app: AppFactory) -> None:
    app, database = _staged(make_app)
    cli = app.test_cli_runner()  # type: ignore[attr-defined]
    with another_process_holds_the_lock(database):
        moved = cli.invoke(args=["hookledger", "intake", "move"])
    assert moved.exit_code == 5, moved.output
    assert "nothing moved" in moved.output
    assert "2 webhook(s) in the intake" in cli.invoke(args=["hookledger", "intake", "list"]).output


def test_intake_move_exits_1_when_webhooks_are_left_json_or_not(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Webhooks received before the move and left in the intake after it (refused by the
    inbox): exit 1, as the README's table says, with ``--json`` too (a script reads the
    code)."""
    app, _ = _staged(make_app)
    monkeypatch.setattr(WebhookReceiver.state(app).store.inbox, "move_intake", lambda: 0)
    cli = app.test_cli_runner()  # type: ignore[attr-defined]
    text = cli.invoke(args=["hookledger", "intake", "move"])
    assert text.exit_code == 1, text.output
    as_json = cli.invoke(args=["hookledger", "intake", "move", "--json"])
    assert as_json.exit_code == 1, as_json.output
    assert json.loads(as_json.stdout) == {
        "intake": json.loads(as_json.stdout)["intake"],
        "moved": 0,
        "left": 2,
        "stuck": 2,
    }


def test_intake_move_exits_0_when_webhooks_arrive_while_it_moves(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Webhooks that reach the intake while a move runs are the next move's, not its failure:
    on a busy receiver a cron job's `intake move` exited 1 nearly every time (review)."""
    app, database = _staged(make_app)
    inbox = WebhookReceiver.state(app).store.inbox
    move = inbox.move_intake
    client = WebhookTestClient(app)

    def move_then_one_arrives() -> int:
        moved = move()
        with another_process_holds_the_lock(database):
            answer = client.send("payment_succeeded", event_id="evt_meanwhile")
            assert answer.status_code == 200, answer.get_data(as_text=True)
        return moved

    monkeypatch.setattr(inbox, "move_intake", move_then_one_arrives)
    cli = app.test_cli_runner()  # type: ignore[attr-defined]
    as_json = cli.invoke(args=["hookledger", "intake", "move", "--json"])
    assert as_json.exit_code == 0, as_json.output
    found = json.loads(as_json.stdout)
    assert (found["moved"], found["left"], found["stuck"]) == (2, 1, 0)


def test_intake_list_names_another_accounts_object_once(make_app: AppFactory) -> None:
    """An object key carries its account (``eu/payment:pay_1``) outside the default one: the
    list shows that key as it is (it showed ``eu/eu/payment:pay_1``)."""
    accounts = {"eu": {"merchant_id": "merchant_eu", "secrets": "k1:whsec_eu_0123456789abcdef"}}
    app, _ = make_app(sqlite_busy_timeout=1, secrets="", accounts=json.dumps(accounts))
    database = Path(str(WebhookReceiver.state(app).store.engine.url.database))
    client = WebhookTestClient(app)
    with another_process_holds_the_lock(database):
        answer = client.send(
            "payment_succeeded", event_id="evt_eu_1", object_id="pay_eu_1", account="eu"
        )
        assert answer.status_code == 200, answer.get_data(as_text=True)
    listed = app.test_cli_runner().invoke(args=["hookledger", "intake", "list"])  # type: ignore[attr-defined]
    assert listed.exit_code == 0, listed.output
    assert " eu/payment:pay_eu_1 " in listed.output, listed.output
    assert "eu/eu/" not in listed.output, listed.output
