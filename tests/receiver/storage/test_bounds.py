"""Every wait of the worker and the reconciler for PostgreSQL is bounded (issue 29, item 4).

The server's statement, lock and idle-in-transaction timeouts, set on each of the worker's
connections, end a statement that waits on a lock or runs long; a connection whose server
does not answer at all (a hung proxy in between: :mod:`tests.reliability.tcp_proxy`'s
``stall``) is cut on the client's side. Which failure is whose: a handler that stalls its
own transaction (its statement times out, or it sits past the idle timeout) fails, with an
attempt counted and a backoff; a stall of hookledger's own statements is the database's, and
the events' leases are given back with no attempt counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from receiver.config.settings import Settings, reconciler_bounds
from receiver.core.bounds import MIN_ANSWER_GRACE, Bounds
from receiver.core.errors import ConfigurationError
from receiver.core.events import Event, parse_event
from receiver.core.registry import Registry
from receiver.core.retry import RetryPolicy
from receiver.storage.bounds import (
    CONNECT_TIMEOUT,
    answer_watch,
    connect_timeout,
    describe_statement,
    describe_target,
    phase,
)
from receiver.storage.database import make_engine, upgrade
from receiver.storage.tables import EventStatus
from receiver.store import Store
from receiver.testing.factories import build_event, encode
from receiver.worker.runner import Worker, WorkerConfig
from tests.conftest import PG_URL, backend
from tests.reliability.tcp_proxy import TcpProxy

PG = backend() == "postgresql"

#: Short bounds, so the tests wait seconds, not minutes.
SHORT = Bounds(statement_timeout=1.0, lock_timeout=0.5, idle_in_transaction_timeout=1.0)


# -- configuration (no database) -----------------------------------------------------------


def test_the_defaults_fit_the_lease() -> None:
    default = Bounds.for_lease(60.0)
    assert (default.statement_timeout, default.lock_timeout) == (10.0, 5.0)
    assert default.idle_in_transaction_timeout == 600.0
    # A stalled statement is cut within a quarter of the lease: a renewal waiting on it
    # (every third of the lease) still renews in time.
    assert default.answer_timeout is not None and default.answer_timeout <= 60.0 / 4
    assert default.stall_after == 10.0
    short = Bounds.for_lease(3.0)
    assert (short.statement_timeout, short.lock_timeout) == (5.0, 2.5)
    assert short.idle_in_transaction_timeout == 60.0
    long = Bounds.for_lease(600.0)
    assert (long.statement_timeout, long.idle_in_transaction_timeout) == (100.0, 6000.0)
    off = Bounds(statement_timeout=0, lock_timeout=0, idle_in_transaction_timeout=0)
    assert off.answer_timeout is None and off.stall_after is None
    assert default.session_sql() == (
        "SET statement_timeout = 10000; SET lock_timeout = 5000; "
        "SET idle_in_transaction_session_timeout = 600000"
    )


def _settings(**env: str) -> Settings:
    return Settings.resolve(
        {},
        {},
        default_database_url="sqlite://",
        environ={
            "HOOKLEDGER_SECRETS": "k:secret",
            **{f"HOOKLEDGER_{k}": v for k, v in env.items()},
        },
    )


def test_the_timeouts_are_read_from_the_environment_like_every_setting() -> None:
    assert _settings().bounds() == Bounds.for_lease(60.0)
    assert _settings(LEASE_SECONDS="120").bounds() == Bounds.for_lease(120.0)
    set_ = _settings(STATEMENT_TIMEOUT="3", LOCK_TIMEOUT="1.5", IDLE_IN_TRANSACTION_TIMEOUT="30")
    assert set_.bounds() == Bounds(
        statement_timeout=3.0, lock_timeout=1.5, idle_in_transaction_timeout=30.0
    )
    # The worker's --lease-seconds moves the defaults, never a value that was set.
    assert set_.bounds(600.0).statement_timeout == 3.0
    assert _settings(STATEMENT_TIMEOUT="0").bounds().answer_timeout is None
    with pytest.raises(ConfigurationError):
        _settings(LOCK_TIMEOUT="-1")
    with pytest.raises(ConfigurationError):
        _settings(STATEMENT_TIMEOUT="soon")


def test_the_reconciler_reads_the_same_variables_with_a_longer_statement_default() -> None:
    assert reconciler_bounds({}).statement_timeout == 60.0
    assert reconciler_bounds({}).idle_in_transaction_timeout == 600.0
    got = reconciler_bounds({"HOOKLEDGER_STATEMENT_TIMEOUT": "4", "HOOKLEDGER_LOCK_TIMEOUT": "1"})
    assert (got.statement_timeout, got.lock_timeout) == (4.0, 1.0)
    with pytest.raises(ConfigurationError):
        reconciler_bounds({"HOOKLEDGER_IDLE_IN_TRANSACTION_TIMEOUT": "x"})


def test_what_a_stall_names_is_a_statements_verb_and_table_never_its_literals() -> None:
    assert (
        describe_statement("UPDATE hookledger_inbox SET status = :s") == "UPDATE hookledger_inbox"
    )
    assert (
        describe_statement("\n  select * from shop_orders where email = 'a@example.com'")
        == "SELECT shop_orders"
    )
    assert describe_statement("INSERT INTO t (a) VALUES ('secret')") == "INSERT t"
    assert "secret" not in describe_statement("SELECT 'secret'")


def test_what_a_connect_stall_names_is_host_port_and_database_never_the_password() -> None:
    engine = sa.create_engine("postgresql+psycopg://shop:pw-s3cret@db.internal:6432/shop")
    _cargs, cparams = engine.dialect.create_connect_args(engine.url)
    assert describe_target(cparams) == "connect to db.internal:6432/shop"
    assert (
        describe_target({"host": "/run/postgresql", "port": 5432}) == "connect to /run/postgresql"
    )
    assert describe_target({}) == "connect to the local socket"
    # A bounded engine's connect is never without a timeout.
    assert connect_timeout("7") == 7
    assert connect_timeout(5) == 5
    assert connect_timeout("0") == connect_timeout(None) == CONNECT_TIMEOUT


def test_a_connect_that_times_out_before_the_stall_bound_is_told_as_a_stall() -> None:
    """The default connect timeout (5 s) ends before the default stall bound (10 s): the
    connect's own timeout is then the stall the worker logs; it is never cut or told twice."""
    from receiver.storage.bounds import AnswerWatch

    told: list[tuple[str, str, str]] = []

    class Listener:
        def stalled(self, waiting_on: str, phase: str, seconds: float) -> None:
            told.append(("stalled", waiting_on, phase))

        def answered(self, waiting_on: str, phase: str, seconds: float) -> None:
            told.append(("answered", waiting_on, phase))

    watch = AnswerWatch(Bounds(statement_timeout=10))
    watch.add_listener(Listener())
    with phase("claim"):
        token = watch.enter(None, "connect to db:5432/shop")
    assert watch.leave(token, timed_out=True) is False
    assert told == [("stalled", "connect to db:5432/shop", "claim")]
    told.clear()
    assert watch.leave(watch.enter(None, "connect to db:5432/shop")) is False  # answered in time
    assert told == []


