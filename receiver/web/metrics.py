"""Prometheus metrics (``prometheus_client``) and a ``/metrics`` endpoint you mount.

::

    from receiver.web.metrics import Metrics

    metrics = Metrics()                 # HOOKLEDGER_METRICS_TOKEN, or access=..., or public=True
    def create_app():
        app = Flask(__name__)
        hooks.init_app(app)
        metrics.init_app(app)           # GET /metrics (HOOKLEDGER_METRICS_PATH)
        return app

Closed by default: ``init_app`` refuses to start unless a bearer token
(``HOOKLEDGER_METRICS_TOKEN``, sent by Prometheus as ``authorization: Bearer ...``), a
callable (``access=lambda: ...``, for example checking the caller's network) or an explicit
``public=True`` (``HOOKLEDGER_METRICS_PUBLIC=1``, only behind a private network) is given.

Two sources, one page:

- **Counters and histograms** observed where things happen, through :mod:`receiver.core.signals`:
  deliveries by result, rejections by reason and the acknowledgement latency in web
  processes; dispatch latency, handler durations and failures, dead letters, stale and
  duplicate decisions in workers; reconcile runs and recoveries in the reconciler's process.
  Under gunicorn (several processes) set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory
  before the processes start: every process writes there and ``/metrics`` adds them up. A
  worker on the same host may share it; a worker elsewhere serves its own
  (``hookledger worker --metrics-port 9101``).
- **Gauges read from the database** at each scrape, the same from any process on any host:
  queue depth, oldest open event, dead letters waiting, workers alive, and each account's
  latest reconcile run (status, recoveries and drift by kind and path, last success time;
  label ``account``, bounded as below). The alert rules that read them ship in
  ``receiver/alerts/hookledger.rules.yml``.

Metric names are listed in :data:`NAMES`; labels never hold an event id, only bounded values
(a result, a reason, a handler's name, a kind, a path, a status).

With several processor accounts, ``HOOKLEDGER_METRICS_ACCOUNT_LABEL=true`` adds an
``account`` label to the deliveries, rejections, dispatch latency, handler failures, dead
letters and guard decisions (not to the acknowledgement and handler-duration histograms).
It is bounded: the configured accounts, then the first others seen, at most
``HOOKLEDGER_METRICS_ACCOUNT_LABEL_MAX`` (100) get their own value; any further account is
``other``, a delivery refused before its account was known ``none``. Off by default: names
and labels are then exactly as without accounts.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final

from flask import Blueprint, Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

import receiver.core.signals as signals
import receiver.storage.recon_run_reads as recon_runs
import receiver.worker.heartbeat as heartbeat
from receiver.core.accounts import is_account_id
from receiver.core.errors import ConfigurationError

log = logging.getLogger("receiver.metrics")

#: Every metric hookledger exposes, with what it counts.
NAMES: Final[Mapping[str, str]] = {
    "hookledger_deliveries_total": "webhook deliveries stored, by result "
    "(inserted, duplicate, conflict)",
    "hookledger_rejections_total": "webhook deliveries refused, by reason "
    "(bad_signature, malformed, too_large, too_old, account_unknown, account_mismatch: "
    "the request's fault; "
    "storage_unavailable, schema_not_ready: the database's; storage_busy: the database "
    "answered but a lock stayed held past the wait; rejected: any other)",
    "hookledger_ack_seconds": "time to answer the processor (receive endpoint), by HTTP status",
    "hookledger_dispatch_latency_seconds": "from receipt to all handlers done, by source",
    "hookledger_handler_duration_seconds": "one handler's run, by handler and outcome",
    "hookledger_handler_failures_total": "handler exceptions, by handler",
    "hookledger_dead_letters_total": "events dead-lettered",
    "hookledger_guard_decisions_total": "events recorded, not dispatched, by decision "
    "(stale, duplicate)",
    "hookledger_reconcile_runs_total": "reconcile runs finished in this process, by status",
    "hookledger_reconcile_recovered_total": "transitions recovered by reconcile runs in this "
    "process, by kind and path",
    "hookledger_reconcile_unresolved_total": "drift reconcile runs in this process could not "
    "mend, by kind and path",
    "hookledger_queue_depth": "open events now, by status (pending, processing) [database]",
    "hookledger_oldest_open_event_age_seconds": "age of the oldest open event [database]",
    "hookledger_dead_letter_events": "dead-lettered events waiting for an operator [database]",
    "hookledger_workers_alive": "workers whose heartbeat is recent [database]",
    "hookledger_reconcile_last_run_info": "each account's latest finished reconcile run, 1, by "
    "status, mode and account [database]",
    "hookledger_reconcile_last_run_timestamp_seconds": "when each account's latest reconcile run "
    "finished, by account [database]",
    "hookledger_reconcile_last_success_timestamp_seconds": "when each account's latest "
    "reconcile run with status ok finished, by account [database]",
    "hookledger_reconcile_last_run_recovered": "transitions each account's latest run "
    "recovered, by kind, path and account [database]",
    "hookledger_reconcile_last_run_drift": "drift each account's latest run left unresolved, "
    "by kind, path and account [database]",
    "hookledger_metrics_database_up": "1 when the database gauges could be read [database]",
}

#: Rejection reasons the shipped alert rules (``receiver/alerts``) read, exported at 0 from a
#: process's start: a series that first appears at 1 hides that first one from ``increase()``.
#: (With the account label on, each account's series still appears at its first rejection.)
ZERO_REASONS: Final = ("bad_signature", "storage_unavailable", "storage_busy", "schema_not_ready")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_DISPATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400)


#: Label values that are no account: an account past the cap, and none known (a delivery
#: refused before its account was known).
OTHER_ACCOUNT: Final = "other"
NO_ACCOUNT: Final = "none"
#: Accounts that get a label value of their own, at most (``HOOKLEDGER_METRICS_ACCOUNT_LABEL_MAX``).
DEFAULT_ACCOUNT_LABEL_MAX: Final = 100


class AccountLabels:
    """The ``account`` label's value of an account: its id for the configured accounts and
    then the first others seen (accounts of stored events: verified, never a URL's guess),
    at most ``cap`` of them in all; any further account is :data:`OTHER_ACCOUNT`. So a
    platform with thousands of sellers costs at most ``cap`` series per metric and label
    set, never one per seller."""

    def __init__(self, cap: int = DEFAULT_ACCOUNT_LABEL_MAX, known: Iterable[str] = ()) -> None:
        if cap < 0:
            raise ConfigurationError("HOOKLEDGER_METRICS_ACCOUNT_LABEL_MAX must not be negative")
        self.cap = cap
        self._own: set[str] = set()
        self._lock = threading.Lock()
        self.add(known)

    def add(self, accounts: Iterable[str]) -> None:
        """Give these accounts their own value (while the cap allows), sorted: the same
        configuration labels the same accounts in every process."""
        for account in sorted(set(accounts)):
            self(account)

    def __call__(self, account: object) -> str:
        if account is None or account == "":
            return NO_ACCOUNT
        name = str(account)
        if name in self._own:
            return name
        with self._lock:
            if len(self._own) < self.cap and is_account_id(name):
                self._own.add(name)
                return name
        return OTHER_ACCOUNT


class _Set:
    """One set of counters and histograms (with or without the ``account`` label),
    registered in the default registry."""

    def __init__(self, *, by_account: bool) -> None:
        a = ["account"] if by_account else []
        self.collectors: list[Any] = []

        def made(metric: Any) -> Any:
            self.collectors.append(metric)
            return metric

        self.deliveries = made(
            Counter("hookledger_deliveries", NAMES["hookledger_deliveries_total"], ["result", *a])
        )
        self.rejections = made(
            Counter("hookledger_rejections", NAMES["hookledger_rejections_total"], ["reason", *a])
        )
        if not by_account:
            for reason in ZERO_REASONS:
                self.rejections.labels(reason=reason)
        self.ack = made(
            Histogram(
                "hookledger_ack_seconds",
                NAMES["hookledger_ack_seconds"],
                ["code"],
                buckets=_LATENCY_BUCKETS,
            )
        )
        self.dispatch = made(
            Histogram(
                "hookledger_dispatch_latency_seconds",
                NAMES["hookledger_dispatch_latency_seconds"],
                ["source", *a],
                buckets=_DISPATCH_BUCKETS,
            )
        )
        self.handler = made(
            Histogram(
                "hookledger_handler_duration_seconds",
                NAMES["hookledger_handler_duration_seconds"],
                ["handler", "outcome"],
                buckets=_LATENCY_BUCKETS,
            )
        )
        self.handler_failures = made(
            Counter(
                "hookledger_handler_failures",
                NAMES["hookledger_handler_failures_total"],
                ["handler", *a],
            )
        )
        self.dead = made(
            Counter("hookledger_dead_letters", NAMES["hookledger_dead_letters_total"], a)
        )
        self.guard = made(
            Counter(
                "hookledger_guard_decisions",
                NAMES["hookledger_guard_decisions_total"],
                ["decision", *a],
            )
        )
        self.runs = made(
            Counter(
                "hookledger_reconcile_runs", NAMES["hookledger_reconcile_runs_total"], ["status"]
            )
        )
        self.recovered = made(
            Counter(
                "hookledger_reconcile_recovered",
                NAMES["hookledger_reconcile_recovered_total"],
                ["kind", "path"],
            )
        )
        self.unresolved = made(
            Counter(
                "hookledger_reconcile_unresolved",
                NAMES["hookledger_reconcile_unresolved_total"],
                ["kind", "path"],
            )
        )

    def unregister(self) -> None:
        for metric in self.collectors:
            REGISTRY.unregister(metric)


class _Instruments:
    """The process's counters and histograms (created once, in the default registry), and
    the signal receivers that count (connected once per process, strongly referenced).

    With the account label on (:func:`configure_account_label`), the receive and dispatch
    counters and the dispatch latency carry ``account`` too (see :class:`AccountLabels`)."""

    def __init__(self) -> None:
        self.accounts: AccountLabels | None = None
        self.metrics = _Set(by_account=False)

    def __getattr__(self, name: str) -> Any:  # instruments().ack, .deliveries, ...
        return getattr(self.__dict__["metrics"], name)

    def _labels(self, info: dict[str, Any], **labels: str) -> dict[str, str]:
        if self.accounts is not None:
            labels["account"] = self.accounts(info.get("account"))
        return labels

    def use_account_label(self, labels: AccountLabels | None) -> None:
        """Switch the account label on (``labels``) or off (``None``): the metrics are made
        again when that changes their labels (their counts start again; done at start-up)."""
        if (labels is None) != (self.accounts is None):
            self.metrics.unregister()
            self.metrics = _Set(by_account=labels is not None)
        self.accounts = labels

    # Signal receivers.

    def on_received(self, _sender: Any, **info: Any) -> None:
        self.metrics.deliveries.labels(**self._labels(info, result=str(info.get("result")))).inc()

    def on_rejected(self, _sender: Any, **info: Any) -> None:
        self.metrics.rejections.labels(**self._labels(info, reason=str(info.get("reason")))).inc()

    def on_dispatched(self, _sender: Any, **info: Any) -> None:
        latency = info.get("latency_seconds")
        if isinstance(latency, int | float):
            labels = self._labels(info, source=str(info.get("source")))
            self.metrics.dispatch.labels(**labels).observe(latency)

    def on_handler(self, _sender: Any, **info: Any) -> None:
        name, outcome = str(info.get("handler")), str(info.get("status"))
        seconds = info.get("duration_seconds")
        if isinstance(seconds, int | float):
            self.metrics.handler.labels(handler=name, outcome=outcome).observe(seconds)
        if outcome == "failed":
            self.metrics.handler_failures.labels(**self._labels(info, handler=name)).inc()

    def on_dead(self, _sender: Any, **info: Any) -> None:
        labels = self._labels(info)
        (self.metrics.dead.labels(**labels) if labels else self.metrics.dead).inc()

    def on_stale(self, _sender: Any, **info: Any) -> None:
        self.metrics.guard.labels(**self._labels(info, decision="stale")).inc()

    def on_duplicate(self, _sender: Any, **info: Any) -> None:
        self.metrics.guard.labels(**self._labels(info, decision="duplicate")).inc()

    def on_reconcile(self, _sender: Any, **info: Any) -> None:
        self.metrics.runs.labels(status=str(info.get("status"))).inc()
        report = info.get("report")
        if not isinstance(report, dict) or report.get("dry_run"):
            return
        for figure in recon_runs.recon_figures(report):
            if figure.recovered:
                self.metrics.recovered.labels(kind=figure.kind, path=figure.path).inc(
                    figure.recovered
                )
            if figure.unresolved:
                self.metrics.unresolved.labels(kind=figure.kind, path=figure.path).inc(
                    figure.unresolved
                )

    def connect(self) -> None:
        for signal, receiver in (
            (signals.event_received, self.on_received),
            (signals.event_rejected, self.on_rejected),
            (signals.event_dispatched, self.on_dispatched),
            (signals.handler_finished, self.on_handler),
            (signals.event_dead_lettered, self.on_dead),
            (signals.event_stale, self.on_stale),
            (signals.event_duplicate, self.on_duplicate),
            (signals.reconcile_finished, self.on_reconcile),
        ):
            signal.connect(receiver, weak=False)


_lock = threading.Lock()
_instruments: _Instruments | None = None


def instruments() -> _Instruments:
    """The process's metrics, created and connected to the signals on first use."""
    global _instruments
    with _lock:
        if _instruments is None:
            made = _Instruments()
            made.connect()
            _instruments = made
        return _instruments


def configure_account_label(
    enabled: bool, *, cap: int = DEFAULT_ACCOUNT_LABEL_MAX, known: Iterable[str] = ()
) -> None:
    """Add the ``account`` label (``enabled``) to the receive and dispatch metrics of this
    process, or take it away, with ``known`` (the configured accounts) labelled first and
    at most ``cap`` accounts labelled in all. Off by default: the metrics' names and labels
    are then exactly those of a single-account installation."""
    made = instruments()
    with _lock:
        if not enabled:
            made.use_account_label(None)
        elif made.accounts is not None and made.accounts.cap == cap:
            made.accounts.add(known)
        else:
            made.use_account_label(AccountLabels(cap, known))


def _account_label_settings(app: Flask, given: bool | None, cap: int | None) -> tuple[bool, int]:
    """The account label's settings: the arguments, else the receiver's settings on ``app``
    (``HOOKLEDGER_METRICS_ACCOUNT_LABEL`` / ``_MAX``, from ``app.config`` or the
    environment)."""
    state = app.extensions.get("hookledger")
    settings = getattr(state, "settings", None)
    if settings is not None:
        enabled = settings.metrics_account_label if given is None else given
        limit = settings.metrics_account_label_max if cap is None else cap
        return bool(enabled), int(limit)

    def setting(name: str) -> Any:
        key = f"HOOKLEDGER_METRICS_{name}"
        return app.config.get(key) if app.config.get(key) is not None else os.environ.get(key)

    enabled = given if given is not None else _truthy(setting("ACCOUNT_LABEL") or False)
    try:
        limit = (
            cap
            if cap is not None
            else int(setting("ACCOUNT_LABEL_MAX") or DEFAULT_ACCOUNT_LABEL_MAX)
        )
    except ValueError:
        raise ConfigurationError("HOOKLEDGER_METRICS_ACCOUNT_LABEL_MAX must be a number") from None
    return bool(enabled), limit


def _known_accounts(app: Flask) -> list[str]:
    state = app.extensions.get("hookledger")
    if state is None:
        return []
    try:
        return [str(a) for a in state.accounts.ids()]
    except Exception:  # noqa: BLE001 - the merchant's own source: labelled as they are seen
        log.warning("metrics: the account ids could not be read", extra={"action": "metrics"})
        return []


class DatabaseCollector(Collector):
    """Gauges read from hookledger's tables at each scrape (any process, any host).

    The reconcile gauges carry ``account``: the run records are per account, and one
    account's success must not hide another's failure. ``accounts`` (the app's account
    source's ``ids``) limits them to the accounts the installation has now (an account
    removed or deactivated keeps its runs, not its gauges); at most ``account_label_max`` get
    a value of their own, any further one is folded into ``other`` (the oldest last success,
    none when one of them never succeeded, and the oldest last run; drift and recoveries
    added up)."""

    def __init__(
        self,
        engine: Engine,
        *,
        worker_timeout: float = heartbeat.DEFAULT_WORKER_TIMEOUT,
        accounts: Callable[[], Iterable[str]] | None = None,
        account_label_max: int = DEFAULT_ACCOUNT_LABEL_MAX,
    ):
        self.engine = engine
        self.worker_timeout = worker_timeout
        self.accounts = accounts
        self.account_label_max = account_label_max

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "hookledger_metrics_database_up", NAMES["hookledger_metrics_database_up"]
        )
        try:
            found = list(self._read())
        except Exception as exc:  # noqa: BLE001 - a scrape reports the failure, never raises
            log.warning(
                "metrics: the database could not be read: %s",
                type(getattr(exc, "orig", None) or exc).__name__,
                extra={"action": "metrics_failed"},
            )
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from found

    def _read(self) -> Iterator[Metric]:
        status = heartbeat.check(self.engine, worker_timeout=self.worker_timeout, max_open_age=None)
        depth = GaugeMetricFamily(
            "hookledger_queue_depth", NAMES["hookledger_queue_depth"], labels=["status"]
        )
        for name, n in status.open_events.items():
            depth.add_metric([name], n)
        yield depth
        yield GaugeMetricFamily(
            "hookledger_oldest_open_event_age_seconds",
            NAMES["hookledger_oldest_open_event_age_seconds"],
            value=status.oldest_open_age_seconds or 0.0,
        )
        yield GaugeMetricFamily(
            "hookledger_dead_letter_events",
            NAMES["hookledger_dead_letter_events"],
            value=status.dead_events,
        )
        yield GaugeMetricFamily(
            "hookledger_workers_alive",
            NAMES["hookledger_workers_alive"],
            value=status.workers_alive,
        )
        yield from self._reconcile()

    def _current_accounts(self) -> set[str] | None:
        """The installation's accounts now, or ``None`` (no source, or it could not be read:
        every account with runs is shown then)."""
        if self.accounts is None:
            return None
        try:
            return {str(a) for a in self.accounts()}
        except Exception:  # noqa: BLE001 - the merchant's own source: a scrape goes on
            log.warning("metrics: the account ids could not be read", extra={"action": "metrics"})
            return None

    def _reconcile(self) -> Iterator[Metric]:
        found = recon_runs.runs_by_account(self.engine)
        current = self._current_accounts()
        if current is not None:
            found = [r for r in found if r.account in current]
        names = AccountLabels(self.account_label_max, sorted(r.account for r in found))
        info = GaugeMetricFamily(
            "hookledger_reconcile_last_run_info",
            NAMES["hookledger_reconcile_last_run_info"],
            labels=["status", "mode", "account"],
        )
        when = GaugeMetricFamily(
            "hookledger_reconcile_last_run_timestamp_seconds",
            NAMES["hookledger_reconcile_last_run_timestamp_seconds"],
            labels=["account"],
        )
        last_ok = GaugeMetricFamily(
            "hookledger_reconcile_last_success_timestamp_seconds",
            NAMES["hookledger_reconcile_last_success_timestamp_seconds"],
            labels=["account"],
        )
        infos: set[tuple[str, str, str]] = set()
        oldest_run: dict[str, float] = {}
        oldest_ok: dict[str, float] = {}
        #: Labels with an account that has finished runs and never an ok one: the oldest
        #: last success of theirs is none (an account folded into ``other`` must not be
        #: hidden by another's success).
        never_ok: set[str] = set()
        recovered: dict[tuple[str, str, str], int] = {}
        drift: dict[tuple[str, str, str], int] = {}
        for runs in found:
            name = names(runs.account)
            row = runs.latest
            infos.add((row.status, row.mode, name))
            if row.finished_at is not None:
                at = row.finished_at.timestamp()
                oldest_run[name] = min(at, oldest_run.get(name, at))
            if runs.last_success is not None:
                at = runs.last_success.timestamp()
                oldest_ok[name] = min(at, oldest_ok.get(name, at))
            else:
                never_ok.add(name)
            for figure in recon_runs.recon_figures(row.report):
                key = (figure.kind, figure.path, name)
                recovered[key] = recovered.get(key, 0) + figure.recovered
                drift[key] = drift.get(key, 0) + figure.unresolved
        for labels in sorted(infos):
            info.add_metric(list(labels), 1)
        for name, at in sorted(oldest_run.items()):
            when.add_metric([name], at)
        for name, at in sorted(oldest_ok.items()):
            if name not in never_ok:
                last_ok.add_metric([name], at)
        by_figure = ["kind", "path", "account"]
        recovered_family = GaugeMetricFamily(
            "hookledger_reconcile_last_run_recovered",
            NAMES["hookledger_reconcile_last_run_recovered"],
            labels=by_figure,
        )
        drift_family = GaugeMetricFamily(
            "hookledger_reconcile_last_run_drift",
            NAMES["hookledger_reconcile_last_run_drift"],
            labels=by_figure,
        )
        for key, n in sorted(recovered.items()):
            recovered_family.add_metric(list(key), n)
        for key, n in sorted(drift.items()):
            drift_family.add_metric(list(key), n)
        yield info
        yield when
        yield recovered_family
        yield drift_family
        yield last_ok


