"""The same events, delivered in many orders, with duplicates, drains and reconcile runs
interleaved, always end in the processor's truth, with every transition handled at most once.

The processor's truth is made in one sandbox (no webhook URL: events are only recorded):
payments (processing -> succeeded, authorized -> captured, declined), refunds
(pending -> succeeded, failed, succeeded) and disputes (opened -> challenged -> won / lost). The
sandbox's own signed event bodies are then posted through the example shop's webhook endpoint
in a seeded random order per ordering, some twice, with inline drains and reconcile runs
(against the same sandbox) at random points.

Every ordering uses its own objects (ids carry the ordering number) in one database per test, so
orderings never see each other's events. For each ordering, mapped back to canonical names:

- the projection (``hookledger_projection``) equals the processor's statuses, the same for all;
- the shop's orders (status, refunded amount, dispute status) equal what the truth implies;
- no (object, event type, handler) succeeded more than once, and no event is left open;
- a final reconcile run finds nothing to recover and nothing unresolved.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from sqlmodel import Session

import receiver.core.objects as objects
from examples.shop.app import create_app
from examples.shop.models import Order, OrderStatus
from receiver import WebhookReceiver
from receiver.storage.tables import EventStatus, HandlerRun, InboxEvent, Projection
from receiver.testing import WebhookTestClient
from reconcile.client.processor import ProcessorClient
from reconcile.runtime.runner import ReconcileOptions, Reconciler
from reconcile.sandbox import SandboxServer
from tests.conftest import SECRETS, SECRETS_SPEC, backend
from tests.reliability._inproc import (
    CARD_DECLINED,
    CARD_PROCESSING,
    SANDBOX_API_KEY,
    card_payment,
    strict_app,
)
from tests.support import reconcile_ready

pytestmark = pytest.mark.storage

ORDERINGS = 24
DRAIN_CHANCE = 0.2
RECONCILE_CHANCE = 0.05
#: PostgreSQL's reconcile lock is an advisory lock of the whole database, so a run of another
#: test (another schema of the same database) may hold it for a moment: wait for it.
LOCK_WAIT = 30.0
WIDE = ReconcileOptions(mode="wide", lock_wait=LOCK_WAIT)

E: sa.Table = InboxEvent.__table__  # type: ignore[attr-defined]
H: sa.Table = HandlerRun.__table__  # type: ignore[attr-defined]
P: sa.Table = Projection.__table__  # type: ignore[attr-defined]

#: Canonical order name -> order amount (the payment's amount).
ORDERS: dict[str, int] = {
    "proc": 2500,
    "auth": 2500,
    "declined": 2500,
    "refund_full": 2577,
    "refund_mixed": 3000,
    "dispute_won": 2500,
    "dispute_lost": 2500,
}


@dataclass
class Scenario:
    """One ordering's objects in the sandbox and the events the processor emitted for them."""

    number: int
    started: datetime
    names: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, id) -> canonical
    events: list[dict[str, Any]] = field(default_factory=list)

    def window(self) -> ReconcileOptions:
        """A reconcile run over this ordering's objects only (they were created after start)."""
        until = datetime.now(UTC) + timedelta(minutes=1)
        return ReconcileOptions(mode="window", since=self.started, until=until, lock_wait=LOCK_WAIT)

    def payment_id(self, name: str) -> str:
        return f"pay_{self.number:03d}_{name}"

    def order_id(self, name: str) -> str:
        return f"ord_{self.number:03d}_{name}"


def make_truth(server: SandboxServer, number: int) -> Scenario:
    """Create one ordering's objects in the sandbox and move them to their final states."""
    sandbox = server.sandbox
    scenario = Scenario(number, started=sandbox.now())
    start = len(sandbox.events())

    def pay(name: str, **kwargs: Any) -> str:
        payment_id = scenario.payment_id(name)
        card_payment(
            server, payment_id, amount=ORDERS[name], order_id=scenario.order_id(name), **kwargs
        )
        scenario.names[("payment", payment_id)] = name
        return payment_id

    def refund(name: str, amount: int) -> None:
        made = sandbox.create_refund({"payment_id": scenario.payment_id(name), "amount": amount})
        scenario.names[("refund", made["refund_id"])] = f"{name}/refund_{amount}"

    def dispute(name: str, *actions: str) -> None:
        made = sandbox.open_dispute(pay(name))
        for action in actions:
            sandbox.dispute_action(made["dispute_id"], action)
        scenario.names[("dispute", made["dispute_id"])] = f"{name}/dispute"

    pay("proc", card=CARD_PROCESSING)  # processing; succeeded on the tick below
    pay("auth", capture_method="manual")  # authorized; captured below
    pay("declined", card=CARD_DECLINED)
    pay("refund_full")
    refund("refund_full", 2577)  # ends in 77: pending; succeeded on the tick below
    pay("refund_mixed")
    refund("refund_mixed", 1002)  # ends in 02: failed
    refund("refund_mixed", 1000)
    dispute("dispute_won", "challenge", "win")
    dispute("dispute_lost", "challenge", "lose")
    sandbox.capture_payment(scenario.payment_id("auth"), {})
    sandbox.tick()
    scenario.events = sandbox.events()[start:]
    assert len(scenario.events) == 18, [e["event_type"] for e in scenario.events]
    return scenario


