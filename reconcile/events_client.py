"""The public path of the admin events API client: re-exports :mod:`reconcile.client.events_api`,
where the code lives (see docs/architecture.md)."""

from reconcile.client.events_api import (
    EVENTS_LIST_MAX_DAYS as EVENTS_LIST_MAX_DAYS,
)
from reconcile.client.events_api import (
    EventsClient as EventsClient,
)

__all__ = [
    "EVENTS_LIST_MAX_DAYS",
    "EventsClient",
]
