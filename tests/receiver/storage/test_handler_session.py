"""A handler's session cannot end hookledger's transaction (issue 28, hole 1).

The handlers' session used to be the dispatcher's own: ``session.rollback()`` (the usual
``except IntegrityError: session.rollback()``) or ``session.commit()`` ended the batch's
transaction, the next savepoint call raised ``ResourceClosedError``, and the worker took that
for a storage outage: no attempt, no ``last_error``, the event claimed again for ever, and with
``commit()`` the handler's write committed on every loop without its ledger row.

Now each handler gets a session joined to the batch's connection in a savepoint
(``join_transaction_mode="create_savepoint"``): ``rollback()`` undoes the handler's own writes
and the handler goes on; everything that would end the transaction is refused with
``HandlerTransactionError`` and is that handler's failure, caught or not.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from receiver import HandlerTransactionError
from receiver.core.clock import as_utc
from receiver.core.events import Event, parse_event
from receiver.core.registry import Registry
from receiver.core.retry import RetryPolicy
from receiver.storage.database import make_engine, upgrade
from receiver.storage.dispatch import Work
from receiver.storage.handler_session import transaction_control
from receiver.storage.tables import EventStatus
from receiver.store import Store
from receiver.testing.factories import build_event, encode
from receiver.worker.runner import Worker, WorkerConfig

pytestmark = pytest.mark.storage


class _Base(DeclarativeBase):
    pass


class ShopOrder(_Base):
    """The shop's own table, written the usual SQLAlchemy way."""

    __tablename__ = "shop_order"
    id: Mapped[str] = mapped_column(primary_key=True)


@dataclass
class World:
    engine: sa.Engine
    store: Store
    registry: Registry
    calls: Counter[str]

    def insert(self, object_id: str, event_type: str = "payment_succeeded") -> str:
        event_id = f"evt_{object_id}"
        body = encode(build_event(event_type, object_id=object_id, event_id=event_id))
        self.store.inbox.insert(parse_event(body), body)
        return event_id

    def worker(self) -> Worker:
        worker = Worker(self.store, self.registry, WorkerConfig(batch_size=16))
        worker.heartbeat = False
        return worker

    def rows(self, table: str) -> list[str]:
        with self.engine.connect() as conn:
            return sorted(str(r[0]) for r in conn.execute(sa.text(f"SELECT id FROM {table}")))

    def event(self, event_id: str) -> Any:
        row = self.store.operations.get(event_id)
        assert row is not None
        return row

    def run(self, event_id: str, handler: str) -> Any:
        runs = self.store.operations.handler_runs(self.event(event_id).id or 0)
        (run,) = (r for name, r in runs.items() if name.rsplit(".", 1)[-1] == handler)
        return run


@pytest.fixture
def world(database_url: str) -> Iterator[World]:
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        _Base.metadata.create_all(engine)
        with engine.begin() as conn:
            # No key: a write committed twice shows twice.
            conn.execute(sa.text("CREATE TABLE shop_log (id TEXT NOT NULL)"))
        store = Store(engine, retry=RetryPolicy(max_attempts=3, base_seconds=60.0))
        yield World(engine=engine, store=store, registry=Registry(), calls=Counter())
    finally:
        engine.dispose()


def _log(session: Session, what: str) -> None:
    session.execute(sa.text("INSERT INTO shop_log (id) VALUES (:i)"), {"i": what})


def _object_id(event: Event) -> str:
    ref = event.object_ref
    assert ref is not None
    return ref.object_id


