"""What every area of the sandbox shares: :class:`SandboxBase`.

The constructor, the one lock, configuration and lifecycle (keys, business profiles, clock,
webhook delivery), stats, the in-memory stores and the ``created`` index of payments,
finding an object or refusing, and setting a status with its webhook; the id generator and
the few names several areas use. Each area of the API is a mixin over this base (see
:class:`~reconcile.sandbox.state.sandbox.Sandbox`).
"""

from __future__ import annotations

import bisect
import hmac
import os
import secrets
import string
import sys
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Final

from receiver.core.errors import ConfigurationError
from receiver.core.status import event_type_for_status
from reconcile.sandbox.clock import Clock, truncate_ms, utcnow
from reconcile.sandbox.errors import invalid, missing, not_found
from reconcile.sandbox.faults import FaultController, RateLimiter
from reconcile.sandbox.listing import Window
from reconcile.sandbox.models import (
    BusinessProfile,
    CardInfo,
    Customer,
    Dispute,
    JSONDict,
    Mandate,
    Payment,
    Payout,
    Refund,
)
from reconcile.sandbox.webhooks import (
    HYPERSWITCH_RETRY_SCHEDULE,
    DeliveryReport,
    Sender,
    WebhookDispatcher,
)

REFUNDABLE: Final = frozenset(
    {"succeeded", "partially_captured", "partially_captured_and_capturable"}
)
FAILURE_UNIFIED: Final = ("UE_9000", "Something went wrong")
_ALPHANUMERIC: Final = string.ascii_letters + string.digits
IGNORE_FILTERS: Final = "ignore_filters"
REPEAT_PAGES: Final = "repeat_pages"


