"""The shipped rules in a real Prometheus (Debian's ``prometheus``, started here on a loopback
port with its data in a temporary folder): it scrapes the example shop's ``/metrics``
(gunicorn, two processes, multiprocess mode) with the bearer token as the README shows, and
a worker's ``--metrics-port``, under one job. A payment for an order the shop never wrote
is deferred past its limit and dead-lettered: HookledgerDeadLetters fires, and nothing else.

The rules are loaded from a copy of the shipped file whose ``for:`` durations are 10 s
(``rules_files.with_for``, which changes nothing else): the expressions are the shipped ones.
10 s, not less: one scrape slower than its timeout on a loaded machine is ``up == 0`` once,
which must not fire HookledgerTargetDown here any more than in production.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests

from receiver.alerts import RULES_FILE
from receiver.testing import build_event, encode, signed_headers
from tests.conftest import SECRETS, SECRETS_SPEC
from tests.receiver.alerts.rules_files import alerts, tool, with_for

pytestmark = [pytest.mark.storage, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
TOKEN = "alerts-e2e-token-0123456789"
APP = "examples.shop.app:create_app"
T = TypeVar("T")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(what: str, check: Callable[[], T | None], timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except requests.RequestException:
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


@contextmanager
def _process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _api(base: str, path: str) -> Any:
    answer = requests.get(base + path, timeout=5)
    answer.raise_for_status()
    body = answer.json()
    assert body["status"] == "success", body
    return body["data"]


def test_a_dead_letter_fires_in_a_real_prometheus(database_url: str, tmp_path: Path) -> None:
    prometheus = tool("prometheus")
    web_port, worker_port, prom_port = _port(), _port(), _port()
    multiproc = tmp_path / "prom-multiproc"
    multiproc.mkdir()
    env = dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
        HOOKLEDGER_DATABASE_URL=database_url,
        HOOKLEDGER_SECRETS=SECRETS_SPEC,
        HOOKLEDGER_METRICS_TOKEN=TOKEN,
        # A handler's "not yet" past its limit is a dead letter at once (a day by default).
        HOOKLEDGER_DEFER_LIMIT="0",
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    init = subprocess.run(
        ["flask", "--app", APP, "init-db"], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert init.returncode == 0, init.stderr
    _a_reconcile_run(database_url)
    rules = tmp_path / "hookledger.rules.yml"
    rules.write_text(with_for(RULES_FILE.read_text(), "10s"))
    (tmp_path / "token").write_text(TOKEN)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [{rules}]
scrape_configs:
  - job_name: shop
    authorization:
      credentials_file: {tmp_path / "token"}
    static_configs:
      - targets: ["127.0.0.1:{web_port}"]
      - targets: ["127.0.0.1:{worker_port}"]
"""
    )
    web_env = dict(env, PROMETHEUS_MULTIPROC_DIR=str(multiproc))
    web_cmd = ["gunicorn", "--workers", "2", "--bind", f"127.0.0.1:{web_port}", f"{APP}()"]
    worker_cmd = ["hookledger", "--app", APP, "worker", "--metrics-port", str(worker_port)]
    prom_cmd = [
        prometheus,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
    ]
    web = f"http://127.0.0.1:{web_port}"
    prom = f"http://127.0.0.1:{prom_port}"
    with (
        _process(web_cmd, web_env, tmp_path / "web.log"),
        _process(worker_cmd, env, tmp_path / "worker.log"),
    ):
        # The web's /metrics wants the token; the worker is alive (its heartbeat read there).
        _until("the web process", lambda: requests.get(web + "/webhooks/health", timeout=1).ok)
        assert requests.get(web + "/metrics", timeout=5).status_code == 401
        _until(
            "a worker heartbeat",
            lambda: (
                "hookledger_workers_alive 1.0"
                in requests.get(
                    web + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
                ).text
            ),
        )
        with _process(prom_cmd, env, tmp_path / "prometheus.log"):
            try:
                _scrape_evaluate_and_fire(prom, web)
            except AssertionError:
                for log in ("prometheus", "web", "worker"):
                    sys.stderr.write(f"--- {log}.log\n")
                    sys.stderr.write((tmp_path / f"{log}.log").read_text(errors="replace")[-3000:])
                raise


