"""The admin events API client: listing, attempts, manual retry, the admin key, the 90 days."""

from __future__ import annotations

import logging
import socket
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reconcile.client.events_api import EventsClient
from reconcile.core.errors import (
    AuthenticationError,
    EnvironmentMismatch,
    InvalidApiKey,
    InvalidRequest,
    NotFound,
    PagingError,
    RateLimited,
    ServerError,
    TransportError,
)
from tests.reconcile.client._fakeapi import (
    ADMIN_KEY,
    API_KEY,
    NOW,
    FakeProcessor,
    Misbehaviour,
    Scripted,
    Sleeps,
)
from tests.reconcile.client._fakeapi import error_body as _error_body

MakeEvents = Callable[..., EventsClient]

TODAY = datetime.fromtimestamp(NOW, UTC)  # 2023-11-14T22:13:20Z
START = TODAY - timedelta(days=2)
END = TODAY


def _seed(fake: FakeProcessor, count: int = 250) -> tuple[list[str], list[str]]:
    """``count`` undelivered and 20 delivered events over the last day."""
    undelivered = [
        fake.add_event(f"evt_{i:04d}", TODAY - timedelta(minutes=5 * i)).id for i in range(count)
    ]
    delivered = [
        fake.add_event(f"evt_ok_{i:02d}", TODAY - timedelta(minutes=3 * i), delivered=True).id
        for i in range(20)
    ]
    return undelivered, delivered


def test_lists_undelivered_events_by_offset_with_the_admin_key(
    fake: FakeProcessor, events: EventsClient
) -> None:
    undelivered, _ = _seed(fake)
    pager = events.iter_events("merchant_1", START, END)
    got = Counter(row["event_id"] for row in pager)
    assert set(got) == set(undelivered) and set(got.values()) == {1}
    assert (pager.pages, pager.requests, pager.incomplete, pager.row_errors) == (3, 3, [], [])
    sent = [seen for seen in fake.seen if seen.path == "/events/merchant_1"]
    assert [seen.method for seen in sent] == ["POST"] * 3
    assert [seen.body["offset"] for seen in sent] == [0, 100, 200]
    assert sent[0].body == {
        "created_after": "2023-11-12T22:13:20.000Z",
        "created_before": "2023-11-14T22:13:20.000Z",
        "limit": 100,
        "offset": 0,
        "is_delivered": False,
    }
    headers = {k.lower(): v for k, v in sent[0].headers.items()}
    assert headers["api-key"] == ADMIN_KEY


@pytest.mark.parametrize(("is_delivered", "count"), [(True, 20), (None, 270)])
def test_is_delivered_filter(
    fake: FakeProcessor, events: EventsClient, is_delivered: bool | None, count: int
) -> None:
    _seed(fake)
    rows = list(events.iter_events("merchant_1", START, END, is_delivered=is_delivered))
    assert len(rows) == count
    body = fake.seen[-1].body
    assert ("is_delivered" in body) is (is_delivered is not None)


def test_new_events_pushing_rows_down_are_skipped_by_event_id(
    fake: FakeProcessor, events: EventsClient
) -> None:
    undelivered, _ = _seed(fake)
    made: list[str] = []

    def newest(fake: FakeProcessor, path: str, rows: list[Any]) -> None:
        if len(made) < 5:
            made.append(fake.add_event(f"evt_new_{len(made)}", TODAY - timedelta(seconds=1)).id)

    fake.after_list = newest
    got = Counter(row["event_id"] for row in events.iter_events("merchant_1", START, END))
    assert set(undelivered) <= set(got) and set(got.values()) == {1}


def test_the_pager_checks_apply(fake: FakeProcessor, events: EventsClient) -> None:
    _seed(fake)
    fake.misbehave = Misbehaviour(ignore_offset=True)
    pager = events.iter_events("merchant_1", START, END, on_stuck="report", max_requests=50)
    assert len(list(pager)) == 100
    assert pager.requests == 2
    assert "already read" in pager.incomplete[0].reason
    with pytest.raises(ValueError, match="between 1 and 100"):
        events.iter_events("merchant_1", START, END, page_size=101)


# -- the 90 days ---------------------------------------------------------------------------------


def test_the_earliest_listable_time_is_midnight_ninety_days_back(events: EventsClient) -> None:
    assert events.earliest_listable() == datetime(2023, 8, 16, tzinfo=UTC)