def test_rollback_undoes_only_the_handlers_own_writes_and_the_handler_goes_on(
    world: World,
) -> None:
    """The idempotency pattern: a duplicate order raises IntegrityError, the handler rolls
    back and carries on. Its later writes, the other handler's writes and the batch's other
    events all commit once; nothing loops."""
    with Session(world.engine) as shop, shop.begin():
        shop.add(ShopOrder(id="pay_dup"))  # shipped before, by the shop's own code

    @world.registry.on("payment_succeeded")
    def audit(event: Event, session: Session) -> None:
        _log(session, f"audit:{_object_id(event)}")

    @world.registry.on("payment_succeeded")
    def ship(event: Event, session: Session) -> None:
        object_id = _object_id(event)
        world.calls[object_id] += 1
        _log(session, f"before:{object_id}")  # undone by the rollback below, if any
        try:
            session.add(ShopOrder(id=object_id))
            session.flush()
        except IntegrityError:
            session.rollback()
            _log(session, f"already:{object_id}")
            return
        _log(session, f"shipped:{object_id}")

    for object_id in ("pay_new", "pay_dup", "pay_other"):
        world.insert(object_id)
    assert world.worker().run_once() == 3
    for object_id in ("pay_new", "pay_dup", "pay_other"):
        row = world.event(f"evt_{object_id}")
        assert (row.status, row.attempts, row.last_error) == (EventStatus.DONE, 1, None)
    assert world.calls == Counter(pay_new=1, pay_dup=1, pay_other=1)
    assert world.rows("shop_order") == ["pay_dup", "pay_new", "pay_other"]
    assert world.rows("shop_log") == sorted(
        [
            "audit:pay_new",
            "audit:pay_dup",
            "audit:pay_other",
            "before:pay_new",
            "before:pay_other",
            "shipped:pay_new",
            "shipped:pay_other",
            "already:pay_dup",
        ]
    )


def test_a_handler_that_rolls_back_then_fails_leaves_nothing(world: World) -> None:
    """Writes after the handler's own rollback, through a connection it held from before, are
    still the handler's: its failure undoes them too."""

    @world.registry.on("payment_succeeded")
    def ship(event: Event, session: Session) -> None:
        conn = session.connection()
        _log(session, "first")
        session.rollback()
        conn.execute(sa.text("INSERT INTO shop_log (id) VALUES ('held')"))
        _log(session, "second")
        raise RuntimeError("out of stock")

    event_id = world.insert("pay_1")
    assert world.worker().run_once() == 1
    row = world.event(event_id)
    assert (row.status, row.attempts) == (EventStatus.PENDING, 1)
    assert "out of stock" in (world.run(event_id, "ship").last_error or "")
    assert world.rows("shop_log") == []


def _sqlite(session: Session) -> bool:
    return session.get_bind().dialect.name == "sqlite"


#: Every way a handler could end the transaction, each refused before it reaches the database.
ENDINGS: dict[str, Callable[[Session], object]] = {
    "session.commit": lambda s: s.commit(),
    "session.begin": lambda s: s.begin(),
    "with session.begin": lambda s: s.begin().__enter__(),
    "session.close": lambda s: s.close(),
    "session.invalidate": lambda s: s.invalidate(),
    "connection.commit": lambda s: s.connection().commit(),
    "connection.rollback": lambda s: s.connection().rollback(),
    "connection.close": lambda s: s.connection().close(),
    "connection.invalidate": lambda s: s.connection().invalidate(),
    "get_transaction.commit": lambda s: s.connection().get_transaction().commit(),  # type: ignore[union-attr]
    "get_bind.commit": lambda s: s.get_bind().commit(),  # type: ignore[union-attr]
    "pool connection.commit": lambda s: s.connection().connection.commit(),  # type: ignore[attr-defined]
    "driver.commit": lambda s: s.connection().connection.dbapi_connection.commit(),  # type: ignore[union-attr]
    "driver.rollback": lambda s: s.connection().connection.dbapi_connection.rollback(),  # type: ignore[union-attr]
    "SQL COMMIT": lambda s: s.execute(sa.text("COMMIT")),
    "SQL ROLLBACK": lambda s: s.execute(sa.text("rollback")),
    "SQL END": lambda s: s.execute(sa.text("  /* done */ END")),
    "SQL BEGIN": lambda s: s.execute(sa.text("BEGIN")),
    # SQLite: a connection's setting outlives the transaction (query_only left the worker's
    # pooled connection unable to write: the batch was claimed again for ever).
    "PRAGMA query_only": lambda s: s.execute(
        sa.text("PRAGMA query_only = 1" if _sqlite(s) else "COMMIT")
    ),
    "PRAGMA busy_timeout": lambda s: s.execute(
        sa.text("PRAGMA main.busy_timeout = 1" if _sqlite(s) else "COMMIT")
    ),
    "driver SQL COMMIT": lambda s: s.connection().exec_driver_sql("COMMIT"),
    "scalar COMMIT": lambda s: s.scalar(sa.text("COMMIT")),
    "two statements": lambda s: s.connection().exec_driver_sql("SELECT 1; COMMIT"),
    "release hookledger's savepoint": lambda s: s.connection().exec_driver_sql(
        "RELEASE SAVEPOINT sa_savepoint_1"
    ),
}


