"""The API client paged to the end against the sandbox processor, over real HTTP."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from reconcile.client.processor import ProcessorClient
from reconcile.core.errors import PagingError
from reconcile.sandbox import SandboxServer

API_KEY = "snd_client_sandbox_0001"
T0 = datetime(2026, 11, 10, 8, 0, tzinfo=UTC)
WINDOW = (T0 - timedelta(days=1), T0 + timedelta(days=1))


@pytest.fixture(scope="module")
def server() -> Any:
    with SandboxServer(API_KEY) as srv:
        # 357 payments over one hour, 3 of them sharing one instant with others around it.
        srv.sandbox.seed_payments(350, T0, T0 + timedelta(hours=1), id_prefix="pay_spread_")
        srv.sandbox.seed_payments(7, T0 + timedelta(minutes=30), id_prefix="pay_same_")
        yield srv


@pytest.mark.parametrize("dialect", ["hyperswitch", "seed"])
@pytest.mark.parametrize("page_size", [100, 37])
def test_both_payment_dialects_reach_the_end(server: Any, dialect: str, page_size: int) -> None:
    with ProcessorClient(server.base_url, API_KEY) as client:
        pager = client.iter_payments(*WINDOW, dialect=dialect, page_size=page_size)  # type: ignore[arg-type]
        ids = Counter(p["payment_id"] for p in pager)
    assert len(ids) == 357 and set(ids.values()) == {1}
    assert pager.pages >= 357 // page_size


def test_a_narrow_window_returns_only_its_payments(server: Any) -> None:
    instant = T0 + timedelta(minutes=30)
    with ProcessorClient(server.base_url, API_KEY) as client:
        rows = list(client.iter_payments(instant, instant))
    assert len([r for r in rows if r["payment_id"].startswith("pay_same_")]) == 7
    assert {r["created"] for r in rows} == {"2026-11-10T08:30:00.000Z"}


def test_more_rows_at_one_instant_than_a_page_is_reported_not_looped() -> None:
    with SandboxServer(API_KEY) as srv:
        srv.sandbox.seed_payments(30, T0, id_prefix="pay_burst_")
        with ProcessorClient(srv.base_url, API_KEY) as client:
            with pytest.raises(PagingError):
                list(client.iter_payments(*WINDOW, page_size=10))
            pager = client.iter_payments(*WINDOW, page_size=10, on_stuck="report")
            list(pager)
            assert pager.incomplete, "the stuck instant must be reported"
            # The seed's offset dialect pages through the same data completely.
            seed = {
                p["payment_id"] for p in client.iter_payments(*WINDOW, dialect="seed", page_size=10)
            }
            assert len(seed) == 30


class _ShiftingRefunds(requests.adapters.HTTPAdapter):
    """After each refunds list page, a refund not yet read changes (its modified time moves to
    the front of the modified-desc ordering), as happens on a live processor."""

    def __init__(self, server: SandboxServer, refund_ids: list[str]) -> None:
        super().__init__()
        self.server = server
        self.pending = list(refund_ids)

    def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().send(request, *args, **kwargs)
        if request.path_url.startswith("/refunds/list") and self.pending:
            self.server.sandbox.update_refund(self.pending.pop(), {"reason": "changed mid-run"})
        return response


def test_refunds_paging_survives_pages_shifting(server: Any) -> None:
    with SandboxServer(API_KEY) as srv:
        payments = srv.sandbox.seed_payments(60, T0, T0 + timedelta(minutes=10), id_prefix="pay_r_")
        refunds = [
            srv.sandbox.create_refund({"payment_id": pid, "amount": 100})["refund_id"]
            for pid in payments
        ]
        session = requests.Session()
        session.mount("http://", _ShiftingRefunds(srv, refunds[::7]))
        with ProcessorClient(srv.base_url, API_KEY, session=session) as client:
            seen = Counter(
                r["refund_id"]
                for r in client.iter_refunds(
                    datetime.now(UTC) - timedelta(days=1),
                    datetime.now(UTC) + timedelta(days=1),
                    page_size=10,
                )
            )
        session.close()
    assert set(seen) == set(refunds)
    assert set(seen.values()) == {1}


@pytest.mark.parametrize("dialect", ["get", "post"])
def test_payouts_both_forms_reach_the_end(dialect: str) -> None:
    with SandboxServer(API_KEY) as srv:
        made = {
            srv.sandbox.create_payout(
                {
                    "amount": 1000 + i,
                    "currency": "USD",
                    "payout_type": "bank",
                    "auto_fulfill": True,
                    "confirm": True,
                }
            )["payout_id"]
            for i in range(45)
        }
        now = datetime.now(UTC)
        with ProcessorClient(srv.base_url, API_KEY) as client:
            got = Counter(
                p["payout_id"]
                for p in client.iter_payouts(
                    now - timedelta(days=1),
                    now + timedelta(days=1),
                    dialect=dialect,  # type: ignore[arg-type]
                )
            )
    assert set(got) == made and set(got.values()) == {1}
