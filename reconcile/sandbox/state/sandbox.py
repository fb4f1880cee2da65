"""The sandbox processor: :class:`Sandbox`, the state package's areas composed into one
class. Its docstring describes the sandbox's behaviour.
"""

from __future__ import annotations

from reconcile.sandbox.state.disputes import DisputesMixin
from reconcile.sandbox.state.events_api import EventsApiMixin
from reconcile.sandbox.state.mandates import MandatesMixin
from reconcile.sandbox.state.payment_lists import PaymentListsMixin
from reconcile.sandbox.state.payments import PaymentsMixin
from reconcile.sandbox.state.payouts import PayoutsMixin
from reconcile.sandbox.state.refunds import RefundsMixin
from reconcile.sandbox.state.seeding import SeedingMixin
from reconcile.sandbox.state.time_passing import TimePassingMixin


class Sandbox(
    MandatesMixin,
    PaymentsMixin,
    PaymentListsMixin,
    RefundsMixin,
    PayoutsMixin,
    DisputesMixin,
    EventsApiMixin,
    TimePassingMixin,
    SeedingMixin,
):
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

    **Business profiles.** The merchant starts with one profile, ``profile_id``, whose
    webhook URL and key are ``webhook_url`` and ``webhook_secret`` (the merchant account's);
    :meth:`Sandbox.add_profile` adds another with its own URL and key (a second brand of the
    same merchant). An object is created under the request's ``profile_id`` (which must be
    one of the merchant's: 404 otherwise; required once there are several, as Hyperswitch
    requires it), refunds and disputes take their payment's, mandates the payment's that set
    them up; each webhook is signed with its object's profile's key and sent to its URL.
    ``POST /refunds/list``, ``POST /payouts/list``, ``GET /disputes/list`` and the events API
    filter by ``profile_id``; ``GET /payments/list`` and ``GET /payouts/list`` refuse it (an
    unknown query parameter is a 400 there, as on the real server).

    A :class:`Sandbox` holds payments, refunds, payouts, customers, disputes and mandates in
    memory behind one lock, runs their state machines, and emits a webhook whenever an object
    reaches a status that :func:`receiver.core.status.event_type_for_status` maps to an event
    (at most one per object and event type, ever: a status whose event was already sent sends
    nothing). Its public methods take the JSON bodies (or query parameters) of the HTTP API and
    return what the API answers, or raise :class:`~reconcile.sandbox.errors.SandboxError`;
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
