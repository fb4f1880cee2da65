"""Key rotation under load loses nothing (SQLite and PostgreSQL).

While ``rotate-keys`` seals the stored rows again with a new primary key, webhooks keep
arriving (new ones, and processor retries of rows being rotated) and a worker keeps
dispatching. Afterwards every event is stored once, handled once, and readable with the new
key alone; retries were answered as duplicates.
"""

from __future__ import annotations

import base64
import threading
import time
from collections import Counter

import pytest

from receiver import Event, WebhookReceiver
from receiver.core.events import parse_event
from receiver.storage.operator_actions import EventFilter
from receiver.testing import signed_headers
from receiver.testing.factories import build_event, encode
from tests.conftest import SECRETS, AppFactory

pytestmark = pytest.mark.storage

KEY1 = base64.b64encode(b"1" * 32).decode()
KEY2 = base64.b64encode(b"2" * 32).decode()
OLD, NEW = 100, 100
TYPES = ("payment_succeeded", "refund_succeeded", "dispute_opened", "payout_success")


def _bodies(prefix: str, n: int) -> dict[str, bytes]:
    return {
        f"evt_{prefix}_{i:04d}": encode(
            build_event(
                TYPES[i % len(TYPES)],
                event_id=f"evt_{prefix}_{i:04d}",
                object_id=f"obj_{prefix}_{i}",
                metadata={"order_id": f"{prefix}-{i}"},
            )
        )
        for i in range(n)
    }


def test_rotation_under_load_loses_nothing(make_app: AppFactory) -> None:
    handled: Counter[str] = Counter()
    lock = threading.Lock()
    hooks = WebhookReceiver()

    @hooks.on_any()
    def count(event: Event) -> None:
        with lock:
            handled[event.event_id] += 1

    old_app, _ = make_app(hooks, data_keys=f"k1:{KEY1}")
    old = _bodies("old", OLD)
    client = old_app.test_client()
    for body in old.values():
        sent = signed_headers(body, SECRETS["primary"])
        assert client.post("/webhooks/", data=body, headers=sent).status_code == 200
    # Half of them dispatched before the rotation starts, half still queued.
    state = WebhookReceiver.state(old_app)
    state.worker(name="before", batch_size=8).run_once()
    while sum(handled.values()) < OLD // 2:
        state.worker(name="before", batch_size=8).run_once()

    # The new deployment: k2 first (the primary), k1 still readable.
    new_app, _ = make_app(hooks, data_keys=f"k2:{KEY2},k1:{KEY1}")
    new_state = WebhookReceiver.state(new_app)
    store = new_state.store
    store.rotation.batch_size = 16
    new = _bodies("new", NEW)
    answers: Counter[str] = Counter()
    errors: list[BaseException] = []
    stop = threading.Event()

    def receive() -> None:
        try:
            client = new_app.test_client()
            retries = list(old.values())[::4]
            for i, body in enumerate(new.values()):
                for sent_body in (body, retries[i % len(retries)]) if i % 3 == 0 else (body,):
                    sent = signed_headers(sent_body, SECRETS["primary"])
                    response = client.post("/webhooks/", data=sent_body, headers=sent)
                    assert response.status_code == 200, response.data
                    answers[response.json["status"]] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def work() -> None:
        try:
            worker = new_state.worker(name="during", batch_size=8)
            while not stop.is_set():
                if not worker.run_once():
                    stop.wait(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=receive), threading.Thread(target=work)]
    for thread in threads:
        thread.start()
    while answers.total() < 10 and not errors:
        time.sleep(0.01)
    before = (answers.total(), sum(handled.values()))
    # Batches of 16 with a pause between them: the rotation spans many receipts and claims.
    report = store.rotation.run(progress=lambda _n: time.sleep(0.05))
    during = (answers.total() - before[0], sum(handled.values()) - before[1])
    threads[0].join(timeout=120)
    stop.set()
    threads[1].join(timeout=120)
    assert not errors, errors
    assert report.rotated["events"] >= OLD // 2 and not report.unreadable
    assert during[0] > 0 and during[1] > 0, "the rotation did not overlap receipt and dispatch"

    # Whatever the concurrent run left (rows a worker held at that moment) goes next time.
    again = store.rotation.run()
    assert again.complete, again.render()
    new_state.worker(name="after").drain()

    # Nothing lost, nothing twice, everything readable with k2 alone.
    assert answers["inserted"] == NEW and answers["duplicate"] == answers.total() - NEW
    assert handled == Counter({event_id: 1 for event_id in {**old, **new}})
    only_new, _ = make_app(data_keys=f"k2:{KEY2}")
    reader = WebhookReceiver.state(only_new).store
    events = reader.operations.select_events(EventFilter())
    assert len(events) == OLD + NEW
    for event in events:
        assert event.key_id == "k2" and event.status == "done"
        body = reader.open_body(event.body, event.event_id)
        assert body == {**old, **new}[event.event_id]
        assert parse_event(body).event_id == event.event_id
    # A processor retry after the rotation is still a duplicate (the hash was re-keyed).
    retry = old["evt_old_0001"]
    response = only_new.test_client().post(
        "/webhooks/", data=retry, headers=signed_headers(retry, SECRETS["primary"])
    )
    assert response.json["status"] == "duplicate"