def test_near_midnight_the_earliest_is_a_day_later(make_events: MakeEvents) -> None:
    late = datetime(2023, 11, 14, 23, 30, tzinfo=UTC).timestamp()
    client = make_events(clock=lambda: late)
    assert client.earliest_listable() == datetime(2023, 8, 17, tzinfo=UTC)


def test_a_window_older_than_ninety_days_is_refused(events: EventsClient) -> None:
    with pytest.raises(ValueError, match="only the last 90 days.*2023-08-16T00:00:00.000Z"):
        events.iter_events("merchant_1", TODAY - timedelta(days=200), TODAY - timedelta(days=95))


def test_a_window_reaching_back_too_far_is_clamped_and_reported(
    fake: FakeProcessor, events: EventsClient
) -> None:
    undelivered, _ = _seed(fake, 10)
    earliest = events.earliest_listable()
    pager = events.iter_events("merchant_1", TODAY - timedelta(days=365), END, on_stuck="report")
    [clipped] = pager.incomplete  # known before the first request
    assert (clipped.start, clipped.end) == (
        TODAY - timedelta(days=365),
        earliest - timedelta(milliseconds=1),
    )
    assert "only the last 90 days" in clipped.reason
    assert sorted(row["event_id"] for row in pager) == sorted(undelivered)
    assert fake.seen[-1].body["created_after"] == "2023-08-16T00:00:00.000Z"
    assert len(pager.incomplete) == 1


def test_in_raise_mode_the_clipped_part_raises_after_the_events(
    fake: FakeProcessor, events: EventsClient
) -> None:
    undelivered, _ = _seed(fake, 10)
    rows: list[dict[str, Any]] = []
    with pytest.raises(PagingError, match="only the last 90 days") as caught:
        for row in events.iter_events("merchant_1", TODAY - timedelta(days=365), END):
            rows.append(row)
    assert sorted(row["event_id"] for row in rows) == sorted(undelivered)
    assert caught.value.end == datetime(2023, 8, 15, 23, 59, 59, 999000, tzinfo=UTC)


# -- attempts and retry ------------------------------------------------------------------------


def test_event_attempts(fake: FakeProcessor, events: EventsClient) -> None:
    fake.add_event("evt_1", TODAY)
    [attempt] = events.event_attempts("merchant_1", "evt_1")
    assert attempt["event_id"] == "evt_1" and attempt["delivery_attempt"] == "initial_attempt"
    assert fake.seen[-1].method == "GET"
    assert fake.seen[-1].raw_uri == "/events/merchant_1/evt_1/attempts"


def test_retry_event(fake: FakeProcessor, events: EventsClient) -> None:
    fake.add_event("evt_1", TODAY)
    attempt = events.retry_event("merchant_1", "evt_1")
    assert attempt["delivery_attempt"] == "manual_retry"
    assert fake.retried == ["evt_1"]
    assert (fake.seen[-1].method, fake.seen[-1].raw_uri) == (
        "POST",
        "/events/merchant_1/evt_1/retry",
    )
    assert [a["delivery_attempt"] for a in events.event_attempts("merchant_1", "evt_1")] == [
        "initial_attempt",
        "manual_retry",
    ]


def _server_error(status: int = 500) -> Scripted:
    return Scripted(status, body=_error_body("api_error", "HE_00", "Something went wrong"))


@pytest.mark.parametrize("status", [500, 502, 503])
def test_retry_event_is_not_repeated_after_a_server_error(
    fake: FakeProcessor, events: EventsClient, sleeps: Sleeps, status: int
) -> None:
    fake.add_event("evt_1", TODAY)
    fake.script(_server_error(status))
    with pytest.raises(ServerError):
        events.retry_event("merchant_1", "evt_1")
    assert len([s for s in fake.seen if s.path.endswith("/retry")]) == 1 and sleeps == []
    # A read is retried as usual.
    fake.script(_server_error(status))
    assert events.event_attempts("merchant_1", "evt_1")
    assert len(sleeps) == 1


def test_retry_event_is_not_repeated_after_a_read_timeout(
    fake: FakeProcessor, make_events: MakeEvents, sleeps: Sleeps
) -> None:
    fake.add_event("evt_1", TODAY)
    client = make_events(read_timeout=0.2)
    fake.script(Scripted(200, body={"late": True}, delay=0.6))
    with pytest.raises(TransportError):
        client.retry_event("merchant_1", "evt_1")
    assert len(fake.seen) == 1 and sleeps == []