def test_sqlite_engines_are_left_to_their_busy_timeout() -> None:
    engine = make_engine("sqlite://", bounds=SHORT)
    try:
        assert answer_watch(engine) is None
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
    finally:
        engine.dispose()


# -- on PostgreSQL -------------------------------------------------------------------------

pg = pytest.mark.skipif(not PG, reason="PostgreSQL's timeouts and a network link")


@pytest.fixture
def migrated(database_url: str) -> Iterator[str]:
    engine = make_engine(database_url)
    upgrade(engine)
    engine.dispose()
    yield database_url


@pytest.fixture
def proxy(database_url: str) -> Iterator[TcpProxy]:
    url = make_url(database_url)
    with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as running:
        yield running


def _through(database_url: str, proxy: TcpProxy) -> str:
    url = make_url(database_url).set(host="127.0.0.1", port=proxy.port)
    return url.render_as_string(hide_password=False)


def _store(url: str, bounds: Bounds | None = SHORT) -> Store:
    return Store(
        make_engine(url, bounds=bounds),
        retry=RetryPolicy(max_attempts=5, base_seconds=60.0, max_seconds=60.0),
    )


def _insert(store: Store, event_type: str, event_id: str) -> Event:
    body = encode(build_event(event_type, event_id=event_id))
    event = parse_event(body)
    store.inbox.insert(event, body)
    return event


