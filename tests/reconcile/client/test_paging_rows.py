"""Schema-valid rows that paging cannot use are per-row problems, never the end of a listing.

Regressions of a fuzz run: a lone surrogate in an id, ``metadata`` nested very deep
(``RecursionError`` in the client's JSON decoding) and ``created`` in year 9999
(``OverflowError`` in paging) each ended a reconciliation run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from reconcile.client.list_endpoints import payments_pager, refunds_pager
from reconcile.client.paging import MAX_ROW_ERRORS, RowProblem, format_timestamp
from reconcile.client.processor import ProcessorClient
from reconcile.core.errors import escape_id, id_defect
from tests.reconcile.client._fakeapi import FakeProcessor, Misbehaviour, Scripted, iso_ms, to_us

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
START = T0 - timedelta(hours=1)
END = T0 + timedelta(hours=2)
IN_WINDOW = iso_ms(to_us(T0 + timedelta(minutes=5)))

LISTINGS: dict[str, tuple[str, str, Callable[..., Any]]] = {
    "payments-get": ("payment_id", "created", lambda c, **kw: c.iter_payments(START, END, **kw)),
    "payments-seed": (
        "payment_id",
        "created",
        lambda c, **kw: c.iter_payments(START, END, dialect="seed", **kw),
    ),
    "refunds": ("refund_id", "created_at", lambda c, **kw: c.iter_refunds(START, END, **kw)),
    "payouts-get": ("payout_id", "created", lambda c, **kw: c.iter_payouts(START, END, **kw)),
    "payouts-post": (
        "payout_id",
        "created",
        lambda c, **kw: c.iter_payouts(START, END, dialect="post", **kw),
    ),
    "disputes": ("dispute_id", "created_at", lambda c, **kw: c.iter_disputes(START, END, **kw)),
}
KIND_OF = {
    "payments-get": "payments",
    "payments-seed": "payments",
    "refunds": "refunds",
    "payouts-get": "payouts",
    "payouts-post": "payouts",
    "disputes": "disputes",
}


def _bad_rows(id_field: str, created_field: str) -> list[tuple[Any, str, str | None]]:
    """(row, the RowProblem kind, its escaped object_id) for each way a row can be unusable."""

    def row(row_id: Any, created: Any = IN_WINDOW) -> dict[str, Any]:
        return {id_field: row_id, created_field: created, "status": "succeeded"}

    return [
        (["not", "an", "object"], "not_an_object", None),
        ("a string row", "not_an_object", None),
        (None, "not_an_object", None),
        (42, "not_an_object", None),
        ({created_field: IN_WINDOW}, "missing_id", None),
        (row(None), "missing_id", None),
        (row(""), "missing_id", None),
        (row(12345), "bad_id", "12345"),
        (row({"nested": "id"}), "bad_id", "<dict>"),
        (row(True), "bad_id", "True"),
        (row("pay_\x00nul"), "bad_id", "pay_\\x00nul"),
        (row("pay_\ud800lone"), "bad_id", "pay_\\ud800lone"),
        (row("pay_\x1b[31mred"), "bad_id", "pay_\\x1b[31mred"),
        (row("pay_\u200bzero_width"), "bad_id", "pay_\\u200bzero_width"),
        (row("pay_\u2028line"), "bad_id", "pay_\\u2028line"),
        (row("   "), "bad_id", "   "),
        (row("x" * 256), "bad_id", "x" * 79 + "…"),
        (row("pay_no_time", None), "bad_created", "pay_no_time"),
        (row("pay_bad_time", "yesterday"), "bad_created", "pay_bad_time"),
        (row("pay_num_time", 1714564800), "bad_created", "pay_num_time"),
        (row("pay_far", "9999-12-31T23:59:59-05:00"), "bad_created", "pay_far"),
        (row("pay_before_1", "0001-01-01T00:00:00+05:00"), "bad_created", "pay_before_1"),
        (row("pay_huge_text", "2024-05-01T12:00:00" + "0" * 10_000), "bad_created", None),
        ({id_field: "pay_no_field"}, "bad_created", "pay_no_field"),
    ]


@pytest.mark.parametrize("name", LISTINGS)
def test_unusable_rows_are_skipped_and_recorded(
    fake: FakeProcessor, client: ProcessorClient, name: str
) -> None:
    id_field, created_field, make = LISTINGS[name]
    expected = fake.add_many(KIND_OF[name], "in_", 30, T0, timedelta(seconds=7))
    bad = _bad_rows(id_field, created_field)
    served: list[bool] = []

    def once(path: str, bounds: Any, rows: list[Any]) -> list[Any]:
        # Appended to the last (short) page only: offsets stay those of the server's rows.
        if served or len(rows) >= (20 if name == "payouts-post" else 100):
            return []
        served.append(True)
        return [row for row, _, _ in bad]

    fake.misbehave = Misbehaviour(extra_rows=once)
    pager = make(client, on_stuck="report")
    rows = list(pager)

    assert sorted(row[id_field] for row in rows) == sorted(expected)
    assert pager.incomplete == []
    assert pager.row_error_count == len(bad) == len(pager.row_errors)
    for problem, (_, kind, object_id) in zip(pager.row_errors, bad, strict=True):
        assert isinstance(problem, RowProblem)
        assert problem.kind == kind
        if object_id is not None or kind in ("not_an_object", "missing_id"):
            assert problem.object_id == object_id
        assert problem.reason and problem.reason.isprintable()
        assert "\x00" not in problem.reason and "\ud800" not in problem.reason
    with pytest.raises(AttributeError):
        pager.row_errors[0].kind = "other"  # frozen


def test_row_problem_reasons_name_the_field_but_not_the_raw_value(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    fake.misbehave = Misbehaviour(
        extra_rows=lambda path, bounds, rows: [
            {"payment_id": "pay_\x00secret", "created": IN_WINDOW},
            {"payment_id": "pay_ok", "created": "not \x00 a time"},
        ]
    )
    pager = client.iter_payments(START, END, on_stuck="report")
    assert list(pager) == []
    first, second = pager.row_errors
    assert first.reason == "'payment_id' contains NUL"
    assert second.reason == "'created' is not an ISO 8601 timestamp"


def test_row_errors_are_capped_but_counted(fake: FakeProcessor) -> None:
    start = datetime.now(UTC) - timedelta(hours=1)
    fake.misbehave = Misbehaviour(
        has_more=True,
        total=lambda n: 10**9,
        extra_rows=lambda path, bounds, rows: [{"created": IN_WINDOW}] * 100,
    )
    pager = payments_pager(
        fake.fetch, start, start, dialect="seed", on_stuck="report", max_requests=15
    )
    assert list(pager) == []
    assert pager.row_error_count == 1500 and len(pager.row_errors) == MAX_ROW_ERRORS
    assert "budget" in pager.incomplete[0].reason


# -- JSON that json.loads cannot decode ---------------------------------------------------------


def _deep(depth: int) -> str:
    return '{"k":' * depth + '"bottom"' + "}" * depth


def _walk(value: Any, key: str) -> tuple[int, Any]:
    depth = 0
    while isinstance(value, dict) and key in value:
        value, depth = value[key], depth + 1
    return depth, value


@pytest.mark.parametrize("name", ["payments-get", "payments-seed", "refunds", "disputes"])
def test_a_row_with_metadata_100k_deep_is_yielded_as_it_is(
    fake: FakeProcessor, client: ProcessorClient, name: str
) -> None:
    id_field, created_field, make = LISTINGS[name]

    def row(row_id: str, metadata: str = "{}") -> str:
        return (
            f'{{"{id_field}":"{row_id}","{created_field}":"{IN_WINDOW}",'
            f'"status":"succeeded","metadata":{metadata}}}'
        )

    data = ",".join([row("normal_1"), row("deep_1", _deep(100_000)), row("normal_2")])
    if name == "disputes":
        body = f"[{data}]"
    elif name == "payments-seed":
        body = f'{{"data":[{data}],"total_count":3,"has_more":false}}'
    else:
        body = f'{{"count":3,"total_count":3,"data":[{data}]}}'
    fake.script(Scripted(200, {"Content-Type": "application/json"}, body))

    pager = make(client, on_stuck="report")
    rows = list(pager)

    assert [r[id_field] for r in rows] == ["normal_1", "deep_1", "normal_2"]
    assert _walk(rows[1]["metadata"], "k") == (100_000, "bottom")
    assert pager.row_errors == [] and pager.incomplete == []


def test_an_error_body_nested_deep_is_still_a_typed_error(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    from reconcile.core.errors import InvalidRequest

    body = '{"error":{"type":"invalid_request","code":"IR_06","message":"no"},"x":' + _deep(50_000)
    fake.script(Scripted(400, {}, body + "}"))
    with pytest.raises(InvalidRequest) as caught:
        client.get_payment("pay_1")
    assert caught.value.code == "IR_06"


def test_invalid_utf8_and_lone_surrogate_escapes_decode(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    body = (
        b'{"size":3,"data":['
        b'{"payment_id":"pay_\xff\xfe","created":"2024-05-01T12:05:00.000Z"},'
        b'{"payment_id":"pay_\\ud800","created":"2024-05-01T12:05:00.000Z"},'
        b'{"payment_id":"pay_ok","created":"2024-05-01T12:05:00.000Z",'
        b'"metadata":{"note":"\\udc00 lone","big":' + b"9" * 5000 + b"}}"
        b"]}"
    )
    fake.script(Scripted(200, {"Content-Type": "application/json"}, body))
    pager = client.iter_payments(START, END, on_stuck="report")
    rows = list(pager)
    assert [r["payment_id"] for r in rows] == ["pay_\ufffd\ufffd", "pay_ok"]
    assert rows[1]["metadata"]["note"] == "\udc00 lone"
    assert rows[1]["metadata"]["big"] == int("9" * 4000) * 10**1000 + int("9" * 1000)
    [problem] = pager.row_errors
    assert (problem.kind, problem.object_id) == ("bad_id", "pay_\\ud800")


# -- the ends of time -------------------------------------------------------------------------

MIN = datetime.min.replace(tzinfo=UTC)
MAX = datetime.max.replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("start", "end", "instant"),
    [
        (MAX - timedelta(minutes=1), MAX, "9999-12-31T23:59:59.999Z"),
        (MIN, MIN + timedelta(minutes=1), "0001-01-01T00:00:00.000Z"),
        (
            datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
            MIN + timedelta(minutes=1),
            "0001-01-01T00:00:00.000Z",
        ),
        (
            MAX - timedelta(minutes=1),
            datetime(9999, 12, 31, 23, 59, tzinfo=timezone(-timedelta(hours=5))),
            "9999-12-31T23:59:59.999Z",
        ),
    ],
    ids=["year-9999", "year-1", "year-0-utc", "year-10000-utc"],
)
@pytest.mark.parametrize("dialect", ["hyperswitch", "seed"])
def test_windows_and_rows_at_the_ends_of_time(
    fake: FakeProcessor, start: datetime, end: datetime, instant: str, dialect: Any
) -> None:
    """A crowded instant at year 1 or 9999: every ± 1 ms is clamped, nothing overflows."""
    when = to_us(datetime.fromisoformat(instant))
    for i in range(15):
        fake.add("payments", f"pay_{i:02d}", when)
    pager = payments_pager(fake.fetch, start, end, dialect=dialect, page_size=10, on_stuck="report")
    got = {row["payment_id"] for row in pager}
    assert pager.row_errors == []
    if dialect == "seed":
        assert len(got) == 15 and pager.incomplete == []
    else:
        assert len(got) == 10 and len(pager.incomplete) == 1
        window = pager.incomplete[0]
        assert MIN <= window.start <= window.end <= MAX


def test_format_timestamp_at_the_ends_of_time() -> None:
    assert format_timestamp(MIN) == "0001-01-01T00:00:00.000Z"
    assert format_timestamp(MAX) == "9999-12-31T23:59:59.999Z"
    assert format_timestamp(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))) == (
        "0001-01-01T00:00:00.000Z"
    )


def test_time_slices_at_the_end_of_time(fake: FakeProcessor) -> None:
    when = to_us(datetime.fromisoformat("9999-12-31T23:59:59.999Z"))
    for i in range(25):
        fake.add("refunds", f"ref_{i:02d}", when - i * 10)
    pager = refunds_pager(fake.fetch, MAX - timedelta(days=3650), MAX, page_size=10)
    assert len({row["refund_id"] for row in pager}) == 25


# -- escape_id and id_defect -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("pay_123", "pay_123"),
        ("pay_\x00", "pay_\\x00"),
        ("a\\b", "a\\\\b"),
        ("\ud800\udfff", "\\ud800\\udfff"),
        ("\x7f\x9f\xad", "\\x7f\\x9f\\xad"),
        ("tag\U000e0001", "tag\\U000e0001"),
        ("línea\u2028", "línea\\u2028"),
        ("emoji 😀", "emoji 😀"),
        (None, "None"),
        (12, "12"),
        (1.5, "1.5"),
        (False, "False"),
        ({"a": 1}, "<dict>"),
        ([1], "<list>"),
    ],
)
def test_escape_id(value: Any, rendered: str) -> None:
    assert escape_id(value) == rendered
    assert escape_id(value).isprintable()
    escape_id(value).encode("utf-8")


def test_escape_id_of_a_huge_integer() -> None:
    assert escape_id(10**5000) == "<int of 16610 bits>"


def test_escape_id_is_bounded_and_never_cuts_an_escape() -> None:
    assert escape_id("x" * 80) == "x" * 80
    assert escape_id("x" * 81) == "x" * 79 + "…"
    assert escape_id("x" * 10**7, 20) == "x" * 19 + "…"
    cut = escape_id("ab" + "\x00" * 50, 10)
    assert cut == "ab\\x00…"  # "ab\\x00\\x00…" would be 11
    with pytest.raises(ValueError):
        escape_id("x", 1)


@pytest.mark.parametrize(
    ("value", "defect"),
    [
        ("pay_1", None),
        ("pay 1", None),
        ("é", None),
        ("", "is empty"),
        (" ", "is blank"),
        ("a\x00", "contains NUL"),
        ("a\udfff", "contains a lone surrogate"),
        ("a\n", "contains a control character"),
        ("a\x85", "contains a control character"),
        ("a\u200b", "contains a non-printable character"),
        ("a" * 255, None),
        ("a" * 256, "is longer than 255 characters"),
        (7, "is a number, not a string"),
        (None, "is null, not a string"),
    ],
)
def test_id_defect(value: Any, defect: str | None) -> None:
    assert id_defect(value) == defect


def test_an_echoed_api_key_never_reaches_row_problems_or_logs(
    fake: FakeProcessor, client: ProcessorClient, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.reconcile.client._fakeapi import API_KEY

    caplog.set_level(logging.DEBUG)
    fake.misbehave = Misbehaviour(
        extra_rows=lambda path, bounds, rows: [
            {"payment_id": API_KEY, "created": API_KEY},
            {"payment_id": f"pay_{API_KEY}\x00", "created": IN_WINDOW},
        ]
    )
    pager = client.iter_payments(START, END, on_stuck="report")
    assert list(pager) == []
    assert [problem.object_id for problem in pager.row_errors] == [
        "[api-key]",
        "pay_[api-key]\\x00",
    ]
    assert API_KEY not in repr(pager.row_errors) and API_KEY not in caplog.text
