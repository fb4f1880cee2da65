"""The records of the sandbox's emitted webhooks: what the events API answers.

Every emitted event is kept with its stored request (the body and the headers *with the real
signature*) and one :class:`DeliveryAttempt` per row of Hyperswitch's events table: the
``initial_attempt`` (its id is the body's ``event_id``; created when the event is emitted, its
response filled when it is sent), then each ``automatic_retry`` and ``manual_retry`` with a
new ``evt_`` id. A dropped event (the ``drop`` fault) or one emitted without a webhook URL has
an initial attempt that never got a response: it is listed as undelivered. The
``corrupt_signature`` fault corrupts only what goes on the wire; the stored request keeps the
signature Hyperswitch computed, so a manual retry
(:meth:`~reconcile.sandbox.webhooks.dispatcher.WebhookDispatcher.retry`) re-sends the original
bytes with a valid signature. A ``duplicate`` fault's second copy is recorded as
``automatic_retry`` rows.

An event can also be listed before its request is recorded (``request_recorded`` false: a
process killed mid-delivery, after the event row was written and before its request was):
its attempts then show ``request: null`` until the request is recorded
(:meth:`~reconcile.sandbox.webhooks.dispatcher.WebhookDispatcher.unrecord_request` and
``record_request``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reconcile.sandbox.clock import format_timestamp
from reconcile.sandbox.webhooks.envelope import CONTENT_TYPES, EVENT_CLASSES, request_headers


@dataclass(slots=True, kw_only=True, eq=False)
class DeliveryAttempt:
    """One row of the events table: one attempt to deliver an event."""

    #: This attempt's id; the initial attempt's is the event's (and the body's) ``event_id``.
    attempt_id: str
    #: ``initial_attempt``, ``automatic_retry`` or ``manual_retry``.
    delivery_attempt: str
    created: datetime
    #: True once a request was really sent (or a transport failure was seen).
    sent: bool = False
    status_code: int | None = None
    response_body: str | None = field(default=None, repr=False)
    response_headers: list[tuple[str, str]] | None = field(default=None, repr=False)
    error_message: str | None = None

    @property
    def successful(self) -> bool:
        """A 2xx answer."""
        return self.status_code is not None and 200 <= self.status_code < 300

    def outcome(self) -> str:
        """``"2xx"``, ``"HTTP <status>"``, the transport error, or ``"not sent"``."""
        if self.successful:
            return "2xx"
        if self.status_code is not None:
            return f"HTTP {self.status_code}"
        return self.error_message or "not sent"


@dataclass(slots=True, kw_only=True, eq=False)
class WebhookEvent:
    """One emitted event, its stored request and its delivery attempts."""

    event_id: str
    event_type: str
    kind: str
    object_id: str
    profile_id: str
    seq: int
    body: bytes = field(repr=False)
    signature: str = field(repr=False)
    created: datetime
    #: ``pending``, ``delivered``, ``failed`` (retries exhausted), ``dropped`` or
    #: ``undeliverable`` (no webhook URL configured).
    state: str = "pending"
    delivery_attempts: list[DeliveryAttempt] = field(default_factory=list)
    #: False while the event's request is not recorded yet (its attempts show no request).
    request_recorded: bool = True

    @property
    def event_class(self) -> str:
        """Hyperswitch's ``EventClass`` of the event."""
        return EVENT_CLASSES[self.kind]

    @property
    def is_delivery_successful(self) -> bool:
        """True once any attempt got a 2xx (Hyperswitch's overall delivery status)."""
        return any(attempt.successful for attempt in self.delivery_attempts)

    @property
    def attempts(self) -> int:
        """How many requests were sent (or failed at the transport) so far."""
        return sum(1 for attempt in self.delivery_attempts if attempt.sent)

    def stored_headers(self) -> dict[str, str]:
        """The stored request's headers: the real signature, whatever went on the wire."""
        return request_headers(self.signature)

    def to_json(self) -> dict[str, Any]:
        """The sandbox's own view (``GET /__sandbox/events``)."""
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "object_type": CONTENT_TYPES[self.kind],
            "object_id": self.object_id,
            "created": format_timestamp(self.created),
            "state": self.state,
            "attempts": self.attempts,
            "responses": [a.outcome() for a in self.delivery_attempts if a.sent],
            "body": self.body.decode("utf-8"),
        }

    def to_list_item(self, merchant_id: str) -> dict[str, Any]:
        """``EventListItemResponse`` of the initial attempt (overall delivery status)."""
        return self._item(merchant_id, self.event_id, self.created, self.is_delivery_successful)

    def to_retrieve(self, merchant_id: str, attempt: DeliveryAttempt) -> dict[str, Any]:
        """``EventRetrieveResponse`` of one attempt.

        The initial attempt carries the overall delivery status, a retry its own outcome.
        """
        initial = attempt.delivery_attempt == "initial_attempt"
        success = self.is_delivery_successful if initial else attempt.successful
        item = self._item(merchant_id, attempt.attempt_id, attempt.created, success)
        item["request"] = (
            {
                "body": self.body.decode("utf-8"),
                "headers": [[name, value] for name, value in self.stored_headers().items()],
            }
            if self.request_recorded
            else None
        )
        item["response"] = {
            "body": attempt.response_body,
            "headers": (
                None
                if attempt.response_headers is None
                else [[name, value] for name, value in attempt.response_headers]
            ),
            "status_code": attempt.status_code,
            "error_message": attempt.error_message,
        }
        item["delivery_attempt"] = attempt.delivery_attempt
        return item

    def _item(
        self, merchant_id: str, event_id: str, created: datetime, success: bool
    ) -> dict[str, Any]:
        return {
            "event_id": event_id,
            "merchant_id": merchant_id,
            "profile_id": self.profile_id,
            "object_id": self.object_id,
            "event_type": self.event_type,
            "event_class": self.event_class,
            "is_delivery_successful": success,
            "initial_attempt_id": self.event_id,
            "created": format_timestamp(created),
        }