def _row(store: Store, event_id: str) -> Any:
    got = store.operations.get(event_id)
    assert got is not None
    return got


@pg
@pytest.mark.storage
def test_each_worker_connection_sets_the_servers_timeouts(migrated: str) -> None:
    bounded, plain = make_engine(migrated, bounds=SHORT), make_engine(migrated)
    try:
        with bounded.connect() as conn:
            shown = [
                conn.exec_driver_sql(f"SHOW {name}").scalar()
                for name in (
                    "statement_timeout",
                    "lock_timeout",
                    "idle_in_transaction_session_timeout",
                )
            ]
        assert shown == ["1s", "500ms", "1s"]
        with plain.connect() as conn:  # the web's and the operators' engine: as configured
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "0"
        with pytest.raises(OperationalError) as raised, bounded.connect() as conn:
            conn.exec_driver_sql("SELECT pg_sleep(5)")
        assert getattr(raised.value.orig, "sqlstate", None) == "57014"
    finally:
        bounded.dispose()
        plain.dispose()


@pg
@pytest.mark.storage
def test_a_connection_whose_server_stops_answering_is_cut(migrated: str, proxy: TcpProxy) -> None:
    """The proxy in between keeps the connection open and swallows every byte: the server's
    timeouts never fire and TCP keepalives are answered. The client-side bound cuts it; the
    watch says first what it waited on; a new connection works once the server answers."""
    engine = make_engine(_through(migrated, proxy), bounds=SHORT)
    heard: list[tuple[str, str, str]] = []

    class Listener:
        def stalled(self, waiting_on: str, phase: str, _seconds: float) -> None:
            heard.append(("stalled", waiting_on, phase))

        def answered(self, waiting_on: str, phase: str, _seconds: float) -> None:
            heard.append(("answered", waiting_on, phase))

    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1").scalar()
        watch = answer_watch(engine)
        assert watch is not None
        watch.add_listener(Listener())
        proxy.cut("stall")
        errors: list[BaseException] = []

        def query() -> None:
            try:
                with engine.connect() as conn:  # the pooled (now stalled) connection
                    conn.exec_driver_sql("SELECT count(*) FROM hookledger_inbox").scalar()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def in_phase() -> None:
            with phase("claim"):
                query()

        thread = threading.Thread(target=in_phase, daemon=True)
        thread.start()
        thread.join(timeout=60)  # the old code: a hang, for ever
        assert not thread.is_alive(), "a statement waited on a stalled server without a bound"
        assert len(errors) == 1 and isinstance(errors[0], OperationalError), errors
        assert "no answer from the database" in str(errors[0])
        assert heard == [("stalled", "SELECT hookledger_inbox", "claim")]
        proxy.restore()
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT 2").scalar() == 2
    finally:
        engine.dispose()