def test_retry_event_is_repeated_after_a_429(
    fake: FakeProcessor, events: EventsClient, sleeps: Sleeps
) -> None:
    fake.add_event("evt_1", TODAY)
    fake.script(
        Scripted(429, {"Retry-After": "2"}, _error_body("rate_limit_error", "RL_01", "slow"))
    )
    assert events.retry_event("merchant_1", "evt_1")["delivery_attempt"] == "manual_retry"
    assert sleeps == [2.0] and fake.retried == ["evt_1"]
    fake.script(
        *[Scripted(429, {"Retry-After": "1"}, _error_body("rate_limit_error", "RL_01", "x"))] * 3
    )
    with pytest.raises(RateLimited):
        events.retry_event("merchant_1", "evt_1")


def test_retry_event_is_repeated_when_no_connection_was_made(
    make_events: MakeEvents, sleeps: Sleeps
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: connections are refused
    client = make_events(base_url=f"http://127.0.0.1:{port}")
    with pytest.raises(TransportError):
        client.retry_event("merchant_1", "evt_1")
    assert len(sleeps) == 2


# -- keys, environments, ids -------------------------------------------------------------------


@pytest.mark.parametrize("key", [API_KEY, "prd_live_key", "pk_snd_publishable", "", "admin key"])
def test_only_an_admin_key_is_accepted(make_events: MakeEvents, key: str) -> None:
    with pytest.raises(InvalidApiKey) as caught:
        make_events(admin_api_key=key)
    if key:
        assert key not in str(caught.value)


def test_the_environment_is_required_and_checked(fake: FakeProcessor) -> None:
    with pytest.raises(TypeError):
        EventsClient(fake.base_url, ADMIN_KEY)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        EventsClient(fake.base_url, ADMIN_KEY, environment="staging")  # type: ignore[arg-type]
    with pytest.raises(EnvironmentMismatch, match="https"):
        EventsClient("http://example.com", ADMIN_KEY, environment="production")
    with pytest.raises(EnvironmentMismatch):
        EventsClient("https://api.hyperswitch.io", ADMIN_KEY, environment="sandbox")
    with pytest.raises(EnvironmentMismatch):
        EventsClient("https://sandbox.hyperswitch.io", ADMIN_KEY, environment="production")
    EventsClient("https://api.hyperswitch.io", ADMIN_KEY, environment="production").close()


def test_a_merchant_key_is_refused_by_the_server_too(
    fake: FakeProcessor, make_events: MakeEvents, sleeps: Sleeps
) -> None:
    fake.admin_key = "ANOTHER_ADMIN_KEY"
    with pytest.raises(AuthenticationError):
        list(make_events().iter_events("merchant_1", START, END))
    assert sleeps == []


def test_the_admin_key_never_reaches_reprs_errors_or_logs(
    fake: FakeProcessor, events: EventsClient, caplog: pytest.LogCaptureFixture
) -> None:
    fake.echo_key_in_errors = True
    fake.admin_key = "SOMETHING_ELSE"
    caplog.set_level(logging.DEBUG)
    with pytest.raises(AuthenticationError) as caught:
        events.event_attempts("merchant_1", "evt_1")
    assert ADMIN_KEY not in str(caught.value) and ADMIN_KEY not in repr(caught.value)
    assert "[api-key]" in str(caught.value)
    assert ADMIN_KEY not in repr(events) and "***" in repr(events)
    assert ADMIN_KEY not in caplog.text


@pytest.mark.parametrize("bad", ["", ".", "..", "evt\x00", "evt\ud800", "e" * 300])
def test_ids_in_paths_must_be_clean_and_are_never_quoted_raw(
    events: EventsClient, bad: str
) -> None:
    for call in (
        lambda: events.event_attempts("merchant_1", bad),
        lambda: events.retry_event(bad, "evt_1"),
        lambda: events.iter_events(bad, START, END),
    ):
        with pytest.raises(ValueError) as caught:
            call()
        if bad.strip("."):
            assert bad not in str(caught.value)


def test_path_segments_are_quoted(fake: FakeProcessor, events: EventsClient) -> None:
    with pytest.raises(InvalidRequest):  # the fake decodes %2F and finds no such route
        list(events.iter_events("mer chant/1", START, END))
    assert fake.seen[-1].raw_uri == "/events/mer%20chant%2F1"
    with pytest.raises(NotFound):
        events.event_attempts("merchant_1", "evt?x=1#y")
    assert fake.seen[-1].raw_uri == "/events/merchant_1/evt%3Fx%3D1%23y/attempts"
