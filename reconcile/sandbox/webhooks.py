"""Outgoing webhooks of the sandbox, byte-compatible with Hyperswitch's.

Body: compact JSON (``separators=(",", ":")``, ``ensure_ascii=False``) with the keys in
Hyperswitch's struct order ``merchant_id, event_id, event_type, content{type, object},
timestamp``; ``event_id`` is ``"evt_"`` + a time-ordered UUIDv7 in 32 hex digits and
``timestamp`` looks like ``2026-08-12T08:14:55.392Z``. Headers: ``Content-Type:
application/json``, ``User-Agent: Hyperswitch-Backend-Server`` and ``X-Webhook-Signature-512``
= :func:`receiver.signature.sign` (lowercase hex HMAC-SHA512 of the body).

At most one event is emitted per (object id, event type), ever. A background thread POSTs each
event to the configured URL; any 2xx is a success. A failed attempt is retried after the
delays of the retry schedule (Hyperswitch: 60 s, then 300 s x2, 600 s x5, 3600 s x5,
21600 s x3); every retry sends the identical bytes and signature. :meth:`WebhookDispatcher.flush`
waits until every event is delivered or given up.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import requests

from receiver.factories import encode
from receiver.signature import SIGNATURE_HEADER, sign
from reconcile.sandbox.clock import format_timestamp
from reconcile.sandbox.faults import FaultController

logger = logging.getLogger(__name__)

USER_AGENT: Final = "Hyperswitch-Backend-Server"

#: ``content.type`` per object kind.
CONTENT_TYPES: Final = {
    "payment": "payment_details",
    "refund": "refund_details",
    "payout": "payout_details",
    "dispute": "dispute_details",
}


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


@dataclass(slots=True, kw_only=True, eq=False)
class WebhookEvent:
    """One emitted event and what happened to its deliveries."""

    event_id: str
    event_type: str
    kind: str
    object_id: str
    body: bytes = field(repr=False)
    signature: str = field(repr=False)
    created: datetime
    #: ``pending``, ``delivered``, ``failed`` (retries exhausted), ``dropped`` or
    #: ``undeliverable`` (no webhook URL configured).
    state: str = "pending"
    attempts: int = 0
    responses: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "object_type": CONTENT_TYPES[self.kind],
            "object_id": self.object_id,
            "created": format_timestamp(self.created),
            "state": self.state,
            "attempts": self.attempts,
            "responses": list(self.responses),
            "body": self.body.decode("utf-8"),
        }


@dataclass(slots=True, eq=False)
class _Delivery:
    """One copy of an event on its way (a duplicated event has two)."""

    event: WebhookEvent
    signature: str
    attempt: int = 0
    done: bool = False


class WebhookDispatcher:
    """Emits events (at most one per object and event type) and delivers them in a thread.

    Shares the sandbox's lock: :meth:`emit` is called with it held, while the HTTP request is
    sent without it.
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
        self._emitted: set[tuple[str, str]] = set()
        self._events: list[WebhookEvent] = []
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
        return f"WebhookDispatcher(url={self.url!r}, events={len(self._events)})"

    # -- emitting --------------------------------------------------------------------------

    def emit(
        self, kind: str, object_id: str, event_type: str, obj: Any, when: datetime
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
                body=body,
                signature=sign(body, self._secret),
                created=when,
            )
            self._events.append(event)
            if self.url is None:
                event.state = "undeliverable"
                return event
            plan = self._faults.plan_webhook(event_id, event_type)
            if plan.drop:
                event.state = "dropped"
                return event
            signature = _corrupt(event.signature) if plan.corrupt_signature else event.signature
            copies = [_Delivery(event, signature)]
            if plan.duplicate:
                copies.append(_Delivery(event, signature))
            if plan.reorder:
                self._held.extend(copies)
                return event
            due = time.monotonic() + plan.delay_seconds
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

    def stats(self) -> dict[str, Any]:
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

    # -- the delivery thread ---------------------------------------------------------------

    def start(self) -> None:
        """Start the delivery thread (idempotent)."""
        with self._lock:
            if self._thread is not None:
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
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._held:
                now = time.monotonic()
                for delivery in self._held:
                    self._push(now, delivery)
                self._held.clear()
            while self._queue or self._in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None:
                    return False
                self._cond.wait(remaining)
            return True

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
            try:
                outcome = self._send(delivery)
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

    def _send(self, delivery: _Delivery) -> str | None:
        """POST once; ``None`` on a 2xx, else a short description of the failure."""
        session, url = self._session, self.url
        if session is None or url is None:
            return "stopped"
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            SIGNATURE_HEADER: delivery.signature,
        }
        try:
            with session.post(
                url,
                data=delivery.event.body,
                headers=headers,
                timeout=self.timeout,
                allow_redirects=False,
            ) as response:
                if 200 <= response.status_code < 300:
                    return None
                return f"HTTP {response.status_code}"
        except requests.RequestException as exc:
            return type(exc).__name__

    def _record(self, delivery: _Delivery, failure: str | None) -> None:
        event = delivery.event
        self._sent += 1
        event.attempts += 1
        event.responses.append(failure or "2xx")
        if failure is None:
            delivery.done = True
            event.state = "delivered"
            return
        self._failed_attempts += 1
        if self._stopping:
            return
        if delivery.attempt < len(self.retry_schedule):
            delay = self.retry_schedule[delivery.attempt]
            delivery.attempt += 1
            self._push(time.monotonic() + delay, delivery)
            return
        delivery.done = True
        if event.state != "delivered":
            event.state = "failed"
            logger.info(
                "webhook given up",
                extra={"action": "sandbox_webhook_given_up", "event_id": event.event_id},
            )


def _corrupt(signature: str) -> str:
    """A well-formed signature that does not match (one hex digit changed)."""
    last = signature[-1]
    return signature[:-1] + ("0" if last != "0" else "1")
