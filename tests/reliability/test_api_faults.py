"""A reconcile run through a faulty processor API reports exactly what a clean run reports.

Design: ONE sandbox holds the dataset (payments in every status, refunds, payouts, disputes),
and the reconciler runs twice into TWO fresh databases: once with no fault, once with the
sandbox answering ~30% of requests with 500/502/503, ~10% with 429 (``Retry-After`` and
``X-RateLimit-Reset``), ~10% with a delay past the client's read timeout and ~5% with a 5xx
after handling the request. One sandbox rather than two "identical" ones, because then the
dataset is identical by construction (same ids, timestamps and bodies), so beyond the report's
counts the inboxes themselves can be compared: the reconciler's event ids and bodies are
deterministic functions of the remote objects. Two real databases rather than one dry run,
because the non-dry path (insert, watermark, stored report, local-only check) is what runs in
production; a dry run skips all of it.

The faulty client has a short read timeout, many attempts, tiny backoff and an injected sleep
that records the waits instead of sleeping, so the test is fast. The sandbox's fault RNG is
seeded and the client is sequential, so the same faults hit the same requests on every run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from receiver import WebhookReceiver
from receiver.storage.tables import InboxEvent, Projection
from reconcile.client.processor import ProcessorClient
from reconcile.client.transport import RetryPolicy
from reconcile.core.report import KindReport, Report
from reconcile.runtime.runner import ReconcileOptions, Reconciler
from reconcile.sandbox import ApiFaultConfig, SandboxServer
from tests.conftest import SECRETS_SPEC
from tests.reliability._inproc import (
    CARD_OK,
    SANDBOX_API_KEY,
    card_payment,
    extra_database_url,
)
from tests.support import reconcile_ready

pytestmark = pytest.mark.storage

FAULTS = ApiFaultConfig(
    error_rate=0.3,
    rate_limit=0.1,
    rate_limit_reset_seconds=1,
    timeout=0.1,
    timeout_seconds=1.0,
    error_after_processing=0.05,
)
READ_TIMEOUT = 0.3
PATIENT = RetryPolicy(max_attempts=30, base_delay=0.001, max_delay=5.0)
#: Small pages: more requests, so more of them meet a fault.
#: (lock_wait: PostgreSQL's reconcile lock is database-wide; another test may hold it a moment.)
OPTIONS = ReconcileOptions(page_size=5, lock_wait=30.0)
#: The second runs look at everything again (an incremental window would depend on when the
#: first run of each side happened).
WIDE = ReconcileOptions(mode="wide", page_size=5, lock_wait=30.0)

E: sa.Table = InboxEvent.__table__  # type: ignore[attr-defined]
P: sa.Table = Projection.__table__  # type: ignore[attr-defined]


def make_dataset(server: SandboxServer) -> None:
    """Objects of every kind in event-worthy and eventless statuses (no webhooks sent)."""
    sandbox = server.sandbox
    now = datetime.now(UTC)
    sandbox.seed_payments(
        35,
        now - timedelta(hours=3),
        now - timedelta(hours=2),
        status=[
            "succeeded",
            "failed",
            "requires_capture",
            "processing",
            "cancelled",
            "requires_payment_method",
            "requires_customer_action",
        ],
        amount=lambda i: 1000 + i,
        id_prefix="pay_seed_",
    )
    for i in range(6):
        card_payment(server, f"pay_card_{i}", CARD_OK, amount=5000)
    for i, amount in enumerate((500, 1002, 777, 1088, 400, 1202)):
        sandbox.create_refund({"payment_id": f"pay_card_{i}", "amount": amount})
    for i, actions in enumerate(((), ("challenge",), ("challenge", "win"), ("lose",))):
        dispute = sandbox.open_dispute(f"pay_card_{i}", amount=1000)
        for action in actions:
            sandbox.dispute_action(dispute["dispute_id"], action)
    for amount in (1000, 1002, 1077, 2000):
        sandbox.create_payout(
            {"amount": amount, "currency": "USD", "payout_type": "bank", "auto_fulfill": True}
        )
    sandbox.create_payout({"amount": 3000, "currency": "EUR", "payout_type": "card"})


def summary(report: Report) -> dict[str, dict[str, Any]]:
    """Everything a report says about the data (not how many requests or how long it took)."""

    def of(k: KindReport) -> dict[str, Any]:
        return {
            "checked": k.checked,
            "in_sync": k.in_sync,
            "recovered": dict(sorted(k.recovered.items())),
            "queued": k.queued,
            "no_event": k.no_event,
            "unknown_status": k.unknown_status,
            "local_ahead": k.local_ahead,
            "mismatched": k.mismatched,
            "local_only": k.local_only,
            "remote_errors": list(k.remote_errors),
            "incomplete": list(k.incomplete),
            "unresolved": k.unresolved,
        }

    return {name: of(k) for name, k in sorted(report.kinds.items())}


class Side:
    """One database with a receiver app (no handlers) and a reconciler."""

    def __init__(self, database_url: str, client: ProcessorClient) -> None:
        self.app = Flask("hookledger_api_faults")
        self.app.config.update(
            HOOKLEDGER_DATABASE_URL=database_url,
            HOOKLEDGER_SECRETS=SECRETS_SPEC,
            HOOKLEDGER_AUTO_MIGRATE=True,
        )
        WebhookReceiver().init_app(self.app)
        self.state = WebhookReceiver.state(self.app)
        self.engine: sa.Engine = self.state.store.engine

        reconcile_ready(self.engine)
        self.client = client
        self.reconciler = Reconciler(client, self.state.store)

    def run(self, options: ReconcileOptions = OPTIONS) -> Report:
        return self.reconciler.run(options)

    def drain(self) -> int:
        return self.state.worker(name="api-faults").drain()

    def inbox(self) -> set[tuple[str, str | None, str, str]]:
        """Each stored event: id, type, its body without the timestamp, status. (Disputes
        and payouts carry no modification time, so their recovered events are dated when
        each run observed them: the one thing two runs cannot agree on.)"""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(E.c.event_id, E.c.event_type, E.c.body, E.c.status))
            out = set()
            for r in rows:
                body = json.loads(r.body)
                body.pop("timestamp")
                out.add((r.event_id, r.event_type, json.dumps(body, sort_keys=True), r.status))
            return out

    def projection(self) -> dict[tuple[str, str], str]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(P.c.object_kind, P.c.object_id, P.c.status))
            return {(r.object_kind, r.object_id): r.status for r in rows}

    def close(self) -> None:
        self.client.close()
        self.engine.dispose()


class SteppingClock:
    """Sandbox time that moves 1 s per reading, so no two objects share a millisecond (the
    lists page on creation time; small pages cannot split a crowd created at one instant)."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@pytest.fixture