@pytest.mark.parametrize("caught", [True, False], ids=["caught", "raised"])
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_ending_the_transaction_is_refused_and_is_the_handlers_failure(
    world: World, ending: str, caught: bool
) -> None:
    """The handler's write is rolled back, its ledger row says why, the attempt counts and
    the backoff applies; the batch's other events are done, their writes committed once."""

    @world.registry.on("payment_succeeded")
    def ship(event: Event, session: Session) -> None:
        object_id = _object_id(event)
        _log(session, object_id)
        if object_id != "pay_bad":
            return
        try:
            ENDINGS[ending](session)
        except HandlerTransactionError:
            if not caught:
                raise
        except Exception:  # the driver's own refusal (SQLite's authorizer), caught too
            if not caught:
                raise

    for object_id in ("pay_1", "pay_bad", "pay_2"):
        world.insert(object_id)
    worker = world.worker()
    assert worker.run_once() == 3  # no outage: nothing raised, nothing left claimed
    assert world.rows("shop_log") == ["pay_1", "pay_2"]
    for good in ("evt_pay_1", "evt_pay_2"):
        row = world.event(good)
        assert (row.status, row.attempts) == (EventStatus.DONE, 1)
    bad = world.event("evt_pay_bad")
    assert (bad.status, bad.attempts, bad.lease_owner) == (EventStatus.PENDING, 1, None)
    assert as_utc(bad.next_attempt_at) - world.store.now() > timedelta(seconds=25)
    run = world.run("evt_pay_bad", "ship")
    assert run.status == "failed" and run.attempts == 1
    assert "HandlerTransactionError" in (run.last_error or "")
    assert "HandlerTransactionError" in (bad.last_error or "")


def test_a_handler_that_always_commits_is_dead_lettered_and_never_ships(world: World) -> None:
    """``run(burst=True)`` ends: three attempts, then the dead-letter; the shipment it tried
    to commit each time is in the shop's table no time."""
    world.store.retry = RetryPolicy(max_attempts=3, base_seconds=0.0, max_seconds=0.0)
    world.store.dispatcher.retry = world.store.retry

    @world.registry.on("payment_succeeded")
    def ship(event: Event, session: Session) -> None:
        world.calls["ship"] += 1
        _log(session, "shipped")
        session.commit()

    event_id = world.insert("pay_1")
    world.worker().run(burst=True)
    row = world.event(event_id)
    assert (row.status, row.attempts, row.lease_owner) == (EventStatus.DEAD, 3, None)
    assert world.calls["ship"] == 3
    assert world.rows("shop_log") == []
    run = world.run(event_id, "ship")
    assert (run.status, run.attempts) == ("failed", 3)
    assert "session.commit()" in (run.last_error or "")


def test_a_handler_that_ends_the_transaction_under_the_guards_fails_alone(
    world: World,
) -> None:
    """On the driver's cursor, nothing can be refused: the dispatcher sees the transaction
    ended after the handler returns. That handler fails (without running again); the batch's
    other events, whose writes went with the transaction, are dispatched again one by one and
    their writes commit once."""

    @world.registry.on("payment_succeeded")
    def ship(event: Event, session: Session) -> None:
        object_id = _object_id(event)
        world.calls[object_id] += 1
        _log(session, object_id)
        if object_id == "pay_bad":
            driver: Any = session.connection().connection.dbapi_connection
            cursor = driver.cursor()
            if world.engine.dialect.name == "sqlite":
                driver.set_authorizer(None)  # what only a driver-level handler would do
            cursor.execute("ROLLBACK")
            cursor.close()

    for object_id in ("pay_1", "pay_bad", "pay_2"):
        world.insert(object_id)
    # One transaction for the three (a worker on a SQLite file commits in turns).
    batch = world.store.queue.claim_batch("worker-1", 60.0, limit=8)
    spec = world.registry.handlers[0]
    works = [
        Work(
            claimed=c,
            handlers=[
                (
                    spec.name,
                    partial(spec.call, parse_event(world.store.open_body(c.body, c.event_id))),
                    True,
                )
            ],
        )
        for c in sorted(
            batch, key=lambda c: ["evt_pay_1", "evt_pay_bad", "evt_pay_2"].index(c.event_id)
        )
    ]
    outcomes = world.store.dispatcher.dispatch_many(works)
    assert [o.status for o in outcomes] == ["done", "pending", "done"]
    assert outcomes[1].refused and outcomes[1].refused[0][0] == spec.name
    assert world.rows("shop_log") == ["pay_1", "pay_2"]
    for good in ("evt_pay_1", "evt_pay_2"):
        row = world.event(good)
        assert (row.status, row.attempts) == (EventStatus.DONE, 1)
    bad = world.event("evt_pay_bad")
    assert (bad.status, bad.attempts, bad.lease_owner) == (EventStatus.PENDING, 1, None)
    run = world.run("evt_pay_bad", "ship")
    assert run.status == "failed" and "ended hookledger's transaction" in (run.last_error or "")
    assert world.calls["pay_bad"] == 1  # failed, not run again
    # pay_1 ran before it in the transaction that was lost: it ran again, on its own.
    assert world.calls == Counter(pay_1=2, pay_bad=1, pay_2=1)


