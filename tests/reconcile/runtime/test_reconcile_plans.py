"""Every statement of a reconcile run reads the big tables through indexes, whatever the
planner's statistics: none at all here (autovacuum off, ``pg_statistic`` emptied), the case
of a platform's database on the night it adopts a batch of new sellers, their recoveries
still queued, before anything analysed the tables.

Found by the 1,000-account bench: with no statistics, the probe for objects with an open
event ANDed the status index (every open event of every account) with the object index, and
the sweep's delete of settled follow-ups scanned them per chunk; a run took 350 ms per
account at 1,000 accounts against 40 at 10. As in ``test_dispatch_plans``, each statement is
checked with the plan made afresh and, when it already ran on the empty database, with the
generic plan a connection kept from then.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import requests
import sqlalchemy as sa

import receiver.storage.database as db
from receiver.store import Store
from reconcile.client.processor import ProcessorClient
from reconcile.runtime.runner import ReconcileOptions, Reconciler
from reconcile.sandbox.app import create_app as sandbox_app
from reconcile.sandbox.state import Sandbox
from reconcile.sandbox.transport import mount_wsgi
from reconcile.storage.store import RECONCILE_MIGRATIONS
from tests import plans

pytestmark = plans.PLAN_MARKS

BIG = plans.HISTORY_TABLES | {"hookledger_recon_object", "hookledger_recon_run"}
HISTORY = 20_000
PAYMENTS = 60  # per account: a run reads a few rows for each
START = datetime(2026, 3, 2, tzinfo=UTC)
END = START + timedelta(days=7)


def _fill_other_accounts(engine: sa.Engine, n: int) -> None:
    """``n`` rows of 1,000 other accounts in each big table: open recoveries (pending
    events, not dispatched yet), projections, transitions, follow-ups and runs; and ``n``
    objects the first account follows; no ANALYZE."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_event (account, event_id, source, event_type,"
                " object_kind, object_id, object_status, object_key, event_time, received_at,"
                " body, headers, body_sha256, status, attempts, next_attempt_at)"
                " SELECT 'seller' || (g % 1000), 'evt_other_' || g, 'reconcile',"
                " 'payment_processing', 'payment', 'pay_' || g, 'processing',"
                " 'seller' || (g % 1000) || '/payment:pay_' || g, now(), now(),"
                " convert_to(repeat('x', 600), 'UTF8'), '{}', md5(g::text), 'pending', 0, now()"
                " FROM generate_series(1, :n) AS g"
            ),
            {"n": n},
        )
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_transition (account, object_kind, object_id, state,"
                " event_pk, created_at) SELECT 'seller' || (g % 1000), 'payment', 'pay_' || g,"
                " 'processing', g, now() FROM generate_series(1, :n) AS g"
            ),
            {"n": n},
        )
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_projection (account, object_kind, object_id, status,"
                " event_time, event_pk, updated_at) SELECT 'seller' || (g % 1000), 'payment',"
                " 'pay_' || g, 'processing', now(), g, now() FROM generate_series(1, :n) AS g"
            ),
            {"n": n},
        )
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_recon_object (account, kind, object_id, created_at,"
                " first_seen_at, status, last_checked_at, next_check_at, checks)"
                " SELECT 'seller' || (g % 1000), 'payments', 'pay_' || g, now(), now(),"
                " 'processing', now(), now(), 1 FROM generate_series(1, :n) AS g"
            ),
            {"n": n},
        )
        # And the first account's own long tail: objects it follows (not in this week's
        # listing), so the sweep's delete of settled ones must probe them, not scan them.
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_recon_object (account, kind, object_id, created_at,"
                " first_seen_at, status, last_checked_at, next_check_at, checks)"
                " SELECT 'first', 'payments', 'pay_tail_' || g, now(), now(),"
                " 'processing', now(), now() + interval '30 days', 1"
                " FROM generate_series(1, :n) AS g"
            ),
            {"n": n},
        )
        conn.execute(
            sa.text(
                "INSERT INTO hookledger_recon_run (account, mode, owner, started_at,"
                " finished_at, status, report) SELECT 'seller' || (g % 1000), 'window', 'x',"
                " now(), now(), 'ok', '{}' FROM generate_series(1, :n) AS g"
            ),
            {"n": n},
        )


def _reconciler(store: Store, account: str, seed: int) -> Reconciler:
    """An account whose processor holds ``PAYMENTS`` payments of the week, none of them
    known locally (a new seller's first night); some still processing (followed)."""
    key = f"snd_{account}_key_0123"
    sandbox = Sandbox(key, merchant_id=f"mer_{account}", seed=seed)
    sandbox.seed_payments(PAYMENTS, START, END, status=["succeeded", "failed", "processing"])
    session = requests.Session()
    url = f"http://{account}.processor.test"
    mount_wsgi(session, url, sandbox_app(sandbox))
    return Reconciler(ProcessorClient(url, key, session=session), store, account=account)


def _run(reconciler: Reconciler) -> None:
    options = ReconcileOptions(
        kinds=["payments"],
        mode="window",
        since=START - timedelta(minutes=5),
        until=END + timedelta(minutes=5),
        events=False,
        require_adoption=False,
    )
    report = reconciler.run(options)
    assert report.kinds["payments"].checked == PAYMENTS, report.as_dict()


def test_reconcile_statements_stay_on_indexes_as_other_accounts_grow(
    engine: sa.Engine, store: Store
) -> None:
    db.upgrade(engine, tree=RECONCILE_MIGRATIONS)
    plans.no_statistics(engine, BIG)
    statements, stop = plans.capture(engine)
    try:
        first = _reconciler(store, "first", 1)
        _run(first)  # the first night: every payment recovered
        _run(first)  # the next: the processing ones followed, the settled ones let go
        early = dict(statements)
        planner = plans.Planner(engine)
        try:
            planner.prepare(early)
            _fill_other_accounts(engine, HISTORY)
            statements.clear()
            _run(_reconciler(store, "late", 2))
            _run(first)
            late = dict(statements)
            problems = []
            for statement, params in late.items():
                made = {"custom": planner.custom(statement, params)}
                if statement in early:
                    made["generic (made on the empty database)"] = planner.generic(
                        statement, params
                    )
                for mode, plan in made.items():
                    if tables := plans.read_in_full(plan, 2_000, BIG):
                        summary = " ".join(statement.split())[:240]
                        problems.append(f"{mode}: {sorted(tables)} in {summary}")
            assert problems == [], json.dumps(problems, indent=1)
        finally:
            planner.close()
    finally:
        stop()