@pg
@pytest.mark.storage
def test_a_handler_that_stalls_its_transaction_fails_with_an_attempt_counted(
    migrated: str,
) -> None:
    """A handler sat past the idle-in-transaction timeout (an e-mail call that hangs) and
    PostgreSQL ended the batch's transaction (25P03): that handler failed, not the database.
    The other event of the batch is done; the stalled one is pending with attempt 1, its
    last error naming the timeout, and a backoff."""
    store = _store(migrated)
    registry = Registry()
    calls: list[str] = []

    @registry.on("payment_succeeded")
    def hang(event: Event) -> None:
        calls.append(event.event_id)
        time.sleep(SHORT.idle_in_transaction_timeout + 0.8)

    @registry.on("refund_succeeded")
    def quick(event: Event, session: Session) -> None:
        calls.append(event.event_id)
        session.execute(sa.text("SELECT 1"))

    try:
        _insert(store, "refund_succeeded", "evt_quick")
        _insert(store, "payment_succeeded", "evt_hang")
        worker = Worker(store, registry, WorkerConfig(lease_seconds=30, batch_size=10))
        assert worker.run_once() == 2  # no storage error: nothing stranded
        assert worker._stranded == []
        hung, quick_ = _row(store, "evt_hang"), _row(store, "evt_quick")
        assert quick_.status == EventStatus.DONE
        assert hung.status == EventStatus.PENDING and hung.attempts == 1
        assert "HandlerStalled" in (hung.last_error or "")
        assert "25P03" in (hung.last_error or "")
        assert hung.next_attempt_at > store.now()
        # The stalled handler was not run again in the same round.
        assert calls.count("evt_hang") == 1
    finally:
        store.engine.dispose()


@pg
@pytest.mark.storage
def test_many_short_handlers_never_add_up_to_the_idle_timeout(migrated: str) -> None:
    """Handlers without the session, one after the other in one batch, each well under the
    idle timeout but together over it: the batch's transaction is kept awake between them,
    so every event is done."""
    store = _store(migrated)
    registry = Registry()

    @registry.on("payment_succeeded")
    def slowish(_event: Event) -> None:
        time.sleep(SHORT.idle_in_transaction_timeout / 4)

    try:
        for i in range(8):  # 8 x 0.25 s: twice the idle timeout
            _insert(store, "payment_succeeded", f"evt_slowish_{i}")
        worker = Worker(store, registry, WorkerConfig(lease_seconds=30, batch_size=10))
        assert worker.run_once() == 8
        assert {_row(store, f"evt_slowish_{i}").status for i in range(8)} == {EventStatus.DONE}
    finally:
        store.engine.dispose()


@pg
@pytest.mark.storage
def test_a_handlers_own_statement_timeout_is_that_handlers_failure(migrated: str) -> None:
    store = _store(migrated)
    registry = Registry()

    @registry.on("payment_succeeded")
    def report(_event: Event, session: Session) -> None:
        session.execute(sa.text("SELECT pg_sleep(5)"))

    try:
        _insert(store, "payment_succeeded", "evt_report")
        worker = Worker(store, registry, WorkerConfig(lease_seconds=30))
        assert worker.run_once() == 1
        row = _row(store, "evt_report")
        assert row.status == EventStatus.PENDING and row.attempts == 1
        assert "57014" in (row.last_error or "")
    finally:
        store.engine.dispose()