def truth_of(server: SandboxServer, scenario: Scenario) -> dict[str, str]:
    """Canonical object name -> the processor's current status."""
    sandbox = server.sandbox
    getters = {
        "payment": sandbox.get_payment,
        "refund": sandbox.get_refund,
        "dispute": sandbox.get_dispute,
    }
    states = {
        name: objects.state_of(kind, getters[kind](object_id))
        for (kind, object_id), name in scenario.names.items()
    }
    return {name: state.status for name, state in states.items() if state is not None}


def expected_orders(truth: dict[str, str]) -> dict[str, tuple[str, int, str | None]]:
    """What the shop's orders must show, given the processor's statuses."""
    out: dict[str, tuple[str, int, str | None]] = {}
    for name, amount in ORDERS.items():
        refunded = sum(
            int(key.rsplit("_", 1)[1])
            for key, status in truth.items()
            if key.startswith(f"{name}/refund_") and status == "succeeded"
        )
        dispute = truth.get(f"{name}/dispute")
        if truth[name] == "failed":
            status = OrderStatus.FAILED
        elif dispute in ("dispute_lost", "dispute_accepted"):
            status = OrderStatus.CHARGEBACK
        elif dispute in ("dispute_opened", "dispute_challenged"):
            status = OrderStatus.DISPUTED
        elif refunded:
            status = OrderStatus.REFUNDED if refunded >= amount else OrderStatus.PARTIALLY_REFUNDED
        else:
            status = OrderStatus.PAID
        out[name] = (status, refunded, dispute)
    return out


@pytest.fixture
def shop(database_url: str) -> Iterator[Flask]:
    # On SQLite the orderings share one in-memory database: a file database fsyncs every
    # commit (synchronous=FULL), which would make the ~4000 commits of this test take ~20 s.
    url = "sqlite://" if backend() != "postgresql" else database_url
    app = create_app(
        {
            "HOOKLEDGER_DATABASE_URL": url,
            "HOOKLEDGER_SECRETS": SECRETS_SPEC,
            "HOOKLEDGER_BACKOFF_BASE": 0,
            "HOOKLEDGER_BACKOFF_MAX": 0,
        }
    )
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 0, result.output
    engine = WebhookReceiver.state(app).store.engine
    reconcile_ready(engine)
    yield strict_app(app)
    engine.dispose()


