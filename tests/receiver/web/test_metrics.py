"""Prometheus metrics: counted where things happen, database gauges at scrape time, a closed
endpoint, and one sum across gunicorn's processes (multiprocess mode)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from receiver import Event
from receiver.core.clock import as_utc, utcnow
from receiver.core.errors import ConfigurationError
from receiver.core.signature import sign
from receiver.extension import WebhookReceiver
from receiver.testing import WebhookTestClient
from receiver.testing.factories import build_event, encode
from receiver.web.metrics import NAMES, Metrics
from receiver.worker.heartbeat import record
from tests.conftest import SECRETS, SECRETS_SPEC, AppFactory

pytestmark = pytest.mark.storage

TOKEN = "scrape-token-0123456789"
ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape(
    client: object, token: str = TOKEN
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})  # type: ignore[attr-defined]
    assert response.status_code == 200, response.data
    return samples(response.get_data(as_text=True))


def test_the_endpoint_is_closed_by_default(make_app: AppFactory) -> None:
    app, _ = make_app()
    with pytest.raises(ConfigurationError, match="closed by default"):
        Metrics(app)
    with pytest.raises(ConfigurationError, match="16 characters"):
        Metrics(app, token="short")


def test_a_scrape_needs_the_token_or_the_access_rule(make_app: AppFactory) -> None:
    app, _ = make_app()
    Metrics(app, token=TOKEN)
    client = app.test_client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    other, _ = make_app()
    Metrics(other, access=lambda: True, path="/internal/metrics")
    assert other.test_client().get("/internal/metrics").status_code == 200


def test_what_happens_is_counted(make_app: AppFactory) -> None:
    hooks = WebhookReceiver()

    @hooks.on("payment_succeeded", name="ship")
    def ship(event: Event) -> None:
        pass

    @hooks.on("payment_failed", name="notify")
    def notify(event: Event) -> None:
        raise RuntimeError("down")

    app, _ = make_app(hooks, max_attempts=1)
    Metrics(app, token=TOKEN)
    http = app.test_client()
    before = scrape(http)
    client = WebhookTestClient(app)
    paid = build_event("payment_succeeded", event_id="evt_m1", object_id="pay_m1")
    client.post(paid)
    client.post(paid)  # the processor's retry: a duplicate delivery
    client.send("payment_failed", event_id="evt_m2", object_id="pay_m2")
    client.post(b"{}", signature="0" * 128)
    mid = scrape(http)
    assert value(mid, "hookledger_queue_depth", status="pending") == 2
    assert value(mid, "hookledger_oldest_open_event_age_seconds") >= 0
    assert value(mid, "hookledger_workers_alive") == 0
    client.drain()
    client.send("payment_processing", event_id="evt_m3", object_id="pay_m1")  # stale
    client.drain()
    after = scrape(http)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("hookledger_deliveries_total", result="inserted") == 3
    assert delta("hookledger_deliveries_total", result="duplicate") == 1
    assert delta("hookledger_rejections_total", reason="bad_signature") == 1
    assert delta("hookledger_ack_seconds_count", code="200") == 4
    assert delta("hookledger_ack_seconds_count", code="401") == 1
    assert delta("hookledger_dispatch_latency_seconds_count", source="webhook") == 1
    assert (
        delta("hookledger_handler_duration_seconds_count", handler="ship", outcome="succeeded") == 1
    )
    assert delta("hookledger_handler_failures_total", handler="notify") == 1
    assert delta("hookledger_dead_letters_total") == 1
    assert delta("hookledger_guard_decisions_total", decision="stale") == 1
    assert value(after, "hookledger_dead_letter_events") == 1
    assert value(after, "hookledger_queue_depth", status="pending") == 0
    assert value(after, "hookledger_metrics_database_up") == 1
    record(
        WebhookReceiver.state(app).store.engine,
        "w1",
        started_at=utcnow(),
        processed=0,
    )
    assert value(scrape(http), "hookledger_workers_alive") == 1
    names = {n for (n, _) in after}
    for documented in NAMES:
        if not documented.startswith("hookledger_reconcile"):
            assert any(n.startswith(documented) for n in names), documented


def test_reconcile_runs_are_read_from_their_table(make_app: AppFactory) -> None:
    import json

    import sqlalchemy as sa

    import receiver.storage.database as db
    from reconcile.storage.store import RECONCILE_MIGRATIONS, ReconcileStore

    app, _ = make_app()
    Metrics(app, token=TOKEN)
    engine = WebhookReceiver.state(app).store.engine
    db.upgrade(engine, tree=RECONCILE_MIGRATIONS)
    store = ReconcileStore(engine)
    report = {
        "status": "unresolved",
        "dry_run": False,
        "kinds": {"payments": {"recovered_total": 3, "unresolved": 1}},
        "sweep": {"refunds": {"recovered_total": 2, "unresolved": 0}},
        "events": {"recovered": {"dispute_lost": 4}, "unresolved": 0},
    }
    ok = store.start_run("incremental", "test")
    store.finish_run(ok, "ok", {"status": "ok"})
    run = store.start_run("wide", "test")
    store.finish_run(run, "unresolved", report)
    found = scrape(app.test_client())
    mine = {"account": "default"}
    assert (
        value(found, "hookledger_reconcile_last_run_info", status="unresolved", mode="wide", **mine)
        == 1
    )
    assert (
        value(
            found, "hookledger_reconcile_last_run_recovered", kind="payments", path="lists", **mine
        )
        == 3
    )
    assert (
        value(
            found, "hookledger_reconcile_last_run_recovered", kind="refunds", path="sweep", **mine
        )
        == 2
    )
    assert (
        value(
            found, "hookledger_reconcile_last_run_recovered", kind="disputes", path="events", **mine
        )
        == 4
    )
    assert (
        value(found, "hookledger_reconcile_last_run_drift", kind="payments", path="lists", **mine)
        == 1
    )
    with engine.connect() as conn:
        finished = conn.execute(
            sa.text("SELECT finished_at FROM hookledger_recon_run WHERE id = :i"), {"i": ok}
        ).scalar()
    assert finished is not None
    if isinstance(finished, str):  # SQLite's text, read without the column's type
        finished = datetime.fromisoformat(finished)
    assert value(found, "hookledger_reconcile_last_success_timestamp_seconds", **mine) == (
        pytest.approx(as_utc(finished).timestamp())
    )
    assert json.dumps(report)  # the report is stored as JSON, as the reconciler does


def _runs(engine: object, account: str, *runs: tuple[str, datetime]) -> None:
    """Finished runs of ``account``: (status, finished at), oldest first."""
    from reconcile.storage.store import ReconcileStore

    for status, at in runs:
        store = ReconcileStore(engine, account=account, clock=lambda at=at: at)  # type: ignore[arg-type]
        run = store.start_run("incremental", "test")
        report = {"status": status, "kinds": {"payments": {"unresolved": 2}}}
        store.finish_run(run, status, report if status == "unresolved" else {"status": status})


def test_the_reconcile_gauges_are_per_account(make_app: AppFactory) -> None:
    """One account's success no longer hides another's failure: the last success, the
    latest run and its drift are each account's, for the accounts the installation has."""
    import receiver.storage.database as db
    from reconcile.storage.store import RECONCILE_MIGRATIONS, ReconcileStore

    app, _ = make_app(secrets="", accounts=json.dumps(TWO_ACCOUNTS))
    Metrics(app, token=TOKEN)
    engine = WebhookReceiver.state(app).store.engine
    db.upgrade(engine, tree=RECONCILE_MIGRATIONS)
    now = utcnow()
    # eu: its last success two hours ago, failing since; us: all good, drift once before.
    _runs(engine, "eu", ("ok", now - timedelta(hours=2)), ("failed", now - timedelta(hours=1)))
    _runs(engine, "us", ("unresolved", now - timedelta(minutes=20)), ("ok", now))
    # An account the installation no longer has: its runs stay, its gauges go.
    _runs(engine, "gone", ("ok", now - timedelta(days=3)))
    # Neither a dry run nor a run still going is "the latest finished run".
    _runs(engine, "eu", ("dry_run", now))
    ReconcileStore(engine, account="us").start_run("incremental", "test")
    found = scrape(app.test_client())
    success = "hookledger_reconcile_last_success_timestamp_seconds"
    assert value(found, success, account="eu") == pytest.approx(
        (now - timedelta(hours=2)).timestamp()
    )
    assert value(found, success, account="us") == pytest.approx(now.timestamp())
    assert value(found, "hookledger_reconcile_last_run_timestamp_seconds", account="eu") == (
        pytest.approx((now - timedelta(hours=1)).timestamp())
    )
    info = "hookledger_reconcile_last_run_info"
    assert value(found, info, status="failed", mode="incremental", account="eu") == 1
    assert value(found, info, status="ok", mode="incremental", account="us") == 1
    # The latest run's drift: us's earlier drift is gone with its next run.
    drift = "hookledger_reconcile_last_run_drift"
    assert value(found, drift, kind="payments", path="lists", account="us") == 0
    assert not [key for key in found if ("account", "gone") in key[1]]
    assert [key for key in found if key[0] == success] == [
        (success, (("account", "eu"),)),
        (success, (("account", "us"),)),
    ]


