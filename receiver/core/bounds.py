"""The bounds on the worker's and the reconciler's waits for PostgreSQL (seconds), and the
name of what a thread waits for; applied by :mod:`receiver.storage.bounds`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from receiver.core.errors import ConfigurationError

#: The smallest default statement timeout, seconds (short leases in development and tests).
MIN_STATEMENT_TIMEOUT = 5.0
#: The smallest default idle-in-transaction timeout, seconds.
MIN_IDLE_IN_TRANSACTION_TIMEOUT = 60.0
#: The client-side bound waits this much (at least) beyond the statement timeout, so a
#: server that does answer gets to end the statement itself, with its clearer error.
MIN_ANSWER_GRACE = 2.0

#: What the current thread is doing for the worker ("claim", "dispatch", "renew leases"...),
#: named in the ``stalled`` log line (see :func:`phase`).
PHASE: ContextVar[str] = ContextVar("hookledger_phase", default="")


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Name what the current thread waits for the database for, while in the block."""
    token = PHASE.set(name)
    try:
        yield
    finally:
        PHASE.reset(token)


@dataclass(frozen=True, kw_only=True, slots=True)
class Bounds:
    """Seconds; ``0`` turns one off. See the module docstring."""

    statement_timeout: float = 10.0
    lock_timeout: float = 5.0
    idle_in_transaction_timeout: float = 600.0

    def __post_init__(self) -> None:
        for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_timeout"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{name.upper()} must not be negative")

    @classmethod
    def for_lease(
        cls,
        lease_seconds: float,
        *,
        statement_timeout: float | None = None,
        lock_timeout: float | None = None,
        idle_in_transaction_timeout: float | None = None,
    ) -> Bounds:
        """The bounds for a worker holding leases of ``lease_seconds``, each unless given.

        - statement timeout: a sixth of the lease, at least 5 s (10 s for the default lease
          of 60 s). With the client-side grace a stalled statement is cut within a quarter
          of the lease, so a renewal that waits on it (every third of the lease) still
          renews before the lease runs out.
        - lock timeout: half the statement timeout (a lock wait ends with its own error,
          ``55P03``, before the statement's).
        - idle in transaction: ten leases, at least 60 s. The worker's transaction is idle
          only while a handler runs without the database; a handler that takes longer than
          this fails (it is that handler's failure, retried with backoff), and a worker
          frozen mid-transaction lets go of its locks.
        """
        statement = (
            statement_timeout
            if statement_timeout is not None
            else max(MIN_STATEMENT_TIMEOUT, lease_seconds / 6)
        )
        lock = lock_timeout if lock_timeout is not None else statement / 2
        idle = (
            idle_in_transaction_timeout
            if idle_in_transaction_timeout is not None
            else max(MIN_IDLE_IN_TRANSACTION_TIMEOUT, lease_seconds * 10)
        )
        return cls(statement_timeout=statement, lock_timeout=lock, idle_in_transaction_timeout=idle)

    @property
    def answer_timeout(self) -> float | None:
        """The client-side bound: no answer at all within this long cuts the connection
        (``None`` when the statement timeout is off)."""
        if self.statement_timeout <= 0:
            return None
        return self.statement_timeout + max(MIN_ANSWER_GRACE, self.statement_timeout / 2)

    @property
    def stall_after(self) -> float | None:
        """A wait longer than the statement timeout is a stall: the server would have ended
        the statement by now if it were answering."""
        return self.statement_timeout if self.statement_timeout > 0 else None

    def session_sql(self) -> str:
        """The ``SET`` statements each new connection runs (one round trip)."""
        values = (
            ("statement_timeout", self.statement_timeout),
            ("lock_timeout", self.lock_timeout),
            ("idle_in_transaction_session_timeout", self.idle_in_transaction_timeout),
        )
        return "; ".join(f"SET {name} = {round(seconds * 1000):d}" for name, seconds in values)
