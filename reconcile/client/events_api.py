"""The admin events API client: list events, their delivery attempts, retry a delivery.

Hyperswitch keeps every outgoing webhook as an *event* (``hyperswitch-facts.md`` section 3);
the admin API lists them, so the reconciler can find what was never delivered::

    with EventsClient(base_url, admin_key, environment="production") as events:
        for event in events.iter_events(merchant_id, start, end):   # undelivered by default
            attempts = events.event_attempts(merchant_id, event["event_id"])

* ``POST /events/{merchant_id}`` (:meth:`EventsClient.iter_events`): initial attempts created
  in a window, ``EventListConstraints`` ``{created_after, created_before, limit <= 100, offset,
  is_delivered}``, answer ``TotalEventsResponse {events, total_count}``, newest first. The
  server refuses bounds older than 90 days (midnight UTC, 90 days before its today).
* ``GET /events/{merchant_id}/{event_id}/attempts`` (:meth:`EventsClient.event_attempts`).
* ``POST /events/{merchant_id}/{event_id}/retry`` (:meth:`EventsClient.retry_event`): *not a
  read*; never retried after the server may have acted on it.

Authentication is the **admin** API key (security scheme ``admin_api_key``, sent in the same
``api-key`` header), never a merchant's secret key. An admin key has no ``snd_``/``prd_``
prefix, so the environment must be given; the base URL checks of
:class:`~reconcile.client.transport.ApiClient` apply (a production key only over https, a known
sandbox/production host must match). The transport (retries, typed errors, redaction, no
redirects, safe JSON decoding) is :class:`~reconcile.client.transport.ApiClient`'s. The key never
appears in a log line, an error or a repr.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import requests

from reconcile.client.list_endpoints import events_pager
from reconcile.client.paging import (
    IncompleteWindow,
    OnStuck,
    Pager,
    check_budget,
    format_timestamp,
)
from reconcile.client.transport import ApiClient, Environment, RetryPolicy, path_segment
from reconcile.core.errors import ApiError, InvalidApiKey

__all__ = ["EVENTS_LIST_MAX_DAYS", "EventsClient"]

#: How far back the server lists events (``INITIAL_DELIVERY_ATTEMPTS_LIST_MAX_DAYS``).
EVENTS_LIST_MAX_DAYS: Final = 90
#: Clock skew and paging time allowed for: the server's "today" may be ours plus this much.
_SKEW: Final = timedelta(hours=1)
#: Prefixes of keys that are not admin keys (merchant secret and publishable keys).
_MERCHANT_PREFIXES: Final = ("snd_", "prd_", "pk_")


def _check_admin_key(admin_api_key: str) -> None:
    if not isinstance(admin_api_key, str) or not admin_api_key:
        raise InvalidApiKey("the events API needs the admin API key")
    if not all("\x21" <= ch <= "\x7e" for ch in admin_api_key):
        raise InvalidApiKey("the admin API key contains whitespace or non-ASCII characters")
    if admin_api_key.startswith(_MERCHANT_PREFIXES):
        raise InvalidApiKey(
            "the events API needs the admin API key, not a merchant's secret or publishable "
            "key (snd_..., prd_..., pk_...)"
        )


class EventsClient(ApiClient):
    """A client of the admin events API, authenticated by the admin API key.

    ``environment`` is required: an admin key does not say which environment it belongs to.
    ``max_list_requests``: the default request budget of :meth:`iter_events` (a call's own
    ``max_requests`` wins; ``None``: 1,000 list calls). The other options are
    :class:`~reconcile.client.transport.ApiClient`'s (``clock`` also dates the 90-day limit of
    :meth:`iter_events`).
    """

    def __init__(
        self,
        base_url: str,
        admin_api_key: str,
        *,
        environment: Environment,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),  # noqa: B008 - frozen, hence shareable
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        max_list_requests: int | None = None,
    ) -> None:
        _check_admin_key(admin_api_key)
        super().__init__(
            base_url,
            admin_api_key,
            environment=environment,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retry=retry,
            session=session,
            sleep=sleep,
            clock=clock,
            rng=rng,
        )
        self.max_list_requests = check_budget(max_list_requests, "max_list_requests")

    def earliest_listable(self) -> datetime:
        """The oldest creation time :meth:`iter_events` can ask for now.

        The server accepts bounds from midnight UTC 90 days before its today; this is one day
        later when the server's today may already be tomorrow (within an hour of midnight), so
        clock skew and a long paging run do not turn into a refused request.
        """
        today = (datetime.fromtimestamp(self._clock(), UTC) + _SKEW).date()
        first = today - timedelta(days=EVENTS_LIST_MAX_DAYS)
        return datetime(first.year, first.month, first.day, tzinfo=UTC)

    def iter_events(
        self,
        merchant_id: str,
        start: datetime,
        end: datetime,
        *,
        is_delivered: bool | None = False,
        page_size: int = 100,
        max_requests: int | None = None,
        on_stuck: OnStuck = "raise",
        profile_id: str | None = None,
    ) -> Pager:
        """Events (initial delivery attempts) created in ``[start, end]``, each once.

        ``is_delivered``: ``False`` (default) lists the events never delivered successfully,
        ``True`` the delivered ones, ``None`` all. ``profile_id``: one business profile's
        events only (``EventListConstraints.profile_id``; the processor answers 404 for a
        profile the merchant does not have). ``merchant_id`` may also be a profile id (older
        servers).
        The pager is a :mod:`reconcile.client.paging` offset pager with all its guarantees (budget,
        no-progress checks, rows checked against the window, ``row_errors``); ids are
        ``event_id``.

        The request budget: at most ``max_requests`` list calls (``None``: the client's
        ``max_list_requests``, else 1,000); when they are spent the iterator raises
        :class:`~reconcile.core.errors.RequestBudgetExhausted` (``on_stuck="report"``: the
        unread window is reported in ``pager.incomplete``), never pages without end.

        The 90-day limit: a window that ends before :meth:`earliest_listable` raises
        :class:`ValueError`; one that starts before it is clamped, and the part cut off is
        reported like a stuck window (in ``pager.incomplete`` at once with
        ``on_stuck="report"``; a :class:`~reconcile.core.errors.PagingError` after the listable
        events otherwise).
        """
        if start.tzinfo is None or end.tzinfo is None:
            raise ValueError("start and end must be timezone-aware (naive datetimes are ambiguous)")
        earliest = self.earliest_listable()
        unlistable: list[IncompleteWindow] = []
        if end < earliest:
            raise ValueError(
                f"the events API lists only the last {EVENTS_LIST_MAX_DAYS} days: the window "
                f"must end on or after {format_timestamp(earliest)}"
            )
        if start < earliest and start <= end:
            unlistable.append(
                IncompleteWindow(
                    start,
                    earliest - timedelta(milliseconds=1),
                    f"the events API lists only the last {EVENTS_LIST_MAX_DAYS} days (from "
                    f"{format_timestamp(earliest)}); older events were not read",
                )
            )
            start = earliest
        return events_pager(
            self.request,
            merchant_id,
            start,
            end,
            is_delivered=is_delivered,
            page_size=page_size,
            on_stuck=on_stuck,
            max_requests=max_requests if max_requests is not None else self.max_list_requests,
            unlistable=unlistable,
            redact=self._redact,
            profile_id=profile_id,
        )

    def event_attempts(self, merchant_id: str, event_id: str) -> list[dict[str, Any]]:
        """``GET /events/{merchant_id}/{event_id}/attempts``: every delivery attempt of an event
        (``EventRetrieveResponse`` objects with ``request``, ``response``, ``delivery_attempt``)."""
        path = (
            f"/events/{path_segment(merchant_id, 'merchant_id')}/"
            f"{path_segment(event_id, 'event_id')}/attempts"
        )
        body = self.request("GET", path)
        if not isinstance(body, list) or not all(isinstance(item, dict) for item in body):
            raise ApiError("expected a JSON array of objects", status=200, method="GET", path=path)
        return body

    def retry_event(self, merchant_id: str, event_id: str) -> dict[str, Any]:
        """``POST /events/{merchant_id}/{event_id}/retry``: deliver the event again, now.

        This is **not a read**: the processor re-sends the webhook synchronously and records a
        new attempt. It is therefore never retried automatically after a 5xx, a read timeout
        or a broken connection, since the processor may already have re-sent it (only a 429,
        or a connection that was never made, is retried). Such a failure raises; the caller
        decides, e.g. by reading :meth:`event_attempts` first. The answer is the new attempt
        (``EventRetrieveResponse``: its ``response`` says how the delivery went).
        """
        path = (
            f"/events/{path_segment(merchant_id, 'merchant_id')}/"
            f"{path_segment(event_id, 'event_id')}/retry"
        )
        body = self.request("POST", path, idempotent=False)
        if not isinstance(body, dict):
            raise ApiError("expected a JSON object", status=200, method="POST", path=path)
        return body
