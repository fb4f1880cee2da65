"""No webhook secret, API key or full card number ever shows, wherever text comes out.

The main flows run with every logger at DEBUG (``caplog`` on the root logger, which also turns
on SQLAlchemy's statement logging) and a stream handler writing every record to stderr, which
``capfd`` captures with anything else written to the process's stdout/stderr:

- receiving signed events (valid, wrong and malformed signatures, credential headers);
- the worker draining an event whose handler fails until it is dead-lettered;
- the ``hookledger`` operator commands (events, requeue, replay, stats);
- the sandbox taking payments and payouts with full card numbers over HTTP, sending signed
  webhooks to the served app with corrupted signatures among them;
- reconcile runs over an API injecting 5xx, 429 and timeouts, and with a wrong key (401);
- the ``reconcile`` command;
- the API client's errors: 401, an error body, HTML, a non-JSON 200, a redirect and a list page
  that echo the key back, a refused connection, invalid keys, a key for the wrong environment.

Checked for leaks: every log record (message, arguments, extra fields, traceback), stderr and
stdout, every exception raised (``str``, ``repr`` and the formatted traceback with its causes),
every stored row of every table (``last_error``, headers, bodies, reports), the reprs of
settings, secrets, stores, clients, reconcilers, the sandbox and its parts, the CLI outputs and
the sandbox's HTTP answers.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
import requests
import sqlalchemy as sa
from click.testing import CliRunner
from flask import Flask, Response, redirect, request

import reconcile.cli.commands as reconcile_cli
from receiver import Event, WebhookReceiver
from receiver.core.signature import parse_secrets
from receiver.testing import WebhookTestClient
from receiver.testing.factories import build_event, encode
from reconcile.client.processor import ProcessorClient
from reconcile.client.transport import RetryPolicy
from reconcile.core.errors import ProcessorError
from reconcile.runtime.runner import ReconcileOptions, Reconciler
from reconcile.sandbox import ApiFaultConfig, SandboxServer, WebhookFaultConfig
from tests.conftest import SECRETS, AppFactory
from tests.reliability._inproc import (
    CARD_DECLINED,
    CARD_OK,
    CARD_OK_MASTERCARD,
    CARD_PROCESSING,
    FULL_CARD_NUMBERS,
    SANDBOX_API_KEY,
    card_payment_body,
    strict_app,
)
from tests.support import reconcile_ready, serve

pytestmark = pytest.mark.storage

WRONG_API_KEY = "snd_wrong_key_9f8e7d6c5b4a39281706"
PUBLISHABLE_KEY = "pk_snd_publishable_5e4d3c2b1a0f9e8d"
SPACED_KEY = "snd_spaced key_0a1b2c3d4e5f"
PRODUCTION_KEY = "prd_live_key_77aa88bb99cc00dd"
LOCK_WAIT = 30.0  # PostgreSQL's reconcile lock is database-wide: another test may hold it


def _card_forms(number: str) -> list[str]:
    groups = [number[i : i + 4] for i in range(0, len(number), 4)]
    return [number, " ".join(groups), "-".join(groups)]


FORBIDDEN: dict[str, str] = {
    **{f"webhook secret {k}": v for k, v in SECRETS.items()},
    "api key": SANDBOX_API_KEY,
    "wrong api key": WRONG_API_KEY,
    "publishable key": PUBLISHABLE_KEY,
    "spaced key": SPACED_KEY,
    "production key": PRODUCTION_KEY,
    **{f"card {form}": form for card in FULL_CARD_NUMBERS for form in _card_forms(card)},
}


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _exception_text(exc: BaseException) -> str:
    return "\n".join(
        [
            str(exc),
            repr(exc),
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        ]
    )


@dataclass
class Evidence:
    """Every text the flows produced, by where it came from; :meth:`check` ends a test."""

    caplog: pytest.LogCaptureFixture
    capfd: pytest.CaptureFixture[str]
    texts: list[tuple[str, str]] = field(default_factory=list)

    def add(self, where: str, value: Any) -> None:
        self.texts.append((where, _text(value)))

    def obj(self, where: str, value: Any) -> None:
        self.add(f"repr({where})", repr(value))
        self.add(f"str({where})", str(value))

    def raised(self, where: str, call: Callable[[], object]) -> BaseException:
        """Run ``call``, which must raise; keep the exception's texts."""
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - any exception's text is evidence
            self.add(f"exception from {where}", _exception_text(exc))
            return exc
        raise AssertionError(f"{where} did not raise")

    def database(self, where: str, engine: sa.Engine) -> None:
        """Every row of every table, every column."""
        metadata = sa.MetaData()
        metadata.reflect(engine)
        with engine.connect() as conn:
            for table in metadata.sorted_tables:
                for row in conn.execute(sa.select(table)):
                    self.add(f"{where}.{table.name}", " | ".join(_text(v) for v in row))

    def leaks(self) -> list[str]:
        found = []
        for where, text in self.texts:
            for name, secret in FORBIDDEN.items():
                if secret in text:
                    at = text.index(secret)
                    found.append(f"{name} in {where}: ...{text[max(at - 80, 0) : at + 40]!r}")
        return found

    def check(self) -> None:
        """Add the captured logs, stdout and stderr; fail on any leak anywhere."""
        for record in self.caplog.records:
            self.add(f"caplog {record.name}", self.caplog.handler.format(record))
        out, err = self.capfd.readouterr()
        self.add("stdout", out)
        self.add("stderr", err)
        assert any(where.startswith("log ") for where, _ in self.texts), "nothing was logged"
        assert any(where == "stderr" and text for where, text in self.texts), "no stderr"
        leaks = self.leaks()
        assert not leaks, "\n".join(leaks[:20])