def _scrape_evaluate_and_fire(prom: str, web: str) -> None:
    _until("prometheus", lambda: requests.get(prom + "/-/ready", timeout=1).ok)
    # Both targets scraped under one job, the web with the token.
    targets = _until(
        "both targets up",
        lambda: (
            found
            if len(found := _api(prom, "/api/v1/targets")["activeTargets"]) == 2
            and all(t["health"] == "up" for t in found)
            else None
        ),
    )
    assert {t["labels"]["job"] for t in targets} == {"shop"}
    # Every shipped rule loaded and evaluated without error.
    names = {a.name for a in alerts()}

    def evaluated() -> list[dict[str, Any]] | None:
        rules = [r for g in _api(prom, "/api/v1/rules")["groups"] for r in g["rules"]]
        return rules if rules and all(r["health"] == "ok" for r in rules) else None

    rules = _until("the rules evaluated", evaluated)
    assert {r["name"] for r in rules} == names
    # The metrics the rules read are there, from these processes.
    for metric in (
        "hookledger_workers_alive",
        "hookledger_oldest_open_event_age_seconds",
        "hookledger_dead_letter_events",
        "hookledger_dead_letters_total",
        "hookledger_metrics_database_up",
        'hookledger_rejections_total{reason="bad_signature"}',
        'hookledger_rejections_total{reason="storage_unavailable"}',
        'hookledger_rejections_total{reason="storage_busy"}',
        'hookledger_reconcile_last_success_timestamp_seconds{account="default"}',
        'hookledger_reconcile_last_run_timestamp_seconds{account="default"}',
        'hookledger_reconcile_last_run_info{account="default",status="ok"}',
        'hookledger_reconcile_last_run_drift{account="default",kind="payments"}',
    ):
        found = _api(prom, f"/api/v1/query?query={requests.utils.quote(metric)}")["result"]
        assert found, metric
    # A quiet start (longer than the shortened for: durations): the worker is alive, the
    # reconciler succeeded, nothing refused, nothing dead.
    time.sleep(12)
    assert _firing(prom) == {}

    # A payment for an order the shop never wrote: shop.paid defers it, past its limit.
    body = encode(
        build_event(
            "payment_succeeded", event_id="evt_alert_e2e", metadata={"order_id": "o-never-written"}
        )
    )
    sent = requests.post(
        web + "/webhooks/",
        data=body,
        headers=signed_headers(body, SECRETS["primary"]),
        timeout=10,
    )
    assert sent.status_code == 200, sent.text
    firing = _until("HookledgerDeadLetters firing", lambda: _firing(prom) or None, timeout=90)
    assert set(firing) == {"HookledgerDeadLetters"}, firing
    alert = firing["HookledgerDeadLetters"]
    assert alert["labels"] == {
        "alertname": "HookledgerDeadLetters",
        "job": "shop",
        "severity": "warning",
    }
    assert alert["annotations"]["summary"] == "hookledger: new dead letters"
    assert "hookledger --app <your app> events --status dead" in alert["annotations"]["runbook"]
    # The worker counted it, and the database agrees: one dead letter waits. (The alert may
    # fire on one of them a scrape before the other target's is in: each is waited for.)
    for query in ("sum(hookledger_dead_letters_total)", "max(hookledger_dead_letter_events)"):

        def value(query: str = query) -> float | None:
            found = _api(prom, f"/api/v1/query?query={requests.utils.quote(query)}")["result"]
            return float(found[0]["value"][1]) if found else None

        _until(f"{query} == 1", lambda value=value: value() == 1 or None, timeout=30)
        assert value() == 1, query


def _a_reconcile_run(database_url: str) -> None:
    """The reconciler's tables and one ok run of the default account, as `reconcile run`
    records it: its gauges are then scraped too."""
    import receiver.storage.database as db
    from reconcile.storage.store import ReconcileStore
    from tests.support import reconcile_ready

    engine = db.make_engine(database_url)
    try:
        reconcile_ready(engine)
        store = ReconcileStore(engine)
        run = store.start_run("incremental", "test")
        report = {"status": "ok", "kinds": {"payments": {"recovered_total": 1, "unresolved": 0}}}
        store.finish_run(run, "ok", report)
    finally:
        engine.dispose()


def _firing(prom: str) -> dict[str, dict[str, Any]]:
    return {
        a["labels"]["alertname"]: a
        for a in _api(prom, "/api/v1/alerts")["alerts"]
        if a["state"] == "firing"
    }
