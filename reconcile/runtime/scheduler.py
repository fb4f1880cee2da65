"""The reconcile schedule (APScheduler 3.x), run as its own process: ``reconcile schedule``.

Two jobs: a frequent incremental run (default every 10 minutes) and a nightly wide run
(default 02:00 UTC over the previous 48 hours); and the receiver's retention (prune, then
redact, daily at 03:30 UTC). All coalesce missed firings into one run, never overlap
(``max_instances=1``; the database lock also keeps other hosts out), and are skipped when
more than ``misfire_grace`` seconds late. Never start this inside web workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

log = logging.getLogger("reconcile.scheduler")

INCREMENTAL_JOB = "reconcile-incremental"
NIGHTLY_JOB = "reconcile-nightly"
RETENTION_JOB = "hookledger-retention"


def parse_time_of_day(value: str) -> tuple[int, int]:
    """``"02:00"`` -> ``(2, 0)``; raises ValueError with a clear message."""
    try:
        hour_text, minute_text = value.strip().split(":")
        hour, minute = int(hour_text), int(minute_text)
    except ValueError:
        raise ValueError(f"time of day must look like HH:MM, not {value!r}") from None
    if not (0 <= hour < 24 and 0 <= minute < 60):
        raise ValueError(f"time of day out of range: {value!r}")
    return hour, minute


def configure(
    scheduler: BaseScheduler,
    run: Callable[[str], Any],
    *,
    every_minutes: float = 10.0,
    nightly_at: str = "02:00",
    misfire_grace: int = 300,
    retention: Callable[[], Any] | None = None,
    retention_at: str = "03:30",
) -> BaseScheduler:
    """Add the two reconcile jobs to ``scheduler``; ``run(mode)`` does one run. With
    ``retention``, a third job calls it daily at ``retention_at`` UTC (prune, then redact:
    :mod:`receiver.atrest.retention`)."""
    if every_minutes <= 0:
        raise ValueError("the incremental interval must be positive")
    hour, minute = parse_time_of_day(nightly_at)
    retention_time = parse_time_of_day(retention_at)
    defaults = {"coalesce": True, "max_instances": 1, "misfire_grace_time": misfire_grace}
    scheduler.add_job(
        run,
        IntervalTrigger(minutes=every_minutes, timezone="UTC"),
        args=["incremental"],
        id=INCREMENTAL_JOB,
        name="incremental reconcile",
        replace_existing=True,
        **defaults,
    )
    scheduler.add_job(
        run,
        CronTrigger(hour=hour, minute=minute, timezone="UTC"),
        args=["wide"],
        id=NIGHTLY_JOB,
        name="nightly wide reconcile",
        replace_existing=True,
        **defaults,
    )
    if retention is not None:
        scheduler.add_job(
            retention,
            CronTrigger(hour=retention_time[0], minute=retention_time[1], timezone="UTC"),
            id=RETENTION_JOB,
            name="nightly retention (prune, redact)",
            replace_existing=True,
            **defaults,
        )
    return scheduler


def blocking_scheduler() -> BlockingScheduler:
    return BlockingScheduler(timezone="UTC")
