"""The API client against a Prism mock of Hyperswitch's patched OpenAPI spec.

Every request the client (and the example shop) sends must be accepted by the contract:
Prism answers 2xx without violations, and every query parameter and body field is declared
(see :mod:`tests.contract.recorder`). The answers are Prism's static examples, so the pagers
are cut short with :func:`itertools.islice`; the point is the shape of each request and that
the client reads each answer. The last tests send bad requests on purpose to show that the
contract does reject them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import requests

from examples.shop import app as shop_app
from examples.shop.models import Order
from reconcile.client.events_api import EventsClient
from reconcile.client.paging import Pager
from reconcile.client.processor import ProcessorClient
from reconcile.core.errors import InvalidRequest, NotFound
from tests.contract import API_KEY
from tests.contract.patch_spec import load_spec, patch_spec
from tests.contract.prism import PrismServer
from tests.contract.recorder import ContractRecorder

pytestmark = pytest.mark.contract

#: Around the ``created`` of Prism's static payment, payout and event (2022-09-10T10:11:12Z,
#: the spec's examples).
START = datetime(2022, 9, 10, 10, 0, tzinfo=UTC)
END = START + timedelta(hours=1)
#: Around the ``created_at`` of Prism's static refund and dispute: the spec gives no example,
#: so Prism serves its default date-time, 2019-08-24T14:15:22Z.
DEFAULT_START = datetime(2019, 8, 24, 14, 0, tzinfo=UTC)
DEFAULT_END = DEFAULT_START + timedelta(hours=1)


def take(pager: Pager, count: int) -> list[dict[str, Any]]:
    """The first ``count`` rows of ``pager`` (mock data never ends some pagers)."""
    return list(islice(pager, count))


def sent(recorder: ContractRecorder, method: str, path: str) -> list[dict[str, Any]]:
    """Query parameters (GET) or JSON bodies (POST) of the recorded calls to one endpoint."""
    found: list[dict[str, Any]] = []
    for exchange in recorder.exchanges:
        if exchange.method == method and exchange.path == path:
            found.append(dict(exchange.query) if method == "GET" else exchange.body)
    return found


# -- retrieve ----------------------------------------------------------------------------------


def test_health(client: ProcessorClient, recorder: ContractRecorder) -> None:
    # Regression: health() once sent only "Accept: application/json"; /health is text/plain.
    assert client.health() == {"message": "health is good"}
    recorder.assert_accepted()


@pytest.mark.parametrize(
    ("method_name", "object_id", "id_field"),
    [
        ("get_payment", "pay_contract_000001", "payment_id"),
        ("get_refund", "ref_contract_000001", "refund_id"),
        ("get_payout", "payout_contract_000001", "payout_id"),
        ("get_dispute", "dp_contract_000001", "dispute_id"),
        ("get_mandate", "man_contract_000001", "mandate_id"),
    ],
)
def test_retrieve(
    client: ProcessorClient,
    recorder: ContractRecorder,
    method_name: str,
    object_id: str,
    id_field: str,
) -> None:
    found = getattr(client, method_name)(object_id)
    assert isinstance(found.get(id_field), str)
    recorder.assert_accepted()


# -- lists -------------------------------------------------------------------------------------


def test_payments_hyperswitch_dialect(client: ProcessorClient, recorder: ContractRecorder) -> None:
    # One row per page is a full page, so the pager moves its upper bound down and asks again.
    pager = client.iter_payments(START, END, page_size=1, on_stuck="report")
    rows = take(pager, 3)
    assert rows and all(isinstance(row["payment_id"], str) for row in rows)
    recorder.assert_accepted()
    queries = sent(recorder, "GET", "/payments/list")
    assert len(queries) >= 2
    assert queries[0] == {
        "created.gte": "2022-09-10T10:00:00.000Z",
        "created.lte": "2022-09-10T11:00:00.000Z",
        "limit": "1",
    }


def test_payments_hyperswitch_dialect_full_pages(
    client: ProcessorClient, recorder: ContractRecorder
) -> None:
    assert take(client.iter_payments(START, END), 5)
    recorder.assert_accepted()
    assert sent(recorder, "GET", "/payments/list")[0]["limit"] == "100"


@pytest.mark.parametrize("prefer", [None, "example=seed"], ids=["hyperswitch-answer", "seed"])
def test_payments_seed_dialect(
    make_client: Callable[..., ProcessorClient], recorder: ContractRecorder, prefer: str | None
) -> None:
    client = make_client(prefer=prefer)
    rows = take(client.iter_payments(START, END, dialect="seed"), 5)
    assert [row["payment_id"] for row in rows] == ["pay_contract_000001"]
    recorder.assert_accepted()
    assert sent(recorder, "POST", "/payments/list")[0] == {
        "limit": 100,
        "offset": 0,
        "created_gte": "2022-09-10T10:00:00.000Z",
        "created_lte": "2022-09-10T11:00:00.000Z",
    }


@pytest.mark.parametrize("page_size", [1, 100])
@pytest.mark.parametrize(
    ("dialect", "names"),
    [("hyperswitch", ("start_time", "end_time")), ("seed", ("created_gte", "created_lte"))],
)
def test_refunds(
    client: ProcessorClient,
    recorder: ContractRecorder,
    page_size: int,
    dialect: Any,
    names: tuple[str, str],
) -> None:
    pager = client.iter_refunds(
        DEFAULT_START, DEFAULT_END, dialect=dialect, page_size=page_size, on_stuck="report"
    )
    rows = take(pager, 5)
    recorder.assert_accepted()
    assert sent(recorder, "POST", "/refunds/list")[0] == {
        "limit": page_size,
        "offset": 0,
        names[0]: "2019-08-24T14:00:00.000Z",
        names[1]: "2019-08-24T15:00:00.000Z",
    }
    if page_size == 100:  # one static row: the whole window in one answer
        assert [row["refund_id"] for row in rows] == ["string"] and pager.incomplete == []
    else:  # a full page, split into slices; the static row is outside the first slice
        assert "outside the requested" in pager.incomplete[0].reason


@pytest.mark.parametrize(("dialect", "page_size"), [("get", 1), ("get", None), ("post", None)])
def test_payouts(
    client: ProcessorClient, recorder: ContractRecorder, dialect: Any, page_size: int | None
) -> None:
    pager = client.iter_payouts(START, END, dialect=dialect, page_size=page_size, on_stuck="report")
    rows = take(pager, 3)
    assert rows and all(isinstance(row["payout_id"], str) for row in rows)
    recorder.assert_accepted()
    method = "GET" if dialect == "get" else "POST"
    first = sent(recorder, method, "/payouts/list")[0]
    assert first["start_time"] == "2022-09-10T10:00:00.000Z"
    assert str(first["limit"]) == str(page_size or (100 if dialect == "get" else 20))


def test_disputes(client: ProcessorClient, recorder: ContractRecorder) -> None:
    pager = client.iter_disputes(DEFAULT_START, DEFAULT_END, on_stuck="report")
    rows = take(pager, 5)
    assert rows and all(isinstance(row["dispute_id"], str) for row in rows)
    assert pager.incomplete == []
    recorder.assert_accepted()
    assert sent(recorder, "GET", "/disputes/list")[0] == {
        "limit": "100",
        "offset": "0",
        "start_time": "2019-08-24T14:00:00.000Z",
        "end_time": "2019-08-24T15:00:00.000Z",
    }


# -- the admin events API ----------------------------------------------------------------------


@pytest.mark.parametrize(("page_size", "is_delivered"), [(1, False), (100, None), (100, True)])
def test_events_list(
    events: EventsClient, recorder: ContractRecorder, page_size: int, is_delivered: bool | None
) -> None:
    pager = events.iter_events(
        "merchant_1668273825",
        START,
        END,
        page_size=page_size,
        is_delivered=is_delivered,
        on_stuck="report",
    )
    rows = take(pager, 5)
    assert [row["event_id"] for row in rows] == ["evt_018e31720d1b7a2b82677d3032cab959"]
    assert pager.row_errors == []
    if page_size == 1:  # a full page; the mock answers the same page at offset 1
        assert "already read" in pager.incomplete[0].reason and pager.requests == 2
    else:
        assert pager.incomplete == [] and pager.requests == 1
    recorder.assert_accepted()
    body = {
        "created_after": "2022-09-10T10:00:00.000Z",
        "created_before": "2022-09-10T11:00:00.000Z",
        "limit": page_size,
        "offset": 0,
    }
    if is_delivered is not None:
        body["is_delivered"] = is_delivered
    assert sent(recorder, "POST", "/events/merchant_1668273825")[0] == body


def test_event_attempts_and_retry(events: EventsClient, recorder: ContractRecorder) -> None:
    attempts = events.event_attempts("merchant_1668273825", "evt_018e31720d1b7a2b82677d3032cab959")
    assert attempts and all(isinstance(a["event_id"], str) for a in attempts)
    retried = events.retry_event("merchant_1668273825", "evt_018e31720d1b7a2b82677d3032cab959")
    assert isinstance(retried["response"], dict)
    recorder.assert_accepted()
    assert [(e.method, e.path) for e in recorder.exchanges] == [
        ("GET", "/events/merchant_1668273825/evt_018e31720d1b7a2b82677d3032cab959/attempts"),
        ("POST", "/events/merchant_1668273825/evt_018e31720d1b7a2b82677d3032cab959/retry"),
    ]


# -- the example shop's create payment ---------------------------------------------------------


def test_shop_create_payment_body(
    prism: PrismServer,
    recorder: ContractRecorder,
    make_client: Callable[..., ProcessorClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``examples/shop/app.py`` ``_pay``: ``POST /payments`` with the shop's body."""
    monkeypatch.setattr(shop_app, "ProcessorClient", functools.partial(_shop_client, make_client))
    order = Order(id="ord_0123456789ab", amount=1999, currency="USD")
    payment = shop_app._pay(prism.base_url, API_KEY, order, "4242424242424242")
    assert isinstance(payment.get("payment_id"), str)
    recorder.assert_accepted()
    [body] = sent(recorder, "POST", "/payments")
    assert body["payment_id"] == "pay_ord_0123456789ab" and body["amount"] == 1999


