"""Payouts: create, update, fulfil (the amount decides the outcome), reverse and fail
late, and the payout lists in both dialects: :class:`PayoutsMixin`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Final

from reconcile.sandbox import fields
from reconcile.sandbox.errors import conflict, duplicate, invalid
from reconcile.sandbox.listing import (
    Window,
    limit_from_body,
    limit_from_query,
    offset_from,
    query_params,
    time_from,
    values_from,
)
from reconcile.sandbox.models import Customer, JSONDict, Payout
from reconcile.sandbox.state.base import FAILURE_UNIFIED, IGNORE_FILTERS, SandboxBase, new_id
from reconcile.sandbox.state.payout_methods import mask_payout_method

PAYOUT_TYPES: Final = frozenset({"card", "bank", "wallet", "bank_redirect"})
PAYOUT_ENTITY_TYPES: Final = frozenset(
    {"Individual", "Company", "NonProfit", "PublicSector", "NaturalPerson", "lowercase", "Personal"}
)
PAYOUT_PRIORITIES: Final = frozenset(
    {"instant", "fast", "regular", "wire", "cross_border", "internal"}
)
_GET_PAYOUTS_PARAMS: Final = (
    "customer_id",
    "starting_after",
    "ending_before",
    "limit",
    "created",
    "start_time",
    "end_time",
)


class PayoutsMixin(SandboxBase):
    """The payouts API."""

    # -- payouts ---------------------------------------------------------------------------

    def create_payout(self, body: fields.Body) -> JSONDict:
        """``POST /payouts/create`` -> ``requires_fulfillment``, fulfilled at once with
        ``auto_fulfill: true``."""
        amount = fields.required_integer(body, "amount", minimum=1)
        currency = fields.currency(body)
        assert currency is not None
        payout_id = fields.identifier(body, "payout_id")
        reference = fields.string(body, "merchant_order_reference_id", max_length=255)
        payout_type = fields.string(body, "payout_type", choices=PAYOUT_TYPES)
        method_data = mask_payout_method(fields.obj(body, "payout_method_data"))
        customer_obj = fields.obj(body, "customer") or {}
        customer_id = fields.string(customer_obj, "id", max_length=64) or fields.string(
            body, "customer_id", max_length=64
        )
        contact = {
            name: fields.string(customer_obj, name) or fields.string(body, name)
            for name in ("name", "email", "phone", "phone_country_code")
        }
        auto_fulfill = fields.boolean(body, "auto_fulfill")
        profile_id = self._profile_of_request(fields.string(body, "profile_id"))
        return_url = fields.string(body, "return_url", max_length=1024) or self.return_url
        country = fields.string(body, "business_country", max_length=2) or self.business_country
        entity_type = fields.string(body, "entity_type", choices=PAYOUT_ENTITY_TYPES)
        priority = fields.string(body, "priority", choices=PAYOUT_PRIORITIES)
        with self.lock:
            if payout_id is None:
                payout_id = new_id("payout_", 23)
            elif payout_id in self._payouts:
                raise duplicate(
                    f"The payout with the specified payout_id '{payout_id}' already exists"
                )
            now = self.now()
            customer = self._customers.get(customer_id) if customer_id else None
            if customer is None:
                customer = Customer(customer_id=customer_id or new_id("cus_"), created=now)
                for name, value in contact.items():
                    setattr(customer, name, value)
                self._customers[customer.customer_id] = customer
            payout = Payout(
                payout_id=payout_id,
                seq=self._next_seq(),
                merchant_id=self.merchant_id,
                profile_id=profile_id,
                amount=amount,
                currency=currency,
                status="requires_fulfillment",
                customer=customer,
                client_secret=f"{payout_id}_secret_{os.urandom(10).hex()}",
                created=now,
                modified_at=now,
                return_url=return_url,
                business_country=country,
                entity_type=entity_type or "Individual",
                merchant_order_reference_id=reference,
                payout_type=payout_type,
                payout_method_data=method_data,
                auto_fulfill=auto_fulfill,
                billing=fields.obj(body, "billing"),
                recurring=fields.boolean(body, "recurring"),
                description=fields.string(body, "description", max_length=1024),
                priority=priority,
                metadata=fields.metadata(body),
                payout_method_id=fields.string(body, "payout_method_id"),
            )
            self._payouts[payout_id] = payout
            if auto_fulfill:
                self._fulfill(payout)
            return payout.to_api()

    def get_payout(self, payout_id: str) -> JSONDict:
        """``GET /payouts/<id>``."""
        with self.lock:
            return self._payout(payout_id).to_api()

    def update_payout(self, payout_id: str, body: fields.Body) -> JSONDict:
        """``PUT /payouts/<id>``: ``description``, ``metadata``, ``merchant_order_reference_id``."""
        description = fields.string(body, "description", max_length=1024)
        metadata = fields.metadata(body)
        reference = fields.string(body, "merchant_order_reference_id", max_length=255)
        with self.lock:
            payout = self._payout(payout_id)
            if description is not None:
                payout.description = description
            if metadata is not None:
                payout.metadata = metadata
            if reference is not None:
                payout.merchant_order_reference_id = reference
            payout.modified_at = self.now()
            return payout.to_api()

    def fulfill_payout(self, payout_id: str, body: fields.Body) -> JSONDict:
        """``POST /payouts/<id>/fulfill``; ``payout_id`` must be in the body and match the path."""
        body_id = fields.required_string(body, "payout_id")
        if body_id != payout_id:
            raise invalid("payout_id in the body does not match the payout_id in the path")
        with self.lock:
            payout = self._payout(payout_id)
            if payout.status != "requires_fulfillment":
                raise conflict(
                    f"This payout could not be fulfilled because it has a status of "
                    f"{payout.status}. The expected state is requires_fulfillment"
                )
            self._fulfill(payout)
            return payout.to_api()

    def reverse_payout(self, payout_id: str) -> JSONDict:
        """Reverse a paid-out payout (sandbox admin): ``success`` -> ``reversed``.

        The bank returns the funds, days later if the clock says so; emits ``payout_reversed``.
        """
        with self.lock:
            payout = self._payout(payout_id)
            if payout.status != "success":
                raise conflict(f"a payout in {payout.status} cannot be reversed (success only)")
            self._set_payout_status(payout, "reversed")
            return payout.to_api()

    def fail_payout(self, payout_id: str, *, reason: str | None = None) -> JSONDict:
        """Fail an unsettled payout late (sandbox admin): ``initiated``/``pending`` -> failed."""
        with self.lock:
            payout = self._payout(payout_id)
            if payout.status not in {"initiated", "pending"}:
                raise conflict(
                    f"a payout in {payout.status} cannot fail (initiated or pending only)"
                )
            payout.error_code = "payout_failed"
            payout.error_message = reason or "The payout was rejected by the beneficiary bank"
            payout.unified_code, payout.unified_message = FAILURE_UNIFIED
            self._set_payout_status(payout, "failed")
            return payout.to_api()

    def list_payouts_hyperswitch(
        self, items: Iterable[tuple[str, str]], *, list_fault: str | None = None
    ) -> JSONDict:
        """``GET /payouts/list``: ``{size, data}`` (no ``total_count``), limit 1..100.

        ``start_time``/``created`` and ``end_time``/``created`` bound ``created``
        (inclusive); without them the cursors ``starting_after``/``ending_before`` take the
        cursor payout's ``created``, inclusive of the cursor row.
        """
        params = query_params(items, _GET_PAYOUTS_PARAMS)
        limit = limit_from_query(params.get("limit"), default=10, maximum=100)
        created = time_from(params, "created", allow_naive=False)
        start = time_from(params, "start_time", allow_naive=False) or created
        end = time_from(params, "end_time", allow_naive=False) or created
        customer_id = params.get("customer_id")
        if list_fault is not None:
            params.pop("starting_after", None)
            params.pop("ending_before", None)
            end = None
        if list_fault == IGNORE_FILTERS:
            start, customer_id = None, None
        with self.lock:
            if start is None and "starting_after" in params:
                start = self._payout(params["starting_after"]).created
            if end is None and "ending_before" in params:
                end = self._payout(params["ending_before"]).created
            window = Window(start, end)
            rows = [
                p
                for p in self._payouts_desc()
                if p.created in window
                and (customer_id is None or p.customer.customer_id == customer_id)
            ][:limit]
            return {"size": len(rows), "data": [p.to_api() for p in rows]}

    def list_payouts(self, body: fields.Body, *, list_fault: str | None = None) -> JSONDict:
        """``POST /payouts/list``: ``{size, data, total_count}``, limit 1..20, offset paging."""
        limit = limit_from_body(body, default=10, maximum=20)
        offset = offset_from(body.get("offset"))
        window = Window(
            time_from(body, "start_time", allow_naive=False),
            time_from(body, "end_time", allow_naive=False),
        )
        statuses = values_from(body, "status")
        currencies = values_from(body, "currency")
        methods = values_from(body, "payout_method")
        single: dict[str, str | None] = {
            name: fields.string(body, name)
            for name in ("payout_id", "merchant_order_reference_id", "profile_id", "customer_id")
        }
        if list_fault == IGNORE_FILTERS:
            window, statuses, currencies, methods, single = Window(), None, None, None, {}
        if list_fault is not None:
            offset, window = 0, Window(window.start, None)
        with self.lock:
            matches = [
                p
                for p in self._payouts_desc()
                if p.created in window
                and (statuses is None or p.status in statuses)
                and (currencies is None or p.currency in currencies)
                and (methods is None or p.payout_type in methods)
                and all(v is None or _payout_field(p, k) == v for k, v in single.items())
            ]
            page = matches[offset : offset + limit]
            return {
                "size": len(page),
                "data": [p.to_api() for p in page],
                "total_count": len(matches),
            }

    # -- internals -------------------------------------------------------------------------

    def _payouts_desc(self) -> list[Payout]:
        return sorted(self._payouts.values(), key=lambda p: (p.created, p.seq), reverse=True)

    def _fulfill(self, payout: Payout) -> None:
        payout.connector_transaction_id = new_id("po_txn_")
        status = _payout_outcome(payout.amount)
        if status == "failed":
            payout.error_code = "payout_declined"
            payout.error_message = "Payout declined by the sandbox (amount ends in 02)"
            payout.unified_code, payout.unified_message = FAILURE_UNIFIED
        self._set_payout_status(payout, status)


def _payout_outcome(amount: int) -> str:
    return {2: "failed", 77: "pending", 55: "initiated"}.get(amount % 100, "success")


def _payout_field(payout: Payout, name: str) -> str | None:
    if name == "customer_id":
        return payout.customer.customer_id
    value = getattr(payout, name)
    return value if isinstance(value, str) else None
