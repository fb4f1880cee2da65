"""Payment lists in both dialects: the seed's ``POST /payments/list`` (offset paging) and
Hyperswitch's ``GET /payments/list`` (time bounds and cursors): :class:`PaymentListsMixin`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from reconcile.sandbox import fields
from reconcile.sandbox.listing import (
    Window,
    limit_from_body,
    limit_from_query,
    offset_from,
    query_params,
    time_from,
    values_from,
)
from reconcile.sandbox.models import JSONDict, Payment
from reconcile.sandbox.state.base import IGNORE_FILTERS, SandboxBase

_GET_PAYMENTS_PARAMS: Final = (
    "customer_id",
    "starting_after",
    "ending_before",
    "limit",
    "created",
    "created.lt",
    "created.gt",
    "created.lte",
    "created.gte",
)


class PaymentListsMixin(SandboxBase):
    """The payment list endpoints."""

    # -- payment lists ---------------------------------------------------------------------

    def list_payments(self, body: fields.Body, *, list_fault: str | None = None) -> JSONDict:
        """The seed's ``POST /payments/list``: offset paging, ``{data, total_count, has_more}``."""
        limit = limit_from_body(body, default=10, maximum=100)
        offset = offset_from(body.get("offset"))
        window = Window(
            time_from(body, "created_gte", allow_naive=True),
            time_from(body, "created_lte", allow_naive=True),
        )
        statuses = values_from(body, "status")
        currencies = values_from(body, "currency")
        methods = values_from(body, "payment_method")
        customer_id = fields.string(body, "customer_id")
        if list_fault == IGNORE_FILTERS:
            window, statuses, currencies, methods, customer_id = Window(), None, None, None, None
        if list_fault is not None:
            offset, window = 0, Window(window.start, None)
        with self.lock:
            matches = [
                p
                for p in self._payments_desc(window)
                if (statuses is None or p.status in statuses)
                and (currencies is None or p.currency in currencies)
                and (methods is None or "card" in methods)
                and (customer_id is None or _customer_id(p) == customer_id)
            ]
            page = matches[offset : offset + limit]
            return {
                "data": [p.to_api() for p in page],
                "total_count": len(matches),
                "has_more": offset + len(page) < len(matches),
            }

    def list_payments_hyperswitch(
        self, items: Iterable[tuple[str, str]], *, list_fault: str | None = None
    ) -> JSONDict:
        """Hyperswitch's ``GET /payments/list``: ``{size, data}``, newest first, no offset.

        ``created.gte``/``created.gt``/``created`` set the lower bound and
        ``created.lte``/``created.lt``/``created`` the upper one, all inclusive (``.gt`` and
        ``.lt`` too, as on the real server); without a time bound ``starting_after``/
        ``ending_before`` take the ``created`` of that payment, inclusive of the cursor row.
        """
        params = query_params(items, _GET_PAYMENTS_PARAMS)
        limit = limit_from_query(params.get("limit"), default=10, maximum=100)
        times = {
            name: time_from(params, name, allow_naive=False)
            for name in ("created", "created.gte", "created.gt", "created.lte", "created.lt")
        }
        start = times["created.gte"] or times["created.gt"] or times["created"]
        end = times["created.lte"] or times["created.lt"] or times["created"]
        customer_id = params.get("customer_id")
        if list_fault is not None:
            params.pop("starting_after", None)
            params.pop("ending_before", None)
            end = None
        if list_fault == IGNORE_FILTERS:
            start, customer_id = None, None
        with self.lock:
            if start is None and "starting_after" in params:
                start = self._payment(params["starting_after"]).created
            if end is None and "ending_before" in params:
                end = self._payment(params["ending_before"]).created
            data: list[JSONDict] = []
            for payment in self._payments_desc(Window(start, end)):
                if customer_id is not None and _customer_id(payment) != customer_id:
                    continue
                data.append(payment.to_api())
                if len(data) == limit:
                    break
            return {"size": len(data), "data": data}


def _customer_id(payment: Payment) -> str | None:
    return payment.customer.customer_id if payment.customer else None