@pytest.mark.parametrize("user", ["another handler", "a thread"])
def test_a_session_kept_after_its_handler_returned_writes_nothing(world: World, user: str) -> None:
    """Review of issue 28: a handler's session kept past its call (by a later handler of the
    event that takes no session, or by a thread the handler started) wrote into the batch's
    transaction outside any handler's savepoint: committed although the handler using it
    failed, and again at each retry. Once its handler's call is over the session refuses
    every statement (HandlerTransactionError); nothing is written."""
    kept: dict[str, Any] = {}
    errors: list[BaseException] = []

    def late_write(session: Session, object_id: str) -> None:
        try:
            _log(session, f"late:{object_id}")
        except BaseException as exc:  # noqa: BLE001 - what the thread saw
            errors.append(exc)
            raise

    @world.registry.on("payment_succeeded")
    def first(event: Event, session: Session) -> None:
        kept["session"] = session
        if user == "a thread":
            go = threading.Event()
            kept["go"] = go

            def later() -> None:
                go.wait(10)
                with contextlib.suppress(HandlerTransactionError):
                    late_write(session, _object_id(event))

            kept["thread"] = threading.Thread(target=later)
            kept["thread"].start()

    @world.registry.on("payment_succeeded")
    def second(event: Event) -> None:  # takes no session
        if user == "a thread":
            kept["go"].set()
            kept["thread"].join(10)
        else:
            late_write(kept["session"], _object_id(event))
        raise RuntimeError("out of stock")

    event_id = world.insert("pay_1")
    assert world.worker().run_once() == 1
    assert world.rows("shop_log") == []
    assert len(errors) == 1 and isinstance(errors[0], HandlerTransactionError)
    row = world.event(event_id)
    assert (row.status, row.attempts) == (EventStatus.PENDING, 1)
    assert world.run(event_id, "first").status == "succeeded"
    assert world.run(event_id, "second").status == "failed"