def sandbox() -> Iterator[SandboxServer]:
    clock = SteppingClock(datetime.now(UTC) - timedelta(hours=1))
    with SandboxServer(
        SANDBOX_API_KEY, webhook_url=None, webhook_secret="unused", seed=11, now=clock
    ) as sb:
        make_dataset(sb)
        yield sb


def test_a_faulty_api_gives_the_same_report_as_a_clean_one(
    sandbox: SandboxServer, database_url: str, tmp_path: Path
) -> None:
    waits: list[float] = []
    with extra_database_url(tmp_path, "faulty") as faulty_url:
        clean = Side(database_url, ProcessorClient(sandbox.base_url, SANDBOX_API_KEY))
        faulty = Side(
            faulty_url,
            ProcessorClient(
                sandbox.base_url,
                SANDBOX_API_KEY,
                connect_timeout=2.0,
                read_timeout=READ_TIMEOUT,
                retry=PATIENT,
                sleep=waits.append,
            ),
        )
        try:
            expected = clean.run()
            assert expected.unresolved == 0, expected.as_dict()
            for name in ("payments", "refunds", "payouts", "disputes"):
                assert expected.kinds[name].recovered, (name, expected.as_dict())

            sandbox.sandbox.faults.configure(api=FAULTS)
            got = faulty.run()
            applied = sandbox.sandbox.faults.stats()["api"]
            assert summary(got) == summary(expected)
            assert got.unresolved == 0 and got.recovered == expected.recovered
            # The faults really happened and were survived by retrying, not avoided.
            assert all(applied[fault] > 0 for fault in ("error", "rate_limit", "timeout")), applied
            # (one request may meet two faults, a delay then a 5xx: count the retries loosely)
            assert len(waits) >= max(applied.values()), (waits, applied)
            # The same missed transitions went into both inboxes (the bodies equal but for the
            # dating of those observed).
            assert faulty.inbox() == clean.inbox()
            assert clean.drain() == faulty.drain() > 0
            assert faulty.projection() == clean.projection()
            # A second run over the faulty API finds everything in sync, like a clean one.
            again_faulty = faulty.run(WIDE)
            sandbox.sandbox.faults.reset()
            again_clean = clean.run(WIDE)
            assert summary(again_faulty) == summary(again_clean)
            assert again_faulty.recovered == 0 and again_faulty.unresolved == 0
            total = again_clean.as_dict()["totals"]
            assert total["in_sync"] + total["no_event"] == total["checked"] > 0
        finally:
            sandbox.sandbox.faults.reset()
            clean.close()
            faulty.close()
