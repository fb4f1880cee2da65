"""The sandbox processor's state and behaviour: :class:`Sandbox`.

A :class:`Sandbox` holds payments, refunds, payouts, customers and disputes in memory behind
one lock, runs their state machines, and emits a webhook whenever an object reaches a status
that :func:`receiver.status.event_type_for_status` maps to an event. Its public methods take
the JSON bodies (or query parameters) of the HTTP API and return what the API answers, or raise
:class:`~reconcile.sandbox.errors.SandboxError`; :func:`reconcile.sandbox.app.create_app` is a
thin HTTP layer over them, and tests may call them directly.

Outcomes (the card table is in :mod:`reconcile.sandbox.cards`):

- Refunds: the refund ``amount`` (lowest unit) decides. Ending in ``02`` (e.g. 102, 1002):
  ``failed``. Ending in ``77``: ``pending``, ``succeeded`` on the next tick. Ending in ``88``:
  ``review``, ``succeeded`` on the next tick. Anything else: ``succeeded`` at once.
- Payouts: fulfilment (``POST /payouts/<id>/fulfill``, or at create with
  ``auto_fulfill: true``) decides by the payout ``amount``: ending in ``02``: ``failed``;
  ending in ``77``: ``pending``, ``success`` on the next tick; anything else: ``success``.
- Disputes: opened on a succeeded payment by :meth:`Sandbox.open_dispute` (or automatically on
  the next tick for card 4000000000000259), then moved by :meth:`Sandbox.dispute_action`:
  ``challenge``, ``accept``, ``win``, ``lose``, ``expire``, ``cancel``.
- :meth:`Sandbox.tick` advances everything that waits: ``processing`` payments, ``pending`` and
  ``review`` refunds, ``pending`` payouts and due automatic disputes.

Timestamps come from the clock hook ``now`` (default: the current UTC time), truncated to
milliseconds; a :class:`~reconcile.sandbox.clock.FrozenClock` creates many objects at the same
instant. Lists order by ``created`` (refunds: ``updated_at``) descending; rows with equal
timestamps come newest-inserted first.
"""

from __future__ import annotations

import bisect
import hmac
import os
import secrets
import string
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from receiver.errors import ConfigurationError
from receiver.status import REFUND_STATUS_ALIASES, event_type_for_status
from reconcile.sandbox import fields
from reconcile.sandbox.cards import (
    AUTHENTICATION_FAILED,
    EXPIRED,
    SUCCESS,
    TEST_CARDS,
    CardOutcome,
    brand_for,
    luhn_valid,
    outcome_for,
)
from reconcile.sandbox.clock import Clock, truncate_ms, utcnow
from reconcile.sandbox.errors import SandboxError, conflict, duplicate, invalid, missing, not_found
from reconcile.sandbox.faults import FaultController, RateLimiter
from reconcile.sandbox.listing import (
    Window,
    csv_values,
    limit_from_body,
    limit_from_query,
    offset_from,
    query_params,
    time_from,
    values_from,
)
from reconcile.sandbox.models import (
    CardInfo,
    Customer,
    Dispute,
    JSONDict,
    Payment,
    Payout,
    Refund,
)
from reconcile.sandbox.webhooks import HYPERSWITCH_RETRY_SCHEDULE, WebhookDispatcher

CAPTURE_METHODS: Final = frozenset(
    {"automatic", "manual", "manual_multiple", "scheduled", "sequential_automatic"}
)
CAPTURABLE: Final = frozenset({"requires_capture"})
CANCELLABLE: Final = frozenset(
    {
        "requires_payment_method",
        "requires_confirmation",
        "requires_customer_action",
        "requires_capture",
    }
)
CONFIRMABLE: Final = frozenset({"requires_payment_method", "requires_confirmation"})
REFUNDABLE: Final = frozenset({"succeeded", "partially_captured"})
#: Refund filter values of Hyperswitch's ``refund_status[]``: the *internal* enum.
REFUND_FILTER_STATUSES: Final = (
    "success",
    "failure",
    "pending",
    "manual_review",
    "transaction_failure",
)
PAYOUT_TYPES: Final = frozenset({"card", "bank", "wallet", "bank_redirect"})
PAYOUT_METHODS: Final = ("card", "bank_transfer", "wallet", "bank_redirect", "passthrough")
DISPUTE_ACTIONS: Final = {
    "challenge": "dispute_challenged",
    "accept": "dispute_accepted",
    "win": "dispute_won",
    "lose": "dispute_lost",
    "expire": "dispute_expired",
    "cancel": "dispute_cancelled",
}
_DISPUTE_MOVES: Final = {
    "dispute_opened": frozenset(DISPUTE_ACTIONS.values()),
    "dispute_challenged": frozenset(
        {"dispute_won", "dispute_lost", "dispute_expired", "dispute_cancelled", "dispute_accepted"}
    ),
}
_SENSITIVE_KEYS: Final = frozenset(
    {
        "bank_account_number",
        "bank_routing_number",
        "bank_sort_code",
        "iban",
        "dpan",
        "application_primary_account_number",
        "pix_key",
        "emv",
        "psp_token",
        "tax_id",
    }
)
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
_GET_PAYOUTS_PARAMS: Final = (
    "customer_id",
    "starting_after",
    "ending_before",
    "limit",
    "created",
    "start_time",
    "end_time",
)
_GET_DISPUTES_PARAMS: Final = (
    "dispute_id",
    "payment_id",
    "limit",
    "offset",
    "profile_id",
    "dispute_status",
    "dispute_stage",
    "connector",
    "currency",
    "reason",
    "merchant_connector_id",
    "start_time",
    "end_time",
)
_FAILURE_UNIFIED: Final = ("UE_9000", "Something went wrong")
_ALPHANUMERIC: Final = string.ascii_letters + string.digits


