"""The retry schedule of the sandbox's outgoing webhooks: the delays before each retry.

Hyperswitch's default (60 s, then 300 s x2, 600 s x5, 3600 s x5, 21600 s x3, each measured from
the previous attempt), or a schedule parsed from ``"none"`` or delays such as ``"0.2,0.2,1"`` /
``"0.2x3,1"`` (the sandbox command's option).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final


def expand_schedule(steps: Iterable[tuple[float, int]]) -> tuple[float, ...]:
    """``[(60, 1), (300, 2)]`` -> ``(60, 300, 300)``: delays before each retry, in seconds."""
    return tuple(float(delay) for delay, count in steps for _ in range(count))


#: Hyperswitch's default outgoing-webhook retry delays (16 retries over about 24 hours).
HYPERSWITCH_RETRY_SCHEDULE: Final = expand_schedule(
    [(60, 1), (300, 2), (600, 5), (3600, 5), (21600, 3)]
)


def parse_retry_schedule(spec: str) -> tuple[float, ...]:
    """Parse ``"hyperswitch"``, ``"none"`` or delays such as ``"0.2,0.2,1"`` / ``"0.2x3,1"``."""
    text = spec.strip().lower()
    if text == "hyperswitch":
        return HYPERSWITCH_RETRY_SCHEDULE
    if text in {"", "none"}:
        return ()
    steps: list[tuple[float, int]] = []
    for part in text.split(","):
        delay, _, count = part.strip().partition("x")
        try:
            step = (float(delay), int(count) if count else 1)
        except ValueError as exc:
            raise ValueError(f"invalid retry schedule step {part.strip()!r}") from exc
        if step[0] < 0 or step[1] < 1:
            raise ValueError(f"invalid retry schedule step {part.strip()!r}")
        steps.append(step)
    return expand_schedule(steps)