@pg
@pytest.mark.storage
def test_a_stall_of_hookledgers_own_statements_is_the_databases_no_attempt_counted(
    migrated: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Another session (an operator's script, a migration) holds the event's row lock: the
    worker's own write of the outcome hits the lock timeout. That is a storage problem: the
    batch's leases are given back once the database answers, with the attempt returned, and
    the handler then runs once."""
    store = _store(migrated)
    registry = Registry()
    ran: list[str] = []

    @registry.on("payment_succeeded")
    def ship(event: Event) -> None:
        ran.append(event.event_id)
        time.sleep(0.2)  # the lock is taken meanwhile (below)

    admin = make_engine(migrated)
    locker = admin.connect()
    try:
        _insert(store, "payment_succeeded", "evt_locked")
        worker = Worker(store, registry, WorkerConfig(lease_seconds=30))
        taken = threading.Event()

        def migrate() -> None:  # after the claim, before the outcome's write
            while not ran:
                time.sleep(0.01)
            locker.exec_driver_sql(
                "SELECT id FROM hookledger_event WHERE event_id = 'evt_locked' FOR UPDATE"
            )
            taken.set()

        thread = threading.Thread(target=migrate, daemon=True)
        thread.start()
        with pytest.raises(OperationalError) as raised:
            worker.run_once()
        assert taken.is_set()
        assert getattr(raised.value.orig, "sqlstate", None) in ("55P03", "57014")
        assert [c.event_id for c in worker._stranded] == ["evt_locked"]
        locker.rollback()  # the other session ends
        worker._give_back_stranded()
        row = _row(store, "evt_locked")
        assert row.status == EventStatus.PENDING and row.attempts == 0
        assert worker.run_once() == 1
        assert _row(store, "evt_locked").status == EventStatus.DONE
        assert ran == ["evt_locked", "evt_locked"]  # the first run's work was rolled back
    finally:
        locker.close()
        admin.dispose()
        store.engine.dispose()


@pg
@pytest.mark.storage
def test_a_running_worker_logs_the_stall_resumes_by_itself_and_burst_gives_up(
    migrated: str, proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """The database stops answering under a running worker: it logs ``stalled`` (naming
    the statement and the phase), and once the database answers again it logs ``resumed``
    and dispatches what was stored meanwhile, unrestarted. ``run(burst=True)`` meanwhile
    returns with ``gave_up`` (the command's exit 5) instead of waiting for ever."""
    store = _store(_through(migrated, proxy))
    direct = _store(migrated, bounds=None)  # the receiver, storing events meanwhile
    registry = Registry()
    done: list[str] = []

    @registry.on("payment_succeeded")
    def ship(event: Event) -> None:
        done.append(event.event_id)

    caplog.set_level(logging.INFO, logger="receiver")

    def actions() -> list[str | None]:
        return [getattr(r, "action", None) for r in caplog.records]

    def wait_for(check: Any, what: str) -> None:
        deadline = time.monotonic() + 90
        while not check():
            assert time.monotonic() < deadline, f"{what}: {actions()} {done}"
            time.sleep(0.05)

    running = Worker(store, registry, WorkerConfig(poll_interval=0.05))
    running.heartbeat = False
    thread = threading.Thread(target=running.run, daemon=True)
    try:
        _insert(direct, "payment_succeeded", "evt_warm")
        thread.start()
        wait_for(lambda: done == ["evt_warm"], "the worker never dispatched")
        proxy.cut("stall")
        for i in range(5):
            _insert(direct, "payment_succeeded", f"evt_during_{i}")
        wait_for(lambda: "stalled" in actions(), "no stall logged")
        stalled = next(r for r in caplog.records if getattr(r, "action", None) == "stalled")
        # What it waits on: a statement's verb and table, or a commit; and the phase.
        assert stalled.phase and stalled.waiting_on, stalled.__dict__

        answer = SHORT.answer_timeout
        assert answer is not None
        burst = Worker(store, registry, WorkerConfig(poll_interval=0.05, give_up_after=answer))
        burst.heartbeat = False
        finished = threading.Event()
        other = threading.Thread(
            target=lambda: (burst.run(burst=True), finished.set()), daemon=True
        )
        other.start()
        assert finished.wait(60), "worker --burst never returned on a stalled database"
        assert burst.gave_up and "worker_gave_up" in actions()

        assert done == ["evt_warm"] and thread.is_alive()
        proxy.restore()  # the database answers new connections again
        everything = ["evt_warm", *(f"evt_during_{i}" for i in range(5))]
        wait_for(lambda: sorted(done) == sorted(everything), "not dispatched after the stall")
        wait_for(lambda: "resumed" in actions(), "no resumed logged")
        assert {_row(direct, e).status for e in everything} == {EventStatus.DONE}
    finally:
        running.stop()
        thread.join(timeout=30)
        proxy.restore()
        store.engine.dispose()
        direct.engine.dispose()


@pg
@pytest.mark.storage
def test_the_reconcilers_engine_is_bounded_and_its_migrations_are_not(
    migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconcile.cli.context import Context

    monkeypatch.setenv("HOOKLEDGER_STATEMENT_TIMEOUT", "7")
    context = Context(migrated, None, None)
    engine, migrations = context.inbox().engine, context.migration_engine()
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "7s"
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "3500ms"
        with migrations.connect() as conn:  # reconcile db upgrade: may run long
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "0"
        assert answer_watch(engine) is not None and answer_watch(migrations) is None
    finally:
        engine.dispose()
        migrations.dispose()


@pg
@pytest.mark.storage
def test_the_worker_command_gets_a_bounded_store_and_the_web_keeps_its_own(
    migrated: str,
) -> None:
    from flask import Flask

    from receiver.extension import WebhookReceiver

    app = Flask("bounded")
    app.config.update(
        HOOKLEDGER_DATABASE_URL=migrated,
        HOOKLEDGER_SECRETS="k:secret",
        HOOKLEDGER_STATEMENT_TIMEOUT="2",
    )
    WebhookReceiver(app)
    state = WebhookReceiver.state(app)
    worker = state.worker(bounded=True, lease_seconds=30)
    inline = state.worker()
    try:
        assert inline.store is state.store and answer_watch(state.store.engine) is None
        with worker.store.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "2s"
            assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == (
                "5min"
            )
        assert worker.config.give_up_after == 2 + MIN_ANSWER_GRACE
    finally:
        worker.store.engine.dispose()
        state.store.engine.dispose()


def _backends(application_name: str) -> int:
    """The server's connections named ``application_name`` (this test's own)."""
    counter = sa.create_engine(PG_URL, poolclass=sa.pool.NullPool)
    try:
        with counter.connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"),
                    {"n": application_name},
                ).scalar_one()
            )
    finally:
        counter.dispose()


@pg
@pytest.mark.storage
def test_the_worker_command_run_in_process_leaves_no_connection_open(migrated: str) -> None:
    """A shop's test suite builds an app, posts webhooks and runs ``hookledger worker
    --burst`` in-process: each run made an engine of its own (the bounded worker's) that
    nothing closed, its connections open until the garbage collector found it (one more
    server connection per run, "too many clients" in a long suite). The run closes its own;
    ``state.worker(bounded=True)`` called again reuses the app's one worker engine."""
    import gc
    import signal
    import uuid

    from flask import Flask

    from receiver.extension import WebhookReceiver
    from receiver.testing import WebhookTestClient

    name = f"hl_conns_{uuid.uuid4().hex[:8]}"
    hooks = WebhookReceiver()
    hooks.on_any(name="noop")(lambda event: None)
    app = Flask("conns")
    app.config.update(
        HOOKLEDGER_DATABASE_URL=f"{migrated}&application_name={name}",
        HOOKLEDGER_SECRETS="k:whsec_conns_0123456789",
    )
    hooks.init_app(app)
    state = WebhookReceiver.state(app)
    client = WebhookTestClient(app)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    gc.collect()
    gc.disable()  # what the runs leave open counts, not what a collection happens to close
    try:
        assert client.send("payment_succeeded", object_id="pay_0").status_code == 200
        assert client.drain() == 1
        before = _backends(name)
        for n in range(1, 4):
            assert client.send("payment_succeeded", object_id=f"pay_{n}").status_code == 200
            result = app.test_cli_runner().invoke(args=["hookledger", "worker", "--burst"])
            assert result.exit_code == 0, result.output
        after_runs = _backends(name)
        for _ in range(3):
            state.worker(bounded=True).drain()
        after_workers = _backends(name)
    finally:
        gc.enable()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        state.worker(bounded=True).store.engine.dispose()
        state.store.engine.dispose()
    assert before >= 1
    assert after_runs == before, (before, after_runs)
    assert after_workers == before + 1, (before, after_workers)
