"""Bulk seeding: many payments created directly in the state, fast, for benchmarks and
tests: :class:`SeedingMixin`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from reconcile.sandbox.cards import SUCCESS, TEST_CARDS, CardOutcome
from reconcile.sandbox.clock import truncate_ms
from reconcile.sandbox.models import CardInfo, Customer, Payment
from reconcile.sandbox.state.base import SandboxBase, new_id


class SeedingMixin(SandboxBase):
    """Bulk seeding of payments."""

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
        profile_id: str | None = None,
    ) -> list[str]:
        """Create ``n`` payments directly in the state, fast (for benchmarks and tests).

        ``created`` is spread evenly from ``created_from`` to ``created_to`` (inclusive; all
        equal when ``created_to`` is omitted). ``status`` cycles through the given statuses
        (``succeeded``, ``failed``, ``requires_capture``, ``processing``, ``cancelled``,
        ``requires_payment_method``, ``requires_customer_action``); ``amount`` may be a
        function of the index. No webhooks unless ``emit_webhooks``. ``profile_id``: one of
        the merchant's business profiles (default: the first). Returns the new ids.
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
            profile = self._helper_profile(profile_id)
            customer = None
            if customer_id is not None:
                customer = self._customers.get(customer_id)
                if customer is None:
                    customer = Customer(customer_id=customer_id, created=start)
                    self._customers[customer_id] = customer
            for index in range(n):
                created = truncate_ms(start + span * (index / (n - 1))) if n > 1 else start
                value = amount(index) if callable(amount) else amount
                payment_id = new_id(id_prefix)
                payment = Payment(
                    payment_id=payment_id,
                    seq=self._next_seq(),
                    merchant_id=self.merchant_id,
                    profile_id=profile,
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
                    payment.connector_transaction_id = new_id("txn_")
                _seed_status(payment, target, decline)
                self._payments[payment_id] = payment
                self._payment_keys.append((payment.created, payment.seq))
                self._payment_order.append(payment_id)
                ids.append(payment_id)
                if emit_webhooks:
                    self._emit("payment", payment_id, payment.status, payment.to_api(), profile)
            order = sorted(range(len(self._payment_keys)), key=self._payment_keys.__getitem__)
            self._payment_keys = [self._payment_keys[i] for i in order]
            self._payment_order = [self._payment_order[i] for i in order]
        return ids


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
