"""A stateful local sandbox of the Hyperswitch payment processor.

Serves the processor's API (payments, refunds, payouts, customers, disputes, mandates, the
admin events API; both list dialects) with only the fields of Hyperswitch's OpenAPI contract,
sends signed webhooks byte-compatible with Hyperswitch's, runs lifecycles on a settable clock
(authorisation expiry, asynchronous captures, dispute stages, payout reversals, ...) and
injects faults on demand. For tests, demos and benchmarks; never for real money.

- :class:`SandboxServer`: serve a sandbox on loopback in a background thread.
- :class:`MerchantsServer` / :class:`MerchantsApp`: several merchants (a :class:`Sandbox`
  each, with its own keys, webhook URL and secret) on one base URL, routed by ``api-key``.
- :class:`Sandbox`: the state, webhook and fault controller (usable without HTTP).
- :func:`create_app`: the Flask app over a :class:`Sandbox`.
- :func:`mount_wsgi` / :func:`wsgi_sender`: in-process HTTP (no socket) to the app, and
  webhook delivery into a Flask app, for ``Sandbox(send=...)``'s clock-driven delivery.

Module guide: :mod:`~reconcile.sandbox.state` (behaviour, lifecycles),
:mod:`~reconcile.sandbox.app` (routes), :mod:`~reconcile.sandbox.webhooks` (bodies,
delivery, events records), :mod:`~reconcile.sandbox.cards` (test cards),
:mod:`~reconcile.sandbox.faults` (faults), :mod:`~reconcile.sandbox.models` (what answers
carry), :mod:`~reconcile.sandbox.transport` (in-process HTTP),
:mod:`~reconcile.sandbox.merchants` (several merchants).
"""

from reconcile.sandbox.app import create_app
from reconcile.sandbox.clock import FrozenClock
from reconcile.sandbox.errors import SandboxError
from reconcile.sandbox.faults import ApiFaultConfig, WebhookFaultConfig
from reconcile.sandbox.merchants import MerchantsApp, MerchantsServer
from reconcile.sandbox.server import SandboxServer
from reconcile.sandbox.state import Sandbox
from reconcile.sandbox.transport import WSGIAdapter, mount_wsgi, wsgi_sender
from reconcile.sandbox.webhooks import (
    HYPERSWITCH_RETRY_SCHEDULE,
    DeliveryRecord,
    DeliveryReport,
    parse_retry_schedule,
)

__all__ = [
    "HYPERSWITCH_RETRY_SCHEDULE",
    "ApiFaultConfig",
    "DeliveryRecord",
    "DeliveryReport",
    "FrozenClock",
    "MerchantsApp",
    "MerchantsServer",
    "Sandbox",
    "SandboxError",
    "SandboxServer",
    "WSGIAdapter",
    "WebhookFaultConfig",
    "create_app",
    "mount_wsgi",
    "parse_retry_schedule",
    "wsgi_sender",
]
