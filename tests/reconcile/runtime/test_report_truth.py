"""Reports that tell the truth (reconciliation issue, item 5), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from reconcile.client.paging import Pager
from reconcile.runtime.runner import ReconcileOptions
from tests.conftest import AppFactory
from tests.reconcile.world import world

pytestmark = pytest.mark.storage

LISTS_ONLY = ReconcileOptions(sweep_budget=0)


def test_recovery_waiting_for_the_worker_is_queued_not_unresolved(make_app: AppFactory) -> None:
    with world(make_app) as w:
        for n in range(3):
            w.drop_next("payment_succeeded")
            w.pay(f"pay_q{n}")
        w.settle()
        first = w.run(LISTS_ONLY, drain=False)
        assert first.kinds["payments"].recovered == Counter(payment_succeeded=3)
        # The worker has not run yet: the next run sees the recovery waiting, says so,
        # and is ok (it used to report them mismatched and exit 1).
        second = w.run(LISTS_ONLY, drain=False)
        payments = second.kinds["payments"]
        assert (payments.queued, payments.mismatched, second.status) == (3, 0, "ok")
        w.drain()
        third = w.run(LISTS_ONLY)
        assert third.kinds["payments"].in_sync == 3 and third.status == "ok"
        assert set(w.handled.values()) == {1}


def test_a_payment_in_the_windows_last_millisecond_is_not_local_only(
    make_app: AppFactory,
) -> None:
    """Regression: the window end was rounded down to the millisecond for listing but not
    for the local check, so a payment created in the run's starting millisecond (listed by
    no page: the processor's own time for it is past the printed bound) was local_only."""
    with world(make_app) as w:
        w.frozen.move_to(w.now().replace(microsecond=500))  # mid-millisecond
        w.pay("pay_edge")
        w.settle()  # the webhook arrives: projected, created in this very millisecond
        real = w.reconciler._pager

        def listing_without_the_edge(*args: Any) -> Pager:
            pager = real(*args)

            class Edgeless(Pager):
                def __init__(self) -> None:  # noqa: D107 - the wrapped pager holds state
                    self.pages = self.requests = 0
                    self.incomplete = []

                def _rows(self) -> Iterator[dict[str, Any]]:
                    for row in pager:
                        self.pages, self.requests = pager.pages, pager.requests
                        if row.get("payment_id") != "pay_edge":
                            yield row

                def __iter__(self) -> Iterator[dict[str, Any]]:
                    return self._rows()

            return Edgeless()

        w.reconciler._pager = listing_without_the_edge  # type: ignore[method-assign]
        report = w.run(ReconcileOptions(kinds=["payments"], sweep_budget=0))
        assert report.kinds["payments"].local_only == 0, report.as_dict()
        assert report.status == "ok"


def test_a_bad_remote_row_is_reported_and_the_run_goes_on(make_app: AppFactory) -> None:
    with world(make_app) as w:
        w.drop_next("payment_succeeded", count=2)
        w.pay("pay_good")
        w.pay("pay_deep")
        w.settle()
        real = w.reconciler._pager

        def with_bad_rows(name: str, *args: Any) -> Any:
            pager = real(name, *args)
            if name != "payments":
                return pager

            def rows() -> Iterator[dict[str, Any]]:
                for row in pager:
                    if row["payment_id"] == "pay_deep":
                        row = dict(row, metadata={"note": "\ud800 unpaired"})
                    yield row
                yield {
                    "payment_id": "pay_\x00nul",
                    "status": "succeeded",
                    "created": row["created"],
                }
                yield {"payment_id": "pay_status", "status": 7, "created": row["created"]}

            class Bad:
                pages = requests = 0
                incomplete: list[Any] = []
                row_errors: list[Any] = []

                def __iter__(self) -> Iterator[dict[str, Any]]:
                    return rows()

            return Bad()

        w.reconciler._pager = with_bad_rows  # type: ignore[method-assign]
        report = w.run(ReconcileOptions(kinds=["payments"], sweep_budget=0))
        payments = report.kinds["payments"]
        assert payments.recovered == Counter(payment_succeeded=1)
        assert payments.bad_rows == 3
        joined = " | ".join(payments.bad_rows_sample)
        assert "pay_\\x00nul: payment_id contains NUL" in joined
        assert "pay_status: status is a number, not a string" in joined
        assert "pay_deep: the object cannot be encoded" in joined
        assert report.status == "unresolved"  # never ok with rows it could not take


def test_a_listing_the_server_does_not_filter_is_reported_incomplete(
    make_app: AppFactory,
) -> None:
    with world(make_app) as w:
        for n in range(5):
            w.pay(f"pay_old_{n}")
        w.settle()
        w.advance(timedelta(days=3))
        w.run()  # the watermark moves past the old payments' creation
        w.advance(timedelta(hours=3))
        w.pay("pay_new")
        w.settle()
        w.sandbox.faults.once("ignore_filters", count=50, path="/payments/list")
        report = w.run(ReconcileOptions(kinds=["payments"], sweep_budget=0))
        payments = report.kinds["payments"]
        assert payments.incomplete, report.as_dict()
        assert report.status == "incomplete"