class _Everything(logging.Handler):
    """Keeps every record rendered with all its fields, as a structured formatter would."""

    def __init__(self, evidence: Evidence) -> None:
        super().__init__(logging.DEBUG)
        self.evidence = evidence
        self.formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")

    def emit(self, record: logging.LogRecord) -> None:
        rendered = self.format(record)
        fields = {k: v for k, v in vars(record).items() if k not in ("exc_info", "exc_text")}
        self.evidence.add(f"log {record.name}", f"{rendered}\n{fields!r}")


@pytest.fixture
def evidence(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> Iterator[Evidence]:
    """Every logger at DEBUG, every record kept and also written to stderr."""
    found = Evidence(caplog, capfd)
    caplog.set_level(logging.DEBUG)
    # Libraries that set their own level (SQLAlchemy: WARN) go to DEBUG too, which turns on
    # SQLAlchemy's statement and parameter logging. caplog restores every level afterwards.
    for name, known in list(logging.root.manager.loggerDict.items()):
        if isinstance(known, logging.Logger) and known.level != logging.NOTSET:
            caplog.set_level(logging.DEBUG, logger=name)
    root = logging.getLogger()
    everything = _Everything(found)
    stream = logging.StreamHandler(sys.stderr)
    stream.setLevel(logging.DEBUG)
    stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.addHandler(everything)
    root.addHandler(stream)
    try:
        yield found
    finally:
        root.removeHandler(everything)
        root.removeHandler(stream)


def _receiver_app(make_app: AppFactory) -> Flask:
    hooks = WebhookReceiver()

    @hooks.on("payment_succeeded", name="ok")
    def ok(event: Event) -> None:
        pass

    @hooks.on("payment_succeeded", "refund_succeeded", name="fails")
    def fails(event: Event) -> None:
        raise RuntimeError(f"the ledger refused {event.event_id}")

    @hooks.on_any(name="reads")
    def reads(event: Event) -> None:
        repr(event)
        repr(event.object)

    app, _ = make_app(hooks, max_attempts=2)
    return strict_app(app)


def _cli(app: Flask, evidence: Evidence, *args: str) -> None:
    result = app.test_cli_runner().invoke(args=list(args))
    evidence.add(f"hookledger {' '.join(args)}", result.output)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        evidence.add(f"hookledger {' '.join(args)} exception", _exception_text(result.exception))
    assert result.exit_code == 0, (args, result.output)


def test_receive_worker_and_operator_commands_show_no_secret(
    make_app: AppFactory, evidence: Evidence
) -> None:
    app = _receiver_app(make_app)
    state = WebhookReceiver.state(app)
    client = app.test_client()
    hooks = WebhookTestClient(app)
    credentials = {
        "Authorization": f"Bearer {SANDBOX_API_KEY}",
        "api-key": SANDBOX_API_KEY,
        "Cookie": f"session={SECRETS['primary']}",
        "Proxy-Authorization": f"Basic {SECRETS['previous']}",
    }
    bodies = [
        encode(build_event("payment_succeeded", object_id=f"pay_s{i}", event_id=f"evt_s{i}"))
        for i in range(3)
    ]
    sent = [
        hooks.post(bodies[0], headers=credentials),
        hooks.post(bodies[1], sign_with=SECRETS["previous"]),
        hooks.post(bodies[2], sign_with="a-secret-the-app-does-not-know"),
        hooks.post(bodies[2], signature="0" * 128),
        hooks.post(bodies[2], signature=SECRETS["primary"]),  # a confused sender: secret as is
        client.post("/webhooks/", data=bodies[2], headers=credentials),
        hooks.post(b"{not json", headers=credentials),
        hooks.send("refund_succeeded", object_id="ref_s1", payment_id="pay_s0"),
    ]
    assert [r.status_code for r in sent] == [200, 200, 401, 401, 401, 401, 400, 200]
    for response in sent:
        evidence.add("receive response", response.get_data())
    # Handlers fail on every attempt: the events end dead-lettered with their last error.
    hooks.drain()
    _cli(app, evidence, "hookledger", "events", "--json")
    _cli(app, evidence, "hookledger", "events", "--status", "dead")
    _cli(app, evidence, "hookledger", "requeue", "--status", "dead", "--dry-run", "--json")
    _cli(app, evidence, "hookledger", "requeue", "--status", "dead")
    hooks.drain()
    _cli(app, evidence, "hookledger", "replay", "--type", "payment_succeeded", "--json")
    _cli(app, evidence, "hookledger", "replay", "--event-id", "evt_s0")
    hooks.drain()
    _cli(app, evidence, "hookledger", "stats", "--json")
    _cli(app, evidence, "hookledger", "stats")
    _cli(app, evidence, "hookledger", "db", "current")
    dead = state.store.operations.get("evt_s0")
    assert dead is not None and dead.status == "dead" and dead.last_error
    assert "RuntimeError" in dead.last_error
    for name, value in [
        ("settings", state.settings),
        ("secrets", state.settings.secrets),
        ("parsed secrets", parse_secrets(",".join(f"{k}:{v}" for k, v in SECRETS.items()))),
        ("state", state),
        ("store", state.store),
        ("registry", state.registry),
        ("worker", state.worker(name="repr")),
        ("test client", hooks),
        ("receiver", app.extensions),
        ("stored event", dead),
        ("handler runs", state.store.operations.handler_runs(dead.id or 0)),
    ]:
        evidence.obj(name, value)
    evidence.database("db", state.store.engine)
    evidence.check()


def _payout_body(card: str, amount: int) -> dict[str, Any]:
    return {
        "amount": amount,
        "currency": "USD",
        "payout_type": "card",
        "auto_fulfill": True,
        "payout_method_data": {
            "card": {
                "card_number": card,
                "expiry_month": "12",
                "expiry_year": "2030",
                "card_holder_name": "Rel Iability",
            }
        },
    }


def test_sandbox_client_and_reconcile_show_no_secret_or_card_number(
    make_app: AppFactory, evidence: Evidence
) -> None:
    app = _receiver_app(make_app)
    state = WebhookReceiver.state(app)
    engine = state.store.engine

    reconcile_ready(engine)
    database_url = str(state.settings.database_url)
    with (
        serve(app) as base,
        SandboxServer(
            SANDBOX_API_KEY,
            webhook_url=base + "/webhooks/",
            webhook_secret=SECRETS["primary"],
            retry_schedule=[0.05],
            seed=5,
        ) as server,
    ):
        sandbox = server.sandbox
        sandbox.faults.configure(
            webhooks=WebhookFaultConfig(corrupt_signature=0.3, duplicate=0.3, drop=0.2)
        )
        api = requests.Session()
        api.headers["api-key"] = SANDBOX_API_KEY

        def call(method: str, path: str, **kwargs: Any) -> requests.Response:
            response = api.request(method, server.base_url + path, timeout=10, **kwargs)
            evidence.add(f"sandbox {method} {path} -> {response.status_code}", response.text)
            return response

        cards = (CARD_OK, CARD_OK_MASTERCARD, CARD_DECLINED, CARD_PROCESSING, "4000000000000002")
        for i, card in enumerate(cards):
            body = card_payment_body(f"pay_card_{i}", card, amount=5000 + i)
            assert call("POST", "/payments", json=body).status_code == 200
            call("GET", f"/payments/pay_card_{i}")
        # Rejected card data: the error must not echo it.
        bad = card_payment_body("pay_card_bad", "4242424242424241")
        assert call("POST", "/payments", json=bad).status_code == 400
        expired = card_payment_body("pay_card_expired", "4000000000000069")
        call("POST", "/payments", json=expired)
        for i, card in enumerate((CARD_OK, "4000000000000002")):
            call("POST", "/payouts/create", json=_payout_body(card, 1000 + i))
        call("POST", "/refunds", json={"payment_id": "pay_card_0", "amount": 1000})
        sandbox.tick()
        assert sandbox.flush_webhooks(15)
        evidence.add("sandbox events", repr(sandbox.events()))
        evidence.add("sandbox stats", repr(sandbox.stats()))
        for name, value in [
            ("sandbox server", server),
            ("sandbox", sandbox),
            ("webhook dispatcher", sandbox.webhooks),
            ("faults", sandbox.faults),
            ("sandbox webhook events", sandbox.webhooks.events()),
        ]:
            evidence.obj(name, value)
        api.close()
        WebhookTestClient(app).drain()

        # Reconcile over a faulty API: every retry and give-up path logs.
        sandbox.faults.configure(
            api=ApiFaultConfig(
                error_rate=0.3,
                rate_limit=0.15,
                rate_limit_reset_seconds=1,
                timeout=0.15,
                timeout_seconds=0.6,
                error_after_processing=0.1,
            )
        )
        patient = ProcessorClient(
            server.base_url,
            SANDBOX_API_KEY,
            read_timeout=0.25,
            retry=RetryPolicy(max_attempts=25, base_delay=0.001, max_delay=5.0),
            sleep=lambda _s: None,
        )
        hasty = ProcessorClient(
            server.base_url,
            SANDBOX_API_KEY,
            read_timeout=0.25,
            retry=RetryPolicy(max_attempts=1),
        )
        wrong = ProcessorClient(server.base_url, WRONG_API_KEY)
        try:
            options = ReconcileOptions(page_size=2, lock_wait=LOCK_WAIT)
            for client in (patient, hasty, wrong):
                reconciler = Reconciler(client, state.store)
                report = reconciler.run(options)
                evidence.add("reconcile report", repr(report.as_dict()))
                evidence.obj("reconciler", reconciler)
                evidence.obj("client", client)
                evidence.obj("retry policy", client.retry)
            assert report.kinds["payments"].remote_errors, "the wrong key should fail"
            evidence.raised("get_payment with a wrong key", lambda: wrong.get_payment("pay_card_0"))
            evidence.raised(
                "get_payment with no retries",
                lambda: [hasty.get_payment("pay_card_1") for _ in "x" * 20],
            )
        finally:
            for client in (patient, hasty, wrong):
                client.close()
        sandbox.faults.reset()

        # The reconcile command, with the right and with a wrong key.
        runner = CliRunner()
        # A wrong key is the processor refusing: exit 4. With the right key, 1: drift found
        # (the payments whose handler "fails" was dead-lettered are not in sync).
        for key, expected_exit in ((SANDBOX_API_KEY, 1), (WRONG_API_KEY, 4)):
            env = {
                "HOOKLEDGER_DATABASE_URL": database_url,
                "HOOKLEDGER_PROCESSOR_URL": server.base_url,
                "HOOKLEDGER_API_KEY": key,
                "HOOKLEDGER_RECONCILE_LOOKBACK_HOURS": "1",
            }
            for args in (
                ["-vv", "run", "--json", "--wait", "30"],
                ["run", "--dry-run"],
                ["report"],
            ):
                result = runner.invoke(reconcile_cli.cli, args, env=env)
                evidence.add(f"reconcile {args}", result.output)
                if result.exception is not None and not isinstance(result.exception, SystemExit):
                    evidence.add("reconcile exception", _exception_text(result.exception))
                if args[-1] == "30":
                    assert result.exit_code == expected_exit, result.output
    evidence.database("db", engine)
    evidence.check()


def _echo_app() -> Flask:
    """A "processor" that puts the api-key it receives into every kind of answer."""
    app = Flask("echo_processor")

    @app.route("/<path:rest>", methods=["GET", "POST"])
    def echo(rest: str) -> Any:
        key = request.headers.get("api-key", "")
        if rest.startswith("json500"):
            error = {"type": f"server {key}", "code": key, "message": f"key {key} broke us"}
            return {"error": error}, 500
        if rest.startswith("au401"):
            return {"error": {"type": "invalid_request", "code": "AU_01", "message": key}}, 401
        if rest.startswith("html403"):
            return f"<html><body><h1>Forbidden</h1><p>{key}</p></body></html>", 403
        if rest.startswith("text200") or rest == "health":
            return Response(f"plain {key} text", 200, mimetype="text/plain")
        if rest.startswith("redirect"):
            return redirect(f"http://elsewhere.invalid/login?key={key}")
        if rest.startswith("rl429"):
            return {"error": {"message": f"slow down {key}"}}, 429, {"Retry-After": "99999"}
        if rest.startswith("payments/list"):  # a row whose creation time is the key
            row = {"payment_id": "pay_1", "created": key, "status": key}
            return {"size": 1, "data": [row], "total_count": key}
        if rest.startswith("id/payments/list"):  # a row whose id is the key (known bug)
            return {"size": 1, "data": [{"payment_id": key, "created": "x"}]}
        return {"error": {"code": "HE_02", "message": f"no {rest} for {key}"}}, 404

    return app


def test_api_client_errors_show_no_key(evidence: Evidence) -> None:
    with serve(_echo_app()) as base:
        client = ProcessorClient(
            base, SANDBOX_API_KEY, retry=RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=1.0)
        )
        try:
            for path in ("/json500", "/au401", "/html403", "/text200", "/redirect", "/rl429", "/x"):
                error = evidence.raised(f"GET {path}", partial(client.request, "GET", path))
                assert isinstance(error, ProcessorError)
            evidence.add("health", repr(client.health()))
            now = datetime.now(UTC)
            evidence.raised(
                "payments list",
                lambda: list(client.iter_payments(now - timedelta(hours=1), now, page_size=1)),
            )
            evidence.obj("client", client)
        finally:
            client.close()
    refused = ProcessorClient(
        "http://127.0.0.1:9", SANDBOX_API_KEY, retry=RetryPolicy(max_attempts=2, base_delay=0.0)
    )
    evidence.raised("connection refused", lambda: refused.get_payment("pay_1"))
    refused.close()
    for name, make in [
        ("publishable key", lambda: ProcessorClient(base, PUBLISHABLE_KEY)),
        ("key with a space", lambda: ProcessorClient(base, SPACED_KEY)),
        (
            "sandbox key on production",
            lambda: ProcessorClient("https://api.hyperswitch.io", SANDBOX_API_KEY),
        ),
        ("production key over http", lambda: ProcessorClient("http://example.com", PRODUCTION_KEY)),
        (
            "production key, sandbox env",
            lambda: ProcessorClient(base, PRODUCTION_KEY, environment="sandbox"),
        ),
        ("unprefixed key", lambda: ProcessorClient(base, "key_" + SANDBOX_API_KEY)),
    ]:
        evidence.raised(name, make)
    evidence.check()


def test_paging_error_does_not_quote_a_remote_id() -> None:
    # Regression: PagingError texts once quoted the remote row's id (here an echoed key).
    with serve(_echo_app()) as base:
        client = ProcessorClient(base + "/id", SANDBOX_API_KEY)
        now = datetime.now(UTC)
        try:
            list(client.iter_payments(now - timedelta(hours=1), now, page_size=1))
        except ProcessorError as exc:
            assert SANDBOX_API_KEY not in _exception_text(exc)
        finally:
            client.close()
