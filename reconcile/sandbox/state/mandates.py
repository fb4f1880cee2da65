"""Customers and their card mandates: create and read customers; create, read, revoke and
list mandates: :class:`MandatesMixin`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconcile.sandbox import fields
from reconcile.sandbox.errors import conflict, duplicate
from reconcile.sandbox.models import CardInfo, Customer, JSONDict, Mandate, customer_acceptance
from reconcile.sandbox.state.base import SandboxBase, new_id
from reconcile.sandbox.state.payment_method_data import payment_method_from


class MandatesMixin(SandboxBase):
    """The customers and mandates API."""

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
                customer_id = new_id("cus_")
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
        profile_id: str | None = None,
    ) -> JSONDict:
        """Create an ``active`` card mandate directly (sandbox admin; ``mandate_active``).

        ``customer_id`` must be an existing customer when given; ``profile_id`` (one of the
        merchant's, else the default profile) is the business profile whose URL and key its
        webhooks take.
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
        card, _, _ = payment_method_from(body)
        assert card is not None
        with self.lock:
            profile = self._helper_profile(profile_id)
            customer = self._require_customer(customer_id)
            mandate = self._new_mandate(
                card,
                customer.customer_id if customer else None,
                customer_acceptance(acceptance) if acceptance is not None else None,
                None,
                profile,
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
            self._emit(
                "mandate", mandate.mandate_id, "revoked", mandate.to_api(), mandate.profile_id
            )
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

    # -- internals -------------------------------------------------------------------------

    def _new_mandate(
        self,
        card: CardInfo,
        customer_id: str | None,
        acceptance: JSONDict | None,
        payment_id: str | None,
        profile_id: str,
    ) -> Mandate:
        mandate = Mandate(
            mandate_id=new_id("man_"),
            seq=self._next_seq(),
            customer_id=customer_id,
            payment_method_id=new_id("pm_"),
            card=card,
            status="active",
            created=self.now(),
            customer_acceptance=acceptance,
            payment_id=payment_id,
            profile_id=profile_id,
        )
        self._mandates[mandate.mandate_id] = mandate
        self._emit("mandate", mandate.mandate_id, "active", mandate.to_api(), profile_id)
        return mandate
