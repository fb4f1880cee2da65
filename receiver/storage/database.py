"""Engines and schema migrations.

SQLite is the embedded default (WAL, ``synchronous=FULL``, every transaction ``BEGIN
IMMEDIATE`` so a read-then-write transaction can never fail to upgrade its lock); PostgreSQL
is the production engine. The schema is owned by Alembic migrations shipped in the package,
with their own version table so they never collide with the application's migrations.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, MetaData, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.pool import StaticPool

from receiver.core.errors import ConfigurationError
from receiver.storage.bounds import Bounds, bound
from receiver.storage.checkpoints import take_checkpoints_aside

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
VERSION_TABLE = "hookledger_alembic_version"


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


#: PostgreSQL: a pooled connection idle for longer than this is pinged before use (seconds).
PING_AFTER_IDLE = 30.0


def make_engine(
    url: str,
    *,
    sqlite_busy_timeout: float = 5.0,
    ping_after_idle: float | None = PING_AFTER_IDLE,
    bounds: Bounds | None = None,
    **kwargs: Any,
) -> Engine:
    """Create an engine for ``url`` with hookledger's settings for that database.

    ``sqlite_busy_timeout``: how long a SQLite writer waits for the lock before the request
    fails (the receiver then answers 503 and the processor retries); keep it below the
    processor's delivery timeout.

    ``ping_after_idle`` (PostgreSQL): a pooled connection is pinged before use only when it
    has been idle for longer than this many seconds (a dead one is then replaced), not on
    every checkout (``pool_pre_ping``, one more round trip per request under load). A
    connection that dies within that window fails its statement: that request answers 503
    (the processor retries; the receive path runs its idempotent insert again once on a new
    connection first), and SQLAlchemy replaces the pool's other connections. ``None``: ping
    on every checkout (``pool_pre_ping``).

    ``bounds`` (PostgreSQL): the statement, lock and idle-in-transaction timeouts each new
    connection sets, and the client-side bound on a wait for an answer
    (:mod:`receiver.storage.bounds`); the worker's and the reconciler's engines have them.
    ``None``: the server's own settings, no client-side bound (migrations and operators'
    commands may run long).
    """
    url = normalise_url(url)
    try:
        parsed = make_url(url)
    except Exception as exc:  # noqa: BLE001 - any parse failure is a configuration error
        raise ConfigurationError("HOOKLEDGER_DATABASE_URL is not a valid database URL") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        memory = parsed.database in (None, "", ":memory:")
        connect_args = {"timeout": sqlite_busy_timeout, "check_same_thread": False}
        if memory:
            kwargs.setdefault("poolclass", StaticPool)
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        _configure_sqlite(engine, memory=memory, busy_ms=int(sqlite_busy_timeout * 1000))
        return engine
    if backend == "postgresql":
        # Without a connect timeout a network partition hangs requests in connect() until
        # the web server kills its worker; with one, the receiver answers 503 in time.
        # Keepalives and a TCP user timeout: an established connection whose peer vanished
        # (a partition that drops packets) fails in seconds instead of hanging for minutes.
        defaults = {
            "connect_timeout": 5,
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 2,
            "tcp_user_timeout": 10_000,
        }
        connect_args = kwargs.setdefault("connect_args", {})
        for name, value in defaults.items():
            if name not in parsed.query:
                connect_args.setdefault(name, value)
        kwargs.setdefault("pool_pre_ping", ping_after_idle is None)
        kwargs.setdefault("pool_size", 5)
        kwargs.setdefault("max_overflow", 10)
        if parsed.get_driver_name() == "psycopg" and importlib.util.find_spec("psycopg") is None:
            raise ConfigurationError(
                "PostgreSQL needs the psycopg driver: pip install 'hookledger[postgres]'"
            )
        try:
            engine = create_engine(url, **kwargs)
        except ImportError as exc:  # another driver named in the URL, not installed
            raise ConfigurationError(
                f"the database driver {parsed.get_driver_name()!r} is not installed "
                "(hookledger's is psycopg: pip install 'hookledger[postgres]' and use "
                "postgresql+psycopg://...)"
            ) from exc
        if ping_after_idle is not None and not kwargs["pool_pre_ping"]:
            _ping_after_idle(engine, ping_after_idle)
        if bounds is not None:
            bound(engine, bounds)
        return engine
    raise ConfigurationError(f"unsupported database backend {backend!r} (use sqlite or postgresql)")


_IDLE_SINCE = "hookledger_idle_since"


def _ping_after_idle(engine: Engine, seconds: float) -> None:
    """Ping a pooled connection at checkout only if it sat idle for over ``seconds``."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get(_IDLE_SINCE)
        if since is None or time.monotonic() - since <= seconds:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # noqa: BLE001 - any failure: replace the connection
            raise DisconnectionError("connection lost while idle in the pool") from exc
        if not alive:
            raise DisconnectionError("connection lost while idle in the pool")


