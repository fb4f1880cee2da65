"""The retry schedule of a failed event: exponential backoff with jitter, then dead-letter."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Per-event retry schedule: exponential backoff with jitter, then dead-letter."""

    max_attempts: int = 8
    base_seconds: float = 2.0
    max_seconds: float = 3600.0
    #: How long after its receipt an event may still be deferred (:class:`receiver.Defer`).
    defer_limit_seconds: float = 86_400.0

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """Delay before attempt ``attempts + 1``: ``base * 2**(attempts-1)``, capped, with
        "equal jitter" (between half and all of it) so retries of many events spread out."""
        ceiling = min(self.max_seconds, self.base_seconds * (2.0 ** max(attempts - 1, 0)))
        jitter: float = (rng or random.Random()).uniform(0.0, ceiling / 2)
        return ceiling / 2 + jitter
