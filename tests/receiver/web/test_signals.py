"""Signals: what merchants alert on, sent after the change is committed, with id and type."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import receiver.core.signals as signals
from receiver import Defer, Event
from receiver.extension import WebhookReceiver
from receiver.testing import WebhookTestClient
from tests.conftest import AppFactory

pytestmark = pytest.mark.storage


@pytest.fixture
def caught() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []
    receivers = []
    for signal in signals.ALL:

        def receiver(sender: Any, _name: str = signal.name, **info: Any) -> None:
            seen.append((_name.split(".")[-1], info))

        signal.connect(receiver)
        receivers.append((signal, receiver))
    yield seen
    for signal, receiver in receivers:
        signal.disconnect(receiver)


def _names(seen: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [name for name, _ in seen]


def test_the_lifecycle_of_events_is_signalled(
    make_app: AppFactory, caught: list[tuple[str, dict[str, Any]]]
) -> None:
    hooks = WebhookReceiver()

    @hooks.on("payment_failed")
    def broken(event: Event) -> None:
        raise RuntimeError("template missing")

    @hooks.on("payment_succeeded")
    def fine(event: Event) -> None:
        pass

    app, _ = make_app(hooks, max_attempts=1)
    client = WebhookTestClient(app)
    assert client.send("payment_succeeded", event_id="evt_ok", object_id="pay_1").status_code == 200
    assert client.send("payment_failed", event_id="evt_bad", object_id="pay_2").status_code == 200
    assert client.post(b"{}", signature="00").status_code == 401
    client.drain()
    # A late "processing" after "succeeded" is stale; the same transition again a duplicate.
    client.send("payment_processing", event_id="evt_late", object_id="pay_1")
    client.send("payment_succeeded", event_id="evt_again", object_id="pay_1")
    client.drain()

    by_name: dict[str, list[dict[str, Any]]] = {}
    for name, info in caught:
        by_name.setdefault(name, []).append(info)
    assert [i["result"] for i in by_name["event-received"]] == ["inserted"] * 4
    rejected = [{"reason": "bad_signature", "status": 401, "code": "HL_01", "account": "default"}]
    assert by_name["event-rejected"] == rejected
    (dispatched,) = by_name["event-dispatched"]
    assert dispatched["event_id"] == "evt_ok" and dispatched["event_type"] == "payment_succeeded"
    assert [h.rsplit(".", 1)[-1] for h in dispatched["handlers"]] == ["fine"]
    assert dispatched["latency_seconds"] >= 0 and dispatched["source"] == "webhook"
    (failed,) = by_name["handler-failed"]
    assert failed["event_id"] == "evt_bad" and failed["handler"].endswith(".broken")
    assert isinstance(failed["error"], RuntimeError) and failed["will_retry"] is False
    (dead,) = by_name["event-dead-lettered"]
    assert dead["event_id"] == "evt_bad" and "template missing" in dead["reason"]
    (stale,) = by_name["event-stale"]
    assert stale["event_id"] == "evt_late" and stale["reason"]
    (duplicate,) = by_name["event-duplicate"]
    assert duplicate["event_id"] == "evt_again" and duplicate["reason"]
    durations = {
        (i["handler"].rsplit(".", 1)[-1], i["status"]) for i in by_name["handler-finished"]
    }
    assert durations == {("fine", "succeeded"), ("broken", "failed")}
    for name, info in caught:
        if name not in ("event-rejected", "reconcile-finished"):
            assert info["event_id"] and "event_type" in info, name


def test_a_conflicting_body_and_a_deferral(
    make_app: AppFactory, caught: list[tuple[str, dict[str, Any]]]
) -> None:
    hooks = WebhookReceiver()

    @hooks.on("refund_succeeded")
    def later(event: Event) -> None:
        raise Defer(60, "order not written yet")

    app, _ = make_app(hooks)
    client = WebhookTestClient(app)
    client.send("refund_succeeded", event_id="evt_c", object_id="ref_1", amount=100)
    client.send("refund_succeeded", event_id="evt_c", object_id="ref_1", amount=200)
    client.drain()
    assert ("event-conflict", {"event_id": "evt_c", "event_type": "refund_succeeded",
                               "source": "webhook", "account": "default"}) in caught  # fmt: skip
    finished = [i for n, i in caught if n == "handler-finished"]
    assert [i["status"] for i in finished] == ["deferred"]
    assert "event-dispatched" not in _names(caught) and "handler-failed" not in _names(caught)


def test_a_conflict_reaches_its_listener_when_no_one_listens_for_receipts(
    make_app: AppFactory,
) -> None:
    """Nobody listens for ``event_received``: ``event_conflict`` is still sent."""
    seen: list[dict[str, Any]] = []

    def conflict(sender: Any, **info: Any) -> None:
        seen.append(info)

    signals.event_conflict.connect(conflict)
    try:
        app, _ = make_app()
        client = WebhookTestClient(app)
        client.send("refund_succeeded", event_id="evt_k", object_id="ref_1", amount=100)
        client.send("refund_succeeded", event_id="evt_k", object_id="ref_1", amount=200)
    finally:
        signals.event_conflict.disconnect(conflict)
    assert seen == [{"event_id": "evt_k", "event_type": "refund_succeeded",
                     "source": "webhook", "account": "default"}]  # fmt: skip


def test_a_receiver_that_raises_never_breaks_receiving(make_app: AppFactory) -> None:
    def angry(sender: Any, **info: Any) -> None:
        raise RuntimeError("pager down")

    signals.event_received.connect(angry)
    try:
        app, _ = make_app()
        assert WebhookTestClient(app).send("payment_succeeded").status_code == 200
    finally:
        signals.event_received.disconnect(angry)


def test_the_sender_is_the_app_in_an_app_context(make_app: AppFactory) -> None:
    app, _ = make_app()
    senders: list[Any] = []

    def mine(sender: Any, **info: Any) -> None:
        senders.append(sender)

    signals.event_received.connect(mine, sender=app)
    try:
        WebhookTestClient(app).send("payment_succeeded")
    finally:
        signals.event_received.disconnect(mine, sender=app)
    assert senders == [app]
