"""Database tables of the receiver (SQLModel).

The schema is created and upgraded by the Alembic migrations in ``receiver/migrations``
(``hookledger db upgrade``), never by ``create_all`` on a production path. A test
(``tests/receiver/storage/test_migrations.py``) fails when these models and the migrations drift.

All times are stored as naive UTC.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
    true,
)
from sqlmodel import Field, SQLModel

from receiver.core.accounts import DEFAULT_ACCOUNT

#: Metadata of hookledger's own tables, separate from the application's ``SQLModel.metadata``
#: so that a merchant's ``create_all`` never creates (or a merchant's Alembic never drops) ours.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)


#: SQLite only autoincrements a column declared exactly INTEGER PRIMARY KEY.
_BIGINT_PK = BigInteger().with_variant(Integer(), "sqlite")


class Base(SQLModel):
    metadata = metadata


class EventStatus:
    """Lifecycle of an inbox row."""

    PENDING = "pending"  # due at next_attempt_at (new, or waiting for a retry)
    PROCESSING = "processing"  # leased by a worker until lease_expires_at
    DONE = "done"  # every handler succeeded (or none was registered)
    STALE = "stale"  # older than the object's projected status: recorded, not dispatched
    DUPLICATE = "duplicate"  # the transition (object, event type) was already dispatched
    DEAD = "dead"  # out of attempts; an operator requeues it

    OPEN = (PENDING, PROCESSING)
    TERMINAL = (DONE, STALE, DUPLICATE, DEAD)
    ALL = (PENDING, PROCESSING, DONE, STALE, DUPLICATE, DEAD)


#: How a deferred event's ``last_error`` begins (the handler's reason follows); it is
#: ``pending`` meanwhile.
DEFERRED_PREFIX = "deferred: "


class Source:
    """Where an inbox row came from."""

    WEBHOOK = "webhook"  # delivered by the processor to the blueprint
    RECONCILE = "reconcile"  # synthesised by the reconciler from a listed or fetched object
    RECOVERED = "recovered"  # an undelivered webhook fetched from the processor's events API
    API = "api"  # a processor API response the shop observed (``WebhookReceiver.observe``)
    BACKFILL = "backfill"  # a transition from before the cut-over the merchant asked for
    REPLAY = "replay"  # an operator's copy of a stored event (bypasses the guard)

    ALL = (WEBHOOK, RECONCILE, RECOVERED, API, BACKFILL, REPLAY)
    #: Sources the cut-over applies to: what they report may have happened before it.
    HISTORICAL = (WEBHOOK, RECONCILE, RECOVERED)


class InboxEvent(Base, table=True):
    """One received (or synthesised, or replayed) event, with the raw bytes as they arrived."""

    __tablename__ = "hookledger_event"
    __table_args__ = (
        UniqueConstraint("account", "event_id"),
        Index("ix_hookledger_event_due", "status", "next_attempt_at"),
        Index("ix_hookledger_event_object", "object_key", "event_time", "id"),
        Index(
            "ix_hookledger_event_open_due",
            "account",
            "next_attempt_at",
            "id",
            postgresql_where=text("status IN ('pending', 'processing')"),
            sqlite_where=text("status IN ('pending', 'processing')"),
        ),
        # Ids are never reused, even after ``prune`` deleted the highest ones: the guard
        # tells a retry of a transition's owner from another event by its id.
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(
        default=None, sa_column=Column(_BIGINT_PK, primary_key=True, autoincrement=True)
    )
    #: The processor account the row belongs to (:mod:`receiver.core.accounts`).
    account: str = Field(
        default=DEFAULT_ACCOUNT,
        sa_column=Column(String(64), nullable=False, server_default=text("'default'")),
    )
    event_id: str = Field(max_length=255)
    source: str = Field(max_length=16)
    merchant_id: str | None = Field(default=None, max_length=255)
    event_type: str | None = Field(default=None, max_length=64)
    content_type: str | None = Field(default=None, max_length=64)
    object_kind: str | None = Field(default=None, max_length=32)
    object_id: str | None = Field(default=None, max_length=255)
    object_status: str | None = Field(default=None, max_length=64)
    #: A dispute's ``dispute_stage`` (part of its state; ``None`` for other kinds).
    object_stage: str | None = Field(default=None, max_length=64)
    #: ``kind:id`` of the object, or ``event:<event_id>`` when the object is unknown: the unit of
    #: ordering (events of one key are processed one at a time, in event-time order).
    object_key: str = Field(max_length=300)
    event_time: datetime | None = Field(default=None)
    #: When the processor created the object (for the reconciler's "known only locally" check).
    object_created_at: datetime | None = Field(default=None)
    received_at: datetime
    body: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    headers: str = Field(sa_column=Column(Text, nullable=False))
    body_sha256: str = Field(max_length=64)
    secret_id: str | None = Field(default=None, max_length=64)
    #: For ``source == replay``: the row replayed (the guard and transition rule are bypassed).
    replay_of: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    status: str = Field(default=EventStatus.PENDING, max_length=16)
    attempts: int = Field(default=0)
    next_attempt_at: datetime
    lease_owner: str | None = Field(default=None, max_length=128)
    lease_expires_at: datetime | None = Field(default=None)
    last_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    processed_at: datetime | None = Field(default=None)
    #: The data key ``body``, ``headers`` and ``body_sha256`` are sealed and keyed with
    #: (``None``: stored in the clear, with a plain SHA-256; see
    #: :mod:`receiver.storage.sealed_columns`).
    key_id: str | None = Field(default=None, max_length=64)
    #: When retention dropped the body, headers and error texts (the row, its ledger, its
    #: transitions and the projection stay, so dedupe and the guard still hold).
    redacted_at: datetime | None = Field(default=None)


class EventConflict(Base, table=True):
    """A delivery whose ``event_id`` was already stored with a different body."""

    __tablename__ = "hookledger_event_conflict"
    __table_args__ = (UniqueConstraint("account", "event_id", "body_sha256"),)

    id: int | None = Field(default=None, primary_key=True)
    #: The processor account the row belongs to (:mod:`receiver.core.accounts`).
    account: str = Field(
        default=DEFAULT_ACCOUNT,
        sa_column=Column(String(64), nullable=False, server_default=text("'default'")),
    )
    event_id: str = Field(max_length=255)
    source: str = Field(max_length=16)
    body: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    headers: str = Field(sa_column=Column(Text, nullable=False))
    body_sha256: str = Field(max_length=64)
    secret_id: str | None = Field(default=None, max_length=64)
    received_at: datetime
    key_id: str | None = Field(default=None, max_length=64)
    redacted_at: datetime | None = Field(default=None)


class HandlerRun(Base, table=True):
    """The per-(event, handler) ledger: a retry re-runs only handlers that have not succeeded."""

    __tablename__ = "hookledger_handler_run"

    event_pk: int = Field(sa_column=Column(BigInteger, primary_key=True))
    handler: str = Field(primary_key=True, max_length=255)
    status: str = Field(max_length=16)  # succeeded | failed
    attempts: int = Field(default=0)
    last_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    updated_at: datetime


class Projection(Base, table=True):
    """Latest known state of each object, moved by the guard along the transition model."""

    __tablename__ = "hookledger_projection"
    __table_args__ = (
        # Partial: the guard's lookup of one object (kind, id) can only use the primary key.
        Index(
            "ix_hookledger_projection_created",
            "account",
            "object_kind",
            "object_created_at",
            postgresql_where=text("object_created_at IS NOT NULL"),
            sqlite_where=text("object_created_at IS NOT NULL"),
        ),
    )

    account: str = Field(
        default=DEFAULT_ACCOUNT,
        sa_column=Column(
            String(64), primary_key=True, nullable=False, server_default=text("'default'")
        ),
    )
    object_kind: str = Field(primary_key=True, max_length=32)
    object_id: str = Field(primary_key=True, max_length=255)
    status: str = Field(max_length=64)
    #: A dispute's stage (``None`` for other kinds).
    stage: str | None = Field(default=None, max_length=64)
    event_time: datetime | None = Field(default=None)
    object_created_at: datetime | None = Field(default=None)
    event_pk: int = Field(sa_column=Column(BigInteger, nullable=False))
    updated_at: datetime


class Transition(Base, table=True):
    """(object, state) pairs already dispatched: each is dispatched at most once.

    ``state`` is :attr:`receiver.core.transitions.State.key`: the status, or ``stage/status`` for
    a dispute (not the event type: see :mod:`receiver.core.transitions`)."""

    __tablename__ = "hookledger_transition"

    account: str = Field(
        default=DEFAULT_ACCOUNT,
        sa_column=Column(
            String(64), primary_key=True, nullable=False, server_default=text("'default'")
        ),
    )
    object_kind: str = Field(primary_key=True, max_length=32)
    object_id: str = Field(primary_key=True, max_length=255)
    state: str = Field(primary_key=True, max_length=140)
    event_pk: int = Field(sa_column=Column(BigInteger, nullable=False))
    created_at: datetime


class OrderReference(Base, table=True):
    """The order index: a digest of each of the shop's order references an event carries
    (``HOOKLEDGER_ORDER_FIELDS``, :mod:`receiver.core.order_refs`), so ``hookledger events
    --order`` and the console find an order's events whatever seals their bodies.

    ``digest`` is HMAC-SHA-256 of the reference under a key derived from the data key
    ``key_id`` for this purpose alone, or plain SHA-256 without a data key (then the body it
    comes from is in the clear too): nothing readable is stored. Written with the event
    (receipt, observe, the reconciler's recoveries, backfills, replays), rewritten by
    ``rotate-keys``, deleted when the event is redacted or pruned; ``hookledger order-index
    backfill`` indexes events stored before it existed.
    """

    __tablename__ = "hookledger_order_ref"
    __table_args__ = (Index("ix_hookledger_order_ref_digest", "digest", "account"),)

    #: The inbox row (``hookledger_event.id``).
    event_pk: int = Field(sa_column=Column(BigInteger, primary_key=True))
    #: The configured field the reference was read from (``metadata.order_id``).
    path: str = Field(primary_key=True, max_length=128)
    #: The event's processor account (:mod:`receiver.core.accounts`).
    account: str = Field(
        default=DEFAULT_ACCOUNT,
        sa_column=Column(String(64), nullable=False, server_default=text("'default'")),
    )
    digest: str = Field(max_length=64)
    #: The data key the digest is keyed with (``None``: plain SHA-256).
    key_id: str | None = Field(default=None, max_length=64)


class OrderIndexBackfill(Base, table=True):
    """Where ``hookledger order-index backfill`` stands (resumable): per scope (``*`` for
    every account, else the accounts it was limited to), the fields it indexes and the
    last inbox row it has indexed."""

    __tablename__ = "hookledger_order_backfill"

    scope: str = Field(primary_key=True, max_length=200)
    #: The fields indexed (:meth:`receiver.core.order_refs.OrderFields.describe`).
    fields: str = Field(sa_column=Column(Text, nullable=False))
    #: Every inbox row up to this id is indexed.
    after_pk: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    started_at: datetime
    updated_at: datetime
    #: When it last reached the end of the inbox (``None``: not yet).
    finished_at: datetime | None = Field(default=None)


#: The cut-over's row of ``hookledger_cutover``.
CUTOVER_NAME = "cutover"
#: The row of ``hookledger_cutover`` that keeps the first webhook delivery hookledger stored
#: or was attempted with (``mode`` ``delivery``, the time in ``cutover_at``).
FIRST_DELIVERY_NAME = "first_delivery"
#: The row of ``hookledger_cutover`` that keeps the deploy that pointed the processor at
#: hookledger, as the operator stated it to adoption's first run (``reconcile adopt
#: --deployed-at``; ``mode`` ``deployed``, the time in ``cutover_at``).
DEPLOYED_NAME = "deployed"


class CutOver(Base, table=True):
    """Where hookledger's own history starts on an account that had one before it.

    Written by the reconciler's adoption (``reconcile adopt``): ``cutover_at`` is when the
    adoption began reading the processor's state. An event received after ``recorded_at``
    that happened before ``cutover_at`` (a processor retry of an old delivery, an
    undelivered event, a state a reconcile path finds) is recorded but never dispatched:
    the shop's earlier system handled it. ``cutover_at`` is ``None`` for an account declared
    new (nothing before it). One row at most (``name = 'cutover'``).

    A second row (``name = 'first_delivery'``, ``mode = 'delivery'``) keeps, in
    ``cutover_at``, the first webhook delivery hookledger stored or was attempted with: the
    deploy that pointed the processor at hookledger came before it, so the earlier system's
    history ends there if that is earlier than the cut-over (see
    :attr:`receiver.core.guard.CutOver.history_ends`). A third (``name = 'deployed'``,
    ``mode = 'deployed'``) keeps the deploy the operator stated to adoption's first run
    (``reconcile adopt --deployed-at``): the history ends there if that is earlier.
    """

    __tablename__ = "hookledger_cutover"

    account: str = Field(
        default=DEFAULT_ACCOUNT,
        sa_column=Column(
            String(64), primary_key=True, nullable=False, server_default=text("'default'")
        ),
    )
    name: str = Field(primary_key=True, max_length=32)
    mode: str = Field(max_length=16)  # adopted | new_account
    cutover_at: datetime | None = Field(default=None)
    recorded_at: datetime


class ObjectLease(Base, table=True):
    """Mutual exclusion per object: at most one worker processes events of one object."""

    __tablename__ = "hookledger_object_lease"

    object_key: str = Field(primary_key=True, max_length=300)
    owner: str = Field(max_length=128)
    expires_at: datetime


class WorkerHeartbeat(Base, table=True):
    """A running worker process: written when it starts and every few seconds while it runs,
    deleted when it stops cleanly. A row whose ``seen_at`` is old is a worker that died (or
    hangs): ``hookledger status`` and readiness count only recent ones."""

    __tablename__ = "hookledger_worker"

    name: str = Field(primary_key=True, max_length=128)
    host: str = Field(max_length=255)
    pid: int
    started_at: datetime
    seen_at: datetime
    #: Events this worker has processed since it started.
    processed: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))


class Rejection(Base, table=True):
    """A rejected delivery (bad or missing signature, too large, malformed, too old).

    Written at a bounded rate per web process (what is not written is counted in
    ``suppressed``) and capped in rows; never the body unless an operator opts in
    (``HOOKLEDGER_REJECTIONS_BODY_BYTES``), then capped and sealed. See
    :mod:`receiver.atrest.rejected_deliveries`.
    """

    __tablename__ = "hookledger_rejection"
    __table_args__ = (Index("ix_hookledger_rejection_received_at", "received_at"),)

    id: int | None = Field(
        default=None, sa_column=Column(_BIGINT_PK, primary_key=True, autoincrement=True)
    )
    received_at: datetime
    #: ``signature_mismatch``, ``signature_missing``, ``signature_malformed``, ``too_large``,
    #: ``malformed_event``, ``too_old``; ``rate_limited`` for a row that only carries a count.
    reason: str = Field(max_length=32)
    #: The account the delivery was addressed to (its URL), when it named a known one.
    account: str | None = Field(default=None, max_length=64)
    http_status: int
    remote_addr: str | None = Field(default=None, max_length=64)
    #: Bytes of the body (read, or declared by Content-Length when it was refused unread: a
    #: declared length past 2**63 - 1 is stored as 2**63 - 1, one that is not a non-negative
    #: integer as NULL; see :func:`receiver.atrest.rejected_deliveries.declared_size`).
    size: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    #: JSON list of the request's header names (lower case; never a value).
    header_names: str = Field(sa_column=Column(Text, nullable=False))
    #: JSON list of the ids of the webhook secrets the signature was checked against.
    secret_ids: str = Field(sa_column=Column(Text, nullable=False))
    #: Rejections this process did not record (rate limit) before this row.
    suppressed: int = Field(default=0)
    #: The first bytes of the body, sealed, when an operator opted in.
    body: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    key_id: str | None = Field(default=None, max_length=64)


class StoredAccount(Base, table=True):
    """A processor account kept in hookledger's own table (``hookledger accounts add``),
    read per request (:class:`receiver.storage.account_table.StoredAccounts`).

    ``secrets``, ``api_key`` and ``admin_key`` are always sealed (text tokens bound to the
    account id, under ``key_id``): hookledger refuses to store them without a data key. The
    rest stays readable: the id, the merchant and profile ids that route deliveries, the
    processor URL and environment, whether it is active, and when it was written.
    """

    __tablename__ = "hookledger_account"
    __table_args__ = (Index("ix_hookledger_account_merchant_id", "merchant_id"),)

    id: str = Field(primary_key=True, max_length=64)
    merchant_id: str = Field(max_length=255)
    #: JSON list of profile ids (``[]``: every profile of the merchant).
    profile_ids: str = Field(sa_column=Column(Text, nullable=False))
    #: Sealed JSON list of ``[secret id, base64 value]``, the first the primary.
    secrets: str = Field(sa_column=Column(Text, nullable=False))
    api_key: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    admin_key: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    base_url: str | None = Field(default=None, max_length=500)
    environment: str | None = Field(default=None, max_length=16)
    active: bool = Field(
        default=True, sa_column=Column(Boolean, nullable=False, server_default=true())
    )
    #: The data key the sealed columns are under.
    key_id: str = Field(max_length=64)
    created_at: datetime
    updated_at: datetime