def test_the_clients_list_budget_does_not_cut_a_run_short(make_app: AppFactory) -> None:
    """Issue 18: the iterators' default budget (here 1 request, on the client) is not the
    run's: ``reconcile run`` passes its own per-window budget, and a window over it is
    reported incomplete (stuck), never raised."""
    with world(make_app) as w:
        w.drop_next("payment_succeeded", count=5)
        for n in range(5):
            w.pay(f"pay_budget_{n}")
            w.frozen.tick(timedelta(seconds=1))
        w.settle()
        w.client.max_list_requests = 1
        report = w.run(ReconcileOptions(kinds=["payments"], sweep_budget=0, page_size=2))
        payments = report.kinds["payments"]
        assert payments.requests >= 3 and not payments.incomplete, report.as_dict()
        assert payments.recovered == Counter(payment_succeeded=5)
        assert report.status == "ok"
        # The run's own budget spent: the window is reported, the run goes on and says so.
        w.advance(timedelta(hours=2))
        tight = ReconcileOptions(
            kinds=["payments"], mode="wide", sweep_budget=0, page_size=2, max_requests=1
        )
        report = w.run(tight)
        incomplete = report.kinds["payments"].incomplete
        assert len(incomplete) == 1 and "request budget of 1 requests" in incomplete[0]
        assert report.status == "incomplete"


def test_a_dry_run_exits_as_the_real_run_would(make_app: AppFactory) -> None:
    """Issue 28, hole 9: a dry run that could not read the processor, or found drift, exits
    4 or 1 as the same run without ``--dry-run`` does, never 0 with "recovered 0"."""
    from reconcile.cli.context import EXIT_OK, EXIT_PROCESSOR, EXIT_UNRESOLVED, exit_code
    from reconcile.core.report import render

    with world(make_app) as w:
        w.drop_next("payment_succeeded")
        w.pay("pay_dry")
        w.settle()
        fine = w.run(ReconcileOptions(dry_run=True), drain=False)
        assert (fine.status, fine.outcome, exit_code(fine)) == ("dry_run", "ok", EXIT_OK)
        assert fine.kinds["payments"].recovered == Counter(payment_succeeded=1)
        w.sandbox.faults.once("error", count=50, path="/", status=503)
        for dry_run in (True, False):
            report = w.run(ReconcileOptions(dry_run=dry_run), drain=False)
            assert report.outcome == "incomplete", report.as_dict()
            assert exit_code(report) == EXIT_PROCESSOR
        assert "dry_run, incomplete" in render(
            w.run(ReconcileOptions(dry_run=True), drain=False).as_dict()
        )
        w.sandbox.faults.reset()
        w.run()  # recovered and dispatched
        with w.store.engine.begin() as conn:  # the projection now ahead of the processor
            conn.exec_driver_sql(
                "UPDATE hookledger_projection SET status = 'cancelled_post_capture' "
                "WHERE object_id = 'pay_dry'"
            )
        drift = w.run(ReconcileOptions(dry_run=True, mode="wide"), drain=False)
        assert drift.outcome == "unresolved", drift.as_dict()
        assert exit_code(drift) == EXIT_UNRESOLVED


def test_a_wide_run_after_a_gap_leaves_the_gap_to_the_next_incremental_run(
    make_app: AppFactory,
) -> None:
    """Regression (found by the world model, tests/model): a wide run (the last 48 h) moved
    each watermark to its end even when the last incremental run was older than its window,
    so what was created in between (a payment whose webhook was lost, four days ago) was
    read by no run ever again."""
    with world(make_app) as w:
        first = w.run(LISTS_ONLY)
        assert first.status == "ok"
        w.advance(timedelta(hours=1))
        w.drop_next("payment_succeeded")
        w.pay("pay_gap")
        w.settle()
        assert w.projected("payment", "pay_gap") is None
        w.advance(timedelta(days=4))  # no incremental run meanwhile
        wide = w.run(ReconcileOptions(mode="wide", sweep_budget=0))
        assert wide.status == "ok" and not wide.kinds["payments"].recovered
        incremental = w.run(LISTS_ONLY)
        assert incremental.kinds["payments"].recovered == Counter(payment_succeeded=1)
        assert w.projected("payment", "pay_gap") == "succeeded"
        # Once read on from the watermark, the next wide run moves it again.
        w.advance(timedelta(hours=1))
        w.run(ReconcileOptions(mode="wide", sweep_budget=0))
        assert w.reconciler.store.watermark("payment") == w.now()