def _shop_client(
    make_client: Callable[..., ProcessorClient], base_url: str, api_key: str
) -> ProcessorClient:
    assert api_key == API_KEY
    return make_client()


# -- the contract has teeth --------------------------------------------------------------------


def test_prism_rejects_a_limit_over_100(
    client: ProcessorClient, recorder: ContractRecorder
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        client.request("GET", "/payments/list", params={"limit": 1000})
    assert caught.value.status == 422
    [problem] = recorder.problems()
    assert "limit must be <= 100" in problem


def test_prism_rejects_a_create_body_of_the_wrong_type(
    client: ProcessorClient, recorder: ContractRecorder
) -> None:
    with pytest.raises(InvalidRequest):
        client.request("POST", "/payments", json={"amount": "19.99", "currency": "USD"})
    assert any("amount must be integer" in problem for problem in recorder.problems())


def test_prism_rejects_the_response_enum_as_refund_filter(
    client: ProcessorClient, recorder: ContractRecorder
) -> None:
    body = {"start_time": "2022-09-10T10:00:00Z", "refund_status": ["succeeded"]}
    with pytest.raises(InvalidRequest):
        client.request("POST", "/refunds/list", json=body)
    assert any("refund_status.0 must be equal to one of" in p for p in recorder.problems())


def test_prism_rejects_an_events_limit_over_100(
    events: EventsClient, recorder: ContractRecorder
) -> None:
    with pytest.raises(InvalidRequest):
        events.request("POST", "/events/merchant_1", json={"limit": 101})
    assert any("limit must be <= 100" in p for p in recorder.problems())


def test_a_refund_body_mixing_both_forms_is_rejected(
    client: ProcessorClient, recorder: ContractRecorder
) -> None:
    body = {"limit": 10, "created_gte": "2022-09-10T10:00:00Z", "end_time": "2022-09-10T11:00:00Z"}
    client.request("POST", "/refunds/list", json=body)
    assert any("undeclared body field" in p for p in recorder.problems())


def test_prism_rejects_a_missing_api_key(prism: PrismServer) -> None:
    with requests.Session() as session:
        response = session.get(f"{prism.base_url}/payments/list", params={"limit": 1}, timeout=10)
    assert response.status_code == 401


def test_undeclared_query_parameter_is_rejected(
    client: ProcessorClient, recorder: ContractRecorder
) -> None:
    # Prism ignores unknown query parameters; the real server answers 400 (deny_unknown_fields),
    # so the recorder reports them: here the seed's name on Hyperswitch's GET list.
    client.request("GET", "/payments/list", params={"created_gte": "2022-09-10T10:00:00Z"})
    [problem] = recorder.problems()
    assert "undeclared query parameter 'created_gte'" in problem
    with pytest.raises(AssertionError, match="the contract rejects"):
        recorder.assert_accepted()


def test_undeclared_body_field_is_rejected(
    client: ProcessorClient, recorder: ContractRecorder
) -> None:
    body = {"limit": 10, "start_time": "2022-09-10T10:00:00Z", "created_gte": "2022-09-10"}
    client.request("POST", "/refunds/list", json=body)
    assert any("undeclared body field 'created_gte'" in p for p in recorder.problems())


def test_prism_rejects_a_payouts_post_limit_over_20(
    client: ProcessorClient, recorder: ContractRecorder
) -> None:
    body = {"limit": 21, "offset": 0, "start_time": "2022-09-10T10:00:00Z"}
    with pytest.raises(InvalidRequest):
        client.request("POST", "/payouts/list", json=body)
    assert any("limit must be <= 20" in p for p in recorder.problems())


def test_a_path_outside_the_contract_is_rejected(
    client: ProcessorClient, recorder: ContractRecorder
) -> None:
    with pytest.raises(NotFound):
        client.request("GET", "/customers/list")
    assert any("no such operation in the contract" in p for p in recorder.problems())


# -- the patch itself (no Prism) ---------------------------------------------------------------


def test_patch_leaves_the_source_alone_and_fixes_the_list_endpoints(source_spec: Path) -> None:
    original = load_spec(source_spec)
    before = repr(original["paths"]["/payments/list"])
    patched = patch_spec(original)
    assert repr(original["paths"]["/payments/list"]) == before
    listing = patched["paths"]["/payments/list"]
    names = {p["name"] for p in listing["get"]["parameters"]}
    assert {"created.gte", "created.lte", "created.gt", "created.lt"} <= names
    assert not names & {"created_gte", "created_lte"}
    schema = listing["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/PaymentListResponse"}
    assert "post" in listing
    payouts = patched["paths"]["/payouts/list"]["get"]["parameters"]
    assert not any(p["required"] for p in payouts)
    refund_filter = patched["components"]["schemas"]["RefundFilterStatus"]["enum"]
    assert "success" in refund_filter and "succeeded" not in refund_filter
    refunds_body = patched["paths"]["/refunds/list"]["post"]["requestBody"]
    forms = refunds_body["content"]["application/json"]["schema"]["anyOf"]
    assert forms == [
        {"$ref": "#/components/schemas/RefundListRequest"},
        {"$ref": "#/components/schemas/SeedRefundListRequest"},
    ]
    schemas = patched["components"]["schemas"]
    assert schemas["EventListConstraints"]["properties"]["limit"]["maximum"] == 100
    response = schemas["OutgoingWebhookResponseContent"]["properties"]["error_message"]
    assert "example" not in response
    assert (
        original["components"]["schemas"]["EventListConstraints"]["properties"]["limit"].get(
            "maximum"
        )
        is None
    )
