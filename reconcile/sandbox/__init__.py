"""A stateful local sandbox of the Hyperswitch payment processor.

Serves the processor's API (payments, refunds, payouts, customers, disputes; both list
dialects), sends signed webhooks byte-compatible with Hyperswitch's, and injects faults on
demand. For tests, demos and benchmarks; never for real money.

- :class:`SandboxServer`: serve a sandbox on loopback in a background thread.
- :class:`Sandbox`: the state, webhook and fault controller (usable without HTTP).
- :func:`create_app`: the Flask app over a :class:`Sandbox`.
"""

from reconcile.sandbox.app import create_app
from reconcile.sandbox.clock import FrozenClock
from reconcile.sandbox.errors import SandboxError
from reconcile.sandbox.faults import ApiFaultConfig, WebhookFaultConfig
from reconcile.sandbox.server import SandboxServer
from reconcile.sandbox.state import Sandbox
from reconcile.sandbox.webhooks import HYPERSWITCH_RETRY_SCHEDULE, parse_retry_schedule

__all__ = [
    "HYPERSWITCH_RETRY_SCHEDULE",
    "ApiFaultConfig",
    "FrozenClock",
    "Sandbox",
    "SandboxError",
    "SandboxServer",
    "WebhookFaultConfig",
    "create_app",
    "parse_retry_schedule",
]