def _new_id(prefix: str, length: int = 20) -> str:
    """``prefix`` + ``length`` random lowercase hex digits."""
    return prefix + os.urandom((length + 1) // 2).hex()[:length]


class Sandbox:
    """A stateful, in-memory payment processor speaking the Hyperswitch API.

    ``api_key`` must start with ``snd_``. ``webhook_url`` of ``None`` records events without
    delivering them; ``webhook_secret`` of ``None`` generates a 64-character key like
    Hyperswitch does (read it from :attr:`webhook_secret`). ``retry_schedule`` holds the
    delays before each webhook retry; ``seed`` seeds the fault RNG; ``now`` is the clock hook.
    Call :meth:`start` to start webhook delivery and :meth:`close` to stop it.
    """

    def __init__(
        self,
        api_key: str,
        *,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        merchant_id: str = "merchant_sandbox",
        profile_id: str = "pro_sandbox",
        retry_schedule: Sequence[float] = HYPERSWITCH_RETRY_SCHEDULE,
        seed: int = 0,
        now: Clock | None = None,
        webhook_timeout: float = 5.0,
        rate_limit_per_minute: int = 10_000,
        auto_dispute: bool = True,
        public_url: str = "http://127.0.0.1",
    ) -> None:
        if not api_key.startswith("snd_") or len(api_key) <= len("snd_"):
            raise ConfigurationError("the sandbox api key must start with 'snd_'")
        if webhook_secret is not None and not webhook_secret:
            raise ConfigurationError("the webhook secret must not be empty")
        self.lock = threading.RLock()
        self._api_key = api_key
        self.merchant_id = merchant_id
        self.profile_id = profile_id
        self.auto_dispute = auto_dispute
        #: Base URL used in ``next_action.redirect_to_url`` (the server sets it when it binds).
        self.public_url = public_url
        self._clock: Clock = now or utcnow
        self._webhook_secret = webhook_secret or "".join(
            secrets.choice(_ALPHANUMERIC) for _ in range(64)
        )
        self.faults = FaultController(self.lock, seed)
        self.rate_limiter = RateLimiter(rate_limit_per_minute)
        self.webhooks = WebhookDispatcher(
            lock=self.lock,
            merchant_id=merchant_id,
            secret=self._webhook_secret,
            url=webhook_url,
            retry_schedule=retry_schedule,
            timeout=webhook_timeout,
            faults=self.faults,
        )
        self._stopping = threading.Event()
        self._seq = 0
        self._payments: dict[str, Payment] = {}
        # ``created`` index of payments: keys ascending, ids in the same order.
        self._payment_keys: list[tuple[datetime, int]] = []
        self._payment_order: list[str] = []
        self._refunds: dict[str, Refund] = {}
        self._refunds_by_payment: dict[str, list[Refund]] = {}
        self._payouts: dict[str, Payout] = {}
        self._customers: dict[str, Customer] = {}
        self._disputes: dict[str, Dispute] = {}

    def __repr__(self) -> str:
        return (
            f"Sandbox(merchant_id={self.merchant_id!r}, payments={len(self._payments)}, "
            f"webhook_url={self.webhooks.url!r})"
        )

    # -- configuration and lifecycle -------------------------------------------------------

    @property
    def webhook_secret(self) -> str:
        """The key webhooks are signed with (never logged, not in reprs)."""
        return self._webhook_secret

    @property
    def webhook_url(self) -> str | None:
        return self.webhooks.url

    @webhook_url.setter
    def webhook_url(self, url: str | None) -> None:
        with self.lock:
            self.webhooks.url = url

    def check_api_key(self, given: str | None) -> bool:
        """Constant-time comparison of an ``api-key`` header with the configured key."""
        if not given:
            return False
        return hmac.compare_digest(given.encode("utf-8"), self._api_key.encode("utf-8"))

    def now(self) -> datetime:
        """The sandbox time: the clock hook's value, UTC, truncated to milliseconds."""
        return truncate_ms(self._clock())

    @property
    def clock(self) -> Clock:
        """The clock hook in use."""
        return self._clock

    def set_clock(self, clock: Clock | None) -> None:
        """Replace the clock hook (``None``: the current UTC time)."""
        with self.lock:
            self._clock = clock or utcnow

    def start(self) -> None:
        """Start delivering webhooks."""
        self._stopping.clear()
        self.webhooks.start()

    def close(self) -> None:
        """Stop delivering webhooks and wake every request sleeping in a timeout fault."""
        self._stopping.set()
        self.webhooks.stop()

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``; returns early when the sandbox closes."""
        self._stopping.wait(seconds)

    def flush_webhooks(self, timeout: float = 10.0) -> bool:
        """Wait until every emitted event is delivered or given up; False on timeout."""
        return self.webhooks.flush(timeout)

    def events(self) -> list[JSONDict]:
        """Every emitted webhook event (with its body and delivery attempts), oldest first."""
        return [event.to_json() for event in self.webhooks.events()]

    def stats(self) -> JSONDict:
        """Object counts, webhook delivery counters and the faults applied so far."""
        with self.lock:
            return {
                "objects": {
                    "payments": len(self._payments),
                    "refunds": len(self._refunds),
                    "payouts": len(self._payouts),
                    "customers": len(self._customers),
                    "disputes": len(self._disputes),
                },
                "webhooks": self.webhooks.stats(),
                "faults": self.faults.stats(),
            }

    # -- customers -------------------------------------------------------------------------

    def create_customer(self, body: fields.Body) -> JSONDict:
        """``POST /customers``."""
        customer_id = fields.identifier(body, "customer_id")
        details = {
            name: fields.string(body, name, max_length=255)
            for name in ("name", "email", "phone", "phone_country_code", "description")
        }
        address = fields.obj(body, "address")
        metadata = fields.metadata(body)
        with self.lock:
            if customer_id is None:
                customer_id = _new_id("cus_")
            elif customer_id in self._customers:
                raise duplicate("Customer with the given `customer_id` already exists")
            customer = Customer(
                customer_id=customer_id,
                created=self.now(),
                address=address,
                metadata=metadata,
                **details,
            )
            self._customers[customer_id] = customer
            return customer.to_api()

    def get_customer(self, customer_id: str) -> JSONDict:
        """``GET /customers/<id>``."""
        with self.lock:
            customer = self._customers.get(customer_id)
            if customer is None:
                raise not_found("Customer")
            return customer.to_api()

    # -- payments --------------------------------------------------------------------------

    def create_payment(self, body: fields.Body) -> JSONDict:
        """``POST /payments``; ``confirm: true`` confirms in the same request."""
        amount = fields.required_integer(body, "amount", minimum=1)
        currency = fields.currency(body)
        assert currency is not None
        payment_id = fields.identifier(body, "payment_id")
        for name in ("items", "line_items", "cart_items"):
            if name in body:
                raise invalid(
                    f"{name} is not an accepted field: send order contents as order_details"
                )
        capture_method = fields.string(body, "capture_method", choices=CAPTURE_METHODS)
        authentication_type = fields.string(
            body, "authentication_type", choices={"three_ds", "no_three_ds"}
        )
        customer_id = fields.string(body, "customer_id", max_length=64)
        confirm = fields.boolean(body, "confirm")
        details = {
            name: fields.string(body, name, max_length=1024)
            for name in (
                "email",
                "name",
                "phone",
                "phone_country_code",
                "description",
                "statement_descriptor",
                "return_url",
            )
        }
        metadata = fields.metadata(body)
        billing = fields.obj(body, "billing")
        shipping = fields.obj(body, "shipping")
        order_details = fields.array(body, "order_details")
        profile_id = fields.string(body, "profile_id") or self.profile_id
        card, payment_method, payment_method_type = _payment_method(body)
        if confirm and card is None:
            raise missing("payment_method_data")
        with self.lock:
            if payment_id is None:
                payment_id = _new_id("pay_")
            elif payment_id in self._payments:
                raise duplicate(
                    f"The payment with the specified payment_id '{payment_id}' already exists "
                    "in our records"
                )
            self._require_customer(customer_id)
            now = self.now()
            payment = Payment(
                payment_id=payment_id,
                seq=self._next_seq(),
                merchant_id=self.merchant_id,
                profile_id=profile_id,
                status="requires_confirmation" if card else "requires_payment_method",
                amount=amount,
                currency=currency,
                client_secret=f"{payment_id}_secret_{os.urandom(10).hex()}",
                created=now,
                modified_at=now,
                capture_method=capture_method or "automatic",
                authentication_type=authentication_type,
                customer_id=customer_id,
                metadata=metadata,
                billing=billing,
                shipping=shipping,
                order_details=order_details,
                payment_method=payment_method,
                payment_method_type=payment_method_type,
                card=card,
                amount_capturable=amount,
            )
            for name, value in details.items():
                setattr(payment, name, value)
            self._insert_payment(payment)
            if confirm:
                self._confirm(payment)
            return payment.to_api()

    def update_payment(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>``: change an unconfirmed payment (-> ``requires_confirmation``)."""
        amount = fields.integer(body, "amount", minimum=1)
        currency = fields.currency(body, required=False)
        customer_id = fields.string(body, "customer_id", max_length=64)
        capture_method = fields.string(body, "capture_method", choices=CAPTURE_METHODS)
        details = {
            name: fields.string(body, name, max_length=1024)
            for name in (
                "email",
                "name",
                "phone",
                "phone_country_code",
                "description",
                "statement_descriptor",
                "return_url",
            )
            if name in body
        }
        metadata = fields.metadata(body)
        billing = fields.obj(body, "billing")
        card, payment_method, payment_method_type = _payment_method(body)
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status not in CONFIRMABLE:
                raise conflict(_state_message(payment, "updated", CONFIRMABLE))
            self._require_customer(customer_id)
            if amount is not None:
                payment.amount = amount
                payment.amount_capturable = amount
            if currency is not None:
                payment.currency = currency
            if customer_id is not None:
                payment.customer_id = customer_id
            if capture_method is not None:
                payment.capture_method = capture_method
            if metadata is not None:
                payment.metadata = metadata
            if billing is not None:
                payment.billing = billing
            for name, value in details.items():
                setattr(payment, name, value)
            if card is not None:
                payment.card = card
                payment.payment_method = payment_method
                payment.payment_method_type = payment_method_type
            payment.status = "requires_confirmation"
            payment.modified_at = self.now()
            return payment.to_api()

    def confirm_payment(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>/confirm``: authorise with the attached or the given card."""
        card, payment_method, payment_method_type = _payment_method(body)
        return_url = fields.string(body, "return_url", max_length=1024)
        billing = fields.obj(body, "billing")
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status not in CONFIRMABLE:
                raise conflict(_state_message(payment, "confirmed", CONFIRMABLE))
            if card is not None:
                payment.card = card
                payment.payment_method = payment_method
                payment.payment_method_type = payment_method_type
            if payment.card is None:
                raise missing("payment_method_data")
            if return_url is not None:
                payment.return_url = return_url
            if billing is not None:
                payment.billing = billing
            self._confirm(payment)
            return payment.to_api()

    def capture_payment(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>/capture``: full or partial capture of an authorisation."""
        amount = fields.integer(body, "amount_to_capture", minimum=1)
        prefix = fields.string(body, "statement_descriptor_prefix") or ""
        suffix = fields.string(body, "statement_descriptor_suffix") or ""
        if len(prefix) + len(suffix) > 22:
            raise invalid("statement descriptor prefix plus suffix should not exceed 22 characters")
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status in {"succeeded", "partially_captured", "cancelled"}:
                raise conflict(
                    f"The payment is already {payment.status.replace('_', ' ')}", status=409
                )
            if payment.status not in CAPTURABLE:
                raise conflict(_state_message(payment, "captured", CAPTURABLE))
            amount = payment.amount_capturable if amount is None else amount
            if amount > payment.amount_capturable:
                raise invalid("amount_to_capture is greater than amount_capturable")
            now = self.now()
            payment.amount_received = amount
            payment.amount_capturable = 0
            payment.captured_at = now
            full = amount == payment.amount
            self._set_payment_status(payment, "succeeded" if full else "partially_captured")
            return payment.to_api()

    def cancel_payment(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>/cancel``: void a payment that is not captured."""
        reason = fields.string(body, "cancellation_reason", max_length=255)
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status not in CANCELLABLE:
                raise conflict(_state_message(payment, "cancelled", CANCELLABLE))
            payment.cancellation_reason = reason
            payment.cancelled_at = self.now()
            payment.amount_capturable = 0
            payment.next_action = None
            payment.pending_behaviour = None
            self._set_payment_status(payment, "cancelled")
            return payment.to_api()

    def get_payment(self, payment_id: str) -> JSONDict:
        """``GET /payments/<id>``."""
        with self.lock:
            return self._payment(payment_id).to_api()

    def complete_authentication(self, payment_id: str, success: bool = True) -> JSONDict:
        """Finish 3-D Secure of a ``requires_customer_action`` payment (sandbox admin)."""
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status != "requires_customer_action":
                raise conflict(
                    _state_message(payment, "authenticated", {"requires_customer_action"})
                )
            payment.next_action = None
            self._apply_outcome(payment, SUCCESS if success else AUTHENTICATION_FAILED)
            return payment.to_api()

    # -- payment lists ---------------------------------------------------------------------

    def list_payments(self, body: fields.Body) -> JSONDict:
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
        with self.lock:
            matches = [
                p
                for p in self._payments_desc(window)
                if (statuses is None or p.status in statuses)
                and (currencies is None or p.currency in currencies)
                and (methods is None or p.payment_method in methods)
                and (customer_id is None or p.customer_id == customer_id)
            ]
            page = matches[offset : offset + limit]
            return {
                "data": [p.to_api() for p in page],
                "total_count": len(matches),
                "has_more": offset + len(page) < len(matches),
            }

    def list_payments_hyperswitch(self, items: Iterable[tuple[str, str]]) -> JSONDict:
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
        with self.lock:
            if start is None and "starting_after" in params:
                start = self._payment(params["starting_after"]).created
            if end is None and "ending_before" in params:
                end = self._payment(params["ending_before"]).created
            data: list[JSONDict] = []
            for payment in self._payments_desc(Window(start, end)):
                if customer_id is not None and payment.customer_id != customer_id:
                    continue
                data.append(payment.to_api())
                if len(data) == limit:
                    break
            return {"size": len(data), "data": data}

    # -- refunds ---------------------------------------------------------------------------

    def create_refund(self, body: fields.Body) -> JSONDict:
        """``POST /refunds``: full (no ``amount``) or partial refund of a succeeded payment."""
        payment_id = fields.required_string(body, "payment_id")
        refund_id = fields.identifier(body, "refund_id")
        amount = fields.integer(body, "amount", minimum=1)
        reason = fields.string(body, "reason", max_length=255)
        refund_type = (fields.string(body, "refund_type") or "instant").lower()
        if refund_type not in {"instant", "scheduled"}:
            raise invalid("Invalid value provided: refund_type (instant or scheduled)")
        metadata = fields.metadata(body)
        with self.lock:
            payment = self._payment(payment_id)
            if refund_id is None:
                refund_id = _new_id("ref_")
            elif refund_id in self._refunds:
                raise duplicate(
                    "Duplicate refund request. Refund already attempted with the refund ID"
                )
            if payment.status not in REFUNDABLE:
                raise conflict(
                    "The payment has not succeeded yet. Please pass a successful payment to "
                    "initiate refund"
                )
            refunded = sum(
                r.amount
                for r in self._refunds_by_payment.get(payment_id, [])
                if r.status != "failed"
            )
            refundable = (payment.amount_received or 0) - refunded
            amount = refundable if amount is None else amount
            if amount > refundable or amount <= 0:
                raise invalid(
                    f"Refund amount exceeds the refundable amount ({refundable} left of "
                    f"{payment.amount_received or 0})"
                )
            now = self.now()
            refund = Refund(
                refund_id=refund_id,
                seq=self._next_seq(),
                payment_id=payment_id,
                merchant_id=self.merchant_id,
                profile_id=payment.profile_id,
                amount=amount,
                currency=payment.currency,
                status=_refund_outcome(amount),
                created=now,
                updated_at=now,
                reason=reason,
                refund_type=refund_type,
                metadata=metadata,
                connector_refund_id=_new_id("re_conn_"),
            )
            self._refunds[refund_id] = refund
            self._refunds_by_payment.setdefault(payment_id, []).append(refund)
            if refund.status == "failed":
                refund.error_code = "refund_declined"
                refund.error_message = "Refund declined by the sandbox (amount ends in 02)"
                refund.unified_code, refund.unified_message = _FAILURE_UNIFIED
            self._emit("refund", refund_id, refund.status, refund.to_api())
            return refund.to_api()

    def update_refund(self, refund_id: str, body: fields.Body) -> JSONDict:
        """``POST /refunds/<id>``: change ``reason``/``metadata`` (moves ``updated_at``)."""
        reason = fields.string(body, "reason", max_length=255)
        metadata = fields.metadata(body)
        with self.lock:
            refund = self._refund(refund_id)
            if reason is not None:
                refund.reason = reason
            if metadata is not None:
                refund.metadata = metadata
            refund.updated_at = self.now()
            return refund.to_api()

    def get_refund(self, refund_id: str) -> JSONDict:
        """``GET /refunds/<id>``."""
        with self.lock:
            return self._refund(refund_id).to_api()

    def list_refunds(self, body: fields.Body) -> JSONDict:
        """``POST /refunds/list`` in both dialects: ``{count, total_count, data}``.

        Seed fields: ``limit``, ``offset``, ``payment_id``, ``status`` (API enum),
        ``created_gte``, ``created_lte``. Hyperswitch fields: ``limit`` (1..100), ``offset``,
        ``start_time``/``end_time``, ``refund_status[]`` (internal enum: ``success``,
        ``failure``, ``pending``, ``manual_review``, ``transaction_failure``), ``refund_id``,
        ``profile_id``, ``currency[]``, ``amount_filter``. Ordered by ``updated_at`` descending
        like the real server, so offset pages shift when refunds change. Time filters apply to
        ``created``.
        """
        limit = limit_from_body(body, default=10, maximum=100)
        offset = offset_from(body.get("offset"))
        payment_id = fields.string(body, "payment_id")
        refund_id = fields.string(body, "refund_id")
        profile_id = fields.string(body, "profile_id")
        seed_statuses = values_from(body, "status")
        internal = values_from(body, "refund_status", allowed=REFUND_FILTER_STATUSES)
        statuses = _intersect(
            seed_statuses,
            None if internal is None else {REFUND_STATUS_ALIASES.get(s, s) for s in internal},
        )
        currencies = values_from(body, "currency")
        windows = (
            Window(
                time_from(body, "created_gte", allow_naive=True),
                time_from(body, "created_lte", allow_naive=True),
            ),
            Window(
                time_from(body, "start_time", allow_naive=False),
                time_from(body, "end_time", allow_naive=False),
            ),
        )
        low, high = _amount_filter(body)
        with self.lock:
            matches = [
                r
                for r in self._refunds.values()
                if (payment_id is None or r.payment_id == payment_id)
                and (refund_id is None or r.refund_id == refund_id)
                and (profile_id is None or r.profile_id == profile_id)
                and (statuses is None or r.status in statuses)
                and (currencies is None or r.currency in currencies)
                and all(r.created in window for window in windows)
                and (low is None or r.amount >= low)
                and (high is None or r.amount <= high)
            ]
            matches.sort(key=lambda r: (r.updated_at, r.seq), reverse=True)
            page = matches[offset : offset + limit]
            return {
                "count": len(page),
                "total_count": len(matches),
                "data": [r.to_api() for r in page],
            }

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
        method_data = _mask_payout_method(fields.obj(body, "payout_method_data"))
        customer_obj = fields.obj(body, "customer") or {}
        customer_id = fields.string(customer_obj, "id", max_length=64) or fields.string(
            body, "customer_id", max_length=64
        )
        contact = {
            name: fields.string(customer_obj, name) or fields.string(body, name)
            for name in ("name", "email", "phone", "phone_country_code")
        }
        auto_fulfill = fields.boolean(body, "auto_fulfill")
        profile_id = fields.string(body, "profile_id") or self.profile_id
        with self.lock:
            if payout_id is None:
                payout_id = _new_id("payout_", 23)
            elif payout_id in self._payouts:
                raise duplicate(
                    f"The payout with the specified payout_id '{payout_id}' already exists"
                )
            now = self.now()
            customer = self._customers.get(customer_id) if customer_id else None
            if customer is None:
                customer = Customer(customer_id=customer_id or _new_id("cus_"), created=now)
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
                customer_id=customer.customer_id,
                customer={
                    "id": customer.customer_id,
                    "name": customer.name,
                    "email": customer.email,
                    "phone": customer.phone,
                    "phone_country_code": customer.phone_country_code,
                },
                client_secret=f"{payout_id}_secret_{os.urandom(10).hex()}",
                created=now,
                modified_at=now,
                merchant_order_reference_id=reference,
                payout_type=payout_type,
                payout_method_data=method_data,
                auto_fulfill=auto_fulfill,
                billing=fields.obj(body, "billing"),
                recurring=fields.boolean(body, "recurring"),
                return_url=fields.string(body, "return_url", max_length=1024),
                business_country=fields.string(body, "business_country", max_length=2),
                description=fields.string(body, "description", max_length=1024),
                entity_type=fields.string(body, "entity_type"),
                priority=fields.string(body, "priority"),
                metadata=fields.metadata(body),
                payout_link=fields.boolean(body, "payout_link"),
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

    def list_payouts_hyperswitch(self, items: Iterable[tuple[str, str]]) -> JSONDict:
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
        with self.lock:
            if start is None and "starting_after" in params:
                start = self._payout(params["starting_after"]).created
            if end is None and "ending_before" in params:
                end = self._payout(params["ending_before"]).created
            window = Window(start, end)
            rows = [
                p
                for p in self._payouts_desc()
                if p.created in window and (customer_id is None or p.customer_id == customer_id)
            ][:limit]
            return {"size": len(rows), "data": [p.to_api() for p in rows]}

    def list_payouts(self, body: fields.Body) -> JSONDict:
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
        single = {
            name: fields.string(body, name)
            for name in ("payout_id", "merchant_order_reference_id", "profile_id", "customer_id")
        }
        with self.lock:
            matches = [
                p
                for p in self._payouts_desc()
                if p.created in window
                and (statuses is None or p.status in statuses)
                and (currencies is None or p.currency in currencies)
                and (methods is None or p.payout_type in methods)
                and all(v is None or getattr(p, k) == v for k, v in single.items())
            ]
            page = matches[offset : offset + limit]
            return {
                "size": len(page),
                "data": [p.to_api() for p in page],
                "total_count": len(matches),
            }

    # -- disputes --------------------------------------------------------------------------

    def open_dispute(
        self,
        payment_id: str,
        *,
        amount: int | None = None,
        reason: str | None = None,
        reason_code: str | None = None,
        stage: str = "dispute",
    ) -> JSONDict:
        """Open a dispute (``dispute_opened``) on a succeeded payment (sandbox admin)."""
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status not in REFUNDABLE:
                raise conflict("Only a succeeded payment can be disputed")
            received = payment.amount_received or 0
            if amount is None:
                amount = received
            if not 1 <= amount <= received:
                raise invalid(f"the dispute amount must be between 1 and {received}")
            return self._open_dispute(payment, amount, reason, reason_code, stage).to_api()

    def dispute_action(self, dispute_id: str, action: str) -> JSONDict:
        """Move a dispute: ``challenge``, ``accept``, ``win``, ``lose``, ``expire``, ``cancel``."""
        target = DISPUTE_ACTIONS.get(action)
        if target is None:
            raise invalid(f"action must be one of {', '.join(DISPUTE_ACTIONS)}")
        with self.lock:
            dispute = self._disputes.get(dispute_id)
            if dispute is None:
                raise not_found("Dispute")
            if target not in _DISPUTE_MOVES.get(dispute.status, frozenset()):
                raise conflict(f"a dispute in {dispute.status} cannot {action}")
            if target == "dispute_lost":
                payment = self._payments[dispute.payment_id]
                refunded = sum(
                    r.amount
                    for r in self._refunds_by_payment.get(payment.payment_id, [])
                    if r.status == "succeeded"
                )
                dispute.is_already_refunded = refunded + dispute.amount > (
                    payment.amount_received or 0
                )
            dispute.status = target
            dispute.modified_at = self.now()
            self._emit("dispute", dispute.dispute_id, dispute.status, dispute.to_api())
            return dispute.to_api()

    def get_dispute(self, dispute_id: str) -> JSONDict:
        """``GET /disputes/<id>``."""
        with self.lock:
            dispute = self._disputes.get(dispute_id)
            if dispute is None:
                raise not_found("Dispute")
            return dispute.to_api()

    def list_disputes(self, items: Iterable[tuple[str, str]]) -> list[JSONDict]:
        """``GET /disputes/list``: a bare JSON array, newest first, ``limit``/``offset``,
        ``start_time``/``end_time`` on ``created_at``, comma-separated ``dispute_status``,
        ``dispute_stage`` and ``currency``."""
        params = query_params(items, _GET_DISPUTES_PARAMS)
        limit = limit_from_query(params.get("limit"), default=100, maximum=100)
        offset = offset_from(params.get("offset"))
        window = Window(
            time_from(params, "start_time", allow_naive=False),
            time_from(params, "end_time", allow_naive=False),
        )
        statuses = csv_values(params, "dispute_status")
        stages = csv_values(params, "dispute_stage")
        currencies = csv_values(params, "currency")
        with self.lock:
            matches = [
                d
                for d in sorted(
                    self._disputes.values(), key=lambda d: (d.created, d.seq), reverse=True
                )
                if d.created in window
                and (statuses is None or d.status in statuses)
                and (stages is None or d.stage in stages)
                and (currencies is None or d.currency in currencies)
                and params.get("payment_id", d.payment_id) == d.payment_id
                and params.get("dispute_id", d.dispute_id) == d.dispute_id
                and params.get("reason", d.reason) == d.reason
            ]
            return [d.to_api() for d in matches[offset : offset + limit]]

    # -- time passing ----------------------------------------------------------------------

    def tick(self) -> dict[str, list[str]]:
        """Advance everything that waits by one step; return the ids that changed.

        ``processing`` payments authorise, ``pending``/``review`` refunds succeed, ``pending``
        payouts succeed, and payments of the dispute test card get their dispute.
        """
        changed: dict[str, list[str]] = {
            "payments": [],
            "refunds": [],
            "payouts": [],
            "disputes": [],
        }
        with self.lock:
            for payment in list(self._payments.values()):
                if payment.pending_behaviour == "processing" and payment.status == "processing":
                    payment.pending_behaviour = None
                    self._authorised(payment)
                    changed["payments"].append(payment.payment_id)
                elif payment.pending_behaviour == "dispute" and payment.status in REFUNDABLE:
                    payment.pending_behaviour = None
                    dispute = self._open_dispute(
                        payment, payment.amount_received or payment.amount, None, None, "dispute"
                    )
                    changed["disputes"].append(dispute.dispute_id)
            for refund in self._refunds.values():
                if refund.status in {"pending", "review"}:
                    self._set_refund_status(refund, "succeeded")
                    changed["refunds"].append(refund.refund_id)
            for payout in self._payouts.values():
                if payout.status == "pending":
                    self._set_payout_status(payout, "success")
                    changed["payouts"].append(payout.payout_id)
        return changed

    # -- bulk seeding ----------------------------------------------------------------------

    def seed_payments(
        self,
        n: int,
        created_from: datetime,
        created_to: datetime | None = None,
        *,
        status: str | Sequence[str] = "succeeded",
        amount: int | Callable[[int], int] = 1000,
        currency: str = "USD",
        customer_id: str | None = None,
        emit_webhooks: bool = False,
        id_prefix: str = "pay_",
    ) -> list[str]:
        """Create ``n`` payments directly in the state, fast (for benchmarks and tests).

        ``created`` is spread evenly from ``created_from`` to ``created_to`` (inclusive; all
        equal when ``created_to`` is omitted). ``status`` cycles through the given statuses
        (``succeeded``, ``failed``, ``requires_capture``, ``processing``, ``cancelled``,
        ``requires_payment_method``, ``requires_customer_action``); ``amount`` may be a
        function of the index. No webhooks unless ``emit_webhooks``. Returns the new ids.
        """
        statuses = [status] if isinstance(status, str) else list(status)
        supported = {
            "succeeded",
            "failed",
            "requires_capture",
            "processing",
            "cancelled",
            "requires_payment_method",
            "requires_customer_action",
        }
        if n < 0 or not statuses or not set(statuses) <= supported:
            raise ValueError(f"seed_payments takes n >= 0 and statuses among {sorted(supported)}")
        start = truncate_ms(created_from)
        span = truncate_ms(created_to) - start if created_to is not None else timedelta(0)
        decline = TEST_CARDS["4000000000000002"]
        ids: list[str] = []
        with self.lock:
            if customer_id is not None and customer_id not in self._customers:
                self._customers[customer_id] = Customer(customer_id=customer_id, created=start)
            for index in range(n):
                created = truncate_ms(start + span * (index / (n - 1))) if n > 1 else start
                value = amount(index) if callable(amount) else amount
                payment_id = _new_id(id_prefix)
                payment = Payment(
                    payment_id=payment_id,
                    seq=self._next_seq(),
                    merchant_id=self.merchant_id,
                    profile_id=self.profile_id,
                    status="requires_payment_method",
                    amount=value,
                    currency=currency,
                    client_secret=f"{payment_id}_secret_{os.urandom(10).hex()}",
                    created=created,
                    modified_at=created,
                    customer_id=customer_id,
                    amount_capturable=value,
                )
                target = statuses[index % len(statuses)]
                if target != "requires_payment_method":
                    payment.card = _seed_card()
                    payment.payment_method, payment.payment_method_type = "card", "credit"
                    payment.attempt_count = 1
                    payment.connector_transaction_id = _new_id("txn_")
                _seed_status(payment, target, decline)
                self._payments[payment_id] = payment
                self._payment_keys.append((payment.created, payment.seq))
                self._payment_order.append(payment_id)
                ids.append(payment_id)
                if emit_webhooks:
                    self._emit("payment", payment_id, payment.status, payment.to_api())
            order = sorted(range(len(self._payment_keys)), key=self._payment_keys.__getitem__)
            self._payment_keys = [self._payment_keys[i] for i in order]
            self._payment_order = [self._payment_order[i] for i in order]
        return ids

    # -- internals -------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _payment(self, payment_id: str) -> Payment:
        payment = self._payments.get(payment_id)
        if payment is None:
            raise not_found("Payment")
        return payment

    def _refund(self, refund_id: str) -> Refund:
        refund = self._refunds.get(refund_id)
        if refund is None:
            raise not_found("Refund")
        return refund

    def _payout(self, payout_id: str) -> Payout:
        payout = self._payouts.get(payout_id)
        if payout is None:
            raise not_found("Payout")
        return payout

    def _require_customer(self, customer_id: str | None) -> None:
        if customer_id is not None and customer_id not in self._customers:
            raise invalid(
                f"customer_id '{customer_id}' does not exist: create it with POST /customers"
            )

    def _insert_payment(self, payment: Payment) -> None:
        self._payments[payment.payment_id] = payment
        key = (payment.created, payment.seq)
        index = bisect.bisect_right(self._payment_keys, key)
        self._payment_keys.insert(index, key)
        self._payment_order.insert(index, payment.payment_id)

    def _payments_desc(self, window: Window) -> Iterator[Payment]:
        """Payments with ``created`` in ``window``, newest first (ties: newest inserted)."""
        low = 0
        high = len(self._payment_keys)
        if window.start is not None:
            low = bisect.bisect_left(self._payment_keys, (window.start, -1))
        if window.end is not None:
            high = bisect.bisect_right(self._payment_keys, (window.end, sys.maxsize))
        for index in range(high - 1, low - 1, -1):
            yield self._payments[self._payment_order[index]]

    def _payouts_desc(self) -> list[Payout]:
        return sorted(self._payouts.values(), key=lambda p: (p.created, p.seq), reverse=True)

    def _emit(self, kind: str, object_id: str, status: str, obj: JSONDict) -> None:
        event_type = event_type_for_status(kind, status)
        if event_type is not None:
            self.webhooks.emit(kind, object_id, event_type, obj, self.now())

    def _set_payment_status(self, payment: Payment, status: str) -> None:
        changed = payment.status != status
        payment.status = status
        payment.modified_at = self.now()
        if changed:
            self._emit("payment", payment.payment_id, status, payment.to_api())

    def _set_refund_status(self, refund: Refund, status: str) -> None:
        changed = refund.status != status
        refund.status = status
        refund.updated_at = self.now()
        if changed:
            self._emit("refund", refund.refund_id, status, refund.to_api())

    def _set_payout_status(self, payout: Payout, status: str) -> None:
        changed = payout.status != status
        payout.status = status
        payout.modified_at = self.now()
        if changed:
            self._emit("payout", payout.payout_id, status, payout.to_api())

    def _confirm(self, payment: Payment) -> None:
        card = payment.card
        assert card is not None
        now = self.now()
        expired = (int(card.exp_year), int(card.exp_month)) < (now.year, now.month)
        self._apply_outcome(payment, EXPIRED if expired else card.outcome)

    def _apply_outcome(self, payment: Payment, outcome: CardOutcome) -> None:
        payment.attempt_count += 1
        payment.connector_transaction_id = _new_id("txn_")
        if outcome.kind == "decline":
            brand = payment.card.brand if payment.card else None
            payment.unified_code = outcome.unified_code
            payment.unified_message = outcome.unified_message
            payment.error_code = outcome.error_code
            payment.error_message = outcome.error_message
            payment.error_details = {
                "unified_details": {
                    "category": "card_declined",
                    "message": outcome.unified_message,
                },
                "issuer_details": {
                    "code": outcome.issuer_code,
                    "message": outcome.issuer_message,
                    "network_details": {"name": brand},
                },
                "connector_details": {
                    "code": outcome.error_code,
                    "message": outcome.error_message,
                    "reason": outcome.error_message,
                },
            }
            payment.amount_capturable = 0
            self._set_payment_status(payment, "failed")
        elif outcome.kind == "three_ds":
            payment.next_action = {
                "type": "redirect_to_url",
                "redirect_to_url": (
                    f"{self.public_url}/__sandbox/payments/{payment.payment_id}/authenticate"
                ),
            }
            self._set_payment_status(payment, "requires_customer_action")
        elif outcome.kind == "processing":
            payment.pending_behaviour = "processing"
            self._set_payment_status(payment, "processing")
        else:
            if outcome.kind == "dispute" and self.auto_dispute:
                payment.pending_behaviour = "dispute"
            self._authorised(payment)

    def _authorised(self, payment: Payment) -> None:
        if payment.capture_method.startswith("manual"):
            payment.amount_capturable = payment.amount
            self._set_payment_status(payment, "requires_capture")
        else:
            payment.amount_received = payment.amount
            payment.amount_capturable = 0
            payment.captured_at = self.now()
            self._set_payment_status(payment, "succeeded")

    def _fulfill(self, payout: Payout) -> None:
        payout.connector_transaction_id = _new_id("po_txn_")
        status = _payout_outcome(payout.amount)
        if status == "failed":
            payout.error_code = "payout_declined"
            payout.error_message = "Payout declined by the sandbox (amount ends in 02)"
            payout.unified_code, payout.unified_message = _FAILURE_UNIFIED
        self._set_payout_status(payout, status)

    def _open_dispute(
        self,
        payment: Payment,
        amount: int,
        reason: str | None,
        reason_code: str | None,
        stage: str,
    ) -> Dispute:
        now = self.now()
        dispute = Dispute(
            dispute_id=_new_id("dp_"),
            seq=self._next_seq(),
            payment_id=payment.payment_id,
            attempt_id=f"{payment.payment_id}_1",
            profile_id=payment.profile_id,
            amount=amount,
            currency=payment.currency,
            status="dispute_opened",
            created=now,
            modified_at=now,
            challenge_required_by=now + timedelta(days=7),
            stage=stage,
            reason=reason or "fraudulent",
            reason_code=reason_code or "10.4",
            connector_dispute_id=_new_id("dp_conn_"),
        )
        self._disputes[dispute.dispute_id] = dispute
        self._emit("dispute", dispute.dispute_id, dispute.status, dispute.to_api())
        return dispute


# -- pure helpers ---------------------------------------------------------------------------


def _payment_method(body: Mapping[str, Any]) -> tuple[CardInfo | None, str | None, str | None]:
    """The card of ``payment_method_data`` (last4 and brand only), and the method names."""
    payment_method = fields.string(body, "payment_method")
    payment_method_type = fields.string(body, "payment_method_type")
    data = fields.obj(body, "payment_method_data")
    if data is None:
        return None, payment_method, payment_method_type
    if payment_method not in (None, "card") or not isinstance(data.get("card"), dict):
        raise invalid(
            "the sandbox processes only payment_method card with payment_method_data.card"
        )
    card = data["card"]
    prefix = "payment_method_data.card."
    raw_number = card.get("card_number")
    if raw_number is None:
        raise missing(prefix + "card_number")
    number = raw_number.replace(" ", "") if isinstance(raw_number, str) else ""
    if not luhn_valid(number):
        raise invalid("Invalid card number")
    month = _card_field(card, "card_exp_month", prefix)
    year = _card_field(card, "card_exp_year", prefix)
    cvc = _card_field(card, "card_cvc", prefix)
    if not month.isdigit() or not 1 <= int(month) <= 12:
        raise invalid(f"Invalid value provided: {prefix}card_exp_month")
    if not year.isdigit() or len(year) not in (2, 4):
        raise invalid(f"Invalid value provided: {prefix}card_exp_year")
    if not cvc.isdigit() or len(cvc) not in (3, 4):
        raise invalid(f"Invalid value provided: {prefix}card_cvc")
    holder = card.get("card_holder_name")
    info = CardInfo(
        last4=number[-4:],
        brand=brand_for(number),
        exp_month=f"{int(month):02d}",
        exp_year=year if len(year) == 4 else f"20{year}",
        holder_name=holder if isinstance(holder, str) else None,
        outcome=outcome_for(number),
    )
    return info, "card", payment_method_type or "credit"


def _card_field(card: Mapping[str, Any], name: str, prefix: str) -> str:
    value = card.get(name)
    if value is None:
        raise missing(prefix + name)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise invalid(f"Invalid value provided: {prefix}{name}")
    return value.strip()


def _seed_card() -> CardInfo:
    return CardInfo(
        last4="4242",
        brand="Visa",
        exp_month="12",
        exp_year="2099",
        holder_name=None,
        outcome=SUCCESS,
    )


def _seed_status(payment: Payment, status: str, decline: CardOutcome) -> None:
    payment.status = status
    if status == "succeeded":
        payment.amount_received = payment.amount
        payment.amount_capturable = 0
        payment.captured_at = payment.created
    elif status == "failed":
        payment.amount_capturable = 0
        payment.unified_code = decline.unified_code
        payment.unified_message = decline.unified_message
        payment.error_code = decline.error_code
        payment.error_message = decline.error_message
    elif status == "requires_capture":
        payment.capture_method = "manual"
    elif status == "cancelled":
        payment.amount_capturable = 0
        payment.cancelled_at = payment.created


def _refund_outcome(amount: int) -> str:
    return {2: "failed", 77: "pending", 88: "review"}.get(amount % 100, "succeeded")


def _payout_outcome(amount: int) -> str:
    return {2: "failed", 77: "pending"}.get(amount % 100, "success")


def _state_message(payment: Payment, flow: str, expected: Iterable[str]) -> str:
    return (
        f"This Payment could not be {flow} because it has a status of {payment.status}. "
        f"The expected state is {' or '.join(sorted(expected))}"
    )


def _intersect(first: set[str] | None, second: set[str] | None) -> set[str] | None:
    if first is None:
        return second
    if second is None:
        return first
    return first & second


def _amount_filter(body: Mapping[str, Any]) -> tuple[int | None, int | None]:
    raw = fields.obj(body, "amount_filter")
    if raw is None:
        return None, None
    return fields.integer(raw, "start_amount"), fields.integer(raw, "end_amount")


def _mask(value: str) -> str:
    return "*" * max(len(value) - 4, 4) + value[-4:] if len(value) > 4 else "****"


def _mask_payout_method(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """``payout_method_data`` as responses show it: sensitive values masked, no card number,
    ``bank_transfer`` keyed as ``bank``."""
    if data is None:
        return None
    if len(data) != 1 or next(iter(data)) not in PAYOUT_METHODS:
        raise invalid(
            "Invalid value provided: payout_method_data (exactly one of "
            + ", ".join(PAYOUT_METHODS)
            + ")"
        )
    method, details = next(iter(data.items()))
    if not isinstance(details, dict):
        raise invalid(f"Invalid value provided: payout_method_data.{method} (an object)")

    def scrub(node: Any) -> Any:
        if isinstance(node, dict):
            out: dict[str, Any] = {}
            for key, value in node.items():
                if key == "card_number" and isinstance(value, str):
                    digits = value.replace(" ", "")
                    out["last4"] = digits[-4:]
                    out.setdefault("card_network", brand_for(digits))
                elif key in _SENSITIVE_KEYS and isinstance(value, str):
                    out[key] = _mask(value)
                else:
                    out[key] = scrub(value)
            return out
        if isinstance(node, list):
            return [scrub(item) for item in node]
        return node

    return {"bank" if method == "bank_transfer" else method: scrub(details)}


__all__ = ["Sandbox", "SandboxError"]