def test_the_reconcile_gauges_fold_accounts_past_the_cap(make_app: AppFactory) -> None:
    """Past ``HOOKLEDGER_METRICS_ACCOUNT_LABEL_MAX`` accounts share ``other``: its last
    success is the oldest of theirs (an alert on it fires for any of them), drift adds up."""
    import receiver.storage.database as db
    from reconcile.storage.store import RECONCILE_MIGRATIONS

    three = {f"a{i}": {"secrets": f"s1:whsec_a{i}_0123456789abcdef"} for i in (1, 2, 3)}
    app, _ = make_app(secrets="", accounts=json.dumps(three))
    Metrics(app, token=TOKEN, account_label_max=1)
    engine = WebhookReceiver.state(app).store.engine
    db.upgrade(engine, tree=RECONCILE_MIGRATIONS)
    now = utcnow()
    _runs(engine, "a1", ("ok", now))
    _runs(engine, "a2", ("ok", now - timedelta(hours=3)), ("unresolved", now))
    _runs(engine, "a3", ("ok", now - timedelta(hours=1)), ("unresolved", now))
    found = scrape(app.test_client())
    success = "hookledger_reconcile_last_success_timestamp_seconds"
    assert value(found, success, account="a1") == pytest.approx(now.timestamp())
    assert value(found, success, account="other") == pytest.approx(
        (now - timedelta(hours=3)).timestamp()
    )
    drift = "hookledger_reconcile_last_run_drift"
    assert value(found, drift, kind="payments", path="lists", account="other") == 4
    assert not [key for key in found if ("account", "a2") in key[1]]


