"""Data-at-rest settings (receiver/atrest.py), the maximum event age, the retention job."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from apscheduler.executors.debug import DebugExecutor
from freezegun import freeze_time

import reconcile.runtime.scheduler as sched
from receiver.config.data_at_rest import (
    DataAtRest,
    RejectionPolicy,
    RetentionPolicy,
    check_event_age,
    from_environment,
)
from receiver.core.errors import ConfigurationError, EventTooOld
from receiver.core.events import parse_event
from receiver.testing.factories import build_event, encode
from tests.reconcile.runtime.test_scheduler import ManualScheduler

KEY = base64.b64encode(bytes(32)).decode()


def resolve(**values: Any) -> DataAtRest:
    return DataAtRest.resolve(lambda name, default=None: values.get(name, default))


def test_defaults_keep_todays_behaviour_with_status_aware_retention() -> None:
    data = resolve()
    assert not data.keyring.enabled and data.max_event_age is None
    assert data.rejections == RejectionPolicy()
    assert data.retention.describe() == "redact=30,done=90,dead=180,conflicts=90,rejected=14"


def test_retention_days_parse() -> None:
    policy = RetentionPolicy.parse("redact=7, dead=never,rejected=0")
    assert (policy.redact, policy.done, policy.dead, policy.rejected) == (7, 90, None, None)
    assert policy.age("redact") == timedelta(days=7) and policy.age("dead") is None
    assert RetentionPolicy.parse({"done": 30}).done == 30
    for bad in ("redact=0.5", "done", "kept=3", "dead=soon"):
        with pytest.raises(ConfigurationError):
            RetentionPolicy.parse(bad)


def test_settings_refuse_what_cannot_work() -> None:
    with pytest.raises(ConfigurationError, match="needs a data key"):
        resolve(REJECTIONS_BODY_BYTES="512")
    assert resolve(REJECTIONS_BODY_BYTES="512", DATA_KEYS=f"k:{KEY}").rejections.body_bytes == 512
    with pytest.raises(ConfigurationError, match="at least 3600"):
        resolve(MAX_EVENT_AGE="60")
    with pytest.raises(ConfigurationError):
        resolve(REJECTIONS_PER_MINUTE="0")
    with pytest.raises(ConfigurationError, match="invalid"):
        resolve(MAX_EVENT_AGE="a day")
    env = from_environment({"HOOKLEDGER_DATA_KEYS": f"k:{KEY}", "HOOKLEDGER_REJECTIONS": "off"})
    assert env.keyring.primary == "k" and not env.rejections.enabled


def test_without_a_data_key_start_up_warns(caplog: pytest.LogCaptureFixture) -> None:
    resolve().warn("test")
    assert "stored in the clear" in caplog.text
    caplog.clear()
    resolve(DATA_KEYS=f"k:{KEY}", MAX_EVENT_AGE="7200").warn("test")
    assert "clear" not in caplog.text and "shorter than the processor's retries" in caplog.text


def test_max_event_age() -> None:
    now = datetime(2026, 11, 23, 12, tzinfo=UTC)
    old = parse_event(encode(build_event("payment_succeeded", timestamp=now - timedelta(days=3))))
    fresh = parse_event(encode(build_event("payment_succeeded", timestamp=now)))
    check_event_age(old, None, lambda: now)  # off by default
    check_event_age(fresh, timedelta(days=2), lambda: now)
    with pytest.raises(EventTooOld) as caught:
        check_event_age(old, timedelta(days=2), lambda: now)
    assert caught.value.http_status == 400 and caught.value.reason == "too_old"


def test_the_scheduler_runs_retention_nightly() -> None:
    runs: list[str] = []
    with freeze_time("2026-11-22 23:55:00") as frozen:
        scheduler = ManualScheduler(timezone="UTC", executors={"default": DebugExecutor()})
        sched.configure(
            scheduler, runs.append, retention=lambda: runs.append("retention"), retention_at="03:30"
        )
        scheduler.start()
        for _ in range(144):  # a day, every ten minutes
            frozen.tick(timedelta(minutes=10))
            scheduler.tick()
        scheduler.shutdown()
    assert runs.count("retention") == 1 and runs.count("wide") == 1
    with pytest.raises(ValueError, match="HH:MM"):
        sched.configure(ManualScheduler(timezone="UTC"), runs.append, retention_at="3")
