"""Key rotation: seal again, with the primary data key, everything sealed with another key or
stored in the clear (``hookledger rotate-keys``).

It runs while the system runs. Rows are taken in id order, a short transaction per batch;
on PostgreSQL with ``FOR UPDATE SKIP LOCKED`` (a row a worker is closing right now is left
for the next pass, never waited for), on SQLite under its one write lock, which it leaves free
between batches. Each row is read, opened, sealed again and written in the same transaction
that holds it, so a concurrent write (a worker's outcome, a redaction) is never overwritten
with older data. It is resumable: what is left is what is not yet under the primary key, so
running it again goes on where it stopped.

What is rotated: event and conflict bodies, headers and body hashes (``key_id``), error
texts (``hookledger_event.last_error``, ``hookledger_handler_run.last_error``), the
bodies operators kept of rejected deliveries, the order index (``hookledger_order_ref``: its
digests keyed again, the references read again from their events' bodies) and the stored
accounts' webhook secrets and API keys (``hookledger_account``). A redacted row has no
body left to hash again: it keeps its hash under the key it had (the report counts them;
keep that key configured until they are pruned if duplicates of them must still be told
from conflicts).

``accounts`` limits the status and the run to those accounts' rows (empty: every account,
and the rejected deliveries that named none); the ledger's error texts follow their events.

A row sealed with a key that is not configured, or that does not open, is reported (by table,
id and key) and skipped; the run goes on.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, and_, bindparam, delete, func, or_, select, tuple_, update

import receiver.storage.order_refs as order_refs
from receiver.atrest.order_index import SOURCE_COLUMNS, Reindexed, reindex
from receiver.core.errors import ConfigurationError, DataUnavailable
from receiver.storage.account_table import ACCOUNT, SEALED_COLUMNS
from receiver.storage.context import Storage
from receiver.storage.sealed_columns import BODY, ERROR, HEADERS, REJECTED_BODY
from receiver.storage.sql.tables import CONFLICT, EVENT, HANDLER_RUN, ORDER_REF
from receiver.storage.tables import DEFERRED_PREFIX, Rejection

REJECTION: Table = Rejection.__table__  # type: ignore[attr-defined]

_SAMPLES = 10


@dataclass(kw_only=True)
class RotationReport:
    """What a rotation did, and what is left."""

    primary: str
    #: The accounts it was limited to (``None``: every account).
    accounts: list[str] | None = None
    rotated: Counter[str] = field(default_factory=Counter)
    #: Rows that could not be opened, by the key they are sealed with.
    unreadable: Counter[str] = field(default_factory=Counter)
    unreadable_sample: list[str] = field(default_factory=list)
    #: Rows still not under the primary key after the run, by table.
    remaining: dict[str, int] = field(default_factory=dict)
    #: Redacted rows whose body hash is keyed with another key (or none), by key id.
    redacted_elsewhere: dict[str, int] = field(default_factory=dict)
    stopped: bool = False
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        """Everything that can be rotated is under the primary key."""
        return not self.stopped and not any(self.remaining.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "primary": self.primary,
            "accounts": self.accounts,
            "complete": self.complete,
            "rotated": dict(self.rotated),
            "unreadable": dict(self.unreadable),
            "unreadable_sample": list(self.unreadable_sample),
            "remaining": dict(self.remaining),
            "redacted_elsewhere": dict(self.redacted_elsewhere),
            "stopped": self.stopped,
            "seconds": round(self.seconds, 3),
        }

    def render(self) -> str:
        rotated = ", ".join(f"{n} {t}" for t, n in sorted(self.rotated.items())) or "nothing"
        scope = f" in account(s) {', '.join(self.accounts)}" if self.accounts else ""
        lines = [f"rotate-keys{scope}: primary {self.primary!r}; sealed again: {rotated}"]
        left = {t: n for t, n in self.remaining.items() if n}
        if left:
            lines.append(
                "left (not under the primary key): "
                + ", ".join(f"{n} {t}" for t, n in sorted(left.items()))
            )
        if self.unreadable:
            lines.append(
                "cannot be opened: "
                + ", ".join(f"{n} under {k!r}" for k, n in sorted(self.unreadable.items()))
            )
            lines.extend(f"  {line}" for line in self.unreadable_sample)
        if self.redacted_elsewhere:
            lines.append(
                "redacted rows keep their body hash under: "
                + ", ".join(f"{k} ({n})" for k, n in sorted(self.redacted_elsewhere.items()))
            )
        if self.stopped:
            lines.append("stopped before the end: run it again to go on")
        elif self.complete:
            lines.append("complete: every readable row is under the primary key")
        return "\n".join(lines)


class KeyRotation:
    """Re-seals stored data with the primary data key, on one :class:`Storage`."""

    def __init__(self, storage: Storage, *, batch_size: int = 200) -> None:
        self.storage = storage
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"KeyRotation(dialect={self.storage.sql.name!r})"

    @property
    def primary(self) -> str:
        primary = self.storage.keyring.primary
        if primary is None:
            raise ConfigurationError(
                "no data key is configured: set HOOKLEDGER_DATA_KEYS (the first key is the "
                "one rows are sealed with)"
            )
        return primary

    # -- what is left ---------------------------------------------------------------------

    def _pending(self, accounts: Collection[str] = ()) -> dict[str, Any]:
        """Per table: the rows not yet under the primary key (a SQL condition), of
        ``accounts`` only when given."""
        p = self.primary
        token = f"{{enc1:{p}:"
        escaped = p.replace("!", "!!").replace("_", "!_").replace("%", "!%")
        handler_runs = []
        if accounts:
            handler_runs.append(
                HANDLER_RUN.c.event_pk.in_(
                    select(EVENT.c.id).where(*of_accounts(EVENT, accounts)).scalar_subquery()
                )
            )
        return {
            "events": and_(
                or_(
                    and_(EVENT.c.redacted_at.is_(None), _not_key(EVENT, p)),
                    and_(
                        EVENT.c.last_error.is_not(None),
                        func.replace(EVENT.c.last_error, token, "").like("%{enc1:%"),
                    ),
                ),
                *of_accounts(EVENT, accounts),
            ),
            "conflicts": and_(
                CONFLICT.c.redacted_at.is_(None),
                _not_key(CONFLICT, p),
                *of_accounts(CONFLICT, accounts),
            ),
            "rejections": and_(
                REJECTION.c.body.is_not(None),
                _not_key(REJECTION, p),
                *of_accounts(REJECTION, accounts),
            ),
            "handler_errors": and_(
                HANDLER_RUN.c.last_error.is_not(None),
                HANDLER_RUN.c.last_error.not_like(f"{{enc1:{escaped}:%", escape="!"),
                *handler_runs,
            ),
            # The order index: digests keyed with another key (or none), re-read from their
            # events' bodies (see :mod:`receiver.atrest.order_index`).
            "order_refs": and_(_not_key(ORDER_REF, p), *of_accounts(ORDER_REF, accounts)),
            # The stored accounts' own rows (``hookledger accounts``): those of ``accounts``.
            "accounts": and_(
                ACCOUNT.c.key_id != p,
                *([ACCOUNT.c.id.in_(sorted(set(accounts)))] if accounts else []),
            ),
        }

    def status(self, *, accounts: Collection[str] = ()) -> dict[str, Any]:
        """Rows by data key (``null``: in the clear), what is left to rotate, and the
        redacted rows whose hash is keyed with another key; of ``accounts`` only when given
        (``accounts`` in the answer: ``None`` for every account)."""
        pending = self._pending(accounts)
        tables: dict[str, Table] = {
            "events": EVENT,
            "conflicts": CONFLICT,
            "rejections": REJECTION,
            "handler_errors": HANDLER_RUN,
            "order_refs": ORDER_REF,
            "accounts": ACCOUNT,
        }
        out: dict[str, Any] = {
            "primary": self.primary,
            "keys": list(self.storage.keyring.ids),
            "accounts": sorted(set(accounts)) or None,
        }
        with self.storage.deferred.connect() as conn:
            by_key: dict[str, dict[str, int]] = {}
            for name, table in (("events", EVENT), ("conflicts", CONFLICT)):
                rows = conn.execute(
                    select(table.c.key_id, func.count())
                    .where(table.c.redacted_at.is_(None), *of_accounts(table, accounts))
                    .group_by(table.c.key_id)
                ).all()
                by_key[name] = {str(k) if k is not None else "null": int(n) for k, n in rows}
            by_key["order_refs"] = {
                str(k) if k is not None else "null": int(n)
                for k, n in conn.execute(
                    select(ORDER_REF.c.key_id, func.count())
                    .where(*of_accounts(ORDER_REF, accounts))
                    .group_by(ORDER_REF.c.key_id)
                )
            }
            out["by_key"] = by_key
            out["remaining"] = {
                name: int(
                    conn.execute(
                        select(func.count()).select_from(tables[name]).where(where)
                    ).scalar_one()
                )
                for name, where in pending.items()
            }
            out["redacted_elsewhere"] = self._redacted_elsewhere(conn, accounts)
        return out

    def _redacted_elsewhere(self, conn: Any, accounts: Collection[str] = ()) -> dict[str, int]:
        p = self.primary
        counts: Counter[str] = Counter()
        for table in (EVENT, CONFLICT):
            for key_id, n in conn.execute(
                select(table.c.key_id, func.count())
                .where(
                    table.c.redacted_at.is_not(None),
                    _not_key(table, p),
                    *of_accounts(table, accounts),
                )
                .group_by(table.c.key_id)
            ):
                counts["unkeyed" if key_id is None else str(key_id)] += int(n)
        return dict(counts)

    # -- the run --------------------------------------------------------------------------

    def run(
        self,
        *,
        stop: threading.Event | None = None,
        progress: Callable[[int], None] | None = None,
        max_passes: int = 5,
        accounts: Collection[str] = (),
    ) -> RotationReport:
        """Seal again everything not under the primary key (of ``accounts`` only, when
        given); see the module docstring."""
        started = time.monotonic()
        report = RotationReport(primary=self.primary, accounts=sorted(set(accounts)) or None)
        pending = self._pending(accounts)
        steps: list[tuple[str, Callable[..., int]]] = [
            ("events", self._events_pass),
            ("conflicts", self._conflicts_pass),
            ("rejections", self._rejections_pass),
            ("handler_errors", self._handler_errors_pass),
            ("order_refs", self._order_refs_pass),
            ("accounts", self._accounts_pass),
        ]
        for name, one_pass in steps:
            for _ in range(max_passes):
                if stop is not None and stop.is_set():
                    report.stopped = True
                    break
                done = one_pass(pending[name], report, stop, progress)
                if not done:
                    break  # nothing more could be done (what is left is unreadable or busy)
        status = self.status(accounts=accounts)
        report.remaining = status["remaining"]
        report.redacted_elsewhere = status["redacted_elsewhere"]
        report.seconds = time.monotonic() - started
        return report

    def _unreadable(self, report: RotationReport, where: str, exc: DataUnavailable) -> None:
        key_id = str(getattr(exc, "key_id", "?"))
        report.unreadable[key_id] += 1
        if len(report.unreadable_sample) < _SAMPLES:
            report.unreadable_sample.append(f"{where}: {exc.message}")

    def _batches(
        self,
        table: Table,
        where: Any,
        rotate: Callable[[Any, Any], dict[str, Any] | None],
        statement: Any,
        name: str,
        report: RotationReport,
        stop: threading.Event | None,
        progress: Callable[[int], None] | None,
        *,
        columns: tuple[Any, ...],
        order: tuple[Any, ...],
        cursor: tuple[Any, ...],
    ) -> int:
        """One pass over ``table``'s rows matching ``where``, in ``order``, a transaction a
        batch; ``rotate(conn, row)`` returns the new values of a row for ``statement`` (an
        empty dict: it wrote them itself; ``None``: it left the row)."""
        rotated = 0
        keyset = tuple_(*order) if len(order) > 1 else order[0]
        while stop is None or not stop.is_set():
            started = time.monotonic()
            with self.storage.engine.begin() as conn:
                after = tuple_(*cursor) if len(cursor) > 1 else cursor[0]
                rows = conn.execute(
                    self.storage.sql.skip_locked(
                        select(*columns)
                        .where(keyset > after, where)
                        .order_by(*order)
                        .limit(self.batch_size)
                    )
                ).all()
                if not rows:
                    return rotated
                changes = [c for c in (rotate(conn, row) for row in rows) if c is not None]
                if any(changes):
                    conn.execute(statement, [c for c in changes if c])
            last = rows[-1]
            cursor = tuple(getattr(last, col.name) for col in order)
            rotated += len(changes)
            report.rotated[name] += len(changes)
            if progress is not None and changes:
                progress(len(changes))
            if self.storage.single_writer:
                held = time.monotonic() - started
                time.sleep(0.11 if held >= 0.05 else max(0.002, held))
        report.stopped = True
        return rotated

    def _events_pass(
        self,
        where: Any,
        report: RotationReport,
        stop: threading.Event | None,
        progress: Callable[[int], None] | None,
    ) -> int:
        keyring, p = self.storage.keyring, self.primary

        def rotate(_conn: Any, row: Any) -> dict[str, Any] | None:
            values = {
                "r_id": row.id,
                "r_body": row.body,
                "r_headers": row.headers,
                "r_hash": row.body_sha256,
                "r_key": row.key_id,
                "r_error": row.last_error,
            }
            try:
                if row.redacted_at is None and row.key_id != p:
                    body = keyring.open(row.body, purpose=BODY, context=row.event_id)
                    headers = keyring.open_text_strict(
                        row.headers, purpose=HEADERS, context=row.event_id
                    )
                    values.update(
                        r_body=keyring.seal(body, purpose=BODY, context=row.event_id),
                        r_headers=keyring.seal_text(headers, purpose=HEADERS, context=row.event_id),
                        r_hash=keyring.digest(body, p),
                        r_key=p,
                    )
                if row.last_error:
                    # Text in the clear is sealed only on rows from before encryption (the
                    # others' clear text is hookledger's own words around their tokens).
                    if row.key_id is None or "{enc1:" in row.last_error:
                        values["r_error"], _ = keyring.reseal_text(
                            row.last_error, purpose=ERROR, keep_prefix=DEFERRED_PREFIX
                        )
            except DataUnavailable as exc:
                self._unreadable(report, f"hookledger_event #{row.id}", exc)
                return None
            return values

        statement = (
            update(EVENT)
            .where(EVENT.c.id == bindparam("r_id"))
            .values(
                body=bindparam("r_body"),
                headers=bindparam("r_headers"),
                body_sha256=bindparam("r_hash"),
                key_id=bindparam("r_key"),
                last_error=bindparam("r_error"),
            )
        )
        columns = (
            EVENT.c.id,
            EVENT.c.event_id,
            EVENT.c.body,
            EVENT.c.headers,
            EVENT.c.body_sha256,
            EVENT.c.key_id,
            EVENT.c.last_error,
            EVENT.c.redacted_at,
        )
        return self._batches(
            EVENT,
            where,
            rotate,
            statement,
            "events",
            report,
            stop,
            progress,
            columns=columns,
            order=(EVENT.c.id,),
            cursor=(0,),
        )

    def _conflicts_pass(
        self,
        where: Any,
        report: RotationReport,
        stop: threading.Event | None,
        progress: Callable[[int], None] | None,
    ) -> int:
        keyring, p = self.storage.keyring, self.primary

        def rotate(conn: Any, row: Any) -> dict[str, Any] | None:
            try:
                body = keyring.open(row.body, purpose=BODY, context=row.event_id)
                headers = keyring.open_text_strict(
                    row.headers, purpose=HEADERS, context=row.event_id
                )
            except DataUnavailable as exc:
                self._unreadable(report, f"hookledger_event_conflict #{row.id}", exc)
                return None
            digest = keyring.digest(body, p)
            if conflict_recorded(conn, row.account, row.event_id, digest, row.id):
                # The same body was recorded again under another key (its hash differed):
                # now that both hashes agree, one record is enough.
                conn.execute(delete(CONFLICT).where(CONFLICT.c.id == row.id))
                return {}
            conn.execute(
                statement,
                {
                    "r_id": row.id,
                    "r_body": keyring.seal(body, purpose=BODY, context=row.event_id),
                    "r_headers": keyring.seal_text(headers, purpose=HEADERS, context=row.event_id),
                    "r_hash": digest,
                    "r_key": p,
                },
            )
            return {}  # written at once: the next row's check must see it

        statement = (
            update(CONFLICT)
            .where(CONFLICT.c.id == bindparam("r_id"))
            .values(
                body=bindparam("r_body"),
                headers=bindparam("r_headers"),
                body_sha256=bindparam("r_hash"),
                key_id=bindparam("r_key"),
            )
        )
        columns = (
            CONFLICT.c.id,
            CONFLICT.c.account,
            CONFLICT.c.event_id,
            CONFLICT.c.body,
            CONFLICT.c.headers,
            CONFLICT.c.key_id,
        )
        return self._batches(
            CONFLICT,
            where,
            rotate,
            statement,
            "conflicts",
            report,
            stop,
            progress,
            columns=columns,
            order=(CONFLICT.c.id,),
            cursor=(0,),
        )

    def _rejections_pass(
        self,
        where: Any,
        report: RotationReport,
        stop: threading.Event | None,
        progress: Callable[[int], None] | None,
    ) -> int:
        keyring, p = self.storage.keyring, self.primary

        def rotate(_conn: Any, row: Any) -> dict[str, Any] | None:
            try:
                body = keyring.open(row.body, purpose=REJECTED_BODY)
            except DataUnavailable as exc:
                self._unreadable(report, f"hookledger_rejection #{row.id}", exc)
                return None
            return {
                "r_id": row.id,
                "r_body": keyring.seal(body, purpose=REJECTED_BODY),
                "r_key": p,
            }

        statement = (
            update(REJECTION)
            .where(REJECTION.c.id == bindparam("r_id"))
            .values(body=bindparam("r_body"), key_id=bindparam("r_key"))
        )
        return self._batches(
            REJECTION,
            where,
            rotate,
            statement,
            "rejections",
            report,
            stop,
            progress,
            columns=(REJECTION.c.id, REJECTION.c.body, REJECTION.c.key_id),
            order=(REJECTION.c.id,),
            cursor=(0,),
        )

    def _handler_errors_pass(
        self,
        where: Any,
        report: RotationReport,
        stop: threading.Event | None,
        progress: Callable[[int], None] | None,
    ) -> int:
        keyring = self.storage.keyring

        def rotate(_conn: Any, row: Any) -> dict[str, Any] | None:
            try:
                text, changed = keyring.reseal_text(
                    row.last_error, purpose=ERROR, keep_prefix=DEFERRED_PREFIX
                )
            except DataUnavailable as exc:
                where = f"hookledger_handler_run ({row.event_pk}, {row.handler!r})"
                self._unreadable(report, where, exc)
                return None
            if not changed:
                return None
            return {"r_pk": row.event_pk, "r_handler": row.handler, "r_error": text}

        statement = (
            update(HANDLER_RUN)
            .where(
                HANDLER_RUN.c.event_pk == bindparam("r_pk"),
                HANDLER_RUN.c.handler == bindparam("r_handler"),
            )
            .values(last_error=bindparam("r_error"))
        )
        return self._batches(
            HANDLER_RUN,
            where,
            rotate,
            statement,
            "handler_errors",
            report,
            stop,
            progress,
            columns=(HANDLER_RUN.c.event_pk, HANDLER_RUN.c.handler, HANDLER_RUN.c.last_error),
            order=(HANDLER_RUN.c.event_pk, HANDLER_RUN.c.handler),
            cursor=(-1, ""),
        )

    def _order_refs_pass(
        self,
        where: Any,
        report: RotationReport,
        stop: threading.Event | None,
        progress: Callable[[int], None] | None,
    ) -> int:
        """The order index rows not keyed with the primary, a batch of events at a time: each
        event is read again (its references from its body) and its rows replaced, keyed with
        the primary, in the transaction that read it (one read, one delete and one insert a
        batch). A row whose event cannot be opened is reported and left."""
        storage, sql = self.storage, self.storage.sql
        rotated, after = 0, -1
        while stop is None or not stop.is_set():
            began = time.monotonic()
            with storage.engine.begin() as conn:
                pks = [
                    int(r[0])
                    for r in conn.execute(
                        select(ORDER_REF.c.event_pk)
                        .where(ORDER_REF.c.event_pk > after, where)
                        .group_by(ORDER_REF.c.event_pk)
                        .order_by(ORDER_REF.c.event_pk)
                        .limit(self.batch_size)
                    )
                ]
                if not pks:
                    return rotated
                events = conn.execute(
                    sql.skip_locked(select(*SOURCE_COLUMNS).where(sql.among(EVENT.c.id, pks)))
                ).all()
                gone = sorted(set(pks) - {int(e.id) for e in events})
                result = Reindexed()
                reindex(storage, conn, events, result)
                # An event pruned meanwhile leaves rows of nothing; a locked one is left for
                # the next pass.
                order_refs.delete_orphans(conn, sql, gone)
            after = pks[-1]
            for key_id, n in result.unreadable.items():
                report.unreadable[key_id] += n
            for line in result.unreadable_sample:
                if len(report.unreadable_sample) < _SAMPLES:
                    report.unreadable_sample.append(line)
            rotated += result.events
            report.rotated["order_refs"] += result.events
            if progress is not None and result.events:
                progress(result.events)
            if storage.single_writer:
                held = time.monotonic() - began
                time.sleep(0.11 if held >= 0.05 else max(0.002, held))
        report.stopped = True
        return rotated

    def _accounts_pass(
        self,
        where: Any,
        report: RotationReport,
        stop: threading.Event | None,
        progress: Callable[[int], None] | None,
    ) -> int:
        keyring, p = self.storage.keyring, self.primary

        def rotate(_conn: Any, row: Any) -> dict[str, Any] | None:
            values: dict[str, Any] = {"r_id": row.id, "r_key": p}
            try:
                for column, purpose in SEALED_COLUMNS.items():
                    text = getattr(row, column)
                    if text is not None:
                        text = keyring.open_text_strict(text, purpose=purpose, context=row.id)
                        text = keyring.seal_text(text, purpose=purpose, context=row.id)
                    values[f"r_{column}"] = text
            except DataUnavailable as exc:
                self._unreadable(report, f"hookledger_account {row.id!r}", exc)
                return None
            return values

        statement = (
            update(ACCOUNT)
            .where(ACCOUNT.c.id == bindparam("r_id"))
            .values(
                secrets=bindparam("r_secrets"),
                api_key=bindparam("r_api_key"),
                admin_key=bindparam("r_admin_key"),
                key_id=bindparam("r_key"),
            )
        )
        return self._batches(
            ACCOUNT,
            where,
            rotate,
            statement,
            "accounts",
            report,
            stop,
            progress,
            columns=(
                ACCOUNT.c.id,
                ACCOUNT.c.secrets,
                ACCOUNT.c.api_key,
                ACCOUNT.c.admin_key,
                ACCOUNT.c.key_id,
            ),
            order=(ACCOUNT.c.id,),
            cursor=("",),
        )


def conflict_recorded(conn: Any, account: str, event_id: str, digest: str, other_than: int) -> bool:
    """Whether another conflict record of ``account`` holds the body hashed ``digest`` for
    ``event_id`` (another account's record of the same id is another event's)."""
    return (
        conn.execute(
            select(CONFLICT.c.id).where(
                CONFLICT.c.account == account,
                CONFLICT.c.event_id == event_id,
                CONFLICT.c.body_sha256 == digest,
                CONFLICT.c.id != other_than,
            )
        ).first()
        is not None
    )


def _not_key(table: Table, key_id: str) -> Any:
    """``table.key_id IS DISTINCT FROM key_id`` (rows in the clear, or under another key)."""
    return or_(table.c.key_id.is_(None), table.c.key_id != key_id)


def of_accounts(table: Table, accounts: Collection[str]) -> list[Any]:
    """The condition limiting ``table`` to ``accounts`` (none when empty: every account)."""
    return [table.c.account.in_(sorted(set(accounts)))] if accounts else []