#: Settings a handler may leave behind that hookledger's own writes of the batch depend on.
SETTINGS = {
    "SET LOCAL search_path": "SET LOCAL search_path TO pg_catalog",
    "SET search_path": "SET search_path TO pg_catalog",
    "set_config": "SELECT set_config('search_path', 'pg_catalog', true)",
    "SET LOCAL statement_timeout": "SET LOCAL statement_timeout = 1",
    "SET lock_timeout": "SET lock_timeout = 1",
    "SET DateStyle": "SET DateStyle = 'SQL, DMY'",
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_settings_a_handler_leaves_behind_are_put_back_before_hookledgers_writes(
    world: World, setting: str
) -> None:
    """Review of issue 28: a handler that succeeded after ``SET LOCAL search_path`` (or a
    ``statement_timeout``, ...) for its own queries left it to hookledger's ledger and
    outcome writes, which failed; the batch was taken for a storage failure, claimed again,
    the handler ran again, for ever (no attempt counted, no last_error, ``worker --burst``
    never ended). The settings are put back before hookledger's writes, and after the
    commit the pooled connection has its own again."""
    if world.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's settings")

    @world.registry.on("payment_succeeded")
    def ship(event: Event, session: Session) -> None:
        object_id = _object_id(event)
        world.calls[object_id] += 1
        _log(session, object_id)
        if object_id == "pay_set":
            session.execute(sa.text(SETTINGS[setting]))

    for object_id in ("pay_set", "pay_2"):
        world.insert(object_id)
    worker = world.worker()
    assert worker.run_once() == 2
    world.insert("pay_3")
    assert worker.run_once() == 1
    for object_id in ("pay_set", "pay_2", "pay_3"):
        row = world.event(f"evt_{object_id}")
        assert (row.status, row.attempts) == (EventStatus.DONE, 1)
    assert world.calls == Counter(pay_set=1, pay_2=1, pay_3=1)
    assert world.rows("shop_log") == ["pay_2", "pay_3", "pay_set"]


def test_what_a_handler_may_still_do(world: World) -> None:
    """Savepoints of its own (``begin_nested()`` and raw SQL), ``flush()``, reads: allowed,
    and its writes commit with its ledger row."""

    @world.registry.on("payment_succeeded")
    def ship(event: Event, session: Session) -> None:
        with session.begin_nested():
            _log(session, "nested kept")
        nested = session.begin_nested()
        _log(session, "nested undone")
        nested.rollback()
        conn = session.connection()
        conn.exec_driver_sql("SAVEPOINT mine")
        conn.exec_driver_sql("INSERT INTO shop_log (id) VALUES ('raw undone')")
        conn.exec_driver_sql("ROLLBACK TO SAVEPOINT mine")
        conn.exec_driver_sql("RELEASE SAVEPOINT mine")
        session.add(ShopOrder(id="pay_1"))
        session.flush()
        assert session.scalar(sa.select(sa.func.count()).select_from(ShopOrder)) == 1
        if _sqlite(session):  # reading pragmas, and those naming what to read
            assert session.execute(sa.text("PRAGMA table_info(shop_log)")).all()
            assert session.scalar(sa.text("PRAGMA query_only")) == 0
            session.execute(sa.text("PRAGMA foreign_key_check(shop_log)")).all()

    event_id = world.insert("pay_1")
    assert world.worker().run_once() == 1
    assert world.event(event_id).status == EventStatus.DONE
    assert world.rows("shop_log") == ["nested kept"]
    assert world.rows("shop_order") == ["pay_1"]


@pytest.mark.parametrize(
    ("sql", "verdict"),
    [
        ("COMMIT", "COMMIT"),
        ("commit work", "COMMIT WORK"),
        ("COMMIT PREPARED 'x'", "COMMIT PREPARED"),
        ("END TRANSACTION", "END TRANSACTION"),
        ("abort", "ABORT"),
        ("BEGIN IMMEDIATE", "BEGIN IMMEDIATE"),
        ("START TRANSACTION", "START TRANSACTION"),
        ("ROLLBACK", "ROLLBACK"),
        ("ROLLBACK PREPARED 'x'", "ROLLBACK"),
        ("ROLLBACK TO SAVEPOINT sa_savepoint_1", "ROLLBACK TO sa_savepoint_1"),
        ("PREPARE TRANSACTION 'x'", "PREPARE TRANSACTION"),
        ("SAVEPOINT sa_savepoint_9", "SAVEPOINT sa_savepoint_9"),
        ("RELEASE other", "RELEASE other"),
        ("SELECT 1; COMMIT", "COMMIT"),
        ("-- note\nCOMMIT", "COMMIT"),
        ("SELECT 'a;b'; /* ; */ rollback;", "ROLLBACK"),
        ("SELECT 1", None),
        ("SELECT 'COMMIT'; SELECT $$ ; COMMIT $$", None),
        ("PREPARE q AS SELECT 1", None),
        ("SAVEPOINT mine; ROLLBACK TO mine; RELEASE SAVEPOINT MINE", None),
        (
            "CREATE TRIGGER t AFTER INSERT ON x BEGIN UPDATE y SET n = CASE WHEN 1 THEN 2 END;"
            " DELETE FROM z; END",
            None,
        ),
        ("CREATE TABLE t (a INT); COMMIT", "COMMIT"),
    ],
)
def test_transaction_statements_are_recognised(sql: str, verdict: str | None) -> None:
    assert transaction_control(sql, set()) == verdict
