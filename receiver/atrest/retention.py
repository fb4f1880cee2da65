"""Retention: redact old payloads, then delete old rows, each kind at its own age.

``redact`` drops the body, headers and error texts of finished events (done, stale,
duplicate) and of conflict records older than the policy's ``redact`` age, and the bodies
operators kept of rejected deliveries; a redacted event's order index rows go with its body
(the references were read from it). The rows stay, with their keyed body hash, their
ledger, and the transitions and projections they moved: a processor retry of a redacted
event is still a duplicate (``event_id`` and the hash), a stale one is still stale (the
projection), a transition is still dispatched once (the transition table). A redacted event
is never dispatched again: requeue and replay refuse it, and a worker that met one would
dead-letter it.

``prune`` deletes finished events, dead letters, conflict records and rejected deliveries,
each past its own age (:class:`receiver.config.data_at_rest.RetentionPolicy`). Open events are never
touched. The scheduler process runs both every night (``reconcile schedule``), pruning
first (nothing is redacted that is about to be deleted).

Both take ``accounts``: only those accounts' rows are touched (empty: every account, and
the rejected deliveries that named none). Pruning one account never deletes another's rows;
an account removed from the configuration keeps its history until it is pruned for it.

Both work in batches of short transactions (on SQLite they leave the write lock free between
batches, as the worker does, so webhooks are not starved).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Table, and_, bindparam, delete, func, select, update

import receiver.storage.order_refs as order_refs
from receiver.atrest.key_rotation import conflict_recorded, of_accounts
from receiver.config.data_at_rest import RetentionPolicy
from receiver.core.errors import DataUnavailable
from receiver.storage.context import Storage
from receiver.storage.sealed_columns import BODY, REDACTED_BODY, REDACTED_HEADERS
from receiver.storage.sql.tables import CONFLICT, EVENT, HANDLER_RUN
from receiver.storage.tables import EventStatus, Rejection

log = logging.getLogger("receiver.retention")

REJECTION: Table = Rejection.__table__  # type: ignore[attr-defined]

#: Statuses whose events are finished for good (a dead letter still waits for an operator).
FINISHED = (EventStatus.DONE, EventStatus.STALE, EventStatus.DUPLICATE)


@dataclass(kw_only=True)
class RetentionReport:
    """What a retention run did (or, dry, would do)."""

    policy: str
    dry_run: bool = False
    #: The accounts it was limited to (``None``: every account).
    accounts: list[str] | None = None
    redacted: dict[str, int] = field(default_factory=dict)
    pruned: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "dry_run": self.dry_run,
            "accounts": self.accounts,
            "redacted": dict(self.redacted),
            "pruned": dict(self.pruned),
            "seconds": round(self.seconds, 3),
        }

    def render(self) -> str:
        verb = "would be " if self.dry_run else ""
        redacted = ", ".join(f"{n} {k}" for k, n in self.redacted.items()) or "nothing"
        pruned = ", ".join(f"{n} {k}" for k, n in self.pruned.items()) or "nothing"
        scope = f" in account(s) {', '.join(self.accounts)}" if self.accounts else ""
        return (
            f"retention ({self.policy}){scope}: {verb}pruned {pruned}; {verb}redacted {redacted} "
            f"in {self.seconds:.2f} s"
        )


class Retention:
    """Redaction and pruning on one :class:`Storage`."""

    def __init__(self, storage: Storage, *, batch_size: int = 500) -> None:
        self.storage = storage
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"Retention(dialect={self.storage.sql.name!r})"

    def run(
        self, policy: RetentionPolicy, *, dry_run: bool = False, accounts: Collection[str] = ()
    ) -> RetentionReport:
        """Prune, then redact, as ``policy`` says (the scheduler's nightly job), in
        ``accounts`` only (every account when empty)."""
        started = time.monotonic()
        report = RetentionReport(
            policy=policy.describe(), dry_run=dry_run, accounts=sorted(set(accounts)) or None
        )
        # Pruning first: no need to redact what is about to be deleted.
        report.pruned = self.prune(policy, dry_run=dry_run, accounts=accounts)
        redact_age = policy.age("redact")
        if redact_age is not None:
            report.redacted = self.redact(redact_age, dry_run=dry_run, accounts=accounts)
        report.seconds = time.monotonic() - started
        log.info(
            "%s",
            report.render(),
            extra={"action": "retention", "redacted": report.redacted, "pruned": report.pruned},
        )
        return report

    # -- redaction ------------------------------------------------------------------------

    def redact(
        self, older_than: timedelta, *, dry_run: bool = False, accounts: Collection[str] = ()
    ) -> dict[str, int]:
        """Drop the payloads of finished events, conflict records and rejected deliveries
        received before ``now - older_than`` (of ``accounts`` only, when given); return how
        many rows of each were redacted.

        A body hash that is not keyed with the primary data key is keyed with it on the
        way, while the body is still there (so no plain hash of a payload outlives it)."""
        now = self.storage.now()
        cutoff = now - older_than
        events = and_(
            EVENT.c.status.in_(FINISHED),
            EVENT.c.redacted_at.is_(None),
            EVENT.c.received_at < cutoff,
            *of_accounts(EVENT, accounts),
        )
        conflicts = and_(
            CONFLICT.c.redacted_at.is_(None),
            CONFLICT.c.received_at < cutoff,
            *of_accounts(CONFLICT, accounts),
        )
        rejections = and_(
            REJECTION.c.body.is_not(None),
            REJECTION.c.received_at < cutoff,
            *of_accounts(REJECTION, accounts),
        )
        if dry_run:
            return {
                "events": self._count(EVENT, events),
                "conflicts": self._count(CONFLICT, conflicts),
                "rejections": self._count(REJECTION, rejections),
            }

        def redact_events(conn: Any, ids: list[int]) -> int:
            self._rekey_hashes(conn, EVENT, ids)
            done = conn.execute(
                update(EVENT)
                .where(self.storage.sql.among(EVENT.c.id, ids), events)
                .values(
                    body=REDACTED_BODY,
                    headers=REDACTED_HEADERS,
                    last_error=None,
                    redacted_at=now,
                )
            ).rowcount
            conn.execute(
                update(HANDLER_RUN)
                .where(
                    self.storage.sql.among(HANDLER_RUN.c.event_pk, ids),
                    HANDLER_RUN.c.last_error.is_not(None),
                )
                .values(last_error=None)
            )
            # The order references were read from the payload: they go with it.
            order_refs.delete_redacted(conn, self.storage.sql, ids)
            return int(done)

        def redact_conflicts(conn: Any, ids: list[int]) -> int:
            self._rekey_hashes(conn, CONFLICT, ids)
            return int(
                conn.execute(
                    update(CONFLICT)
                    .where(self.storage.sql.among(CONFLICT.c.id, ids), conflicts)
                    .values(body=REDACTED_BODY, headers=REDACTED_HEADERS, redacted_at=now)
                ).rowcount
            )

        def redact_rejections(conn: Any, ids: list[int]) -> int:
            return int(
                conn.execute(
                    update(REJECTION)
                    .where(self.storage.sql.among(REJECTION.c.id, ids), rejections)
                    .values(body=None, key_id=None)
                ).rowcount
            )

        counts = {
            "events": self._batches(EVENT, events, redact_events),
            "conflicts": self._batches(CONFLICT, conflicts, redact_conflicts),
            "rejections": self._batches(REJECTION, rejections, redact_rejections),
        }
        if any(counts.values()):
            log.info(
                "redacted payloads older than %g days",
                older_than.total_seconds() / 86400,
                extra={"action": "redact", **counts},
            )
        return counts

    def _rekey_hashes(self, conn: Any, table: Table, ids: list[int]) -> None:
        """Key the body hash of rows about to be redacted with the primary data key, where
        it is not already (their body is still readable now, never again)."""
        keyring = self.storage.keyring
        primary = keyring.primary
        if primary is None:
            return
        rows = conn.execute(
            select(
                table.c.id, table.c.account, table.c.event_id, table.c.body, table.c.key_id
            ).where(
                self.storage.sql.among(table.c.id, ids),
                (table.c.key_id.is_(None)) | (table.c.key_id != primary),
            )
        ).all()
        rekey = (
            update(table)
            .where(table.c.id == bindparam("r_id"))
            .values(body_sha256=bindparam("r_hash"), key_id=bindparam("r_key"))
        )
        for row in rows:
            try:
                body = keyring.open(row.body, purpose=BODY, context=row.event_id)
            except DataUnavailable:
                continue  # its key is gone: it keeps the hash it has
            digest = keyring.digest(body, primary)
            if table is CONFLICT and conflict_recorded(
                conn, row.account, row.event_id, digest, row.id
            ):
                conn.execute(delete(CONFLICT).where(CONFLICT.c.id == row.id))  # a copy
                continue
            conn.execute(rekey, {"r_id": row.id, "r_hash": digest, "r_key": primary})

    # -- pruning --------------------------------------------------------------------------

    def prune(
        self, policy: RetentionPolicy, *, dry_run: bool = False, accounts: Collection[str] = ()
    ) -> dict[str, int]:
        """Delete what ``policy`` no longer keeps: finished events (``done``), dead letters
        (``dead``), with their ledger rows; conflict records; rejected deliveries; of
        ``accounts`` only, when given (never another account's rows). Open events are never
        deleted; transitions and projections are kept, so the guard and the transition-once
        rule still hold for pruned history."""
        now = self.storage.now()
        counts: dict[str, int] = {}
        kinds: list[tuple[str, Table, Any]] = []
        if (age := policy.age("done")) is not None:
            kinds.append(
                (
                    "events",
                    EVENT,
                    and_(
                        EVENT.c.status.in_(FINISHED),
                        EVENT.c.received_at < now - age,
                        *of_accounts(EVENT, accounts),
                    ),
                )
            )
        if (age := policy.age("dead")) is not None:
            kinds.append(
                (
                    "dead",
                    EVENT,
                    and_(
                        EVENT.c.status == EventStatus.DEAD,
                        EVENT.c.received_at < now - age,
                        *of_accounts(EVENT, accounts),
                    ),
                )
            )
        if (age := policy.age("conflicts")) is not None:
            kinds.append(
                (
                    "conflicts",
                    CONFLICT,
                    and_(CONFLICT.c.received_at < now - age, *of_accounts(CONFLICT, accounts)),
                )
            )
        if (age := policy.age("rejected")) is not None:
            kinds.append(
                (
                    "rejections",
                    REJECTION,
                    and_(REJECTION.c.received_at < now - age, *of_accounts(REJECTION, accounts)),
                )
            )
        for name, table, old in kinds:
            if dry_run:
                counts[name] = self._count(table, old)
                continue

            def remove(conn: Any, ids: list[int], table: Table = table, old: Any = old) -> int:
                if table is EVENT:
                    conn.execute(
                        delete(HANDLER_RUN).where(
                            self.storage.sql.among(HANDLER_RUN.c.event_pk, ids)
                        )
                    )
                deleted = int(
                    conn.execute(
                        delete(table).where(self.storage.sql.among(table.c.id, ids), old)
                    ).rowcount
                )
                if table is EVENT:
                    order_refs.delete_orphans(conn, self.storage.sql, ids)
                return deleted

            counts[name] = self._batches(table, old, remove)
        return counts

    # -- batches --------------------------------------------------------------------------

    def _count(self, table: Table, where: Any) -> int:
        with self.storage.deferred.connect() as conn:
            return int(
                conn.execute(select(func.count()).select_from(table).where(where)).scalar_one()
            )

    def _batches(self, table: Table, where: Any, apply: Callable[[Any, list[int]], int]) -> int:
        """Apply ``apply(conn, ids)`` to the rows of ``table`` matching ``where``, in id
        order, one short transaction per batch; return the sum of what it returned."""
        total, cursor = 0, 0
        while True:
            started = time.monotonic()
            with self.storage.engine.begin() as conn:
                ids = [
                    int(r[0])
                    for r in conn.execute(
                        select(table.c.id)
                        .where(table.c.id > cursor, where)
                        .order_by(table.c.id)
                        .limit(self.batch_size)
                    )
                ]
                if not ids:
                    return total
                total += apply(conn, ids)
            cursor = ids[-1]
            self._yield(time.monotonic() - started)

    def _yield(self, held: float) -> None:
        """On SQLite, leave the write lock free for a while (see the worker's reason)."""
        if self.storage.single_writer:
            time.sleep(0.11 if held >= 0.05 else max(0.002, held))