def new_id(prefix: str, length: int = 20) -> str:
    """``prefix`` + ``length`` random lowercase hex digits."""
    return prefix + os.urandom((length + 1) // 2).hex()[:length]


class SandboxBase:
    """The state and the machinery every area of :class:`~reconcile.sandbox.state.Sandbox`
    shares (its docstring describes the constructor's arguments)."""

    lock: threading.RLock
    merchant_id: str
    profile_id: str
    auto_dispute: bool
    return_url: str
    business_country: str
    public_url: str
    faults: FaultController
    rate_limiter: RateLimiter
    webhooks: WebhookDispatcher
    _api_key: str
    _admin_api_key: str | None
    _clock: Clock
    _profiles: dict[str, BusinessProfile]
    _stopping: threading.Event
    _seq: int
    _payments: dict[str, Payment]
    _payment_keys: list[tuple[datetime, int]]
    _payment_order: list[str]
    _refunds: dict[str, Refund]
    _refunds_by_payment: dict[str, list[Refund]]
    _payouts: dict[str, Payout]
    _customers: dict[str, Customer]
    _disputes: dict[str, Dispute]
    _mandates: dict[str, Mandate]

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
        # The merchant account's key, which its default profile inherits (and so does a
        # profile created later without one of its own).
        self._profiles = {
            profile_id: BusinessProfile(profile_id, webhook_url, webhook_secret or _new_key())
        }
        self.faults = FaultController(self.lock, seed)
        self.rate_limiter = RateLimiter(rate_limit_per_minute)
        self.webhooks = WebhookDispatcher(
            lock=self.lock,
            merchant_id=merchant_id,
            profiles=self._profiles,
            default_profile=profile_id,
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
        """The default profile's signing key, the merchant account's (never logged, not in
        reprs); another profile's is :meth:`profile`'s ``webhook_secret``."""
        return self._profiles[self.profile_id].webhook_secret

    def add_profile(
        self,
        profile_id: str | None = None,
        *,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
    ) -> BusinessProfile:
        """Create another business profile of this merchant: its own webhook URL and signing
        key (``payment_response_hash_key``), e.g. a second brand::

            us = sandbox.add_profile("pro_brand_us", webhook_url=url, webhook_secret=key)
            sandbox.create_payment({..., "profile_id": us.profile_id})

        Objects created with its ``profile_id`` (payments, payouts; their refunds, disputes
        and mandates follow their payment) are its: their webhooks are signed with its key
        and sent to its URL. Once the merchant has several profiles, a payment or payout
        create must name its ``profile_id`` (Hyperswitch's rule; 400 otherwise); the sandbox's
        own helpers (:meth:`seed_payments`, :meth:`create_mandate`) still default to the
        first profile. ``profile_id`` of ``None`` generates one (``pro_`` and 20
        letters and digits); ``webhook_secret`` of ``None`` inherits the merchant account's
        key (:attr:`webhook_secret`), as Hyperswitch's profile create does, so pass one for a
        key of its own. A profile id already used raises
        :class:`~receiver.core.errors.ConfigurationError`.
        """
        if webhook_secret is not None and not webhook_secret:
            raise ConfigurationError("the webhook secret must not be empty")
        if profile_id is not None and not (isinstance(profile_id, str) and profile_id.strip()):
            raise ConfigurationError("a profile id must be a non-empty text")
        with self.lock:
            chosen = profile_id or "pro_" + "".join(
                secrets.choice(_ALPHANUMERIC) for _ in range(20)
            )
            if chosen in self._profiles or chosen == self.merchant_id:
                raise ConfigurationError(f"profile id {chosen!r} is already used")
            profile = BusinessProfile(chosen, webhook_url, webhook_secret or self.webhook_secret)
            self._profiles[chosen] = profile
            return profile

    def profile(self, profile_id: str) -> BusinessProfile:
        """The business profile ``profile_id`` (:class:`KeyError` if the merchant has none)."""
        with self.lock:
            return self._profiles[profile_id]

    @property
    def profile_ids(self) -> tuple[str, ...]:
        """The merchant's business profiles, the default one first."""
        with self.lock:
            return tuple(self._profiles)

    def has_profile(self, profile_id: str) -> bool:
        """Whether ``profile_id`` is one of the merchant's business profiles."""
        with self.lock:
            return profile_id in self._profiles

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

    def shares_api_key_with(self, other: SandboxBase) -> bool:
        """Whether ``other`` has the same merchant API key (keys must tell merchants apart)."""
        return other.check_api_key(self._api_key)

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
        if merchant_id != self.merchant_id and merchant_id not in self._profiles:
            raise not_found("Merchant account")

    def _profile_of_request(self, profile_id: str | None) -> str:
        """The profile an object is created under: the request's, which must be one of the
        merchant's (404 otherwise, as Hyperswitch answers), else the default profile, as
        long as the merchant has only that one (with several, Hyperswitch requires
        ``profile_id``: its merchant account then has no default profile)."""
        if profile_id is None:
            if len(self._profiles) > 1:
                raise missing("profile_id")
            return self.profile_id
        if profile_id not in self._profiles:
            raise not_found("Business profile")
        return profile_id

    def _helper_profile(self, profile_id: str | None) -> str:
        """The profile a sandbox helper (seeding, a mandate made directly) creates under: the
        one named (checked), else the first."""
        return self.profile_id if profile_id is None else self._profile_of_request(profile_id)

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

    # -- defined by one area, called by another --------------------------------------------

    if TYPE_CHECKING:
        # PaymentsMixin (reconcile.sandbox.state.payments); time passing calls them.
        def _authorised(self, payment: Payment, authorised: int) -> None: ...

        def _settle_capture(self, payment: Payment, amount: int) -> None: ...

        def _void(self, payment: Payment) -> None: ...

        # MandatesMixin (reconcile.sandbox.state.mandates); an authorised payment calls it.
        def _new_mandate(
            self,
            card: CardInfo,
            customer_id: str | None,
            acceptance: JSONDict | None,
            payment_id: str | None,
            profile_id: str,
        ) -> Mandate: ...

        # DisputesMixin (reconcile.sandbox.state.disputes); time passing calls it.
        def _open_dispute(
            self,
            payment: Payment,
            amount: int,
            reason: str | None,
            reason_code: str | None,
            stage: str,
        ) -> Dispute: ...


def _new_key() -> str:
    """A signing key as Hyperswitch generates one: 64 letters and digits."""
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(64))


def _same(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a header value with a key."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))