class _Process(Collector):
    """This process's (or, in multiprocess mode, every process's) counters and histograms."""

    def collect(self) -> Iterator[Metric]:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            scratch = CollectorRegistry()
            multiprocess.MultiProcessCollector(scratch)  # type: ignore[no-untyped-call]
            yield from scratch.collect()
        else:
            yield from REGISTRY.collect()


def exposition(
    engine: Engine | None,
    *,
    accounts: Callable[[], Iterable[str]] | None = None,
    account_label_max: int = DEFAULT_ACCOUNT_LABEL_MAX,
) -> bytes:
    """The metrics page: the process counters plus (with ``engine``) the database gauges
    (``accounts``, ``account_label_max``: see :class:`DatabaseCollector`)."""
    instruments()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Process())
    if engine is not None:
        registry.register(
            DatabaseCollector(engine, accounts=accounts, account_label_max=account_label_max)
        )
    return generate_latest(registry)


def serve_worker_metrics(
    port: int,
    host: str = "127.0.0.1",
    *,
    engine: Engine | None = None,
    account_label: bool = False,
    account_label_max: int = DEFAULT_ACCOUNT_LABEL_MAX,
    known_accounts: Iterable[str] = (),
    accounts: Callable[[], Iterable[str]] | None = None,
) -> None:
    """Serve this process's metrics (and the database gauges) on ``host:port`` in a thread
    (``hookledger worker --metrics-port``); ``account_label``: see
    :func:`configure_account_label`; ``accounts``: see :class:`DatabaseCollector`."""
    configure_account_label(account_label, cap=account_label_max, known=known_accounts)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Process())
    if engine is not None:
        registry.register(
            DatabaseCollector(engine, accounts=accounts, account_label_max=account_label_max)
        )
    start_http_server(port, addr=host, registry=registry)
    log.info("metrics served on %s:%d", host, port, extra={"action": "metrics_serve"})


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in {"1", "true", "yes", "on"}


