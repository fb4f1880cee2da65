"""The sandbox processor's state and behaviour: :class:`Sandbox`.

A :class:`Sandbox` holds payments, refunds, payouts, customers, disputes and mandates in
memory behind one lock, runs their state machines, and emits a webhook whenever an object
reaches a status that :func:`receiver.core.status.event_type_for_status` maps to an event (at most
one per object and event type, ever: a status whose event was already sent sends nothing).
Its public methods take the JSON bodies (or query parameters) of the HTTP API and return what
the API answers, or raise :class:`~reconcile.sandbox.errors.SandboxError`;
:func:`reconcile.sandbox.app.create_app` is a thin HTTP layer over them, and tests may call
them directly. Every answer carries only the fields Hyperswitch's OpenAPI contract declares
(see :mod:`reconcile.sandbox.models`).

Time is the sandbox clock (``now=``, :meth:`Sandbox.set_clock`; default the current UTC
time), truncated to milliseconds: a :class:`~reconcile.sandbox.clock.FrozenClock` (or
freezegun) drives weeks-long lifecycles. :meth:`Sandbox.tick` moves everything that waits one
step and answers what changed.

Payments (the card table is in :mod:`reconcile.sandbox.cards`):

- ``capture_method``: ``automatic`` captures on authorisation; ``manual`` authorises
  (``requires_capture``), then one capture (a partial one ends ``partially_captured``);
  ``manual_multiple`` allows several captures: a partial one ->
  ``partially_captured_and_capturable`` (event ``payment_captured``), capturing the rest ->
  ``succeeded``. Captures and voids of card 4000000000000333 are asynchronous: capture ->
  ``processing`` (``partially_captured_and_processing`` for a partial ``manual_multiple``
  capture), void -> ``processing``; the next tick settles them.
- **Manual retry**: a ``failed`` payment (``manual_retry_allowed: true``) may be confirmed
  again, with the attached or a new card: a new attempt (``attempt_count`` + 1), whose
  outcome is the card's (``payment_succeeded`` after the earlier ``payment_failed``).
- **Authorisation expiry**: an authorisation not captured within 7 days of being granted
  expires on the first tick at or after that: ``requires_capture`` and
  ``partially_authorized_and_requires_capture`` -> ``expired`` (``payment_expired``);
  ``partially_captured_and_capturable`` -> ``partially_captured``, which shares its event
  (``payment_captured``) with the status before it, so no webhook goes out: reconciliation
  must catch it.
- **Mandates**: a payment with ``setup_future_usage: "off_session"`` or ``mandate_data`` that
  is authorised creates an ``active`` mandate (``mandate_active``); ``POST
  /mandates/revoke/<id>`` (or :meth:`Sandbox.revoke_mandate`) revokes it
  (``mandate_revoked``); :meth:`Sandbox.create_mandate` makes one directly. A payment with
  ``mandate_id`` and ``confirm: true`` charges the mandate's card (an active mandate only).

Refunds: the refund ``amount`` (lowest unit) decides. Ending in ``02`` (e.g. 102, 1002):
``failed``. Ending in ``77``: ``pending``, ``succeeded`` on the next tick. Ending in ``88``:
``review``, ``succeeded`` on the next tick. Anything else: ``succeeded`` at once.
:meth:`Sandbox.fail_refund` fails a ``succeeded``, ``pending`` or ``review`` refund later
(``refund_failed``), days later if wanted.

Payouts: fulfilment (``POST /payouts/<id>/fulfill``, or at create with ``auto_fulfill:
true``) decides by the payout ``amount``: ending in ``02``: ``failed``; ``77``: ``pending``,
``success`` on the next tick; ``55``: ``initiated`` (``payout_initiated``), ``success`` on the
next tick; anything else: ``success``. Later: :meth:`Sandbox.reverse_payout` (``success`` ->
``reversed``, ``payout_reversed``) and :meth:`Sandbox.fail_payout` (``initiated``/``pending``
-> ``failed``).

Disputes: opened on a captured payment by :meth:`Sandbox.open_dispute` (or automatically on
the next tick for card 4000000000000259), then moved by :meth:`Sandbox.dispute_action`:
``challenge``, ``accept``, ``win``, ``lose``, ``expire``, ``cancel`` (any time later: nothing
expires by itself), and to a later stage on the **same** ``dispute_id``: ``pre_arbitration``
(from stage ``pre_dispute``/``dispute``) and ``arbitration`` (from ``pre_dispute``,
``dispute`` or ``pre_arbitration``), both only from a decided dispute (``dispute_won`` or
``dispute_lost``), set ``dispute_stage`` and put ``dispute_status`` back to
``dispute_opened`` with a new 7-day ``challenge_required_by``: no webhook, because
``dispute_opened`` was already sent for that dispute; ``reversal`` turns a ``dispute_lost``
into stage ``dispute_reversal`` with status ``dispute_won`` (the funds come back).

Events API (Hyperswitch's admin routes, ``admin_api_key``): :meth:`Sandbox.list_events`,
:meth:`Sandbox.event_attempts`, :meth:`Sandbox.retry_event`. Webhook delivery is threaded
(:meth:`Sandbox.start`) or, with ``send=``, driven by the sandbox clock
(:meth:`Sandbox.deliver_due`); see :mod:`reconcile.sandbox.webhooks`.

Lists order by ``created`` (refunds: ``updated_at``; events: ``created``) descending; rows with
equal timestamps come newest-inserted first. The list faults ``ignore_filters`` and
``repeat_pages`` (:mod:`reconcile.sandbox.faults`) reach the list methods as ``list_fault``.
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
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from receiver.core.errors import ConfigurationError
from receiver.core.events import EVENT_CLASSES, EVENT_TYPES
from receiver.core.status import REFUND_STATUS_ALIASES, event_type_for_status
from reconcile.sandbox import fields
from reconcile.sandbox.cards import (
    AUTHENTICATION_FAILED,
    EXPIRED,
    INSUFFICIENT_FUNDS,
    SUCCESS,
    TEST_CARDS,
    CardOutcome,
    brand_for,
    luhn_valid,
    outcome_for,
)
from reconcile.sandbox.clock import Clock, truncate_ms, utcnow
from reconcile.sandbox.errors import (
    SandboxError,
    conflict,
    duplicate,
    invalid,
    missing,
    not_found,
)
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
    Capture,
    CardInfo,
    Customer,
    Dispute,
    JSONDict,
    Mandate,
    Payment,
    Payout,
    Refund,
    customer_acceptance,
)
from reconcile.sandbox.webhooks import (
    HYPERSWITCH_RETRY_SCHEDULE,
    DeliveryReport,
    Sender,
    WebhookDispatcher,
)

CAPTURE_METHODS: Final = frozenset(
    {"automatic", "manual", "manual_multiple", "scheduled", "sequential_automatic"}
)
CAPTURABLE: Final = frozenset(
    {
        "requires_capture",
        "partially_authorized_and_requires_capture",
        "partially_captured_and_capturable",
    }
)
#: Authorisations that expire 7 days after they were granted (and what they become).
EXPIRING: Final = {
    "requires_capture": "expired",
    "partially_authorized_and_requires_capture": "expired",
    "partially_captured_and_capturable": "partially_captured",
}
AUTHORISATION_LIFETIME: Final = timedelta(days=7)
CANCELLABLE: Final = frozenset(
    {
        "requires_payment_method",
        "requires_confirmation",
        "requires_customer_action",
        "requires_capture",
        "partially_authorized_and_requires_capture",
    }
)
CONFIRMABLE: Final = frozenset({"requires_payment_method", "requires_confirmation"})
#: A confirm may also retry a payment whose attempt failed (Hyperswitch's manual retry: the
#: response's ``manual_retry_allowed``): a new attempt, with the given or the attached card.
RETRYABLE: Final = CONFIRMABLE | {"failed"}
REFUNDABLE: Final = frozenset(
    {"succeeded", "partially_captured", "partially_captured_and_capturable"}
)
#: Refund filter values of Hyperswitch's ``refund_status[]``: the *internal* enum.
REFUND_FILTER_STATUSES: Final = (
    "success",
    "failure",
    "pending",
    "manual_review",
    "transaction_failure",
)
PAYOUT_TYPES: Final = frozenset({"card", "bank", "wallet", "bank_redirect"})
PAYOUT_METHODS: Final = ("card", "bank", "bank_transfer", "wallet", "bank_redirect", "passthrough")
PAYOUT_ENTITY_TYPES: Final = frozenset(
    {"Individual", "Company", "NonProfit", "PublicSector", "NaturalPerson", "lowercase", "Personal"}
)
PAYOUT_PRIORITIES: Final = frozenset(
    {"instant", "fast", "regular", "wire", "cross_border", "internal"}
)
DISPUTE_ACTIONS: Final = {
    "challenge": "dispute_challenged",
    "accept": "dispute_accepted",
    "win": "dispute_won",
    "lose": "dispute_lost",
    "expire": "dispute_expired",
    "cancel": "dispute_cancelled",
}
#: Stage actions: the stage they move to and the stages they may move from.
DISPUTE_STAGE_ACTIONS: Final = {
    "pre_arbitration": ("pre_arbitration", frozenset({"pre_dispute", "dispute"})),
    "arbitration": ("arbitration", frozenset({"pre_dispute", "dispute", "pre_arbitration"})),
}
#: The statuses a stage action may start from: a decided dispute.
DISPUTE_DECIDED: Final = frozenset({"dispute_won", "dispute_lost"})
DISPUTE_STAGES: Final = (
    "pre_dispute",
    "dispute",
    "pre_arbitration",
    "arbitration",
    "dispute_reversal",
)
_DISPUTE_MOVES: Final = {
    "dispute_opened": frozenset(DISPUTE_ACTIONS.values()),
    "dispute_challenged": frozenset(
        {"dispute_won", "dispute_lost", "dispute_expired", "dispute_cancelled", "dispute_accepted"}
    ),
}
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
_SENSITIVE_KEYS: Final = frozenset(
    {
        "bank_account_number",
        "bank_routing_number",
        "bank_sort_code",
        "iban",
        "pix_key",
        "psp_token",
        "tax_id",
        "telephone_number",
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
IGNORE_FILTERS: Final = "ignore_filters"
REPEAT_PAGES: Final = "repeat_pages"


def _new_id(prefix: str, length: int = 20) -> str:
    """``prefix`` + ``length`` random lowercase hex digits."""
    return prefix + os.urandom((length + 1) // 2).hex()[:length]


class Sandbox:
    """A stateful, in-memory payment processor speaking the Hyperswitch API.

    ``api_key`` must start with ``snd_``. ``admin_api_key`` authenticates the events API
    (``None``: those routes answer 401). ``webhook_url`` of ``None`` records events without
    delivering them; ``webhook_secret`` of ``None`` generates a 64-character key like
    Hyperswitch does (read it from :attr:`webhook_secret`). ``retry_schedule`` holds the
    delays before each webhook retry; ``seed`` seeds the fault RNG; ``now`` is the clock hook.
    ``send`` selects the clock-driven webhook delivery (:meth:`deliver_due`); without it
    :meth:`start` starts a delivery thread and :meth:`close` stops it. ``return_url`` and
    ``business_country`` are the business profile's defaults that payouts report when a
    request gives none (``PayoutCreateResponse`` requires both).
    """

    def __init__(
        self,
        api_key: str,
        *,
        admin_api_key: str | None = None,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        merchant_id: str = "merchant_sandbox",
        profile_id: str = "pro_sandbox",
        retry_schedule: Sequence[float] = HYPERSWITCH_RETRY_SCHEDULE,
        seed: int = 0,
        now: Clock | None = None,
        send: Sender | None = None,
        webhook_timeout: float = 5.0,
        rate_limit_per_minute: int = 10_000,
        auto_dispute: bool = True,
        public_url: str = "http://127.0.0.1",
        return_url: str = "https://merchant.example/return",
        business_country: str = "US",
    ) -> None:
        if not api_key.startswith("snd_") or len(api_key) <= len("snd_"):
            raise ConfigurationError("the sandbox api key must start with 'snd_'")
        if webhook_secret is not None and not webhook_secret:
            raise ConfigurationError("the webhook secret must not be empty")
        if admin_api_key is not None and not admin_api_key:
            raise ConfigurationError("the admin api key must not be empty (None disables it)")
        self.lock = threading.RLock()
        self._api_key = api_key
        self._admin_api_key = admin_api_key
        self.merchant_id = merchant_id
        self.profile_id = profile_id
        self.auto_dispute = auto_dispute
        self.return_url = return_url
        self.business_country = business_country
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
            clock=self.now,
            send=send,
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
        self._mandates: dict[str, Mandate] = {}

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
        """Where webhooks go (``None``: recorded, never sent)."""
        return self.webhooks.url

    @webhook_url.setter
    def webhook_url(self, url: str | None) -> None:
        with self.lock:
            self.webhooks.url = url

    def check_api_key(self, given: str | None) -> bool:
        """Constant-time comparison of an ``api-key`` header with the merchant key."""
        return _same(given, self._api_key)

    def check_admin_key(self, given: str | None) -> bool:
        """Constant-time comparison with the admin key (always False when there is none)."""
        return self._admin_api_key is not None and _same(given, self._admin_api_key)

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
        """Start delivering webhooks (the threaded mode; nothing to do with ``send=``)."""
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
        """Wait until every emitted event is delivered or given up; False on timeout.

        In the clock-driven mode nothing is sent: True when nothing is queued.
        """
        return self.webhooks.flush(timeout)

    def deliver_due(self, *, release_held: bool = False) -> DeliveryReport:
        """Send every webhook attempt due at the sandbox clock's time (needs ``send=``).

        Retries (and ``delay`` faults) are scheduled in sandbox seconds, so advancing a
        :class:`~reconcile.sandbox.clock.FrozenClock` and calling this again sends them.
        ``release_held`` also sends events the ``reorder`` fault holds back. Answers a
        :class:`~reconcile.sandbox.webhooks.DeliveryReport` of the attempts sent.
        """
        return self.webhooks.deliver_due(release_held=release_held)

    def next_delivery_due(self) -> datetime | None:
        """When the next queued webhook attempt is due (clock-driven mode), or ``None``."""
        return self.webhooks.next_due()

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
                    "mandates": len(self._mandates),
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
            return self._customer(customer_id).to_api()

    # -- payments --------------------------------------------------------------------------

    def create_payment(self, body: fields.Body) -> JSONDict:
        """``POST /payments``; ``confirm: true`` confirms in the same request.

        ``setup_future_usage: "off_session"`` or ``mandate_data`` set up a mandate when the
        payment is authorised; ``mandate_id`` (with ``confirm: true``) charges an active
        mandate's card instead of ``payment_method_data``.
        """
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
                "description",
                "statement_descriptor",
                "return_url",
            )
        }
        fields.string(body, "phone_country_code", max_length=1024)
        metadata = fields.metadata(body)
        billing = fields.obj(body, "billing")
        shipping = fields.obj(body, "shipping")
        order_details = fields.array(body, "order_details")
        profile_id = fields.string(body, "profile_id") or self.profile_id
        mandate = _mandate_request(body)
        mandate_id = fields.string(body, "mandate_id")
        partial = fields.boolean(body, "enable_partial_authorization")
        card, _payment_method_name, payment_method_type = _payment_method(body)
        if confirm and card is None and mandate_id is None:
            raise missing("payment_method_data")
        with self.lock:
            if payment_id is None:
                payment_id = _new_id("pay_")
            elif payment_id in self._payments:
                raise duplicate(
                    f"The payment with the specified payment_id '{payment_id}' already exists "
                    "in our records"
                )
            customer = self._require_customer(customer_id)
            if mandate_id is not None:
                card = self._mandate_card(mandate_id)
                payment_method_type = "credit"
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
                customer=customer,
                metadata=metadata,
                billing=billing,
                shipping=shipping,
                order_details=order_details,
                payment_method_type=payment_method_type,
                card=card,
                amount_capturable=amount,
                enable_partial_authorization=partial,
                mandate_id=mandate_id,
                off_session=True if mandate_id is not None else mandate.off_session,
                setup_future_usage=mandate.setup_future_usage,
                mandate_data=mandate.data,
            )
            payment.customer_acceptance = mandate.acceptance
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
                "description",
                "statement_descriptor",
                "return_url",
            )
            if name in body
        }
        metadata = fields.metadata(body)
        billing = fields.obj(body, "billing")
        card, _payment_method_name, payment_method_type = _payment_method(body)
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status not in CONFIRMABLE:
                raise conflict(_state_message(payment, "updated", CONFIRMABLE))
            customer = self._require_customer(customer_id)
            if amount is not None:
                payment.amount = amount
                payment.amount_capturable = amount
            if currency is not None:
                payment.currency = currency
            if customer is not None:
                payment.customer = customer
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
                payment.payment_method_type = payment_method_type
            payment.status = "requires_confirmation"
            payment.modified_at = self.now()
            return payment.to_api()

    def confirm_payment(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>/confirm``: authorise with the attached or the given card
        (also a manual retry of a ``failed`` payment: a new attempt)."""
        card, _payment_method_name, payment_method_type = _payment_method(body)
        return_url = fields.string(body, "return_url", max_length=1024)
        billing = fields.obj(body, "billing")
        mandate = _mandate_request(body)
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status not in RETRYABLE:
                raise conflict(_state_message(payment, "confirmed", RETRYABLE))
            if payment.status == "failed":
                # A new attempt: the failed one's error no longer describes the payment.
                payment.unified_code = payment.unified_message = None
                payment.error_code = payment.error_message = None
                payment.error_details = None
            if card is not None:
                payment.card = card
                payment.payment_method_type = payment_method_type
            if payment.card is None:
                raise missing("payment_method_data")
            if return_url is not None:
                payment.return_url = return_url
            if billing is not None:
                payment.billing = billing
            if mandate.setup_future_usage is not None:
                payment.setup_future_usage = mandate.setup_future_usage
            if mandate.data is not None:
                payment.mandate_data = mandate.data
            if mandate.acceptance is not None:
                payment.customer_acceptance = mandate.acceptance
            self._confirm(payment)
            return payment.to_api()

    def capture_payment(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>/capture``: full or partial capture of an authorisation.

        ``manual``: one capture (partial -> ``partially_captured``). ``manual_multiple``:
        partial captures -> ``partially_captured_and_capturable`` until the rest is captured
        (-> ``succeeded``). Card 4000000000000333 captures asynchronously (``processing`` /
        ``partially_captured_and_processing`` until the next tick).
        """
        amount = fields.integer(body, "amount_to_capture", minimum=1)
        prefix = fields.string(body, "statement_descriptor_prefix") or ""
        suffix = fields.string(body, "statement_descriptor_suffix") or ""
        if len(prefix) + len(suffix) > 22:
            raise invalid("statement descriptor prefix plus suffix should not exceed 22 characters")
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status in {"succeeded", "partially_captured", "cancelled", "expired"}:
                raise conflict(
                    f"The payment is already {payment.status.replace('_', ' ')}", status=409
                )
            if payment.status not in CAPTURABLE or payment.pending_operation is not None:
                raise conflict(_state_message(payment, "captured", CAPTURABLE))
            amount = payment.amount_capturable if amount is None else amount
            if amount > payment.amount_capturable:
                raise invalid("amount_to_capture is greater than amount_capturable")
            multiple = payment.capture_method == "manual_multiple"
            capture: Capture | None = None
            if multiple:
                capture = Capture(
                    capture_id=f"{payment.payment_id}_capture_{len(payment.captures) + 1}",
                    sequence=len(payment.captures) + 1,
                    amount=amount,
                    status="charged",
                    connector_capture_id=_new_id("cap_conn_"),
                )
                payment.captures.append(capture)
            if payment.card is not None and payment.card.outcome.kind == "async":
                payment.pending_operation = ("capture", amount)
                partial = amount < payment.amount_capturable or bool(payment.amount_received)
                if capture is not None:
                    capture.status = "pending"
                status = (
                    "partially_captured_and_processing" if multiple and partial else "processing"
                )
                self._set_payment_status(payment, status)
            else:
                self._settle_capture(payment, amount)
            return payment.to_api()

    def cancel_payment(self, payment_id: str, body: fields.Body) -> JSONDict:
        """``POST /payments/<id>/cancel``: void a payment that is not captured.

        Card 4000000000000333 voids an authorisation asynchronously (``processing`` until the
        next tick, then ``cancelled``).
        """
        reason = fields.string(body, "cancellation_reason", max_length=255)
        with self.lock:
            payment = self._payment(payment_id)
            if payment.status not in CANCELLABLE or payment.pending_operation is not None:
                raise conflict(_state_message(payment, "cancelled", CANCELLABLE))
            payment.cancellation_reason = reason
            payment.next_action = None
            payment.pending_behaviour = None
            authorised = payment.status in CAPTURABLE
            if authorised and payment.card is not None and payment.card.outcome.kind == "async":
                payment.pending_operation = ("void", 0)
                self._set_payment_status(payment, "processing")
            else:
                self._void(payment)
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

    # -- refunds ---------------------------------------------------------------------------

    def create_refund(self, body: fields.Body) -> JSONDict:
        """``POST /refunds``: full (no ``amount``) or partial refund of a captured payment."""
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
            self._emit("refund", refund_id, refund.status, refund.to_api(), refund.profile_id)
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

    def fail_refund(self, refund_id: str, *, reason: str | None = None) -> JSONDict:
        """Fail a refund late (sandbox admin): ``succeeded``/``pending``/``review`` -> ``failed``.

        The connector reports the failure after the fact, days later if the clock says so;
        emits ``refund_failed`` and frees the amount for another refund.
        """
        with self.lock:
            refund = self._refund(refund_id)
            if refund.status not in {"succeeded", "pending", "review"}:
                raise conflict(
                    f"a refund in {refund.status} cannot fail (succeeded, pending or review)"
                )
            refund.error_code = "refund_failed"
            refund.error_message = reason or "The refund was reversed by the connector"
            refund.unified_code, refund.unified_message = _FAILURE_UNIFIED
            self._set_refund_status(refund, "failed")
            return refund.to_api()

    def list_refunds(self, body: fields.Body, *, list_fault: str | None = None) -> JSONDict:
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
        windows = [
            Window(
                time_from(body, "created_gte", allow_naive=True),
                time_from(body, "created_lte", allow_naive=True),
            ),
            Window(
                time_from(body, "start_time", allow_naive=False),
                time_from(body, "end_time", allow_naive=False),
            ),
        ]
        low, high = _amount_filter(body)
        if list_fault == IGNORE_FILTERS:
            payment_id = refund_id = profile_id = None
            statuses = currencies = None
            low = high = None
            windows = []
        if list_fault is not None:
            offset = 0
            windows = [Window(w.start, None) for w in windows]
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
        return_url = fields.string(body, "return_url", max_length=1024) or self.return_url
        country = fields.string(body, "business_country", max_length=2) or self.business_country
        entity_type = fields.string(body, "entity_type", choices=PAYOUT_ENTITY_TYPES)
        priority = fields.string(body, "priority", choices=PAYOUT_PRIORITIES)
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
            payout.unified_code, payout.unified_message = _FAILURE_UNIFIED
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
        """Open a dispute (``dispute_opened``) on a captured payment (sandbox admin)."""
        if stage not in DISPUTE_STAGES:
            raise invalid(f"stage must be one of {', '.join(DISPUTE_STAGES)}")
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
        """Move a dispute (sandbox admin), at any later sandbox time.

        ``challenge``, ``accept``, ``win``, ``lose``, ``expire``, ``cancel`` change its status
        (``dispute_opened`` -> any; ``dispute_challenged`` -> won, lost, expired, cancelled,
        accepted). ``pre_arbitration`` and ``arbitration`` reopen a decided dispute
        (``dispute_won``/``dispute_lost``) at that later stage: status ``dispute_opened``, no
        webhook (already sent for this dispute). ``reversal`` turns ``dispute_lost`` into
        stage ``dispute_reversal``, status ``dispute_won``.
        """
        known = (*DISPUTE_ACTIONS, *DISPUTE_STAGE_ACTIONS, "reversal")
        if action not in known:
            raise invalid(f"action must be one of {', '.join(known)}")
        with self.lock:
            dispute = self._dispute(dispute_id)
            if action in DISPUTE_STAGE_ACTIONS:
                stage, sources = DISPUTE_STAGE_ACTIONS[action]
                if dispute.status not in DISPUTE_DECIDED or dispute.stage not in sources:
                    raise conflict(
                        f"a dispute in {dispute.status} at stage {dispute.stage} cannot move to "
                        f"{stage} (from dispute_won or dispute_lost at "
                        f"{' or '.join(sorted(sources))})"
                    )
                dispute.stage = stage
                dispute.challenge_required_by = self.now() + timedelta(days=7)
                self._set_dispute_status(dispute, "dispute_opened")
                return dispute.to_api()
            if action == "reversal":
                if dispute.status != "dispute_lost":
                    raise conflict(f"a dispute in {dispute.status} cannot be reversed")
                dispute.stage = "dispute_reversal"
                self._set_dispute_status(dispute, "dispute_won")
                return dispute.to_api()
            target = DISPUTE_ACTIONS[action]
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
            self._set_dispute_status(dispute, target)
            return dispute.to_api()

    def get_dispute(self, dispute_id: str) -> JSONDict:
        """``GET /disputes/<id>``."""
        with self.lock:
            return self._dispute(dispute_id).to_api()

    def list_disputes(
        self, items: Iterable[tuple[str, str]], *, list_fault: str | None = None
    ) -> list[JSONDict]:
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
        single = {k: params.get(k) for k in ("payment_id", "dispute_id", "reason")}
        if list_fault == IGNORE_FILTERS:
            window, statuses, stages, currencies = Window(), None, None, None
            single = {}
        if list_fault is not None:
            offset, window = 0, Window(window.start, None)
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
                and all(v is None or getattr(d, k) == v for k, v in single.items())
            ]
            return [d.to_api() for d in matches[offset : offset + limit]]

    # -- mandates --------------------------------------------------------------------------

    def create_mandate(
        self,
        *,
        customer_id: str | None = None,
        card_number: str = "4242424242424242",
        card_exp_month: str = "12",
        card_exp_year: str = "2099",
        card_holder_name: str | None = None,
        acceptance: Mapping[str, Any] | None = None,
    ) -> JSONDict:
        """Create an ``active`` card mandate directly (sandbox admin; ``mandate_active``).

        ``customer_id`` must be an existing customer when given.
        """
        body = {
            "payment_method_data": {
                "card": {
                    "card_number": card_number,
                    "card_exp_month": card_exp_month,
                    "card_exp_year": card_exp_year,
                    "card_cvc": "123",
                    "card_holder_name": card_holder_name,
                }
            }
        }
        card, _, _ = _payment_method(body)
        assert card is not None
        with self.lock:
            customer = self._require_customer(customer_id)
            mandate = self._new_mandate(
                card,
                customer.customer_id if customer else None,
                customer_acceptance(acceptance) if acceptance is not None else None,
                None,
            )
            return mandate.to_api()

    def get_mandate(self, mandate_id: str) -> JSONDict:
        """``GET /mandates/<id>``."""
        with self.lock:
            return self._mandate(mandate_id).to_api()

    def revoke_mandate(self, mandate_id: str) -> JSONDict:
        """``POST /mandates/revoke/<id>``: ``active`` -> ``revoked`` (``mandate_revoked``)."""
        with self.lock:
            mandate = self._mandate(mandate_id)
            if mandate.status == "revoked":
                raise conflict("Mandate has already been revoked")
            mandate.status = "revoked"
            mandate.revoked_at = self.now()
            self._emit("mandate", mandate.mandate_id, "revoked", mandate.to_api(), self.profile_id)
            return mandate.to_revoked_api()

    def list_customer_mandates(self, customer_id: str) -> list[JSONDict]:
        """``GET /customers/<id>/mandates``: the customer's mandates, oldest first."""
        with self.lock:
            self._customer(customer_id)
            return [
                m.to_api()
                for m in sorted(self._mandates.values(), key=lambda m: m.seq)
                if m.customer_id == customer_id
            ]

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
        are then ignored). Newest first. Every emitted event is listed, including dropped
        and undelivered ones (``is_delivery_successful: false``).
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
        event_id = fields.string(body, "event_id")
        object_id = fields.string(body, "object_id")
        window = Window(after or oldest, before)
        if list_fault == IGNORE_FILTERS:
            window, classes, types, delivered, profile_id = Window(), None, None, None, None
            event_id = object_id = None
        if list_fault is not None:
            offset, window = 0, Window(window.start, None)
        allowed_types = (
            None if classes is None else set().union(*(_CLASS_EVENT_TYPES[c] for c in classes))
        )
        with self.lock:
            events = sorted(self.webhooks.events(), key=lambda e: (e.created, e.seq), reverse=True)
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
                    and (profile_id is None or e.profile_id == profile_id)
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
            if event is None:
                raise not_found("Event")
            return [event.to_retrieve(self.merchant_id, a) for a in event.delivery_attempts]

    def retry_event(self, merchant_id: str, event_id: str) -> JSONDict:
        """``POST /events/<merchant_id>/<event_id>/retry``: manual retry, sent synchronously.

        Re-sends the stored initial request (identical body bytes and the real signature) and
        answers the new ``manual_retry`` attempt's ``EventRetrieveResponse``.
        """
        self._check_merchant(merchant_id)
        try:
            result = self.webhooks.retry(event_id)
        except LookupError as exc:
            raise invalid(f"the event cannot be retried: {exc}") from None
        if result is None:
            raise not_found("Event")
        event, attempt = result
        with self.lock:
            return event.to_retrieve(self.merchant_id, attempt)

    # -- time passing ----------------------------------------------------------------------

    def tick(self) -> dict[str, list[str]]:
        """Advance everything that waits by one step; return the ids that changed.

        ``processing`` payments authorise, asynchronous captures and voids settle,
        authorisations older than 7 days expire, payments of the dispute test card get their
        dispute, ``pending``/``review`` refunds succeed, ``pending``/``initiated`` payouts
        succeed. Keys: ``payments``, ``refunds``, ``payouts``, ``disputes``, ``mandates``.
        """
        changed: dict[str, list[str]] = {
            "payments": [],
            "refunds": [],
            "payouts": [],
            "disputes": [],
            "mandates": [],
        }
        with self.lock:
            now = self.now()
            for payment in list(self._payments.values()):
                if payment.pending_behaviour == "processing" and payment.status == "processing":
                    payment.pending_behaviour = None
                    self._authorised(payment, payment.amount)
                    changed["payments"].append(payment.payment_id)
                elif payment.pending_operation is not None:
                    kind, amount = payment.pending_operation
                    payment.pending_operation = None
                    if kind == "capture":
                        for capture in payment.captures:
                            if capture.status == "pending":
                                capture.status = "charged"
                        self._settle_capture(payment, amount)
                    else:
                        self._void(payment)
                    changed["payments"].append(payment.payment_id)
                elif (
                    payment.status in EXPIRING
                    and payment.authorised_at is not None
                    and now >= payment.authorised_at + AUTHORISATION_LIFETIME
                ):
                    payment.amount_capturable = 0
                    self._set_payment_status(payment, EXPIRING[payment.status])
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
                if payout.status in {"pending", "initiated"}:
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
            customer = None
            if customer_id is not None:
                customer = self._customers.get(customer_id)
                if customer is None:
                    customer = Customer(customer_id=customer_id, created=start)
                    self._customers[customer_id] = customer
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
                    customer=customer,
                    amount_capturable=value,
                )
                target = statuses[index % len(statuses)]
                if target != "requires_payment_method":
                    payment.card = _seed_card()
                    payment.payment_method_type = "credit"
                    payment.attempt_count = 1
                    payment.connector_transaction_id = _new_id("txn_")
                _seed_status(payment, target, decline)
                self._payments[payment_id] = payment
                self._payment_keys.append((payment.created, payment.seq))
                self._payment_order.append(payment_id)
                ids.append(payment_id)
                if emit_webhooks:
                    self._emit(
                        "payment", payment_id, payment.status, payment.to_api(), self.profile_id
                    )
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

    def _dispute(self, dispute_id: str) -> Dispute:
        dispute = self._disputes.get(dispute_id)
        if dispute is None:
            raise not_found("Dispute")
        return dispute

    def _mandate(self, mandate_id: str) -> Mandate:
        mandate = self._mandates.get(mandate_id)
        if mandate is None:
            raise not_found("Mandate")
        return mandate

    def _customer(self, customer_id: str) -> Customer:
        customer = self._customers.get(customer_id)
        if customer is None:
            raise not_found("Customer")
        return customer

    def _require_customer(self, customer_id: str | None) -> Customer | None:
        if customer_id is None:
            return None
        customer = self._customers.get(customer_id)
        if customer is None:
            raise invalid(
                f"customer_id '{customer_id}' does not exist: create it with POST /customers"
            )
        return customer

    def _check_merchant(self, merchant_id: str) -> None:
        if merchant_id not in (self.merchant_id, self.profile_id):
            raise not_found("Merchant account")

    def _mandate_card(self, mandate_id: str) -> CardInfo:
        mandate = self._mandates.get(mandate_id)
        if mandate is None:
            raise not_found("Mandate")
        if mandate.status != "active":
            raise invalid(f"mandate {mandate_id} is {mandate.status}, not active")
        return mandate.card

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

    def _emit(self, kind: str, object_id: str, status: str, obj: JSONDict, profile_id: str) -> None:
        event_type = event_type_for_status(kind, status)
        if event_type is not None:
            self.webhooks.emit(kind, object_id, event_type, obj, self.now(), profile_id)

    def _set_payment_status(self, payment: Payment, status: str) -> None:
        changed = payment.status != status
        payment.status = status
        payment.modified_at = self.now()
        if changed:
            self._emit("payment", payment.payment_id, status, payment.to_api(), payment.profile_id)

    def _set_refund_status(self, refund: Refund, status: str) -> None:
        changed = refund.status != status
        refund.status = status
        refund.updated_at = self.now()
        if changed:
            self._emit("refund", refund.refund_id, status, refund.to_api(), refund.profile_id)

    def _set_payout_status(self, payout: Payout, status: str) -> None:
        changed = payout.status != status
        payout.status = status
        payout.modified_at = self.now()
        if changed:
            self._emit("payout", payout.payout_id, status, payout.to_api(), payout.profile_id)

    def _set_dispute_status(self, dispute: Dispute, status: str) -> None:
        dispute.status = status
        self._emit("dispute", dispute.dispute_id, status, dispute.to_api(), dispute.profile_id)

    def _confirm(self, payment: Payment) -> None:
        card = payment.card
        assert card is not None
        now = self.now()
        expired = (int(card.exp_year), int(card.exp_month)) < (now.year, now.month)
        self._apply_outcome(payment, EXPIRED if expired else card.outcome)

    def _apply_outcome(self, payment: Payment, outcome: CardOutcome) -> None:
        payment.attempt_count += 1
        payment.connector_transaction_id = _new_id("txn_")
        if outcome.kind == "partial_auth" and not payment.enable_partial_authorization:
            outcome = INSUFFICIENT_FUNDS
        if outcome.kind == "decline":
            network = payment.card.network if payment.card else None
            payment.unified_code = outcome.unified_code
            payment.unified_message = outcome.unified_message
            payment.error_code = outcome.error_code
            payment.error_message = outcome.error_message
            payment.error_details = {
                "unified_details": {
                    "category": None,
                    "message": outcome.unified_message,
                    "standardised_code": None,
                    "description": None,
                    "user_guidance_message": None,
                    "recommended_action": None,
                },
                "issuer_details": {
                    "code": outcome.issuer_code,
                    "message": outcome.issuer_message,
                    "network_details": {
                        "name": network,
                        "advice_code": None,
                        "advice_message": None,
                    },
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
            partial = outcome.kind == "partial_auth"
            self._authorised(payment, payment.amount // 2 if partial else payment.amount)

    def _authorised(self, payment: Payment, authorised: int) -> None:
        """The issuer approved ``authorised`` (all of the amount, or part of it)."""
        partial = authorised < payment.amount
        now = self.now()
        if payment.capture_method.startswith("manual"):
            payment.amount_capturable = authorised
            payment.authorised_at = now
            status = "partially_authorized_and_requires_capture" if partial else "requires_capture"
        else:
            payment.amount_received = authorised
            payment.amount_capturable = 0
            payment.captured_at = now
            status = "partially_captured" if partial else "succeeded"
        if payment.mandate_id is None and (
            payment.setup_future_usage == "off_session" or payment.mandate_data is not None
        ):
            assert payment.card is not None
            mandate = self._new_mandate(
                payment.card,
                payment.customer.customer_id if payment.customer else None,
                payment.customer_acceptance,
                payment.payment_id,
            )
            payment.mandate_id = mandate.mandate_id
            payment.payment_method_id = mandate.payment_method_id
        self._set_payment_status(payment, status)

    def _settle_capture(self, payment: Payment, amount: int) -> None:
        """``amount`` is captured: the status that follows, and its event."""
        payment.amount_received = (payment.amount_received or 0) + amount
        payment.captured_at = self.now()
        remaining = payment.amount_capturable - amount
        if payment.capture_method == "manual_multiple" and remaining > 0:
            payment.amount_capturable = remaining
            status = "partially_captured_and_capturable"
        else:
            payment.amount_capturable = 0
            full = payment.amount_received >= payment.amount
            status = "succeeded" if full else "partially_captured"
        self._set_payment_status(payment, status)

    def _void(self, payment: Payment) -> None:
        payment.cancelled_at = self.now()
        payment.amount_capturable = 0
        self._set_payment_status(payment, "cancelled")

    def _new_mandate(
        self,
        card: CardInfo,
        customer_id: str | None,
        acceptance: JSONDict | None,
        payment_id: str | None,
    ) -> Mandate:
        mandate = Mandate(
            mandate_id=_new_id("man_"),
            seq=self._next_seq(),
            customer_id=customer_id,
            payment_method_id=_new_id("pm_"),
            card=card,
            status="active",
            created=self.now(),
            customer_acceptance=acceptance,
            payment_id=payment_id,
        )
        self._mandates[mandate.mandate_id] = mandate
        self._emit("mandate", mandate.mandate_id, "active", mandate.to_api(), self.profile_id)
        return mandate

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
            attempt_id=payment.attempt_id,
            profile_id=payment.profile_id,
            amount=amount,
            currency=payment.currency,
            status="dispute_opened",
            created=now,
            challenge_required_by=now + timedelta(days=7),
            stage=stage,
            reason=reason or "fraudulent",
            reason_code=reason_code or "10.4",
            connector_dispute_id=_new_id("dp_conn_"),
        )
        self._disputes[dispute.dispute_id] = dispute
        self._set_dispute_status(dispute, "dispute_opened")
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
        isin=number[:6],
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
        isin="424242",
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
        payment.authorised_at = payment.created
    elif status == "cancelled":
        payment.amount_capturable = 0
        payment.cancelled_at = payment.created


def _refund_outcome(amount: int) -> str:
    return {2: "failed", 77: "pending", 88: "review"}.get(amount % 100, "succeeded")


def _payout_outcome(amount: int) -> str:
    return {2: "failed", 77: "pending", 55: "initiated"}.get(amount % 100, "success")


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


def _masked(details: Mapping[str, Any], name: str) -> str:
    value = details.get(name)
    return _mask(value) if isinstance(value, str) else "****"


def _text(details: Mapping[str, Any], name: str) -> str | None:
    value = details.get(name)
    return value if isinstance(value, str) else None


def _country(details: Mapping[str, Any]) -> str | None:
    value = details.get("bank_country_code")
    return value if isinstance(value, str) and len(value) == 2 and value.isupper() else None


def _bank_response(details: Mapping[str, Any]) -> JSONDict:
    """``BankAdditionalData``: the ACH, BACS, SEPA or PIX shape, numbers masked."""
    if "iban" in details:
        return {
            "iban": _masked(details, "iban"),
            "bank_name": _text(details, "bank_name"),
            "bank_country_code": _country(details),
            "bank_city": _text(details, "bank_city"),
            "bic": _text(details, "bic"),
        }
    if "bank_sort_code" in details:
        return {
            "bank_sort_code": _masked(details, "bank_sort_code"),
            "bank_account_number": _masked(details, "bank_account_number"),
            "bank_name": _text(details, "bank_name"),
            "bank_country_code": _country(details),
            "bank_city": _text(details, "bank_city"),
        }
    if "pix_key" in details:
        return {
            "pix_key": _masked(details, "pix_key"),
            "cpf": None,
            "cnpj": None,
            "source_bank_account_id": None,
            "destination_bank_account_id": None,
            "expiry_date": None,
        }
    for name in ("bank_account_number", "bank_routing_number"):
        if not isinstance(details.get(name), str):
            raise missing(f"payout_method_data.bank.{name}")
    return {
        "bank_account_number": _masked(details, "bank_account_number"),
        "bank_routing_number": _masked(details, "bank_routing_number"),
        "bank_name": None,
        "bank_country_code": _country(details),
        "bank_city": _text(details, "bank_city"),
    }


def _card_payout_response(details: Mapping[str, Any]) -> JSONDict:
    """``CardAdditionalData``: last four digits, BIN and network; never the number."""
    raw = details.get("card_number")
    digits = raw.replace(" ", "") if isinstance(raw, str) else ""
    if not luhn_valid(digits):
        raise invalid("Invalid value provided: payout_method_data.card.card_number")
    brand = brand_for(digits)
    return {
        "card_issuer": None,
        "card_network": None if brand == "Unknown" else brand,
        "card_type": None,
        "card_issuing_country": None,
        "bank_code": None,
        "last4": digits[-4:],
        "card_isin": digits[:6],
        "card_extended_bin": None,
        "card_exp_month": _text(details, "expiry_month") or _text(details, "card_exp_month") or "",
        "card_exp_year": _text(details, "expiry_year") or _text(details, "card_exp_year") or "",
        "card_holder_name": _text(details, "card_holder_name") or "",
    }


def _wallet_response(details: Mapping[str, Any]) -> JSONDict:
    """``WalletAdditionalData`` of ``paypal``, ``venmo`` or ``apple_pay_decrypt``."""
    if len(details) != 1 or not isinstance(next(iter(details.values())), dict):
        raise invalid("payout_method_data.wallet takes one of paypal, venmo, apple_pay_decrypt")
    name, inner = next(iter(details.items()))
    if name == "paypal":
        return {
            "email": _text(inner, "email"),
            "telephone_number": (
                _masked(inner, "telephone_number") if "telephone_number" in inner else None
            ),
            "paypal_id": _text(inner, "paypal_id"),
        }
    if name == "venmo":
        return {"telephone_number": _masked(inner, "telephone_number")}
    if name == "apple_pay_decrypt":
        return {
            "card_exp_month": _text(inner, "expiry_month") or "",
            "card_exp_year": _text(inner, "expiry_year") or "",
            "card_holder_name": _text(inner, "card_holder_name") or "",
        }
    raise invalid("payout_method_data.wallet takes one of paypal, venmo, apple_pay_decrypt")


def _mask_payout_method(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """``payout_method_data`` as ``PayoutMethodDataResponse`` shows it: masked numbers, no card
    number, the fields of the matching ``*AdditionalData`` schema only. The request's
    ``bank`` (Hyperswitch) or ``bank_transfer`` (the seed's name) answers as ``bank``."""
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
    if method in ("bank", "bank_transfer"):
        return {"bank": _bank_response(details)}
    if method == "card":
        return {"card": _card_payout_response(details)}
    if method == "wallet":
        return {"wallet": _wallet_response(details)}
    if method == "bank_redirect":
        interac = details.get("interac")
        email = _text(interac, "email") if isinstance(interac, dict) else None
        return {"bank_redirect": {"email": email}}
    token_type = _text(details, "token_type")
    if token_type is None:
        raise missing("payout_method_data.passthrough.token_type")
    return {"passthrough": {"psp_token": _masked(details, "psp_token"), "token_type": token_type}}


def _customer_id(payment: Payment) -> str | None:
    return payment.customer.customer_id if payment.customer else None


def _payout_field(payout: Payout, name: str) -> str | None:
    if name == "customer_id":
        return payout.customer.customer_id
    value = getattr(payout, name)
    return value if isinstance(value, str) else None


def _same(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a header value with a key."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class _MandateRequest:
    setup_future_usage: str | None
    data: JSONDict | None
    acceptance: JSONDict | None
    off_session: bool | None


def _mandate_request(body: Mapping[str, Any]) -> _MandateRequest:
    """The mandate-related fields of a create or confirm body."""
    usage = fields.string(body, "setup_future_usage", choices={"off_session", "on_session"})
    raw_data = fields.obj(body, "mandate_data")
    raw_acceptance = fields.obj(body, "customer_acceptance")
    if raw_acceptance is None and raw_data is not None:
        nested = raw_data.get("customer_acceptance")
        raw_acceptance = nested if isinstance(nested, dict) else None
    acceptance = customer_acceptance(raw_acceptance) if raw_acceptance is not None else None
    data = (
        None
        if raw_data is None
        else {"update_mandate_id": None, "customer_acceptance": acceptance, "mandate_type": None}
    )
    off_session = body.get("off_session")
    return _MandateRequest(
        setup_future_usage=usage,
        data=data,
        acceptance=acceptance,
        off_session=off_session if isinstance(off_session, bool) else None,
    )


__all__ = ["Sandbox", "SandboxError"]
