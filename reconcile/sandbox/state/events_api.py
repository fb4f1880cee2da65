"""Hyperswitch's admin events API (``admin_api_key``): list events, their delivery
attempts, manual retry: :class:`EventsApiMixin`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from receiver.core.events import EVENT_CLASSES, EVENT_TYPES
from reconcile.sandbox import fields
from reconcile.sandbox.errors import invalid, not_found
from reconcile.sandbox.listing import Window, offset_from, time_from, values_from
from reconcile.sandbox.models import JSONDict
from reconcile.sandbox.state.base import IGNORE_FILTERS, SandboxBase

#: Event classes as Hyperswitch filters them (``EventClass::event_types()``):
#: ``payment_partially_authorized`` is not among the ``payments`` class's types.
_CLASS_EVENT_TYPES: Final = {
    cls: frozenset(
        t for t, c in EVENT_TYPES.items() if c == cls and t != "payment_partially_authorized"
    )
    for cls in EVENT_CLASSES
}
_EVENT_LIST_FIELDS: Final = frozenset(
    {
        "created_after",
        "created_before",
        "limit",
        "offset",
        "object_id",
        "event_id",
        "profile_id",
        "event_classes",
        "event_types",
        "is_delivered",
    }
)
#: The events API lists events created in the last 90 days (and takes bounds within them).
EVENTS_RETENTION: Final = timedelta(days=90)


class EventsApiMixin(SandboxBase):
    """The events API."""

    # -- events API (admin key) ------------------------------------------------------------

    def list_events(
        self, merchant_id: str, body: fields.Body, *, list_fault: str | None = None
    ) -> JSONDict:
        """``POST /events/<merchant_id>``: ``TotalEventsResponse`` of initial attempts.

        Body ``EventListConstraints``: ``created_after``/``created_before`` (with an offset,
        within the last 90 days of the sandbox clock; without ``created_after`` only the last
        90 days are listed), ``limit`` (0..100, default 100), ``offset``, ``profile_id``,
        ``event_classes``, ``event_types``, ``is_delivered``; ``event_id`` or ``object_id``
        switch to a lookup of that event or of that object's events (the other constraints
        are then ignored, except the profile). Newest first. Every emitted event is listed,
        including dropped and undelivered ones (``is_delivery_successful: false``).

        ``profile_id`` (which must be one of the merchant's business profiles: 404
        otherwise) lists that profile's events only, as does a profile id in the path in
        place of the merchant id (the older ``/events/{merchant_id_or_profile_id}``).
        """
        self._check_merchant(merchant_id)
        unknown = set(body) - _EVENT_LIST_FIELDS
        if unknown:
            raise invalid(
                f"Json deserialize error: unknown field `{sorted(unknown)[0]}`, expected one of "
                + ", ".join(f"`{name}`" for name in sorted(_EVENT_LIST_FIELDS))
            )
        limit = body.get("limit")
        if limit is None:
            limit = 100
        if not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= 100:
            raise invalid("limit must be between 0 and 100")
        offset = offset_from(body.get("offset"))
        after = time_from(body, "created_after", allow_naive=False)
        before = time_from(body, "created_before", allow_naive=False)
        now = self.now()
        oldest = now - EVENTS_RETENTION
        for name, value in (("created_after", after), ("created_before", before)):
            if value is not None and value < oldest:
                raise invalid(f"{name} must be within the last 90 days")
        classes = values_from(body, "event_classes", allowed=EVENT_CLASSES)
        types = values_from(body, "event_types", allowed=EVENT_TYPES)
        delivered = body.get("is_delivered")
        if delivered is not None and not isinstance(delivered, bool):
            raise invalid("is_delivered must be true or false")
        profile_id = fields.string(body, "profile_id")
        if profile_id is not None and not self.has_profile(profile_id):
            raise not_found("Business profile")
        profiles = {p for p in (profile_id, self._path_profile(merchant_id)) if p is not None}
        event_id = fields.string(body, "event_id")
        object_id = fields.string(body, "object_id")
        window = Window(after or oldest, before)
        if list_fault == IGNORE_FILTERS:
            window, classes, types, delivered, profiles = Window(), None, None, None, set()
            event_id = object_id = None
        if list_fault is not None:
            offset, window = 0, Window(window.start, None)
        allowed_types = (
            None if classes is None else set().union(*(_CLASS_EVENT_TYPES[c] for c in classes))
        )
        with self.lock:
            events = sorted(
                (e for e in self.webhooks.events() if all(e.profile_id == p for p in profiles)),
                key=lambda e: (e.created, e.seq),
                reverse=True,
            )
            if event_id is not None:
                matches = [e for e in events if e.event_id == event_id]
            elif object_id is not None:
                matches = [e for e in events if e.object_id == object_id]
            else:
                matches = [
                    e
                    for e in events
                    if e.created in window
                    and (types is None or e.event_type in types)
                    and (allowed_types is None or e.event_type in allowed_types)
                    and (delivered is None or e.is_delivery_successful == delivered)
                ]
            page = matches[offset : offset + limit]
            return {
                "events": [e.to_list_item(self.merchant_id) for e in page],
                "total_count": len(matches),
            }

    def event_attempts(self, merchant_id: str, event_id: str) -> list[JSONDict]:
        """``GET /events/<merchant_id>/<event_id>/attempts``: every delivery attempt.

        ``EventRetrieveResponse`` rows, oldest first, each with the stored request (exact
        body bytes as a string, headers with the real ``X-Webhook-Signature-512``) and the
        receiver's response (``null`` fields when nothing was answered).
        """
        self._check_merchant(merchant_id)
        with self.lock:
            event = self.webhooks.find(event_id)
            if event is None or not self._in_path(merchant_id, event.profile_id):
                raise not_found("Event")
            return [event.to_retrieve(self.merchant_id, a) for a in event.delivery_attempts]

    def retry_event(self, merchant_id: str, event_id: str) -> JSONDict:
        """``POST /events/<merchant_id>/<event_id>/retry``: manual retry, sent synchronously.

        Re-sends the stored initial request (identical body bytes and the real signature) and
        answers the new ``manual_retry`` attempt's ``EventRetrieveResponse``.
        """
        self._check_merchant(merchant_id)
        found = self.webhooks.find(event_id)
        if found is not None and not self._in_path(merchant_id, found.profile_id):
            raise not_found("Event")
        try:
            result = self.webhooks.retry(event_id)
        except LookupError as exc:
            raise invalid(f"the event cannot be retried: {exc}") from None
        if result is None:
            raise not_found("Event")
        event, attempt = result
        with self.lock:
            return event.to_retrieve(self.merchant_id, attempt)

    def _path_profile(self, merchant_id: str) -> str | None:
        """The profile a path names in place of the merchant id, if it does."""
        return merchant_id if merchant_id != self.merchant_id else None

    def _in_path(self, merchant_id: str, profile_id: str) -> bool:
        """Whether an event of ``profile_id`` is reached through the path's merchant id (a
        profile id there reaches that profile's events only)."""
        named = self._path_profile(merchant_id)
        return named is None or named == profile_id
