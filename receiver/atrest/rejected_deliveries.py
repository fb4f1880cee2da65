"""The rejected-deliveries log: ``hookledger_rejection``, bounded, rate-limited, off the
request path.

Every request the receiver refuses with a 4xx (a missing, malformed or mismatched signature,
a body over the cap, a malformed event, an event too old) is a candidate row: when, why
(``reason``), from where, how big, the header **names** present (never a value), and the ids
of the webhook secrets its signature was checked against. That answers "why did my key
rotation break?" (every delivery since the change is ``signature_mismatch`` against
``[new]``: the processor still signs with the old key) without reading logs. The body is
kept only when an operator opts in (``HOOKLEDGER_REJECTIONS_BODY_BYTES``), then capped and
sealed with the data key.

A flood of forged requests must neither fill the disk nor slow the receipt of real webhooks:

- a token bucket per process admits at most ``per_minute`` rows a minute (a minute's worth
  at once); the rejections over it are only counted, and the count is written with the next
  row (``suppressed``), so ``rows + sum(suppressed)`` is every rejection;
- a request only appends to an in-memory queue (bounded by the bucket); a daemon thread
  writes the queue in one short transaction a second, and trims the table to ``max_rows``;
  if that transaction fails, it writes the rows one by one, so a row the database refuses
  loses only itself (and is counted);
- every column value is bounded before it is queued: the size a request declares
  (``Content-Length``, refused unread) is a non-negative integer no larger than
  :data:`MAX_SIZE`, else unknown (:func:`declared_size`), so no request can make a batch fail;
- the table is also pruned by age (``HOOKLEDGER_RETENTION_DAYS``, ``rejected=14``).

Rows still queued when a process dies are lost: this is a diagnostic record, not a ledger.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Table, delete, func, insert, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from receiver.config.data_at_rest import RejectionPolicy
from receiver.core.clock import as_utc
from receiver.core.errors import ConfigurationError, DataUnavailable
from receiver.core.signature import Secret
from receiver.storage.context import Storage, is_unavailable
from receiver.storage.sealed_columns import REJECTED_BODY
from receiver.storage.tables import Rejection

log = logging.getLogger("receiver.rejections")

REJECTION: Table = Rejection.__table__  # type: ignore[attr-defined]

#: The reason of a row that only carries a count of rejections not recorded.
RATE_LIMITED = "rate_limited"
_MAX_HEADER_NAMES = 40
#: Intervals without a rejection after which the writer thread ends (the next one starts it).
_IDLE_ROUNDS = 30
_MAX_NAME = 64
#: The largest size a row holds (the column is a signed 64-bit integer). A larger declared
#: ``Content-Length`` is recorded as this.
MAX_SIZE: Final = 2**63 - 1
_MAX_SIZE_DIGITS: Final = len(str(MAX_SIZE))


def declared_size(value: object) -> int | None:
    """A body size as the log stores it: a non-negative whole number of bytes, clamped to
    :data:`MAX_SIZE`; ``None`` (unknown) for anything else: missing, negative, or not plain
    ASCII digits (``Content-Length: abc``, ``-1``, ``+5``, ``1e9``). Pure, never raises, and
    bounded work whatever the length of the text."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if value < 0 else min(value, MAX_SIZE)
    if not isinstance(value, str):
        return None
    text = value.strip(" \t")
    if not text or not text.isascii() or not text.isdigit():
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > _MAX_SIZE_DIGITS:
        return MAX_SIZE
    return min(int(digits), MAX_SIZE)


@dataclass(frozen=True, kw_only=True, slots=True)
class RejectedDelivery:
    """One row of ``hookledger_rejection``, for reading (the body opened, if kept)."""

    id: int
    received_at: datetime
    reason: str
    http_status: int
    remote_addr: str | None
    size: int | None
    header_names: tuple[str, ...]
    secret_ids: tuple[str, ...]
    suppressed: int
    body: bytes | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "received_at": self.received_at.isoformat(),
            "reason": self.reason,
            "http_status": self.http_status,
            "remote_addr": self.remote_addr,
            "size": self.size,
            "header_names": list(self.header_names),
            "secret_ids": list(self.secret_ids),
            "suppressed": self.suppressed,
            "body": None if self.body is None else self.body.decode("utf-8", "replace"),
        }


def _carried(row: dict[str, Any]) -> int:
    """The rejections a queued row stands for: itself (unless it is only a count) and the
    ones counted in it."""
    return (0 if row["reason"] == RATE_LIMITED else 1) + int(row["suppressed"])


def _unreachable(exc: BaseException) -> bool:
    """The database, not the row, failed: writing the other rows one by one would not help."""
    if isinstance(exc, DBAPIError):
        return is_unavailable(exc)
    return isinstance(exc, PoolTimeout)


