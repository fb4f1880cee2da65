"""The processor's side of the world model: its merchants (one sandbox each, with their
business profiles), served over loopback for the reconcile commands; the network their
webhooks cross, whose fate the model decides attempt by attempt; the merchant's earlier
system, which handled every webhook before an account went live on hookledger; and the
processor's truth, read from the sandboxes themselves.

The network (each sandbox's clock-driven sender) sends an attempt either to the earlier
system (a profile whose webhook URL is still the old one: it handles it and answers 200) or
to hookledger's receive path, where the model's next *fate* decides what happens:

- ``deliver``: hookledger answers, the processor reads the answer;
- ``lose``: the request never arrives (a transport failure): the processor retries later;
- ``hold``: the request is in flight for a long time: the processor times out and retries,
  and the held copy arrives when the model releases it (reordered, late, duplicated);
- ``ack_lost``: hookledger stores it, but its answer is lost: the processor retries (the
  retries of a deploy, say);
- ``drop``: this event is lost for good: every attempt at it, retries included, is lost
  (the processor gives up after its retry schedule; only reconciliation finds it).

Every request that reached hookledger is kept, so the model can send an old one again.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import requests

import receiver.core.objects as objects
import receiver.core.status as statuses
from receiver.core.events import parse_event
from receiver.core.transitions import read_event
from reconcile.sandbox.merchants import MerchantsApp
from reconcile.sandbox.state import Sandbox
from reconcile.sandbox.transport import mount_wsgi, wsgi_sender

OLD_SYSTEM = "http://old-system.test"
HOOKLEDGER = "http://merchant.test/webhooks"
ADMIN_KEY = "model_admin_key_0123456789"
KINDS = ("payment", "refund", "dispute", "payout", "mandate")
FATES = ("deliver", "lose", "hold", "ack_lost", "drop")

Key = tuple[str, str, str, str]  # (account, kind, object id, state key)


class Processor:
    """The merchants on one base URL, as Hyperswitch serves them (the API key picks the
    merchant), served in-process to the ``reconcile`` commands' clients (a ``requests``
    session through :func:`reconcile.sandbox.transport.mount_wsgi`). A merchant added later
    joins at once."""

    base_url = "http://processor.test"

    def __init__(self) -> None:
        self._sandboxes: list[Sandbox] = []
        self._app: MerchantsApp | None = None
        self.session = requests.Session()
        self.session.trust_env = False  # no proxies to look up per request
        mount_wsgi(self.session, self.base_url, self._wsgi)

    def add(self, sandbox: Sandbox) -> None:
        self._sandboxes.append(sandbox)
        self._app = MerchantsApp(self._sandboxes)

    def _wsgi(self, environ: Any, start_response: Any) -> Iterable[bytes]:
        assert self._app is not None
        return self._app(environ, start_response)


@dataclass(frozen=True)
class Request:
    """One webhook request as it crossed the network."""

    url: str
    body: bytes
    headers: dict[str, str]

    def describe(self) -> str:
        event = parse_event(self.body)
        ref = event.object_ref
        what = f"{ref.kind}:{ref.object_id}" if ref else "?"
        return f"{event.event_type} {what} -> {self.url.removeprefix(HOOKLEDGER)}"


class EarlierSystem:
    """The merchant's handling before hookledger. It handled each payment at checkout, from
    its own API response (:meth:`handle`), and every webhook that reached its URL
    (``OLD_SYSTEM/<account>/``); it handled each transition once, however often it saw it."""

    def __init__(self) -> None:
        self.handled: set[Key] = set()

    def handle(self, account: str, kind: str, object_id: str, state: str) -> None:
        self.handled.add((account, kind, object_id, state))

    def receive(self, url: str, body: bytes) -> int:
        account = url.removeprefix(OLD_SYSTEM).strip("/")
        event = parse_event(body)
        ref = event.object_ref
        if ref is not None:
            reading = read_event(ref.kind, event.event_type, ref.status, ref.stage)
            if reading.state is not None:
                self.handle(account, ref.kind, ref.object_id, reading.state.key)
        return 200


class Network:
    """The sandboxes' webhook sender (see the module docstring). ``reached(request)`` is
    told of each request that reaches hookledger."""

    def __init__(
        self, receiver_wsgi: Callable[..., Iterable[bytes]], reached: Callable[[Request], None]
    ) -> None:
        self._post = wsgi_sender(receiver_wsgi)
        self._on_reach = reached
        self.earlier = EarlierSystem()
        self.fates: deque[str] = deque()
        self.held: list[Request] = []
        self.reached: list[Request] = []
        #: Events lost for good (every attempt).
        self.dropped: set[str] = set()
        self.counts: Counter[str] = Counter()

    def send(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        fate = self.fates.popleft() if self.fates else "deliver"
        self.counts[fate] += 1
        event_id = parse_event(body).event_id
        if fate == "drop":
            self.dropped.add(event_id)
        if event_id in self.dropped:
            raise requests.ConnectionError("lost for good")
        if url.startswith(OLD_SYSTEM):  # the earlier system: nobody holds its requests
            if fate in ("lose", "hold"):
                raise requests.ConnectionError("lost on the way")
            status = self.earlier.receive(url, body)
            if fate == "ack_lost":
                raise requests.ReadTimeout("the answer was lost")
            return status
        request = Request(url, body, dict(headers))
        if fate == "lose":
            raise requests.ConnectionError("lost on the way")
        if fate == "hold":
            self.held.append(request)
            raise requests.ReadTimeout("in flight for too long")
        status = self.post(request)
        if fate == "ack_lost":
            raise requests.ReadTimeout("the answer was lost")
        return status

    def post(self, request: Request) -> int:
        """Send ``request`` to hookledger now; its HTTP status."""
        self._on_reach(request)
        status = self._post(request.url, request.body, request.headers)
        self.reached.append(request)
        return status


# -- the processor's truth ----------------------------------------------------------------


@dataclass
class Merchant:
    """One processor merchant account (a sandbox) and the installation's accounts on it."""

    sandbox: Sandbox
    api_key: str
    #: profile id -> the account that is (or will be) that profile's on hookledger.
    accounts: dict[str, str] = field(default_factory=dict)
    #: No further profile may be added (it has mandates, whose ownership follows the merchant).
    single: bool = False

    @property
    def merchant_id(self) -> str:
        return self.sandbox.merchant_id


