"""The shop's own API responses, fed through the same gate as webhooks (source ``api``).

A shop that confirms a payment server-side sees its status in the response and may want to
fulfil at once; when the webhook for the same transition arrives, it must not fulfil again
(and the other way round). :meth:`receiver.WebhookReceiver.observe` turns the object the
processor returned into the event the processor would send for it (this module, pure) and
stores it in the inbox, where the transition-once rule makes whichever of API response,
webhook and reconciler comes first the one that dispatches; the others are recorded as
duplicates of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import receiver.core.objects as objects
import receiver.core.status as statuses
from receiver.core.clock import as_utc
from receiver.core.errors import HookledgerError
from receiver.core.events import Event, parse_event

Stored = Literal["inserted", "duplicate", "conflict", "no_event"]


class NotAnObject(HookledgerError, ValueError):
    """The value is not a processor API object hookledger can observe."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """What :meth:`~receiver.WebhookReceiver.observe` did with an API response.

    ``stored``: ``inserted`` (a new event), ``duplicate`` (this very response was observed
    before), ``conflict`` or ``no_event`` (a status the processor sends no event for: nothing
    to dispatch). ``status``: with ``dispatch=True``, the event's status after it was
    processed inline (``done``: this response dispatched the transition; ``duplicate``: a
    webhook or the reconciler dispatched it first; ``stale``; ``deferred``; ``pending``: a
    handler failed and is retried; ``dead``), or ``None`` when it is queued for the worker
    (another worker held the object, or took it over from this call, see the README's
    "Your own API calls").
    """

    kind: str
    object_id: str
    state: str | None
    event_type: str | None
    event_id: str | None
    stored: Stored
    status: str | None = None
    pk: int | None = None

    @property
    def dispatched_here(self) -> bool:
        """True when this call's event dispatched the transition (``dispatch=True``); an
        observation stored before (``stored == "duplicate"``) never did it here."""
        return self.stored == "inserted" and self.status == "done"


def build(
    resource: Mapping[str, Any], *, kind: str | None, now: datetime
) -> tuple[str, str, Any, Event | None, bytes | None]:
    """``(kind, object_id, state, event, body)`` for an API object; event and body are
    ``None`` for a status the processor sends no event for."""
    if not isinstance(resource, Mapping):
        raise NotAnObject("observe() takes the processor's API object (a dict)")
    kind = kind or objects.kind_of(resource)
    if kind is None or kind not in objects.KINDS:
        raise NotAnObject(
            "cannot tell the object's kind: pass kind= (payment, refund, dispute, payout, mandate)"
        )
    object_id = objects.object_id_of(kind, resource)
    if not isinstance(object_id, str) or not object_id.strip():
        raise NotAnObject(f"the {kind} has no {objects.KINDS[kind].id_field}")
    state = objects.state_of(kind, resource)
    if state is None:
        raise NotAnObject(f"the {kind} has no status")
    event_type = statuses.event_type_for_status(kind, state.status)
    if event_type is None:
        return kind, object_id, state, None, None
    when = objects.modified_time(kind, resource) or as_utc(now)
    event_id = objects.event_id_for("api", kind, object_id, state.key)
    try:
        body = objects.event_body(
            kind, resource, event_id=event_id, event_type=event_type, timestamp=when
        )
    except ValueError as exc:
        raise NotAnObject(str(exc)) from None
    return kind, object_id, state, parse_event(body), body
