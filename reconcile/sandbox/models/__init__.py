"""The sandbox's records and how the API renders them (pure, no I/O, no locking).

Records are mutable and owned by :class:`~reconcile.sandbox.state.Sandbox`, which changes them
only under its lock. ``to_api()`` renders a record the way Hyperswitch's API answers and the
way webhook ``content.object`` carries it: only fields the OpenAPI contract declares for that
response (``PaymentsResponse``, ``RefundResponse``, ``DisputeResponse``,
``PayoutCreateResponse``, ``MandateResponse``, ``CustomerResponse``), ``null`` when a field has
no value, timestamps as ISO 8601 UTC with milliseconds and ``Z``.

``from reconcile.sandbox.models import ...`` is the path; the records live in one module per
domain: :mod:`~reconcile.sandbox.models.payments` (payments, their card and captures),
:mod:`~reconcile.sandbox.models.refunds`, :mod:`~reconcile.sandbox.models.payouts`,
:mod:`~reconcile.sandbox.models.disputes`, :mod:`~reconcile.sandbox.models.mandates`,
:mod:`~reconcile.sandbox.models.customers`, the business profiles whose URL and key a webhook
takes (:mod:`~reconcile.sandbox.models.profiles`); what their answers share (the connector's
names, the projections of echoed request objects) in :mod:`~reconcile.sandbox.models.shaping`.
"""

from reconcile.sandbox.clock import iso_or_none
from reconcile.sandbox.models.customers import Customer
from reconcile.sandbox.models.disputes import DISPUTE_CONNECTOR_STATUS, Dispute
from reconcile.sandbox.models.mandates import Mandate
from reconcile.sandbox.models.payments import Capture, CardInfo, Payment
from reconcile.sandbox.models.payouts import Payout
from reconcile.sandbox.models.profiles import BusinessProfile
from reconcile.sandbox.models.refunds import Refund
from reconcile.sandbox.models.shaping import (
    CONNECTOR,
    MERCHANT_CONNECTOR_ID,
    JSONDict,
    address,
    address_details,
    customer_acceptance,
    order_details,
)

__all__ = [
    "CONNECTOR",
    "DISPUTE_CONNECTOR_STATUS",
    "MERCHANT_CONNECTOR_ID",
    "BusinessProfile",
    "Capture",
    "CardInfo",
    "Customer",
    "Dispute",
    "JSONDict",
    "Mandate",
    "Payment",
    "Payout",
    "Refund",
    "address",
    "address_details",
    "customer_acceptance",
    "iso_or_none",
    "order_details",
]
