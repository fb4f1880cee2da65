"""The reconciler's tables: watermarks, runs (with their reports), the run lock, seen ids."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, String, Text, text
from sqlmodel import Field, SQLModel

from receiver.core.accounts import DEFAULT_ACCOUNT

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)

_BIGINT_PK = BigInteger().with_variant(Integer(), "sqlite")


class Base(SQLModel):
    metadata = metadata


class Watermark(Base, table=True):
    """Per kind: objects created up to ``high_water`` have been reconciled."""

    __tablename__ = "hookledger_recon_watermark"

    #: The processor account (:mod:`receiver.core.accounts`).
    account: str = Field(
        default=DEFAULT_ACCOUNT,
        sa_column=Column(
            String(64), primary_key=True, nullable=False, server_default=text("'default'")
        ),
    )
    kind: str = Field(primary_key=True, max_length=32)
    high_water: datetime
    updated_at: datetime


class ReconcileRun(Base, table=True):
    """One run and its report (JSON)."""

    __tablename__ = "hookledger_recon_run"
    __table_args__ = (Index("ix_hookledger_recon_run_account_id", "account", "id"),)

    id: int | None = Field(
        default=None, sa_column=Column(_BIGINT_PK, primary_key=True, autoincrement=True)
    )
    #: The processor account the run reconciled (:mod:`receiver.core.accounts`).
    account: str = Field(
        default=DEFAULT_ACCOUNT,
        sa_column=Column(String(64), nullable=False, server_default=text("'default'")),
    )
    mode: str = Field(max_length=16)
    owner: str = Field(max_length=128)
    started_at: datetime
    finished_at: datetime | None = None
    status: str = Field(max_length=16)  # running | ok | unresolved | failed | dry_run
    report: str = Field(sa_column=Column(Text, nullable=False))


class RunLock(Base, table=True):
    """The one-run-at-a-time lease (SQLite; PostgreSQL uses an advisory lock)."""

    __tablename__ = "hookledger_recon_lock"

    #: The processor account (:mod:`receiver.core.accounts`).
    account: str = Field(
        default=DEFAULT_ACCOUNT,
        sa_column=Column(
            String(64), primary_key=True, nullable=False, server_default=text("'default'")
        ),
    )
    name: str = Field(primary_key=True, max_length=64)
    owner: str = Field(max_length=128)
    expires_at: datetime


class SeenBatch(Base, table=True):
    """Remote ids a run has seen, one listed chunk per row (a JSON array of ids).

    Read back once, at the end of the run, to find objects known locally but not remotely;
    deleted when the run finishes. A row per chunk rather than per id: the marks are written
    while listing, and one row costs the database a fraction of a hundred.
    """

    __tablename__ = "hookledger_recon_seen_batch"
    __table_args__ = (Index("ix_hookledger_recon_seen_batch_run_id_kind", "run_id", "kind"),)

    id: int | None = Field(
        default=None, sa_column=Column(_BIGINT_PK, primary_key=True, autoincrement=True)
    )
    run_id: int = Field(sa_column=Column(BigInteger, nullable=False))
    kind: str = Field(max_length=32)
    object_ids: str = Field(sa_column=Column(Text, nullable=False))


class FollowedObject(Base, table=True):
    """An object the open-object sweep re-fetches by id until it settles or ages out.

    A row is written whenever the reconciler sees an object in a state that is not settled
    for its kind (listed, fetched, or adopted), or finds an object out of step (a recovery
    inserted or waiting, a projection reached by a dead-lettered event: kept, whatever its
    remote state, until a later run finds it in sync); objects whose *projection* is not
    settled are followed even without a row. ``next_check_at`` spaces the checks out as the
    object ages (see :mod:`reconcile.recovery.sweep`); a kept object is checked at every run.
    """

    __tablename__ = "hookledger_recon_object"
    __table_args__ = (
        Index(
            "ix_hookledger_recon_object_account_kind_next_check_at",
            "account",
            "kind",
            "next_check_at",
        ),
    )

    #: The processor account (:mod:`receiver.core.accounts`).
    account: str = Field(
        default=DEFAULT_ACCOUNT,
        sa_column=Column(
            String(64), primary_key=True, nullable=False, server_default=text("'default'")
        ),
    )
    kind: str = Field(primary_key=True, max_length=32)
    object_id: str = Field(primary_key=True, max_length=255)
    #: The object's creation time at the processor, when it shows one.
    created_at: datetime | None = Field(default=None)
    first_seen_at: datetime
    #: The remote status (and a dispute's stage) when last seen.
    status: str = Field(max_length=64)
    stage: str | None = Field(default=None, max_length=64)
    last_checked_at: datetime
    next_check_at: datetime
    checks: int = Field(default=0)


class Adoption(Base, table=True):
    """Progress of ``reconcile adopt`` per kind (resumable), and its report.

    ``reached``: the listing has recorded every object created from there up to the
    cut-over (it pages newest first); ``finished_at`` is set when the kind is done.
    """

    __tablename__ = "hookledger_recon_adoption"

    #: The processor account (:mod:`receiver.core.accounts`).
    account: str = Field(
        default=DEFAULT_ACCOUNT,
        sa_column=Column(
            String(64), primary_key=True, nullable=False, server_default=text("'default'")
        ),
    )
    kind: str = Field(primary_key=True, max_length=32)
    cutover_at: datetime
    started_at: datetime
    history_start: datetime
    reached: datetime | None = Field(default=None)
    finished_at: datetime | None = Field(default=None)
    counts: str = Field(sa_column=Column(Text, nullable=False))
