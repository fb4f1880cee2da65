"""What one clock-driven delivery call sent: a :class:`DeliveryReport` of
:class:`DeliveryRecord` rows, one per attempt, in order (the answer of
:meth:`~reconcile.sandbox.webhooks.dispatcher.WebhookDispatcher.deliver_due`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryRecord:
    """What one attempt sent by :meth:`WebhookDispatcher.deliver_due` did."""

    event_id: str
    attempt_id: str
    event_type: str
    object_id: str
    delivery_attempt: str
    at: datetime
    status_code: int | None
    error: str | None
    #: True when this attempt was the last one (delivered, or retries exhausted).
    final: bool

    @property
    def successful(self) -> bool:
        """A 2xx answer."""
        return self.status_code is not None and 200 <= self.status_code < 300


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """The attempts one :meth:`WebhookDispatcher.deliver_due` call sent, in order."""

    attempts: tuple[DeliveryRecord, ...] = ()

    def __len__(self) -> int:
        return len(self.attempts)

    def __iter__(self) -> Iterator[DeliveryRecord]:
        return iter(self.attempts)

    @property
    def delivered(self) -> list[str]:
        """Event ids delivered (a 2xx) by this call."""
        return [r.event_id for r in self.attempts if r.successful]

    @property
    def failed(self) -> list[DeliveryRecord]:
        """Attempts that failed (a retry may follow)."""
        return [r for r in self.attempts if not r.successful]

    @property
    def given_up(self) -> list[str]:
        """Event ids whose last automatic retry failed in this call."""
        return [r.event_id for r in self.attempts if r.final and not r.successful]
