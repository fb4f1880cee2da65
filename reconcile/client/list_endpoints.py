"""The processor's list endpoints, each as a pager: which path, parameters and strategy.

One constructor per endpoint (``payments_pager``, ``refunds_pager``, ``payouts_pager``,
``disputes_pager``, ``events_pager``) and the dialects some of them speak. Each returns a
:class:`~reconcile.client.paging.Pager` (the guarantees are in :mod:`reconcile.client.paging`)
of one of the strategies of :mod:`reconcile.client.paging_strategies`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Literal
from urllib.parse import quote

from reconcile.client.paging import Fetch, IncompleteWindow, OnStuck, Pager
from reconcile.client.paging_strategies import (
    DENSE_LIMIT,
    BackwardTimePager,
    OffsetPager,
    TimeSlicePager,
)
from reconcile.core.errors import id_defect

__all__ = [
    "PaymentsDialect",
    "PayoutsDialect",
    "RefundsDialect",
    "disputes_pager",
    "events_pager",
    "payments_pager",
    "payouts_pager",
    "refunds_pager",
]

PaymentsDialect = Literal["hyperswitch", "seed"]
RefundsDialect = Literal["hyperswitch", "seed"]
PayoutsDialect = Literal["get", "post"]


def payments_pager(
    fetch: Fetch,
    start: datetime,
    end: datetime,
    *,
    dialect: PaymentsDialect = "hyperswitch",
    page_size: int = 100,
    on_stuck: OnStuck = "raise",
    max_requests: int | None = None,
    redact: Callable[[str], str] | None = None,
) -> Pager:
    """Payments created in ``[start, end]``.

    ``dialect="hyperswitch"``: ``GET /payments/list`` with ``created.gte``/``created.lte``
    (the API-key form of the real server). ``dialect="seed"``: ``POST /payments/list`` with
    ``{limit, offset, created_gte, created_lte}`` and ``has_more``.
    """
    if dialect == "hyperswitch":
        return BackwardTimePager(
            fetch,
            start,
            end,
            kind="payments",
            path="/payments/list",
            id_field="payment_id",
            lower_param="created.gte",
            upper_param="created.lte",
            page_size=page_size,
            max_page_size=100,
            on_stuck=on_stuck,
            max_requests=max_requests,
            redact=redact,
        )
    if dialect == "seed":
        return OffsetPager(
            fetch,
            start,
            end,
            kind="payments",
            path="/payments/list",
            id_field="payment_id",
            lower_param="created_gte",
            upper_param="created_lte",
            page_size=page_size,
            max_page_size=100,
            on_stuck=on_stuck,
            max_requests=max_requests,
            redact=redact,
        )
    raise ValueError("dialect must be 'hyperswitch' or 'seed'")


def refunds_pager(
    fetch: Fetch,
    start: datetime,
    end: datetime,
    *,
    dialect: RefundsDialect = "hyperswitch",
    page_size: int = 100,
    on_stuck: OnStuck = "raise",
    dense_limit: int = DENSE_LIMIT,
    max_requests: int | None = None,
    redact: Callable[[str], str] | None = None,
    profile_id: str | None = None,
) -> Pager:
    """Refunds created in ``[start, end]``: ``POST /refunds/list`` by time slices.

    ``dialect="hyperswitch"`` filters with ``start_time``/``end_time`` (``RefundListRequest``);
    ``dialect="seed"`` with the seed's generic ``created_gte``/``created_lte``
    (``processor-interface.md``, Refunds). Both answer ``{count, total_count, data}``.
    ``profile_id``: one business profile's refunds (``RefundListRequest.profile_id``; the
    Hyperswitch dialect only, the seed's list has no such filter).
    """
    if dialect == "hyperswitch":
        lower, upper = "start_time", "end_time"
    elif dialect == "seed":
        lower, upper = "created_gte", "created_lte"
        if profile_id is not None:
            raise ValueError("the seed dialect's refund list takes no profile_id")
    else:
        raise ValueError("dialect must be 'hyperswitch' or 'seed'")
    return TimeSlicePager(
        fetch,
        start,
        end,
        kind="refunds",
        method="POST",
        path="/refunds/list",
        id_field="refund_id",
        lower_param=lower,
        upper_param=upper,
        bare=False,
        page_size=page_size,
        max_page_size=100,
        on_stuck=on_stuck,
        dense_limit=dense_limit,
        max_requests=max_requests,
        redact=redact,
        extra=_profile(profile_id),
    )


def payouts_pager(
    fetch: Fetch,
    start: datetime,
    end: datetime,
    *,
    dialect: PayoutsDialect = "get",
    page_size: int | None = None,
    on_stuck: OnStuck = "raise",
    max_requests: int | None = None,
    redact: Callable[[str], str] | None = None,
    profile_id: str | None = None,
) -> Pager:
    """Payouts created in ``[start, end]``.

    ``dialect="get"``: ``GET /payouts/list`` (``{size, data}``, no ``total_count``, at most 100
    per page, default 100). ``dialect="post"``: ``POST /payouts/list`` (``total_count``, at most
    20 per page, default 20). ``profile_id``: one business profile's payouts, ``post`` only
    (``PayoutListFilterConstraints``; the GET query refuses unknown parameters).
    """
    if dialect == "get" and profile_id is not None:
        raise ValueError("GET /payouts/list takes no profile_id (use dialect='post')")
    if dialect == "get":
        return BackwardTimePager(
            fetch,
            start,
            end,
            kind="payouts",
            path="/payouts/list",
            id_field="payout_id",
            lower_param="start_time",
            upper_param="end_time",
            page_size=100 if page_size is None else page_size,
            max_page_size=100,
            on_stuck=on_stuck,
            max_requests=max_requests,
            redact=redact,
        )
    if dialect == "post":
        return OffsetPager(
            fetch,
            start,
            end,
            extra=_profile(profile_id),
            kind="payouts",
            path="/payouts/list",
            id_field="payout_id",
            lower_param="start_time",
            upper_param="end_time",
            page_size=20 if page_size is None else page_size,
            max_page_size=20,
            on_stuck=on_stuck,
            max_requests=max_requests,
            redact=redact,
        )
    raise ValueError("dialect must be 'get' or 'post'")


def disputes_pager(
    fetch: Fetch,
    start: datetime,
    end: datetime,
    *,
    page_size: int = 100,
    on_stuck: OnStuck = "raise",
    dense_limit: int = DENSE_LIMIT,
    max_requests: int | None = None,
    redact: Callable[[str], str] | None = None,
    profile_id: str | None = None,
) -> Pager:
    """Disputes created in ``[start, end]``: ``GET /disputes/list`` (bare array) by time slices;
    ``profile_id``: one business profile's (``DisputeListGetConstraints.profile_id``)."""
    return TimeSlicePager(
        fetch,
        start,
        end,
        kind="disputes",
        method="GET",
        path="/disputes/list",
        id_field="dispute_id",
        lower_param="start_time",
        upper_param="end_time",
        bare=True,
        page_size=page_size,
        max_page_size=100,
        on_stuck=on_stuck,
        dense_limit=dense_limit,
        max_requests=max_requests,
        redact=redact,
        extra=_profile(profile_id),
    )