class Harness:
    def __init__(self, app: Flask, server: SandboxServer) -> None:
        self.app = app
        self.server = server
        self.state = WebhookReceiver.state(app)
        self.engine: sa.Engine = self.state.store.engine
        self.hooks = WebhookTestClient(app, secret=server.sandbox.webhook_secret)
        self.client = ProcessorClient(server.base_url, SANDBOX_API_KEY)
        self.reconciler = Reconciler(self.client, self.state.store)
        self.reconcile_runs = 0
        self.recovered = 0

    def open_orders(self, scenario: Scenario) -> None:
        with Session(self.engine) as session:
            for name, amount in ORDERS.items():
                session.add(
                    Order(
                        id=scenario.order_id(name),
                        amount=amount,
                        currency="USD",
                        payment_id=scenario.payment_id(name),
                    )
                )
            session.commit()

    def deliver(self, event: dict[str, Any]) -> None:
        response = self.hooks.post(event["body"].encode("utf-8"))
        assert response.status_code == 200, response.get_data()
        assert response.get_json()["status"] in ("inserted", "duplicate")

    def drain(self) -> None:
        self.hooks.drain()

    def reconcile(self, scenario: Scenario) -> None:
        report = self.reconciler.run(scenario.window())
        self.reconcile_runs += 1
        self.recovered += report.recovered
        # A run between two shuffled deliveries may find an object whose waiting events
        # leave it short of the processor (the later webhook is still to come): behind,
        # never ok; nothing else is ever unresolved.
        behind = sum(part.behind for part in [*report.kinds.values(), *report.sweep.values()])
        assert report.unresolved == behind, report.as_dict()

    def projection(self, scenario: Scenario) -> dict[str, str]:
        ids = {object_id for _, object_id in scenario.names}
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(P.c.object_kind, P.c.object_id, P.c.status).where(P.c.object_id.in_(ids))
            ).all()
        return {scenario.names[(r.object_kind, r.object_id)]: r.status for r in rows}

    def orders(self, scenario: Scenario) -> dict[str, tuple[str, int, str | None]]:
        with Session(self.engine) as session:
            out = {}
            for name in ORDERS:
                order = session.get(Order, scenario.order_id(name))
                assert order is not None
                out[name] = (order.status, order.refunded_amount, order.dispute_status)
            return out

    def handled_twice(self, scenario: Scenario) -> list[tuple[str, str, str, int]]:
        ids = {object_id for _, object_id in scenario.names}
        query = (
            sa.select(E.c.object_id, E.c.event_type, H.c.handler, sa.func.count())
            .select_from(H.join(E, H.c.event_pk == E.c.id))
            .where(H.c.status == "succeeded", E.c.object_id.in_(ids))
            .group_by(E.c.object_id, E.c.event_type, H.c.handler)
            .having(sa.func.count() > 1)
        )
        with self.engine.connect() as conn:
            return [(r[0], r[1], r[2], int(r[3])) for r in conn.execute(query).all()]

    def statuses(self, scenario: Scenario) -> Counter[str]:
        ids = {object_id for _, object_id in scenario.names}
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(E.c.status).where(E.c.object_id.in_(ids))).all()
        return Counter(row.status for row in rows)


def play(harness: Harness, scenario: Scenario, rng: random.Random) -> list[str]:
    """Deliver the scenario's events shuffled, with duplicates, drains and reconcile runs."""
    deliveries = list(scenario.events)
    deliveries += rng.sample(scenario.events, rng.randint(1, 6))
    rng.shuffle(deliveries)
    log: list[str] = []
    if rng.random() < 0.2:
        harness.reconcile(scenario)
        log.append("reconcile")
    for event in deliveries:
        harness.deliver(event)
        log.append(
            f"{scenario.names[(event['object_type'].split('_')[0], event['object_id'])]}"
            f":{event['event_type']}"
        )
        roll = rng.random()
        if roll < DRAIN_CHANCE:
            harness.drain()
            log.append("drain")
        elif roll < DRAIN_CHANCE + RECONCILE_CHANCE:
            harness.reconcile(scenario)
            log.append("reconcile")
    harness.drain()
    return log


def test_every_delivery_order_ends_in_the_processors_truth(shop: Flask) -> None:
    with SandboxServer(
        SANDBOX_API_KEY, webhook_url=None, webhook_secret=SECRETS["primary"]
    ) as server:
        harness = Harness(shop, server)
        try:
            canonical: dict[str, str] | None = None
            for number in range(ORDERINGS):
                scenario = make_truth(server, number)
                truth = truth_of(server, scenario)
                harness.open_orders(scenario)
                log = play(harness, scenario, random.Random(number))
                where = f"ordering {number} (seed {number}): {' '.join(log)}"
                assert harness.projection(scenario) == truth, where
                assert harness.orders(scenario) == expected_orders(truth), where
                assert harness.handled_twice(scenario) == [], where
                left = harness.statuses(scenario)
                assert set(left) <= {EventStatus.DONE, "stale", "duplicate"}, (left, where)
                canonical = canonical or truth
                assert truth == canonical, "the sandbox truth differs between orderings"
            assert harness.reconcile_runs > ORDERINGS // 3, "too few interleaved reconcile runs"
            assert harness.recovered > 0, "no reconcile run ever came before a webhook"
            final = harness.reconciler.run(WIDE)
            assert final.recovered == 0 and final.unresolved == 0, final.as_dict()
            assert final.kinds["payments"].checked == ORDERINGS * len(ORDERS)
        finally:
            harness.client.close()
