"""Every refused delivery is signalled and counted under the reason of its own code: only a
database that cannot store it is ``storage_unavailable`` (an alert people page on); one that
answers but whose lock stayed held past the wait is ``storage_busy``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

import receiver.core.errors as errors
import receiver.core.signals as signals
from receiver.extension import WebhookReceiver
from receiver.testing import signed_headers
from receiver.testing.factories import build_event, encode
from receiver.web.metrics import NAMES, Metrics
from tests.conftest import SECRETS, AppFactory
from tests.receiver.web.test_metrics import TOKEN, scrape, value

pytestmark = pytest.mark.storage

#: Each rejection code and the reason it is signalled and counted under.
REASONS = {
    "HL_00": "rejected",  # the root class: a rejection with no more specific cause
    "HL_01": "bad_signature",
    "HL_03": "storage_unavailable",
    "HL_04": "malformed",
    "HL_05": "schema_not_ready",
    "HL_06": "too_old",
    "HL_07": "account_unknown",
    "HL_08": "account_mismatch",
    "HL_09": "storage_busy",
    "HL_13": "too_large",
}


@pytest.fixture
def rejected() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any, **info: Any) -> None:
        seen.append(info)

    signals.event_rejected.connect(receiver)
    yield seen
    signals.event_rejected.disconnect(receiver)


def _classes() -> list[type[errors.ReceiveError]]:
    found, todo = [], [errors.ReceiveError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_each_rejection_code_is_signalled_under_its_own_reason(
    rejected: list[dict[str, Any]],
) -> None:
    classes = _classes()
    assert {cls.code for cls in classes} == set(REASONS)  # a new code needs its reason here
    for cls in classes:
        rejected.clear()
        signals.rejected(cls())
        assert [(i["reason"], i["status"]) for i in rejected] == [
            (REASONS[cls.code], cls.http_status)
        ], cls.__name__
        assert rejected[0]["code"] == cls.code
        if cls.http_status < 500:  # the request's fault, never an outage
            assert rejected[0]["reason"] != "storage_unavailable", cls.__name__
    for reason in REASONS.values():
        assert reason in NAMES["hookledger_rejections_total"], reason


def _post(app: Flask, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    response = app.test_client().post("/webhooks/", data=body, headers=headers)
    return response.status_code, response.get_json()["error"]["code"]


def test_every_rejection_path_is_counted_under_its_code(
    make_app: AppFactory, rejected: list[dict[str, Any]], tmp_path: Path
) -> None:
    app, _ = make_app(max_body_bytes=5000, max_event_age=7200)
    Metrics(app, token=TOKEN)
    http = app.test_client()
    before = scrape(http)
    secret = SECRETS["primary"]
    good = encode(build_event("payment_succeeded"))
    old = encode(build_event("payment_succeeded", timestamp=datetime.now(UTC) - timedelta(days=2)))
    big = b"x" * 6000
    answers = [
        _post(app, good, {}),
        _post(app, good, {"X-Webhook-Signature-512": "zz"}),
        _post(app, good, {"X-Webhook-Signature-512": "ab" * 64}),
        _post(app, big, signed_headers(big, secret)),
        _post(app, b"{not json", signed_headers(b"{not json", secret)),
        _post(app, old, signed_headers(old, secret)),
    ]
    # The database is not there: the one delivery refused for storage.
    down = Flask("down")
    down.config.update(
        HOOKLEDGER_DATABASE_URL=f"sqlite:///{tmp_path / 'no' / 'such' / 'x.sqlite3'}",
        HOOKLEDGER_SECRETS="primary:" + secret,
    )
    WebhookReceiver(down)
    try:
        answers.append(_post(down, good, signed_headers(good, secret)))
    finally:
        WebhookReceiver.state(down).store.engine.dispose()
    assert answers == [
        (401, "HL_01"),
        (401, "HL_01"),
        (401, "HL_01"),
        (413, "HL_13"),
        (400, "HL_04"),
        (400, "HL_06"),
        (503, "HL_03"),
    ]
    assert [(i["reason"], i["status"]) for i in rejected] == [
        (REASONS[code], status) for status, code in answers
    ]
    assert [i["code"] for i in rejected] == [code for _, code in answers]
    after = scrape(http)

    def delta(reason: str) -> float:
        return value(after, "hookledger_rejections_total", reason=reason) - value(
            before, "hookledger_rejections_total", reason=reason
        )

    assert {r: delta(r) for r in set(REASONS.values())} == {
        "rejected": 0,
        "bad_signature": 3,
        "storage_unavailable": 1,
        "storage_busy": 0,
        "malformed": 1,
        "schema_not_ready": 0,
        "too_old": 1,
        "too_large": 1,
        "account_unknown": 0,
        "account_mismatch": 0,
    }