def events_pager(
    fetch: Fetch,
    merchant_id: str,
    start: datetime,
    end: datetime,
    *,
    is_delivered: bool | None = False,
    page_size: int = 100,
    on_stuck: OnStuck = "raise",
    max_requests: int | None = None,
    unlistable: Iterable[IncompleteWindow] = (),
    redact: Callable[[str], str] | None = None,
    profile_id: str | None = None,
) -> Pager:
    """Initial delivery attempts (events) created in ``[start, end]``: the admin events list.

    ``POST /events/{merchant_id}`` with ``{created_after, created_before, limit, offset}``,
    ``is_delivered`` unless ``None`` and ``profile_id`` when given (``EventListConstraints``;
    both bounds inclusive, newest first, at most 100 per page); answers ``{events,
    total_count}``. Offset paging: events created while paging push rows down, the repeats are
    skipped by ``event_id``. The 90-day limit of the server is the caller's
    (:meth:`reconcile.client.events_api.EventsClient.iter_events`
    clamps the window and passes the clipped part as ``unlistable``).
    """
    if is_delivered is not None and not isinstance(is_delivered, bool):
        raise TypeError("is_delivered must be a bool or None")
    defect = id_defect(merchant_id)
    if defect is not None or merchant_id in (".", ".."):
        raise ValueError(f"merchant_id must be a clean id: it {defect or 'is a dot segment'}")
    return OffsetPager(
        fetch,
        start,
        end,
        method="POST",
        extra={
            **_profile(profile_id),
            **({} if is_delivered is None else {"is_delivered": is_delivered}),
        },
        kind="events",
        path=f"/events/{quote(merchant_id, safe='')}",
        id_field="event_id",
        lower_param="created_after",
        upper_param="created_before",
        page_size=page_size,
        max_page_size=100,
        on_stuck=on_stuck,
        max_requests=max_requests,
        rows_key="events",
        unlistable=unlistable,
        redact=redact,
    )


def _profile(profile_id: str | None) -> dict[str, str]:
    """The ``profile_id`` filter of a list request (none when ``None``); a clean id only."""
    if profile_id is None:
        return {}
    defect = id_defect(profile_id)
    if defect is not None:
        raise ValueError(f"profile_id must be a clean id: it {defect}")
    return {"profile_id": profile_id}
