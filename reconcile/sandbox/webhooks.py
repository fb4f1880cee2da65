"""Outgoing webhooks of the sandbox, byte-compatible with Hyperswitch's, and their records.

**Body.** Compact JSON (``separators=(",", ":")``, ``ensure_ascii=False``) with the keys in
Hyperswitch's struct order ``merchant_id, event_id, event_type, content{type, object},
timestamp``; ``event_id`` is ``"evt_"`` + a time-ordered UUIDv7 in 32 hex digits and
``timestamp`` (the sandbox clock when the event was emitted) looks like
``2026-08-12T08:14:55.392Z``. Content types: ``payment_details``, ``refund_details``,
``dispute_details``, ``payout_details``, ``mandate_details``.

**Headers.** ``Content-Type: application/json``, ``User-Agent: Hyperswitch-Backend-Server``
and ``X-Webhook-Signature-512`` = :func:`receiver.core.signature.sign` (lowercase hex HMAC-SHA512
of the body with the profile's key).

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

**Records (the events API).** Every emitted event is kept with its stored request (the body
and the headers *with the real signature*) and one :class:`DeliveryAttempt` per row of
Hyperswitch's events table: the ``initial_attempt`` (its id is the body's ``event_id``;
created when the event is emitted, its response filled when it is sent), then each
``automatic_retry`` and ``manual_retry`` with a new ``evt_`` id. A dropped event (the ``drop``
fault) or one emitted without a webhook URL has an initial attempt that never got a response:
it is listed as undelivered. The ``corrupt_signature`` fault corrupts only what goes on the
wire; the stored request keeps the signature Hyperswitch computed, so a manual retry
(:meth:`WebhookDispatcher.retry`) re-sends the original bytes with a valid signature. A
``duplicate`` fault's second copy is recorded as ``automatic_retry`` rows.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import requests

from receiver.core.signature import SIGNATURE_HEADER, sign
from receiver.core.wire import encode
from reconcile.sandbox.clock import format_timestamp
from reconcile.sandbox.faults import FaultController

logger = logging.getLogger(__name__)

USER_AGENT: Final = "Hyperswitch-Backend-Server"
#: How much of a receiver's answer is kept per attempt.
MAX_RESPONSE_BODY: Final = 4096

#: ``content.type`` per object kind.
CONTENT_TYPES: Final = {
    "payment": "payment_details",
    "refund": "refund_details",
    "payout": "payout_details",
    "dispute": "dispute_details",
    "mandate": "mandate_details",
}
#: Hyperswitch ``EventClass`` per object kind.
EVENT_CLASSES: Final = {
    "payment": "payments",
    "refund": "refunds",
    "payout": "payouts",
    "dispute": "disputes",
    "mandate": "mandates",
}

#: ``send(url, body, headers) -> HTTP status`` (raise for a transport failure).
Sender = Callable[[str, bytes, dict[str, str]], int]


def expand_schedule(steps: Iterable[tuple[float, int]]) -> tuple[float, ...]:
    """``[(60, 1), (300, 2)]`` -> ``(60, 300, 300)``: delays before each retry, in seconds."""
    return tuple(float(delay) for delay, count in steps for _ in range(count))


#: Hyperswitch's default outgoing-webhook retry delays (16 retries over about 24 hours).
HYPERSWITCH_RETRY_SCHEDULE: Final = expand_schedule(
    [(60, 1), (300, 2), (600, 5), (3600, 5), (21600, 3)]
)


def parse_retry_schedule(spec: str) -> tuple[float, ...]:
    """Parse ``"hyperswitch"``, ``"none"`` or delays such as ``"0.2,0.2,1"`` / ``"0.2x3,1"``."""
    text = spec.strip().lower()
    if text == "hyperswitch":
        return HYPERSWITCH_RETRY_SCHEDULE
    if text in {"", "none"}:
        return ()
    steps: list[tuple[float, int]] = []
    for part in text.split(","):
        delay, _, count = part.strip().partition("x")
        try:
            step = (float(delay), int(count) if count else 1)
        except ValueError as exc:
            raise ValueError(f"invalid retry schedule step {part.strip()!r}") from exc
        if step[0] < 0 or step[1] < 1:
            raise ValueError(f"invalid retry schedule step {part.strip()!r}")
        steps.append(step)
    return expand_schedule(steps)


_id_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_event_id() -> str:
    """``"evt_"`` + a UUIDv7 (32 lowercase hex digits), strictly increasing within a process."""
    global _last_ms, _counter
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, int.from_bytes(os.urandom(2), "big") & 0x3FF
        else:
            _counter += 1
            if _counter > 0xFFF:
                _last_ms, _counter = _last_ms + 1, 0
        value = (_last_ms & 0xFFFF_FFFF_FFFF) << 80
        value |= 0x7 << 76 | _counter << 64
        value |= 0b10 << 62 | int.from_bytes(os.urandom(8), "big") >> 2
    return f"evt_{value:032x}"


def encode_body(
    *, merchant_id: str, event_id: str, event_type: str, kind: str, obj: Any, when: datetime
) -> bytes:
    """The exact bytes Hyperswitch would send for this event."""
    return encode(
        {
            "merchant_id": merchant_id,
            "event_id": event_id,
            "event_type": event_type,
            "content": {"type": CONTENT_TYPES[kind], "object": obj},
            "timestamp": format_timestamp(when),
        }
    )


def request_headers(signature: str) -> dict[str, str]:
    """The headers of a webhook request carrying ``signature``."""
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature,
    }


@dataclass(slots=True, kw_only=True, eq=False)
class DeliveryAttempt:
    """One row of the events table: one attempt to deliver an event."""

    #: This attempt's id; the initial attempt's is the event's (and the body's) ``event_id``.
    attempt_id: str
    #: ``initial_attempt``, ``automatic_retry`` or ``manual_retry``.
    delivery_attempt: str
    created: datetime
    #: True once a request was really sent (or a transport failure was seen).
    sent: bool = False
    status_code: int | None = None
    response_body: str | None = field(default=None, repr=False)
    response_headers: list[tuple[str, str]] | None = field(default=None, repr=False)
    error_message: str | None = None

    @property
    def successful(self) -> bool:
        """A 2xx answer."""
        return self.status_code is not None and 200 <= self.status_code < 300

    def outcome(self) -> str:
        """``"2xx"``, ``"HTTP <status>"``, the transport error, or ``"not sent"``."""
        if self.successful:
            return "2xx"
        if self.status_code is not None:
            return f"HTTP {self.status_code}"
        return self.error_message or "not sent"


@dataclass(slots=True, kw_only=True, eq=False)
class WebhookEvent:
    """One emitted event, its stored request and its delivery attempts."""

    event_id: str
    event_type: str
    kind: str
    object_id: str
    profile_id: str
    seq: int
    body: bytes = field(repr=False)
    signature: str = field(repr=False)
    created: datetime
    #: ``pending``, ``delivered``, ``failed`` (retries exhausted), ``dropped`` or
    #: ``undeliverable`` (no webhook URL configured).
    state: str = "pending"
    delivery_attempts: list[DeliveryAttempt] = field(default_factory=list)

    @property
    def event_class(self) -> str:
        """Hyperswitch's ``EventClass`` of the event."""
        return EVENT_CLASSES[self.kind]

    @property
    def is_delivery_successful(self) -> bool:
        """True once any attempt got a 2xx (Hyperswitch's overall delivery status)."""
        return any(attempt.successful for attempt in self.delivery_attempts)

    @property
    def attempts(self) -> int:
        """How many requests were sent (or failed at the transport) so far."""
        return sum(1 for attempt in self.delivery_attempts if attempt.sent)

    def stored_headers(self) -> dict[str, str]:
        """The stored request's headers: the real signature, whatever went on the wire."""
        return request_headers(self.signature)

    def to_json(self) -> dict[str, Any]:
        """The sandbox's own view (``GET /__sandbox/events``)."""
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "object_type": CONTENT_TYPES[self.kind],
            "object_id": self.object_id,
            "created": format_timestamp(self.created),
            "state": self.state,
            "attempts": self.attempts,
            "responses": [a.outcome() for a in self.delivery_attempts if a.sent],
            "body": self.body.decode("utf-8"),
        }

    def to_list_item(self, merchant_id: str) -> dict[str, Any]:
        """``EventListItemResponse`` of the initial attempt (overall delivery status)."""
        return self._item(merchant_id, self.event_id, self.created, self.is_delivery_successful)

    def to_retrieve(self, merchant_id: str, attempt: DeliveryAttempt) -> dict[str, Any]:
        """``EventRetrieveResponse`` of one attempt.

        The initial attempt carries the overall delivery status, a retry its own outcome.
        """
        initial = attempt.delivery_attempt == "initial_attempt"
        success = self.is_delivery_successful if initial else attempt.successful
        item = self._item(merchant_id, attempt.attempt_id, attempt.created, success)
        item["request"] = {
            "body": self.body.decode("utf-8"),
            "headers": [[name, value] for name, value in self.stored_headers().items()],
        }
        item["response"] = {
            "body": attempt.response_body,
            "headers": (
                None
                if attempt.response_headers is None
                else [[name, value] for name, value in attempt.response_headers]
            ),
            "status_code": attempt.status_code,
            "error_message": attempt.error_message,
        }
        item["delivery_attempt"] = attempt.delivery_attempt
        return item

    def _item(
        self, merchant_id: str, event_id: str, created: datetime, success: bool
    ) -> dict[str, Any]:
        return {
            "event_id": event_id,
            "merchant_id": merchant_id,
            "profile_id": self.profile_id,
            "object_id": self.object_id,
            "event_type": self.event_type,
            "event_class": self.event_class,
            "is_delivery_successful": success,
            "initial_attempt_id": self.event_id,
            "created": format_timestamp(created),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryRecord:
    """What one attempt sent by :meth:`WebhookDispatcher.deliver_due` did."""

    event_id: str
    attempt_id: str
    event_type: str
    object_id: str
    delivery_attempt: str
    at: datetime
    status_code: int | None
    error: str | None
    #: True when this attempt was the last one (delivered, or retries exhausted).
    final: bool

    @property
    def successful(self) -> bool:
        """A 2xx answer."""
        return self.status_code is not None and 200 <= self.status_code < 300


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """The attempts one :meth:`WebhookDispatcher.deliver_due` call sent, in order."""

    attempts: tuple[DeliveryRecord, ...] = ()

    def __len__(self) -> int:
        return len(self.attempts)

    def __iter__(self) -> Iterator[DeliveryRecord]:
        return iter(self.attempts)

    @property
    def delivered(self) -> list[str]:
        """Event ids delivered (a 2xx) by this call."""
        return [r.event_id for r in self.attempts if r.successful]

    @property
    def failed(self) -> list[DeliveryRecord]:
        """Attempts that failed (a retry may follow)."""
        return [r for r in self.attempts if not r.successful]

    @property
    def given_up(self) -> list[str]:
        """Event ids whose last automatic retry failed in this call."""
        return [r.event_id for r in self.attempts if r.final and not r.successful]


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


@dataclass(slots=True)
class _Outcome:
    status_code: int | None = None
    body: str | None = None
    headers: list[tuple[str, str]] | None = None
    error: str | None = None


class WebhookDispatcher:
    """Emits events (at most one per object and event type) and delivers them.

    Shares the sandbox's lock: :meth:`emit` is called with it held, while requests are sent
    without it. ``clock`` is the sandbox clock (event times, attempt times and, in the
    clock-driven mode, when attempts are due); ``send`` selects the clock-driven mode.
    """

    def __init__(
        self,
        *,
        lock: threading.RLock,
        merchant_id: str,
        secret: str,
        url: str | None,
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
        self._secret = secret
        self.url = url
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
        """Emit ``event_type`` for the object unless it was emitted before; queue delivery."""
        with self._lock:
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
                profile_id=profile_id,
                seq=next(self._seq),
                body=body,
                signature=sign(body, self._secret),
                created=when,
            )
            initial = DeliveryAttempt(
                attempt_id=event_id, delivery_attempt="initial_attempt", created=when
            )
            event.delivery_attempts.append(initial)
            self._events.append(event)
            self._by_attempt[event_id] = event
            if self.url is None:
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
                url = self.url
                self._in_flight += 1
            outcome = _send_with(sender, url, delivery.event.body, delivery.signature)
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
            url = self.url
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
            outcome = _send_with(self._sender, url, event.body, event.signature)
        else:
            with requests.Session() as session:
                outcome = _post(session, url, event.body, event.signature, self.timeout)
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
                session, url = self._session, self.url
            outcome = _Outcome(error="stopped")
            try:
                if session is not None and url is not None:
                    outcome = _post(
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

    def _fill(self, attempt: DeliveryAttempt, outcome: _Outcome) -> None:
        attempt.sent = True
        attempt.status_code = outcome.status_code
        attempt.response_body = outcome.body
        attempt.response_headers = outcome.headers
        attempt.error_message = outcome.error
        if attempt.delivery_attempt != "initial_attempt":
            attempt.created = self._clock()

    def _record(self, delivery: _Delivery, outcome: _Outcome) -> DeliveryRecord:
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


def _post(
    session: requests.Session, url: str, body: bytes, signature: str, timeout: float
) -> _Outcome:
    """POST once with ``requests``; the answer or the transport failure."""
    try:
        with session.post(
            url,
            data=body,
            headers=request_headers(signature),
            timeout=timeout,
            allow_redirects=False,
        ) as response:
            return _Outcome(
                status_code=response.status_code,
                body=response.text[:MAX_RESPONSE_BODY],
                headers=list(response.headers.items()),
            )
    except requests.RequestException as exc:
        return _Outcome(error=type(exc).__name__)


def _send_with(sender: Sender, url: str | None, body: bytes, signature: str) -> _Outcome:
    """Send once with a clock-driven mode's sender; the status or the failure."""
    if url is None:
        return _Outcome(error="no webhook URL is configured")
    try:
        status = sender(url, body, request_headers(signature))
    except Exception as exc:  # noqa: BLE001 - any failure of the transport is a failed attempt
        return _Outcome(error=type(exc).__name__)
    return _Outcome(status_code=int(status))


def _corrupt(signature: str) -> str:
    """A well-formed signature that does not match (one hex digit changed)."""
    last = signature[-1]
    return signature[:-1] + ("0" if last != "0" else "1")
