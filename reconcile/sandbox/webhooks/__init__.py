"""Outgoing webhooks of the sandbox, byte-compatible with Hyperswitch's, and their records.

``from reconcile.sandbox.webhooks import ...`` is the path; the code lives in one module per
concept:

- :mod:`~reconcile.sandbox.webhooks.envelope`: the body, the headers, the event ids.
- :mod:`~reconcile.sandbox.webhooks.schedule`: the retry schedule (Hyperswitch's, or parsed).
- :mod:`~reconcile.sandbox.webhooks.records`: emitted events and their delivery attempts (the
  events API's rows).
- :mod:`~reconcile.sandbox.webhooks.report`: what one clock-driven delivery call sent.
- :mod:`~reconcile.sandbox.webhooks.sending`: sending one attempt (``requests`` or a sender).
- :mod:`~reconcile.sandbox.webhooks.dispatcher`: :class:`WebhookDispatcher`, which emits events
  (at most one per object and event type) and delivers them, threaded or clock-driven, with
  retries and the webhook faults.
"""

from reconcile.sandbox.webhooks.dispatcher import WebhookDispatcher
from reconcile.sandbox.webhooks.envelope import (
    CONTENT_TYPES,
    EVENT_CLASSES,
    USER_AGENT,
    encode_body,
    new_event_id,
    request_headers,
)
from reconcile.sandbox.webhooks.records import DeliveryAttempt, WebhookEvent
from reconcile.sandbox.webhooks.report import DeliveryRecord, DeliveryReport
from reconcile.sandbox.webhooks.schedule import (
    HYPERSWITCH_RETRY_SCHEDULE,
    expand_schedule,
    parse_retry_schedule,
)
from reconcile.sandbox.webhooks.sending import MAX_RESPONSE_BODY, Sender

__all__ = [
    "CONTENT_TYPES",
    "EVENT_CLASSES",
    "HYPERSWITCH_RETRY_SCHEDULE",
    "MAX_RESPONSE_BODY",
    "USER_AGENT",
    "DeliveryAttempt",
    "DeliveryRecord",
    "DeliveryReport",
    "Sender",
    "WebhookDispatcher",
    "WebhookEvent",
    "encode_body",
    "expand_schedule",
    "new_event_id",
    "parse_retry_schedule",
    "request_headers",
]