class Metrics:
    """The metrics extension: counts through the signals, serves ``/metrics``.

    Keyword arguments win over ``app.config``, which wins over the environment:

    - ``token`` (``HOOKLEDGER_METRICS_TOKEN``): a scrape must send
      ``authorization: Bearer <token>`` (Prometheus: ``authorization: {credentials: ...}``);
    - ``access``: a callable run in the request, ``True`` lets the scrape in;
    - ``public`` (``HOOKLEDGER_METRICS_PUBLIC``): no check (behind a private network only);
    - ``path`` (``HOOKLEDGER_METRICS_PATH``, default ``/metrics``): where it is mounted;
    - ``account_label`` (``HOOKLEDGER_METRICS_ACCOUNT_LABEL``, default off) and
      ``account_label_max`` (``HOOKLEDGER_METRICS_ACCOUNT_LABEL_MAX``, default 100): an
      ``account`` label on the receive and dispatch metrics, bounded (see
      :func:`configure_account_label`).
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        token: str | None = None,
        access: Callable[[], bool] | None = None,
        public: bool | None = None,
        path: str | None = None,
        account_label: bool | None = None,
        account_label_max: int | None = None,
    ) -> None:
        self._token = token
        self._access = access
        self._public = public
        self._path = path
        self._account_label = account_label
        self._account_label_max = account_label_max
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        def setting(name: str, given: Any) -> Any:
            if given is not None:
                return given
            key = f"HOOKLEDGER_METRICS_{name}"
            return app.config.get(key) if app.config.get(key) is not None else os.environ.get(key)

        token = setting("TOKEN", self._token) or None
        public = _truthy(setting("PUBLIC", self._public) or False)
        path = str(setting("PATH", self._path) or "/metrics")
        access = self._access
        if token is None and access is None and not public:
            raise ConfigurationError(
                "the metrics endpoint is closed by default: set HOOKLEDGER_METRICS_TOKEN (a "
                "bearer token for Prometheus), pass access=<callable>, or "
                "HOOKLEDGER_METRICS_PUBLIC=1 behind a private network"
            )
        if token is not None and len(str(token)) < 16:
            raise ConfigurationError("HOOKLEDGER_METRICS_TOKEN must be at least 16 characters")
        enabled, cap = _account_label_settings(app, self._account_label, self._account_label_max)
        configure_account_label(enabled, cap=cap, known=_known_accounts(app) if enabled else ())
        _time_acknowledgements(app)
        expected = f"Bearer {token}".encode() if token is not None else None

        def allowed() -> bool:
            if public:
                return True
            if expected is not None:
                sent = request.headers.get("Authorization", "").encode("utf-8", "replace")
                if hmac.compare_digest(sent, expected):
                    return True
            return bool(access()) if access is not None else False

        def metrics_view() -> Response:
            if not allowed():
                return Response(
                    "unauthorized\n",
                    status=401,
                    mimetype="text/plain",
                    headers={"WWW-Authenticate": 'Bearer realm="hookledger metrics"'},
                )
            page = exposition(_engine_of(app), accounts=_account_ids_of(app), account_label_max=cap)
            return Response(page, mimetype=CONTENT_TYPE_LATEST)

        bp = Blueprint("hookledger_metrics", __name__)
        bp.add_url_rule(path, "metrics", metrics_view, methods=["GET"])
        app.register_blueprint(bp)
        app.extensions["hookledger_metrics"] = self


def _engine_of(app: Flask) -> Engine | None:
    state = app.extensions.get("hookledger")
    return state.store.engine if state is not None else None


def _account_ids_of(app: Flask) -> Callable[[], Iterable[str]] | None:
    """The ids of the app's account source now (read at each scrape), if it has one."""
    state = app.extensions.get("hookledger")
    source = getattr(state, "accounts", None)
    return source.ids if source is not None else None


def _time_acknowledgements(app: Flask) -> None:
    """Time every answer of the receive endpoint (blueprint ``hookledger``), without
    touching the blueprint: request hooks registered for that blueprint's name."""
    if app.extensions.get("hookledger_metrics_hooks"):
        return
    app.extensions["hookledger_metrics_hooks"] = True

    def start() -> None:
        if request.endpoint == "hookledger.receive":
            g.hookledger_ack_started = time.perf_counter()

    def stop(response: Response) -> Response:
        started = g.pop("hookledger_ack_started", None)
        if started is not None:
            instruments().ack.labels(code=str(response.status_code)).observe(
                time.perf_counter() - started
            )
        return response

    app.before_request_funcs.setdefault("hookledger", []).append(start)
    app.after_request_funcs.setdefault("hookledger", []).append(stop)


__all__ = [
    "NAMES",
    "OTHER_ACCOUNT",
    "AccountLabels",
    "configure_account_label",
    "DatabaseCollector",
    "Metrics",
    "exposition",
    "instruments",
    "serve_worker_metrics",
]