def normalise_url(url: str) -> str:
    """``postgres://`` (Heroku, Render, Fly...) and a driverless ``postgresql://`` name
    hookledger's PostgreSQL driver: ``postgresql+psycopg://``. Other URLs are unchanged."""
    text = url.strip()
    for scheme in ("postgres://", "postgresql://"):
        if text.startswith(scheme):
            return "postgresql+psycopg://" + text[len(scheme) :]
    return text


def _configure_sqlite(engine: Engine, *, memory: bool, busy_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below emit BEGIN itself.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not memory:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute(f"PRAGMA busy_timeout={busy_ms:d}")
        cursor.execute("PRAGMA foreign_keys=ON")
        if not memory:
            take_checkpoints_aside(cursor)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writers take the lock up front (a read-then-write transaction can then never fail
        # to upgrade). Readers, and transactions whose first statement writes, use a deferred
        # BEGIN: a reader reads the WAL snapshot without the lock; a write-first transaction
        # takes it at its first statement, so it holds it no longer than it must. (Sent through
        # SQLAlchemy, which turns "database is locked" into its OperationalError: the
        # receiver's 503 and the worker's retry depend on that.)
        deferred = conn.get_execution_options().get(DEFERRED_BEGIN_OPTION)
        conn.exec_driver_sql("BEGIN" if deferred else "BEGIN IMMEDIATE")


@dataclass(frozen=True, slots=True)
class MigrationTree:
    """One package's migrations: where they live and which version table they own."""

    directory: Path
    version_table: str


RECEIVER_MIGRATIONS = MigrationTree(MIGRATIONS_DIR, VERSION_TABLE)


DEFERRED_BEGIN_OPTION = "hookledger_deferred_begin"


def deferred_begin(engine: Engine) -> Engine:
    """The same engine (same pool) for transactions that only read, or whose *first*
    statement writes.

    On SQLite they begin with a plain (deferred) ``BEGIN``: a reader reads the WAL snapshot
    without the write lock; a write-first transaction takes the lock at that first statement
    (there is no earlier read whose lock could fail to upgrade, the case ``BEGIN IMMEDIATE``
    prevents) and holds it only from there to its commit. Elsewhere it changes nothing.
    """
    return engine.execution_options(**{DEFERRED_BEGIN_OPTION: True})


def _alembic_config(engine: Engine, tree: MigrationTree) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(tree.directory))
    cfg.attributes["engine"] = engine
    cfg.attributes["version_table"] = tree.version_table
    return cfg


def run_migrations(context: Any, metadata: MetaData) -> None:
    """Body of every hookledger ``env.py``: migrate on the engine handed over in attributes."""
    config = context.config
    engine: Engine = config.attributes["engine"]
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            version_table=config.attributes["version_table"],
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


def upgrade(
    engine: Engine, revision: str = "head", tree: MigrationTree = RECEIVER_MIGRATIONS
) -> None:
    """Apply migrations up to ``revision`` (idempotent)."""
    command.upgrade(_alembic_config(engine, tree), revision)


def downgrade(engine: Engine, revision: str, tree: MigrationTree = RECEIVER_MIGRATIONS) -> None:
    command.downgrade(_alembic_config(engine, tree), revision)


def current_revision(engine: Engine, tree: MigrationTree = RECEIVER_MIGRATIONS) -> str | None:
    # A read: on SQLite without the write lock (another process's long write transaction
    # must not make a worker starting up, or ``hookledger status``, wait for it and fail).
    with deferred_begin(engine).connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": tree.version_table})
        return context.get_current_revision()


@lru_cache(maxsize=8)
def head_revision(tree: MigrationTree = RECEIVER_MIGRATIONS) -> str | None:
    """The latest migration of ``tree`` (read once per process: the files do not change)."""
    script = ScriptDirectory.from_config(_alembic_config(create_engine("sqlite://"), tree))
    return script.get_current_head()


def check_schema(engine: Engine, tree: MigrationTree = RECEIVER_MIGRATIONS) -> None:
    """Raise :class:`ConfigurationError` unless the database is at the latest migration."""
    current, head = current_revision(engine, tree), head_revision(tree)
    if current != head:
        raise ConfigurationError(
            f"hookledger schema is at {current or 'nothing'}, expected {head}: "
            "run `hookledger db upgrade` (or `flask hookledger db upgrade`)"
        )