def test_a_folded_account_that_never_succeeded_is_not_hidden_by_another(
    make_app: AppFactory,
) -> None:
    """``other``'s last success is the oldest of its accounts': an account among them with
    runs and never an ``ok`` one has the oldest of all (none), so ``other`` has no last
    success and HookledgerReconcileNotSucceeding's "runs, never a success" fires for it,
    as it would for the account under a label of its own."""
    import receiver.storage.database as db
    from reconcile.storage.store import RECONCILE_MIGRATIONS

    three = {f"a{i}": {"secrets": f"s1:whsec_a{i}_0123456789abcdef"} for i in (1, 2, 3)}
    app, _ = make_app(secrets="", accounts=json.dumps(three))
    Metrics(app, token=TOKEN, account_label_max=1)
    engine = WebhookReceiver.state(app).store.engine
    db.upgrade(engine, tree=RECONCILE_MIGRATIONS)
    now = utcnow()
    _runs(engine, "a1", ("ok", now))
    _runs(engine, "a2", ("failed", now - timedelta(hours=3)), ("failed", now))
    _runs(engine, "a3", ("ok", now))
    found = scrape(app.test_client())
    success = "hookledger_reconcile_last_success_timestamp_seconds"
    assert value(found, success, account="a1") == pytest.approx(now.timestamp())
    assert not [key for key in found if key[0] == success and ("account", "other") in key[1]]
    last_run = "hookledger_reconcile_last_run_timestamp_seconds"
    assert value(found, last_run, account="other") == pytest.approx(now.timestamp())