class _Bucket:
    """A token bucket: ``capacity`` tokens, refilled at ``rate`` a second."""

    def __init__(self, capacity: float, rate: float) -> None:
        self.capacity = capacity
        self.rate = rate
        self.tokens = capacity
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class RejectionLog:
    """Records rejected deliveries (see the module docstring). Thread-safe; fork-safe (a
    process forked after the writer started starts its own)."""

    def __init__(
        self, storage: Storage, policy: RejectionPolicy | None = None, *, interval: float = 1.0
    ) -> None:
        self.storage = storage
        self.policy = policy or RejectionPolicy()
        if self.policy.body_bytes and not storage.keyring.enabled:
            raise ConfigurationError(
                "rejected bodies are kept sealed: HOOKLEDGER_REJECTIONS_BODY_BYTES needs a "
                "data key (HOOKLEDGER_DATA_KEYS)"
            )
        self.interval = interval
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._bucket = _Bucket(self.policy.per_minute, self.policy.per_minute / 60.0)
        self._pending: list[dict[str, Any]] = []
        self._suppressed = 0
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False

    def __repr__(self) -> str:
        return f"RejectionLog(per_minute={self.policy.per_minute}, max_rows={self.policy.max_rows})"

    # -- the request path -----------------------------------------------------------------

    def record(
        self,
        *,
        reason: str,
        http_status: int,
        remote_addr: str | None,
        size: int | None,
        header_names: Iterable[str],
        secrets: Sequence[Secret] = (),
        body: bytes | None = None,
        account: str | None = None,
    ) -> bool:
        """Queue a row for a rejected request, if the rate allows (else count it). Never
        touches the database and never raises; returns whether a row was queued."""
        if not self.policy.enabled:
            return False
        if self._pid != os.getpid():
            self._after_fork()
        try:
            with self._lock:
                if not self._bucket.take():
                    self._suppressed += 1
                    return False
                suppressed, self._suppressed = self._suppressed, 0
            names: list[str] = []
            for name in header_names:
                lowered = str(name).lower()[:_MAX_NAME]
                if lowered not in names:
                    names.append(lowered)
                if len(names) >= _MAX_HEADER_NAMES:
                    break
            keep = self.policy.body_bytes
            row = {
                "received_at": self.storage.now(),
                "reason": reason[:32],
                "account": account[:64] if account else None,
                "http_status": int(http_status),
                "remote_addr": (remote_addr or None) and str(remote_addr)[:64],
                "size": declared_size(size),
                "header_names": json.dumps(names),
                "secret_ids": json.dumps([s.id for s in secrets]),
                "suppressed": suppressed,
                "_body": body[:keep] if body and keep else None,
            }
            with self._lock:
                self._pending.append(row)
            self._ensure_writer()
            self._wake.set()
            return True
        except Exception:  # noqa: BLE001 - a diagnostic record must never fail a request
            log.exception("could not queue a rejected delivery", extra={"action": "rejection"})
            return False

    # -- the writer -----------------------------------------------------------------------

    def _after_fork(self) -> None:
        """In a forked child, the parent's writer thread and locks are not ours."""
        self._pid = os.getpid()
        self._thread = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending = []

    def _ensure_writer(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._run, name="hookledger-rejections", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        idle = 0
        while not self._closed:
            if not self._wake.wait(self.interval):
                idle += 1
                if idle >= _IDLE_ROUNDS:
                    with self._lock:  # record() queues under this lock: nothing is left behind
                        if not self._pending:
                            self._thread = None
                            return
                continue
            idle = 0
            self._wake.clear()
            # Batch what a burst queues within the interval into one transaction.
            time.sleep(min(self.interval, 0.2))
            try:
                self.flush(force=False)
            except Exception:  # noqa: BLE001 - keep the writer alive; the batch is counted
                log.exception("could not write rejected deliveries", extra={"action": "rejection"})

    def flush(self, *, force: bool = True) -> int:
        """Write the queued rows now; with ``force``, also a ``rate_limited`` row carrying a
        count of rejections not recorded yet (for tests and shutdown). Returns rows written."""
        with self._write_lock:
            with self._lock:
                rows, self._pending = self._pending, []
                if force and self._suppressed:
                    rows.append(self._marker(self._suppressed))
                    self._suppressed = 0
            if not rows:
                return 0
            ready: list[dict[str, Any]] = []
            lost = 0
            for row in rows:
                try:
                    ready.append(self._sealed(row))
                except Exception as exc:  # noqa: BLE001 - one row must never cost the others
                    lost += _carried(row)
                    log.warning(
                        "a rejected delivery not recorded: could not seal it: %s",
                        type(exc).__name__,
                        extra={"action": "rejection"},
                    )
            written = self._write(ready) if ready else 0
            if lost:
                with self._lock:
                    self._suppressed += lost
            return written

    def _sealed(self, row: dict[str, Any]) -> dict[str, Any]:
        keyring = self.storage.keyring
        body = row.pop("_body", None)
        row["body"] = keyring.seal(body, purpose=REJECTED_BODY) if body is not None else None
        row["key_id"] = keyring.primary if body is not None else None
        return row

    def _write(self, rows: list[dict[str, Any]]) -> int:
        """Write ``rows`` in one transaction; if it fails, row by row (unless the database
        is unreachable), so a row the database refuses loses only itself. What is not
        written is counted, and the count is written with a later row. Returns rows written."""
        try:
            self._insert(rows)
            return len(rows)
        except Exception as exc:  # noqa: BLE001 - any failure: the driver's, or a value's
            failure: BaseException = exc
        written = lost = 0
        if len(rows) > 1 and not _unreachable(failure):
            for i, row in enumerate(rows):
                try:
                    self._insert([row])
                    written += 1
                except Exception as exc:  # noqa: BLE001 - this row only
                    failure = exc
                    lost += _carried(row)
                    if _unreachable(exc):
                        lost += sum(_carried(r) for r in rows[i + 1 :])
                        break
        else:
            lost = sum(_carried(r) for r in rows)
        with self._lock:
            self._suppressed += lost  # counted, written with a later row
        log.warning(
            "rejected deliveries not recorded (%d): %s",
            lost,
            type(getattr(failure, "orig", None) or failure).__name__,
            extra={"action": "rejection"},
        )
        return written

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        """One transaction: insert ``rows`` and trim the table to ``max_rows``."""
        with self.storage.deferred.begin() as conn:
            conn.execute(insert(REJECTION), rows)
            newest = conn.execute(select(func.max(REJECTION.c.id))).scalar()
            if newest is not None and int(newest) > self.policy.max_rows:
                conn.execute(
                    delete(REJECTION).where(REJECTION.c.id <= int(newest) - self.policy.max_rows)
                )

    def _marker(self, count: int) -> dict[str, Any]:
        return {
            "received_at": self.storage.now(),
            "reason": RATE_LIMITED,
            "account": None,
            "http_status": 0,
            "remote_addr": None,
            "size": None,
            "header_names": "[]",
            "secret_ids": "[]",
            "suppressed": count,
            "_body": None,
        }

    def close(self) -> None:
        """Write what is queued and stop the writer."""
        self._closed = True
        self._wake.set()
        self.flush(force=True)

    # -- reading --------------------------------------------------------------------------

    def rows(
        self,
        *,
        since: datetime | None = None,
        reasons: Sequence[str] = (),
        limit: int | None = 50,
    ) -> list[RejectedDelivery]:
        """The newest rows first (bodies opened when kept and readable)."""
        query = select(REJECTION).order_by(REJECTION.c.id.desc())
        if since is not None:
            query = query.where(REJECTION.c.received_at >= as_utc(since))
        if reasons:
            query = query.where(REJECTION.c.reason.in_(list(reasons)))
        if limit:
            query = query.limit(limit)
        with self.storage.deferred.connect() as conn:
            found = conn.execute(query).all()
        out = []
        for r in found:
            body: bytes | None = None
            if r.body is not None:
                try:
                    body = self.storage.keyring.open(r.body, purpose=REJECTED_BODY)
                except DataUnavailable as exc:
                    body = f"[body {exc.message}]".encode()
            out.append(
                RejectedDelivery(
                    id=int(r.id),
                    received_at=as_utc(r.received_at),
                    reason=r.reason,
                    http_status=int(r.http_status),
                    remote_addr=r.remote_addr,
                    size=None if r.size is None else int(r.size),
                    header_names=tuple(json.loads(r.header_names)),
                    secret_ids=tuple(json.loads(r.secret_ids)),
                    suppressed=int(r.suppressed),
                    body=body,
                )
            )
        return out

    def summary(self, *, since: datetime | None = None) -> dict[str, Any]:
        """Counts by reason (rows and rejections not recorded) and by secret ids tried."""
        hidden = func.sum(REJECTION.c.suppressed)
        query = select(REJECTION.c.reason, REJECTION.c.secret_ids, func.count(), hidden).group_by(
            REJECTION.c.reason, REJECTION.c.secret_ids
        )
        if since is not None:
            query = query.where(REJECTION.c.received_at >= as_utc(since))
        reasons: Counter[str] = Counter()
        tried: Counter[str] = Counter()
        suppressed = 0
        with self.storage.deferred.connect() as conn:
            for reason, secret_ids, n, hidden in conn.execute(query):
                suppressed += int(hidden or 0)
                if reason == RATE_LIMITED:
                    continue
                reasons[reason] += int(n)
                tried[",".join(json.loads(secret_ids)) or "-"] += int(n)
        return {
            "rows": sum(reasons.values()),
            "not_recorded": suppressed,
            "by_reason": dict(reasons),
            "by_secret_ids": dict(tried),
        }