@dataclass(frozen=True)
class Thing:
    """One object at the processor: whose it is and where it lives."""

    account: str
    kind: str
    object_id: str
    merchant: str
    profile: str


def things(merchant: Merchant) -> Iterator[Thing]:
    """Every object of ``merchant`` (read from the sandbox itself), with its account."""
    sandbox = merchant.sandbox
    with sandbox.lock:
        rows: list[tuple[str, str, str]] = [
            *(("payment", p.payment_id, p.profile_id) for p in sandbox._payments.values()),
            *(("refund", r.refund_id, r.profile_id) for r in sandbox._refunds.values()),
            *(("dispute", d.dispute_id, d.profile_id) for d in sandbox._disputes.values()),
            *(("payout", o.payout_id, o.profile_id) for o in sandbox._payouts.values()),
            *(("mandate", m.mandate_id, m.profile_id) for m in sandbox._mandates.values()),
        ]
    for kind, object_id, profile in rows:
        account = merchant.accounts.get(profile)
        if account is not None:
            yield Thing(account, kind, object_id, merchant.merchant_id, profile)


def api_object(sandbox: Sandbox, kind: str, object_id: str) -> dict[str, Any]:
    """The object as the processor's API answers it."""
    getter = {
        "payment": sandbox.get_payment,
        "refund": sandbox.get_refund,
        "dispute": sandbox.get_dispute,
        "payout": sandbox.get_payout,
        "mandate": sandbox.get_mandate,
    }[kind]
    return getter(object_id)


def state_key(sandbox: Sandbox, kind: str, object_id: str) -> str | None:
    """The object's state at the processor (its transition model's key)."""
    state = objects.state_of(kind, api_object(sandbox, kind, object_id))
    return state.key if state is not None else None


def announced(kind: str, key: str | None) -> bool:
    """Whether the processor sends an event for this state (else nothing projects it)."""
    if key is None:
        return False
    status = key.rsplit("/", 1)[-1]
    return statuses.event_type_for_status(kind, status) is not None


class Ids:
    """Deterministic sandbox ids (``ref_0001`` ...): shrunk examples read well and replay
    alike (the sandbox draws random ones)."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def __call__(self, prefix: str, length: int = 20) -> str:
        return f"{prefix}{next(self._counter):04d}"
