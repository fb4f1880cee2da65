"""The processor API client: headers, typed errors, retries, rate limits, environments, secrecy."""

from __future__ import annotations

import logging
import pickle
import random
import socket
from collections.abc import Callable
from typing import Any

import pytest
import requests

from receiver.core.errors import ConfigurationError, HookledgerError
from reconcile.client.processor import ProcessorClient, environment_of_key
from reconcile.client.transport import RetryPolicy
from reconcile.core.errors import (
    ApiError,
    AuthenticationError,
    EnvironmentMismatch,
    InvalidApiKey,
    InvalidRequest,
    NotFound,
    ProcessorError,
    RateLimited,
    ServerError,
    TransportError,
)
from tests.reconcile.client._fakeapi import (
    API_KEY,
    NOW,
    FakeProcessor,
    Scripted,
    Sleeps,
    error_body,
)

MakeClient = Callable[..., ProcessorClient]


def _server_error(status: int = 500) -> Scripted:
    return Scripted(status, body=error_body("api_error", "HE_00", "Something went wrong"))


# -- requests and answers ----------------------------------------------------------------------


def test_sends_key_json_headers_and_user_agent(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    fake.add("payments", "pay_1", 1_000_000)
    assert client.get_payment("pay_1")["payment_id"] == "pay_1"
    headers = {k.lower(): v for k, v in fake.seen[-1].headers.items()}
    assert headers["api-key"] == API_KEY
    assert headers["content-type"] == "application/json"
    assert headers["accept"] == "application/json"
    assert headers["user-agent"].startswith("hookledger/")


def test_retrieves_each_kind_and_quotes_ids(fake: FakeProcessor, client: ProcessorClient) -> None:
    for kind, obj_id in [
        ("payments", "pay_1"),
        ("refunds", "ref_1"),
        ("payouts", "po_1"),
        ("disputes", "dp_1"),
    ]:
        fake.add(kind, obj_id, 1_000_000)
    assert client.get_payment("pay_1")["payment_id"] == "pay_1"
    assert client.get_refund("ref_1")["refund_id"] == "ref_1"
    assert client.get_payout("po_1")["payout_id"] == "po_1"
    assert client.get_dispute("dp_1")["dispute_id"] == "dp_1"
    with pytest.raises(InvalidRequest):  # the fake decodes %2F and finds no such route
        client.get_payment("../refunds/ref_1")
    assert fake.seen[-1].raw_uri == "/payments/..%2Frefunds%2Fref_1"
    with pytest.raises(ValueError):
        client.get_payment("")


def test_mandates_and_get_object(fake: FakeProcessor, client: ProcessorClient) -> None:
    fake.add("mandates", "man_1", 1_000_000, status="active")
    assert client.get_mandate("man_1")["mandate_id"] == "man_1"
    assert fake.seen[-1].raw_uri == "/mandates/man_1"
    for kind, obj_id, field in [
        ("payment", "pay_1", "payment_id"),
        ("refund", "ref_1", "refund_id"),
        ("payout", "po_1", "payout_id"),
        ("dispute", "dp_1", "dispute_id"),
        ("mandate", "man_1", "mandate_id"),
    ]:
        fake.add(f"{kind}s", obj_id, 1_000_000)
        assert client.get_object(kind, obj_id)[field] == obj_id  # type: ignore[arg-type]
        assert fake.seen[-1].raw_uri == f"/{kind}s/{obj_id}"
    with pytest.raises(NotFound):
        client.get_object("mandate", "man_missing")
    with pytest.raises(ValueError, match="kind must be one of payment, refund"):
        client.get_object("customer", "cus_1")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", " ", ".", "..", "pay\x00", "pay\ud800", "p" * 256, 12])
def test_unclean_ids_are_refused_before_sending_and_not_quoted(
    fake: FakeProcessor, client: ProcessorClient, bad: Any
) -> None:
    with pytest.raises(ValueError) as caught:
        client.get_object("payment", bad)
    if isinstance(bad, str) and bad.strip(". "):
        assert bad not in str(caught.value)
    assert fake.seen == []


def test_health_accepts_plain_text(client: ProcessorClient) -> None:
    assert client.health() == {"message": "health is good"}


def test_not_found_is_typed(client: ProcessorClient, sleeps: Sleeps) -> None:
    with pytest.raises(NotFound) as caught:
        client.get_refund("ref_missing")
    error = caught.value
    assert (error.status, error.type, error.code) == (404, "invalid_request", "IR_05")
    assert error.message == "Refund does not exist"
    assert "HTTP 404 IR_05" in str(error) and "GET /refunds/ref_missing" in str(error)
    assert isinstance(error, ApiError | ProcessorError | HookledgerError)
    assert sleeps == []


def test_invalid_request_is_not_retried(
    fake: FakeProcessor, client: ProcessorClient, sleeps: Sleeps
) -> None:
    fake.script(Scripted(400, body=error_body("invalid_request", "IR_04", "bad value")))
    with pytest.raises(InvalidRequest) as caught:
        client.get_payment("pay_1")
    assert (caught.value.status, caught.value.code, caught.value.message) == (
        400,
        "IR_04",
        "bad value",
    )
    assert len(fake.seen) == 1 and sleeps == []


@pytest.mark.parametrize(
    ("status", "code"), [(401, "AU_01"), (401, "AU_02"), (403, "HE_00"), (400, "AU_01")]
)
def test_authentication_errors_are_never_retried(
    fake: FakeProcessor, client: ProcessorClient, sleeps: Sleeps, status: int, code: str
) -> None:
    fake.script(Scripted(status, body=error_body("authentication_error", code, "no")))
    with pytest.raises(AuthenticationError) as caught:
        client.get_payment("pay_1")
    assert (caught.value.status, caught.value.code) == (status, code)
    assert len(fake.seen) == 1 and sleeps == []


def test_wrong_key_gets_au01_once(
    fake: FakeProcessor, make_client: MakeClient, sleeps: Sleeps
) -> None:
    client = make_client(api_key="snd_wrong_key_0000")
    with pytest.raises(AuthenticationError) as caught:
        client.get_payment("pay_1")
    assert caught.value.code == "AU_01" and caught.value.type == "authentication_error"
    assert len(fake.seen) == 1 and sleeps == []


def test_redirects_are_not_followed(fake: FakeProcessor, client: ProcessorClient) -> None:
    fake.script(Scripted(302, headers={"Location": "http://127.0.0.1:9/steal"}))
    with pytest.raises(ApiError) as caught:
        client.get_payment("pay_1")
    assert type(caught.value) is ApiError and caught.value.status == 302
    assert len(fake.seen) == 1


def test_a_2xx_that_is_not_json_is_an_api_error(
    fake: FakeProcessor, client: ProcessorClient
) -> None:
    fake.script(Scripted(200, body="<html>captive portal</html>"))
    with pytest.raises(ApiError, match="not JSON"):
        client.get_payment("pay_1")


# -- retries -------------------------------------------------------------------------------------


def test_5xx_are_retried_with_full_jitter_backoff(
    fake: FakeProcessor, client: ProcessorClient, sleeps: Sleeps
) -> None:
    fake.add("payments", "pay_1", 1_000_000)
    fake.script(_server_error(500), _server_error(502))
    assert client.get_payment("pay_1")["payment_id"] == "pay_1"
    assert len(fake.seen) == 3
    assert len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.5 and 0 <= sleeps[1] <= 1.0
    # Regression: a retry once went out without the api-key header (a shadowed variable).
    for seen in fake.seen:
        sent = {k.lower(): v for k, v in seen.headers.items()}
        assert sent.get("api-key") == client_key(client)


def test_5xx_give_up_after_max_attempts(
    fake: FakeProcessor, client: ProcessorClient, sleeps: Sleeps
) -> None:
    fake.script(_server_error(503), _server_error(503), _server_error(503), _server_error(503))
    with pytest.raises(ServerError) as caught:
        client.get_payment("pay_1")
    assert caught.value.status == 503 and caught.value.code == "HE_00"
    assert len(fake.seen) == 3 and len(sleeps) == 2


def test_ce01_is_a_retryable_server_error(
    fake: FakeProcessor, make_client: MakeClient, sleeps: Sleeps
) -> None:
    client = make_client(retry=RetryPolicy(max_attempts=2))
    unavailable = error_body("connector_error", "CE_01", "processor unavailable")
    fake.script(Scripted(400, body=unavailable), Scripted(400, body=unavailable))
    with pytest.raises(ServerError) as caught:
        client.get_payment("pay_1")
    assert caught.value.code == "CE_01" and len(fake.seen) == 2 and len(sleeps) == 1


class _Extreme(random.Random):
    """An rng whose ``random()`` is always ``value``: jitter at its bound."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(("value", "expected"), [(1.0, [1, 2, 4, 5, 5]), (0.0, [0] * 5)])
def test_backoff_doubles_up_to_the_cap(
    fake: FakeProcessor,
    make_client: MakeClient,
    sleeps: Sleeps,
    value: float,
    expected: list[float],
) -> None:
    policy = RetryPolicy(max_attempts=6, base_delay=1.0, max_delay=5.0)
    client = make_client(retry=policy, rng=_Extreme(value))
    fake.script(*[_server_error() for _ in range(6)])
    with pytest.raises(ServerError):
        client.get_payment("pay_1")
    assert sleeps == expected
    assert len(fake.seen) == 6


def test_backoff_is_jittered_within_bounds() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay=0.5, max_delay=3.0)
    rng = random.Random(7)
    for retry in range(1, 10):
        ceiling = min(3.0, 0.5 * 2 ** (retry - 1))
        assert policy.backoff_ceiling(retry) == ceiling
        draws = [policy.backoff(retry, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in draws)
        assert max(draws) - min(draws) > ceiling / 2  # full jitter, not a fixed delay


def test_retry_policy_is_a_frozen_validated_value() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.base_delay, policy.max_delay) == (3, 0.5, 30.0)
    with pytest.raises(AttributeError):
        policy.max_attempts = 5  # type: ignore[misc]
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base_delay=-1)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_connection_refused_is_retried_then_a_transport_error(
    make_client: MakeClient, sleeps: Sleeps
) -> None:
    client = make_client(base_url=f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(TransportError) as caught:
        client.get_payment("pay_1")
    assert isinstance(caught.value.__cause__, requests.ConnectionError)
    assert caught.value.retryable
    assert len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.5 and 0 <= sleeps[1] <= 1.0


def test_read_timeout_is_retried(
    fake: FakeProcessor, make_client: MakeClient, sleeps: Sleeps
) -> None:
    fake.add("payments", "pay_1", 1_000_000)
    client = make_client(read_timeout=0.2)
    fake.script(Scripted(200, body={"late": True}, delay=0.6))
    assert client.get_payment("pay_1")["payment_id"] == "pay_1"
    assert len(sleeps) == 1


def test_timeouts_give_up_after_max_attempts(
    fake: FakeProcessor, make_client: MakeClient, sleeps: Sleeps
) -> None:
    client = make_client(read_timeout=0.2, retry=RetryPolicy(max_attempts=2))
    late = Scripted(200, body={"late": True}, delay=0.5)
    fake.script(late, late)
    with pytest.raises(TransportError) as caught:
        client.get_payment("pay_1")
    assert isinstance(caught.value.__cause__, requests.Timeout)
    assert len(sleeps) == 1


# -- rate limits -----------------------------------------------------------------------------


def _rate_limited(headers: dict[str, str]) -> Scripted:
    return Scripted(429, headers, error_body("rate_limit_error", "RL_01", "rate limit exceeded"))


def test_429_waits_until_the_reset_time(
    fake: FakeProcessor, client: ProcessorClient, sleeps: Sleeps
) -> None:
    fake.add("payments", "pay_1", 1_000_000)
    fake.script(
        _rate_limited(
            {
                "X-RateLimit-Limit": "60",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": "1700000007",
            }
        )
    )
    assert client.get_payment("pay_1")["payment_id"] == "pay_1"
    assert sleeps == [7.0]


def test_429_reset_in_the_past_retries_at_once(
    fake: FakeProcessor, client: ProcessorClient, sleeps: Sleeps
) -> None:
    fake.add("payments", "pay_1", 1_000_000)
    fake.script(_rate_limited({"X-RateLimit-Reset": str(int(NOW) - 5)}))
    client.get_payment("pay_1")
    assert sleeps == [0.0]


def test_429_falls_back_to_retry_after(
    fake: FakeProcessor, client: ProcessorClient, sleeps: Sleeps
) -> None:
    fake.add("payments", "pay_1", 1_000_000)
    fake.script(_rate_limited({"Retry-After": "3"}))
    client.get_payment("pay_1")
    assert sleeps == [3.0]


def test_429_beyond_max_delay_raises_without_sleeping(
    fake: FakeProcessor, client: ProcessorClient, sleeps: Sleeps
) -> None:
    fake.script(_rate_limited({"X-RateLimit-Reset": str(int(NOW) + 120)}))
    with pytest.raises(RateLimited) as caught:
        client.get_payment("pay_1")
    assert caught.value.reset_at == NOW + 120
    assert caught.value.status == 429 and caught.value.code == "RL_01"
    assert "limit resets at 2023-11-14T22:15:20+00:00" in str(caught.value)
    assert sleeps == [] and len(fake.seen) == 1


def test_429_counts_toward_attempts(
    fake: FakeProcessor, client: ProcessorClient, sleeps: Sleeps
) -> None:
    fake.script(*[_rate_limited({"X-RateLimit-Reset": str(int(NOW) + 2)}) for _ in range(3)])
    with pytest.raises(RateLimited):
        client.get_payment("pay_1")
    assert sleeps == [2.0, 2.0] and len(fake.seen) == 3


# -- bodies that are not the error document ----------------------------------------------------


def test_html_error_pages_become_a_short_safe_message(
    fake: FakeProcessor, make_client: MakeClient
) -> None:
    client = make_client(retry=RetryPolicy(max_attempts=1))
    page = (
        "<html><head><style>body{color:red}</style><script>alert('x')</script></head>"
        "<body><h1>502 Bad Gateway</h1>" + "<p>nginx</p>" * 200 + "</body></html>"
    )
    fake.script(Scripted(502, {"Content-Type": "text/html"}, page))
    with pytest.raises(ServerError) as caught:
        client.get_payment("pay_1")
    error = caught.value
    assert error.code is None and error.type is None and error.status == 502
    assert error.message.startswith("502 Bad Gateway nginx")
    assert (
        "<" not in error.message and "alert" not in error.message and "color" not in error.message
    )
    assert len(error.message) <= 200


def test_api_errors_survive_pickling() -> None:
    error = RateLimited(
        "slow down", status=429, code="RL_01", reset_at=NOW, method="GET", path="/x"
    )
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is RateLimited
    assert (copy.status, copy.code, copy.reset_at, copy.message) == (429, "RL_01", NOW, "slow down")
    assert str(copy) == str(error)


# -- environments --------------------------------------------------------------------------------


def test_environment_comes_from_the_key_prefix(make_client: MakeClient) -> None:
    assert make_client().environment == "sandbox"
    assert make_client(api_key="prd_live_0001").environment == "production"
    assert make_client(api_key="dev_local_0001", environment="sandbox").environment == "sandbox"
    assert environment_of_key("snd_x") == "sandbox" and environment_of_key("xyz_1") is None


@pytest.mark.parametrize("key", ["pk_snd_abc123", "pk_prd_abc123", "admin_abc123"])
def test_publishable_and_admin_keys_are_refused(make_client: MakeClient, key: str) -> None:
    with pytest.raises(InvalidApiKey, match="secret key") as caught:
        make_client(api_key=key)
    assert isinstance(caught.value, ConfigurationError)
    assert key not in str(caught.value)


@pytest.mark.parametrize("key", ["", "snd_with space", "snd_new\nline", "dev_no_prefix"])
def test_unusable_keys_are_refused(make_client: MakeClient, key: str) -> None:
    with pytest.raises(InvalidApiKey) as caught:
        make_client(api_key=key)
    assert not key or key not in str(caught.value)


@pytest.mark.parametrize(
    ("base_url", "key", "environment"),
    [
        (None, API_KEY, "production"),
        (None, "prd_live_0001", "sandbox"),
        ("https://sandbox.hyperswitch.io", "prd_live_0001", None),
        ("https://api.hyperswitch.io", API_KEY, None),
        ("http://payments.example.com", "prd_live_0001", None),
    ],
)
def test_environment_mismatch_is_refused_at_construction(
    make_client: MakeClient, base_url: str | None, key: str, environment: str | None
) -> None:
    options: dict[str, Any] = {"api_key": key, "environment": environment}
    if base_url is not None:
        options["base_url"] = base_url
    with pytest.raises(EnvironmentMismatch) as caught:
        make_client(**options)
    assert key not in str(caught.value)


def test_matching_hosts_are_accepted(make_client: MakeClient) -> None:
    assert make_client(base_url="https://sandbox.hyperswitch.io/").base_url == (
        "https://sandbox.hyperswitch.io"
    )
    prod = make_client(base_url="https://api.hyperswitch.io", api_key="prd_live_0001")
    assert prod.environment == "production"


# -- secrecy ---------------------------------------------------------------------------------------


def test_repr_shows_url_and_environment_but_not_the_key(client: ProcessorClient) -> None:
    text = repr(client)
    assert API_KEY not in text
    assert client.base_url in text and "sandbox" in text and "snd_***" in text


def test_the_key_never_reaches_errors_or_logs(
    fake: FakeProcessor,
    make_client: MakeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.echo_key_in_errors = True
    fake.add("payments", "pay_1", 1_000_000)
    wrong_key = "snd_WRONGKEY_5e1d9c3b7a2f"
    errors: list[BaseException] = []

    with pytest.raises(AuthenticationError) as caught:
        make_client(api_key=wrong_key).get_payment("pay_1")
    errors.append(caught.value)
    assert "[api-key]" in caught.value.message

    fake.script(
        Scripted(500, body=error_body("api_error", "HE_00", f"boom {API_KEY}")),
        Scripted(502, body=f"<h1>bad gateway for {API_KEY}</h1>"),
        Scripted(503, body=f"upstream said {API_KEY}"),
    )
    client = make_client()
    with pytest.raises(ServerError) as server_error:
        client.get_payment("pay_1")
    errors.append(server_error.value)
    assert client.get_payment("pay_1")["payment_id"] == "pay_1"
    list(client.iter_payments(*_window()))

    closed = make_client(base_url=f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(TransportError) as transport:
        closed.get_payment("pay_1")
    errors.append(transport.value)

    for error in errors:
        for text in (str(error), repr(error), str(error.__cause__), repr(error.__cause__)):
            assert API_KEY not in text and wrong_key not in text
    records = [r for r in caplog.records if r.name.startswith("reconcile")]
    assert any(r.levelno == logging.DEBUG and "attempt" in r.getMessage() for r in records)
    for record in caplog.records:
        assert API_KEY not in record.getMessage() and wrong_key not in record.getMessage()
    assert API_KEY not in caplog.text and wrong_key not in caplog.text


def test_debug_log_lines_name_method_path_status_attempt(
    fake: FakeProcessor, client: ProcessorClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="reconcile.client")
    fake.add("payments", "pay_1", 1_000_000)
    fake.script(_server_error(500))
    client.get_payment("pay_1")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert lines[0].startswith("GET /payments/pay_1 -> 500 (attempt 1, ")
    assert lines[1].startswith("GET /payments/pay_1 -> 200 (attempt 2, ")
    assert all(line.endswith(" ms)") for line in lines)


# -- lifecycle -----------------------------------------------------------------------------------


def test_owned_sessions_are_closed_and_passed_sessions_are_not(
    fake: FakeProcessor, make_client: MakeClient
) -> None:
    class Recording(requests.Session):
        closed = 0

        def close(self) -> None:
            type(self).closed += 1
            super().close()

    shared = Recording()
    try:
        with make_client(session=shared) as client:
            assert client.health() == {"message": "health is good"}
        assert Recording.closed == 0
    finally:
        shared.close()
    assert Recording.closed == 1

    with make_client() as client:
        owned = client._session
        owned.__class__ = Recording
    assert Recording.closed == 2


def _window() -> tuple[Any, Any]:
    from datetime import UTC, datetime

    return datetime(1970, 1, 1, tzinfo=UTC), datetime(1970, 1, 2, tzinfo=UTC)


def client_key(client: ProcessorClient) -> str:
    return str(client._headers["api-key"])
