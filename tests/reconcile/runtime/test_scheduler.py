"""The reconcile schedule's triggers, coalescing and misfire handling, under freezegun."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from apscheduler.executors.debug import DebugExecutor
from apscheduler.schedulers.base import BaseScheduler
from freezegun import freeze_time

import reconcile.runtime.scheduler as sched


class ManualScheduler(BaseScheduler):
    """Runs due jobs only when the test calls :meth:`tick` (no threads, no timers)."""

    def shutdown(self, wait: bool = True) -> None:
        super().shutdown(wait)

    def wakeup(self) -> None:
        pass

    def tick(self) -> None:
        self._process_jobs()


def _scheduler(runs: list[tuple[str, datetime]], **kw: Any) -> ManualScheduler:
    scheduler = ManualScheduler(timezone="UTC", executors={"default": DebugExecutor()})

    def run(mode: str) -> None:
        runs.append((mode, datetime.now(UTC)))

    sched.configure(scheduler, run, **kw)
    scheduler.start()
    return scheduler


def test_incremental_every_ten_minutes_and_nightly_at_two() -> None:
    runs: list[tuple[str, datetime]] = []
    with freeze_time("2026-11-21 23:55:00", tz_offset=0) as frozen:
        scheduler = _scheduler(runs)
        for _ in range(17):  # until 02:45
            frozen.tick(timedelta(minutes=10))
            scheduler.tick()
        scheduler.shutdown()
    modes = [m for m, _ in runs]
    assert modes.count("incremental") == 17
    assert modes.count("wide") == 1
    wide_at = next(t for m, t in runs if m == "wide")
    assert (wide_at.hour, wide_at.minute) == (2, 5)  # the first tick at or after 02:00


def test_missed_runs_are_coalesced_into_one() -> None:
    runs: list[tuple[str, datetime]] = []
    with freeze_time("2026-11-22 10:00:00") as frozen:
        scheduler = _scheduler(runs, misfire_grace=3600 * 24)
        frozen.tick(timedelta(hours=3))  # 18 incremental firings missed (process was stopped)
        scheduler.tick()
        scheduler.shutdown()
    assert [m for m, _ in runs] == ["incremental"]


def test_runs_later_than_the_grace_are_skipped() -> None:
    runs: list[tuple[str, datetime]] = []
    with freeze_time("2026-11-22 10:00:00") as frozen:
        scheduler = _scheduler(runs, every_minutes=60, misfire_grace=60)
        frozen.tick(timedelta(minutes=65))  # 5 minutes late, grace is 1 minute
        scheduler.tick()
        assert runs == []
        frozen.tick(timedelta(minutes=55))  # the 12:00 firing is on time
        scheduler.tick()
        scheduler.shutdown()
    assert [m for m, _ in runs] == ["incremental"]


def test_jobs_never_overlap_and_coalesce() -> None:
    scheduler = _scheduler([])
    for job in scheduler.get_jobs():
        assert job.coalesce is True
        assert job.max_instances == 1
    scheduler.shutdown()


@pytest.mark.parametrize("value", ["2", "25:00", "02:61", "x:y", ""])
def test_bad_time_of_day_is_a_clear_error(value: str) -> None:
    with pytest.raises(ValueError, match="HH:MM|out of range"):
        sched.parse_time_of_day(value)