@pytest.mark.slow
def test_gunicorn_processes_add_up_in_multiprocess_mode(database_url: str, tmp_path: Path) -> None:
    import receiver.storage.database as hdb

    engine = hdb.make_engine(database_url)
    hdb.upgrade(engine)
    engine.dispose()
    metrics_dir = tmp_path / "prom"
    metrics_dir.mkdir()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        HOOKLEDGER_DATABASE_URL=database_url,
        HOOKLEDGER_SECRETS=SECRETS_SPEC,
        HOOKLEDGER_METRICS_TOKEN=TOKEN,
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        PYTHONPATH=str(ROOT),
    )
    web = subprocess.Popen(
        [
            str(BIN / "gunicorn"),
            "--workers",
            "3",
            "--bind",
            f"127.0.0.1:{port}",
            "tests.apps.opsapp:create_app()",
        ],  # fmt: skip
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(base + "/metrics", timeout=5)
                break
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        secret = SECRETS["primary"]
        for i in range(30):
            body = encode(build_event("payment_succeeded", event_id=f"evt_g{i}"))
            headers = {"X-Webhook-Signature-512": sign(body, secret)}
            assert requests.post(base + "/webhooks/", data=body, headers=headers, timeout=5).ok
        totals = set()
        for _ in range(6):  # whichever process answers the scrape, the sum is the same
            text = requests.get(
                base + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
            ).text
            totals.add(value(samples(text), "hookledger_deliveries_total", result="inserted"))
        assert totals == {30.0}
        assert len(list(metrics_dir.glob("*.db"))) >= 2  # more than one process wrote
    finally:
        web.terminate()
        web.wait(timeout=30)


TWO_ACCOUNTS = {
    "eu": {"secrets": "s1:whsec_eu_0123456789abcdef"},
    "us": {"secrets": "s1:whsec_us_fedcba9876543210"},
}


def _by_account(
    make_app: AppFactory, prefix: str = "evt_a", **config: object
) -> tuple[object, object]:
    hooks = WebhookReceiver()

    @hooks.on("payment_failed", name="notify")
    def notify(event: Event) -> None:
        raise RuntimeError("down")

    app, _ = make_app(
        hooks, max_attempts=1, secrets="", accounts=json.dumps(TWO_ACCOUNTS), **config
    )
    Metrics(app, token=TOKEN)
    for account in TWO_ACCOUNTS:
        client = WebhookTestClient(app, account=account)
        client.send("payment_succeeded", event_id=f"{prefix}1", object_id=f"{prefix}_pay_1")
        client.send("payment_failed", event_id=f"{prefix}2", object_id=f"{prefix}_pay_2")
    # A wrong signature on eu's URL (eu's rejection), and a URL of no account (nobody's).
    http = app.test_client()
    body = encode(build_event("payment_succeeded"))
    bad = {"x-webhook-signature-512": "0" * 128}
    assert http.post("/webhooks/eu/", data=body, headers=bad).status_code == 401
    assert http.post("/webhooks/asia/", data=body, headers=bad).status_code == 404
    WebhookTestClient(app, account="eu").drain()
    return app, http


def test_the_account_label_is_off_by_default(make_app: AppFactory) -> None:
    _, http = _by_account(make_app)
    found = scrape(http)
    assert not [key for key in found if any(k == "account" for k, _ in key[1])]
    assert value(found, "hookledger_dead_letters_total") >= 2


def test_the_account_label_when_on_and_its_cap(make_app: AppFactory) -> None:
    try:
        _, http = _by_account(make_app, metrics_account_label="true")
        found = scrape(http)
        for account in ("eu", "us"):
            assert (
                value(found, "hookledger_deliveries_total", result="inserted", account=account) == 2
            )
            assert value(found, "hookledger_dead_letters_total", account=account) == 1
            assert (
                value(
                    found,
                    "hookledger_dispatch_latency_seconds_count",
                    source="webhook",
                    account=account,
                )
                == 1
            )
            assert (
                value(found, "hookledger_handler_failures_total", handler="notify", account=account)
                == 1
            )
        assert (
            value(found, "hookledger_rejections_total", reason="bad_signature", account="eu") == 1
        )
        assert (
            value(found, "hookledger_rejections_total", reason="account_unknown", account="none")
            == 1
        )
        # The histograms of the answer and of each handler keep their labels.
        assert not [
            key
            for key in found
            if key[0].startswith(("hookledger_ack_seconds", "hookledger_handler_duration"))
            and any(k == "account" for k, _ in key[1])
        ]

        # One account labelled at most: the configured ones sorted, eu first; us is 'other'.
        _, http = _by_account(
            make_app, "evt_b", metrics_account_label="1", metrics_account_label_max="1"
        )
        found = scrape(http)  # the metrics are the same (the label set did not change)
        assert value(found, "hookledger_deliveries_total", result="inserted", account="eu") == 4
        assert value(found, "hookledger_deliveries_total", result="inserted", account="other") == 2
        assert value(found, "hookledger_deliveries_total", result="inserted", account="us") == 2
    finally:
        from receiver.web.metrics import configure_account_label

        configure_account_label(False)


def test_account_labels_are_bounded() -> None:
    from receiver.web.metrics import AccountLabels

    labels = AccountLabels(3, known=["b", "a"])
    assert [labels(a) for a in ("a", "b", "c", "d", None, "Not An Id")] == [
        "a",
        "b",
        "c",
        "other",
        "none",
        "other",
    ]
    assert AccountLabels(0)("a") == "other"


def test_the_alerted_rejection_reasons_start_at_zero() -> None:
    """A fresh process exports the rejection reasons the shipped alerts read at 0: a series
    that first appeared at 1 would hide that first refusal from Prometheus's increase()."""
    text = subprocess.run(
        [
            sys.executable,
            "-c",
            "from receiver.web.metrics import exposition; print(exposition(None).decode())",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    found = samples(text)
    for reason in ("bad_signature", "storage_unavailable", "storage_busy", "schema_not_ready"):
        assert ("hookledger_rejections_total", (("reason", reason),)) in found, reason
        assert value(found, "hookledger_rejections_total", reason=reason) == 0
    assert ("hookledger_dead_letters_total", ()) in found
