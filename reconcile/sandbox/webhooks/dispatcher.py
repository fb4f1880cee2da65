"""The sandbox's webhook dispatcher: emits events and delivers them, with retries and faults.

**Per business profile.** An event belongs to its object's business profile
(:class:`~reconcile.sandbox.models.BusinessProfile`): it is signed with that profile's key when
it is emitted and sent to that profile's webhook URL (read when each attempt is sent, so a URL
changed later takes effect for retries), as Hyperswitch does (``hyperswitch-facts.md``
section 1).

**At most one event per (object id, event type), ever** (Hyperswitch's idempotent event id):
an object that reaches a status whose event was already emitted emits nothing.

**Delivery.** Any 2xx is a success. A failed attempt is retried after the delays of the retry
schedule (Hyperswitch: 60 s, then 300 s x2, 600 s x5, 3600 s x5, 21600 s x3), each measured
from the previous attempt; every retry sends the identical bytes and signature. Two modes:

- *threaded* (the default, ``send=None``): :meth:`WebhookDispatcher.start` runs a thread that
  POSTs with ``requests`` and waits the delays in real (monotonic) seconds;
  :meth:`WebhookDispatcher.flush` waits until everything is delivered or given up.
- *clock-driven* (``send=`` a callable ``send(url, body: bytes, headers: dict[str, str]) ->
  int`` answering the HTTP status, raising for a transport failure): nothing happens in the
  background. :meth:`WebhookDispatcher.deliver_due` sends every attempt that is due at the
  **sandbox clock's** current time and schedules retries (and ``delay`` faults) in sandbox
  seconds, so a :class:`~reconcile.sandbox.clock.FrozenClock` or freezegun can run a
  120-day lifecycle in a test; it answers a :class:`DeliveryReport`.
  :meth:`WebhookDispatcher.next_due` tells when the next attempt is due.

The webhook faults (``drop``, ``duplicate``, ``delay``, ``reorder``, ``corrupt_signature``;
see :mod:`reconcile.sandbox.faults`) are applied when an event is emitted.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests

from receiver.core.signature import sign
from reconcile.sandbox.faults import FaultController
from reconcile.sandbox.models.profiles import BusinessProfile
from reconcile.sandbox.webhooks.envelope import encode_body, new_event_id
from reconcile.sandbox.webhooks.records import DeliveryAttempt, WebhookEvent
from reconcile.sandbox.webhooks.report import DeliveryRecord, DeliveryReport
from reconcile.sandbox.webhooks.sending import Outcome, Sender, post, send_with

logger = logging.getLogger("reconcile.sandbox.webhooks")


@dataclass(slots=True, eq=False)
class _Delivery:
    """One copy of an event on its way (a duplicated event has two)."""

    event: WebhookEvent
    signature: str
    #: False for the second copy of a duplicated event.
    primary: bool = True
    #: Automatic retries used so far.
    attempt: int = 0
    done: bool = False


class WebhookDispatcher:
    """Emits events (at most one per object and event type) and delivers them.

    Shares the sandbox's lock: :meth:`emit` is called with it held, while requests are sent
    without it. ``profiles`` is the merchant's business profiles by id (the sandbox's own
    mapping, read as it changes), ``default_profile`` the one an event naming none belongs
    to. ``clock`` is the sandbox clock (event times, attempt times and, in the clock-driven
    mode, when attempts are due); ``send`` selects the clock-driven mode.
    """

    def __init__(
        self,
        *,
        lock: threading.RLock,
        merchant_id: str,
        profiles: Mapping[str, BusinessProfile],
        default_profile: str,
        retry_schedule: Sequence[float],
        timeout: float,
        faults: FaultController,
        clock: Callable[[], datetime],
        send: Sender | None = None,
    ) -> None:
        if any(delay < 0 for delay in retry_schedule):
            raise ValueError("retry delays must not be negative")
        self._lock = lock
        self._cond = threading.Condition(lock)
        self._merchant_id = merchant_id
        self._profiles = profiles
        self._default_profile = default_profile
        if default_profile not in profiles:
            raise ValueError("the default profile must be one of the profiles")
        self.retry_schedule = tuple(float(d) for d in retry_schedule)
        self.timeout = timeout
        self._faults = faults
        self._clock = clock
        self._sender = send
        self._emitted: set[tuple[str, str]] = set()
        self._events: list[WebhookEvent] = []
        self._by_attempt: dict[str, WebhookEvent] = {}
        self._queue: list[tuple[float, int, _Delivery]] = []
        self._held: list[_Delivery] = []
        self._seq = itertools.count()
        self._in_flight = 0
        self._sent = 0
        self._failed_attempts = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._session: requests.Session | None = None

    def __repr__(self) -> str:
        return f"WebhookDispatcher(url={self.url!r}, events={len(self._events)}, mode={self.mode})"

    @property
    def url(self) -> str | None:
        """The default profile's webhook URL (``None``: recorded, never sent)."""
        return self._profiles[self._default_profile].webhook_url

    @url.setter
    def url(self, url: str | None) -> None:
        with self._lock:
            self._profiles[self._default_profile].webhook_url = url

    def _profile(self, profile_id: str) -> BusinessProfile:
        found = self._profiles.get(profile_id or self._default_profile)
        if found is None:
            raise LookupError("no such business profile")
        return found

    def _url_of(self, event: WebhookEvent) -> str | None:
        """Where the event goes now: its profile's webhook URL."""
        return self._profile(event.profile_id).webhook_url

    @property
    def mode(self) -> str:
        """``"threaded"`` or ``"clock"`` (deliveries driven by :meth:`deliver_due`)."""
        return "threaded" if self._sender is None else "clock"

    # -- emitting --------------------------------------------------------------------------

    def emit(
        self,
        kind: str,
        object_id: str,
        event_type: str,
        obj: Any,
        when: datetime,
        profile_id: str = "",
    ) -> WebhookEvent | None:
        """Emit ``event_type`` for the object unless it was emitted before; queue delivery.

        ``profile_id``: the object's business profile (``""``: the default one), whose key
        signs the event and whose URL it is sent to."""
        with self._lock:
            profile = self._profile(profile_id)
            key = (object_id, event_type)
            if key in self._emitted:
                return None
            self._emitted.add(key)
            event_id = new_event_id()
            body = encode_body(
                merchant_id=self._merchant_id,
                event_id=event_id,
                event_type=event_type,
                kind=kind,
                obj=obj,
                when=when,
            )
            event = WebhookEvent(
                event_id=event_id,
                event_type=event_type,
                kind=kind,
                object_id=object_id,
                profile_id=profile.profile_id,
                seq=next(self._seq),
                body=body,
                signature=sign(body, profile.webhook_secret),
                created=when,
            )
            initial = DeliveryAttempt(
                attempt_id=event_id, delivery_attempt="initial_attempt", created=when
            )
            event.delivery_attempts.append(initial)
            self._events.append(event)
            self._by_attempt[event_id] = event
            if profile.webhook_url is None:
                event.state = "undeliverable"
                initial.error_message = "no webhook URL is configured"
                return event
            plan = self._faults.plan_webhook(event_id, event_type)
            if plan.drop:
                event.state = "dropped"
                initial.error_message = "not delivered: dropped by the sandbox's drop fault"
                return event
            signature = _corrupt(event.signature) if plan.corrupt_signature else event.signature
            copies = [_Delivery(event, signature)]
            if plan.duplicate:
                copies.append(_Delivery(event, signature, primary=False))
            if plan.reorder:
                self._held.extend(copies)
                return event
            due = self._now_key() + plan.delay_seconds
            for delivery in copies:
                self._push(due, delivery)
            # Held (reordered) events go right after this one.
            for delivery in self._held:
                self._push(due, delivery)
            self._held.clear()
            return event

    def events(self) -> list[WebhookEvent]:
        """Every emitted event, oldest first."""
        with self._lock:
            return list(self._events)

    def unrecord_request(self, event_id: str) -> None:
        """Make the event look as if the process delivering it was killed after its row was
        written and before its request was recorded: listed (undelivered), its attempts with
        ``request: null``, until :meth:`record_request`. Raises :class:`LookupError` for an
        unknown event."""
        self._request_recorded(event_id, False)

    def record_request(self, event_id: str) -> None:
        """Record the event's request (after :meth:`unrecord_request`)."""
        self._request_recorded(event_id, True)

    def _request_recorded(self, event_id: str, recorded: bool) -> None:
        with self._lock:
            event = self._by_attempt.get(event_id)
            if event is None or event.event_id != event_id:
                raise LookupError("no such event")
            event.request_recorded = recorded

    def find(self, attempt_id: str) -> WebhookEvent | None:
        """The event one of whose attempts has id ``attempt_id`` (the event id included)."""
        with self._lock:
            return self._by_attempt.get(attempt_id)

    def stats(self) -> dict[str, Any]:
        """Counters: emitted, requests sent, failed attempts, queued, states, given up."""
        with self._lock:
            states: dict[str, int] = {}
            for event in self._events:
                states[event.state] = states.get(event.state, 0) + 1
            return {
                "emitted": len(self._events),
                "requests_sent": self._sent,
                "failed_attempts": self._failed_attempts,
                "queued": len(self._queue) + len(self._held) + self._in_flight,
                "states": states,
                "given_up": [e.event_id for e in self._events if e.state == "failed"],
            }

    # -- the threaded mode -----------------------------------------------------------------

    def start(self) -> None:
        """Start the delivery thread (idempotent; nothing to start in the clock-driven mode)."""
        with self._lock:
            if self._thread is not None or self._sender is not None:
                return
            self._stopping = False
            self._session = requests.Session()
            self._thread = threading.Thread(target=self._run, name="sandbox-webhooks", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the delivery thread; undelivered events stay ``pending``."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopping = True
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout=self.timeout + 5)
        if self._session is not None:
            self._session.close()
            self._session = None

    def flush(self, timeout: float) -> bool:
        """Wait until every event is delivered or given up; False if ``timeout`` ran out.

        Events held back by the ``reorder`` fault are released first (no later event came).
        In the clock-driven mode nothing is sent: True when nothing is queued (call
        :meth:`deliver_due` to deliver).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._sender is not None:
                return not self._queue and not self._held
            self._release_held()
            while self._queue or self._in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None:
                    return False
                self._cond.wait(remaining)
            return True

    # -- the clock-driven mode -------------------------------------------------------------

    def deliver_due(self, *, release_held: bool = False) -> DeliveryReport:
        """Send every attempt due at the sandbox clock's current time (clock-driven mode).

        Failed attempts are rescheduled ``retry_schedule[n]`` sandbox seconds later; one with
        a zero delay is sent in the same call. ``release_held`` also sends events the
        ``reorder`` fault holds back. Returns what was sent, in order.
        """
        sender = self._sender
        if sender is None:
            raise RuntimeError("deliver_due() needs the clock-driven mode: Sandbox(send=...)")
        records: list[DeliveryRecord] = []
        while True:
            with self._lock:
                if release_held:
                    self._release_held()
                if not self._queue or self._queue[0][0] > self._now_key():
                    break
                delivery = heapq.heappop(self._queue)[2]
                url = self._url_of(delivery.event)
                self._in_flight += 1
            outcome = send_with(sender, url, delivery.event.body, delivery.signature)
            with self._lock:
                self._in_flight -= 1
                records.append(self._record(delivery, outcome))
        return DeliveryReport(tuple(records))

    def next_due(self) -> datetime | None:
        """The sandbox time the next queued attempt is due (clock-driven mode), or ``None``."""
        with self._lock:
            if self._sender is None or not self._queue:
                return None
            return datetime.fromtimestamp(self._queue[0][0], self._clock().tzinfo)

    def pending(self) -> int:
        """How many deliveries are queued or held."""
        with self._lock:
            return len(self._queue) + len(self._held) + self._in_flight

    # -- manual retry (the events API) -----------------------------------------------------

    def retry(self, attempt_id: str) -> tuple[WebhookEvent, DeliveryAttempt] | None:
        """Re-send the stored initial request of an event now, as a ``manual_retry``.

        ``attempt_id`` is the event id or the id of any of its attempts. Sends synchronously
        (the threaded mode with ``requests``, the clock-driven mode with its sender) the
        original bytes with the real signature. ``None`` when no event has that id; raises
        ``LookupError`` when no webhook URL is configured.
        """
        with self._lock:
            event = self._by_attempt.get(attempt_id)
            if event is None:
                return None
            url = self._url_of(event)
            if url is None:
                raise LookupError("no webhook URL is configured")
            attempt = DeliveryAttempt(
                attempt_id=new_event_id(),
                delivery_attempt="manual_retry",
                created=self._clock(),
            )
            event.delivery_attempts.append(attempt)
            self._by_attempt[attempt.attempt_id] = event
        if self._sender is not None:
            outcome = send_with(self._sender, url, event.body, event.signature)
        else:
            with requests.Session() as session:
                outcome = post(session, url, event.body, event.signature, self.timeout)
        with self._lock:
            self._fill(attempt, outcome)
            if attempt.successful:
                event.state = "delivered"
        return event, attempt

    # -- internals -------------------------------------------------------------------------

    def _now_key(self) -> float:
        if self._sender is None:
            return time.monotonic()
        return self._clock().timestamp()

    def _release_held(self) -> None:
        if self._held:
            now = self._now_key()
            for delivery in self._held:
                self._push(now, delivery)
            self._held.clear()

    def _push(self, due: float, delivery: _Delivery) -> None:
        heapq.heappush(self._queue, (due, next(self._seq), delivery))
        self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                delivery = self._next_due()
                if delivery is None:
                    return
                self._in_flight += 1
                session, url = self._session, self._url_of(delivery.event)
            outcome = Outcome(error="stopped")
            try:
                if session is not None and url is not None:
                    outcome = post(
                        session, url, delivery.event.body, delivery.signature, self.timeout
                    )
            finally:
                with self._lock:
                    self._in_flight -= 1
                    self._record(delivery, outcome)
                    self._cond.notify_all()

    def _next_due(self) -> _Delivery | None:
        while not self._stopping:
            if self._queue:
                wait = self._queue[0][0] - time.monotonic()
                if wait <= 0:
                    return heapq.heappop(self._queue)[2]
                self._cond.wait(wait)
            else:
                self._cond.wait()
        return None

    def _attempt_for(self, delivery: _Delivery) -> DeliveryAttempt:
        event = delivery.event
        initial = event.delivery_attempts[0]
        if delivery.primary and delivery.attempt == 0 and not initial.sent:
            return initial
        attempt = DeliveryAttempt(
            attempt_id=new_event_id(), delivery_attempt="automatic_retry", created=self._clock()
        )
        event.delivery_attempts.append(attempt)
        self._by_attempt[attempt.attempt_id] = event
        return attempt

    def _fill(self, attempt: DeliveryAttempt, outcome: Outcome) -> None:
        attempt.sent = True
        attempt.status_code = outcome.status_code
        attempt.response_body = outcome.body
        attempt.response_headers = outcome.headers
        attempt.error_message = outcome.error
        if attempt.delivery_attempt != "initial_attempt":
            attempt.created = self._clock()

    def _record(self, delivery: _Delivery, outcome: Outcome) -> DeliveryRecord:
        event = delivery.event
        attempt = self._attempt_for(delivery)
        self._fill(attempt, outcome)
        self._sent += 1
        final = True
        if attempt.successful:
            delivery.done = True
            event.state = "delivered"
        else:
            self._failed_attempts += 1
            if not self._stopping and delivery.attempt < len(self.retry_schedule):
                delay = self.retry_schedule[delivery.attempt]
                delivery.attempt += 1
                self._push(self._now_key() + delay, delivery)
                final = False
            else:
                delivery.done = True
                if not self._stopping and event.state != "delivered":
                    event.state = "failed"
                    logger.info(
                        "webhook given up",
                        extra={"action": "sandbox_webhook_given_up", "event_id": event.event_id},
                    )
        return DeliveryRecord(
            event_id=event.event_id,
            attempt_id=attempt.attempt_id,
            event_type=event.event_type,
            object_id=event.object_id,
            delivery_attempt=attempt.delivery_attempt,
            at=self._clock(),
            status_code=attempt.status_code,
            error=attempt.error_message,
            final=final,
        )


def _corrupt(signature: str) -> str:
    """A well-formed signature that does not match (one hex digit changed)."""
    last = signature[-1]
    return signature[:-1] + ("0" if last != "0" else "1")
