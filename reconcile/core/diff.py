"""The reconciliation diff (pure, no I/O): remote object vs local projection -> what to do.

For each remote object the processor shows (listed, or fetched by id), compare its state
(status, and a dispute's stage) with the state the merchant's side has projected from
events, in the kind's transition model (:mod:`receiver.core.transitions`). A remote state the
projection has not reached becomes a synthesised event with a deterministic id and the
remote object as ``content.object``; it then goes through the receiver's inbox like any
webhook, so dedupe, the staleness guard, the handler ledger and the transition-once rule
all apply.

**Honest dating.** A synthesised event is dated when the object last changed if the kind's
objects carry a real modification time (a payment's ``modified_at``, a refund's
``updated_at``); disputes, payouts and mandates carry none (Hyperswitch's
``DisputeResponse``, ``PayoutCreateResponse`` and ``MandateResponse`` have only creation
times, if that), so their events are dated when the reconciler observed the object, never
at its creation: the transition happened at or before that moment, and after everything
the merchant's side had seen when the object was read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import receiver.core.objects as objects
import receiver.core.status as statuses
import receiver.core.transitions as transitions
from receiver.core.clock import as_utc
from receiver.core.transitions import State
from reconcile.core.errors import MAX_ID_LENGTH, escape_id, id_defect

Verdict = Literal["in_sync", "missed", "no_event", "local_ahead", "unknown_status", "dead_letter"]
DatedBy = Literal["modified", "observed"]


#: Where each kind keeps its id, status, stage and times (shared with ``observe``).
KINDS = objects.KINDS


@dataclass(frozen=True, slots=True)
class Remote:
    """A remote object as the reconciler reads it."""

    kind: str
    object_id: str
    #: ``None`` when the object carries no usable status.
    state: State | None
    raw: Mapping[str, Any]

    # The times are read only when needed (dating a recovered event, following an open
    # object): parsing them for every listed object cost a third of a run in sync.

    @property
    def created(self) -> datetime | None:
        """The object's creation time at the processor, if it shows one."""
        return objects.created_time(self.kind, self.raw)

    @property
    def modified(self) -> datetime | None:
        """The object's real modification time, for kinds that have one."""
        return objects.modified_time(self.kind, self.raw)


@dataclass(frozen=True, slots=True)
class BadRow:
    """A remote row the reconciler cannot use: reported (never stored), then skipped."""

    kind: str
    #: The id with unsafe characters escaped (``None``: no id at all).
    object_id: str | None
    reason: str

    def __str__(self) -> str:
        return f"{self.kind} {self.object_id or '(no id)'}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Local:
    """What the merchant's side projects for an object: its state and the event behind it.

    ``dead``: that event is dead-lettered (its handlers did not all run): the projection
    shows the state, but the merchant's side has not acted on it.
    """

    state: State
    event_pk: int
    dead: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """The verdict for one remote object."""

    remote: Remote
    local: Local | None
    verdict: Verdict
    event_type: str | None = None

    @property
    def object_id(self) -> str:
        return self.remote.object_id

    def describe(self) -> str:
        local = self.local.state if self.local is not None else "nothing"
        return f"{escape_id(self.object_id)}: local {local}, remote {self.remote.state}"


def clean_text(value: object, limit: int = MAX_ID_LENGTH) -> str | None:
    """Why ``value`` cannot be stored as an id or a status, or ``None`` when it can."""
    defect = id_defect(value)
    if defect is None and isinstance(value, str) and len(value) > limit:
        return f"is longer than {limit} characters"
    return defect


def read_remote(kind: str, obj: object) -> Remote | BadRow:
    """Read one remote object of ``kind``; any value yields a :class:`BadRow` at worst."""
    spec = KINDS[kind]
    if not isinstance(obj, Mapping):
        return BadRow(kind, None, "the row is not a JSON object")
    raw_id = obj.get(spec.id_field)
    problem = clean_text(raw_id)
    if problem is not None:
        shown = escape_id(raw_id) if isinstance(raw_id, str) else None
        return BadRow(kind, shown, f"{spec.id_field} {problem}")
    assert isinstance(raw_id, str)
    status = obj.get(spec.status_field, obj.get("status"))
    if status is not None and (problem := clean_text(status, 64)) is not None:
        return BadRow(kind, escape_id(raw_id), f"{spec.status_field} {problem}")
    stage = obj.get(spec.stage_field) if spec.stage_field else None
    if stage is not None and clean_text(stage, 64) is not None:
        return BadRow(kind, escape_id(raw_id), f"{spec.stage_field} is not a clean string")
    return Remote(kind=kind, object_id=raw_id, state=objects.state_of(kind, obj), raw=obj)


def compare(remote: Remote, local: Local | None) -> Finding:
    """What a remote object's state means against the local projection."""
    state = remote.state
    model = transitions.lifecycle(remote.kind)
    if state is None or model is None or not model.knows(state.status):
        return Finding(remote=remote, local=local, verdict="unknown_status")
    event_type = statuses.event_type_for_status(remote.kind, state.status)
    if local is not None:
        order = transitions.order(local.state, state)
        if order == "same":
            # In step only once the transition's handlers have run: a projection reached by
            # a dead-lettered event is a transition the merchant's side never acted on.
            verdict: Verdict = "dead_letter" if local.dead else "in_sync"
            return Finding(remote=remote, local=local, verdict=verdict)
        if order == "backward":
            return Finding(remote=remote, local=local, verdict="local_ahead")
    if event_type is None:
        # A status the processor sends no event for (requires_payment_method, pending...).
        return Finding(remote=remote, local=local, verdict="no_event")
    return Finding(remote=remote, local=local, verdict="missed", event_type=event_type)


def reaches(remote: State, waiting: Iterable[State]) -> bool:
    """Whether an event waiting in the inbox, in one of the ``waiting`` states, brings the
    projection to the remote state (or past it: the listing was older than the event).
    When none does, what is waiting leaves the projection short of the processor (a
    ``payment_failed`` from before the customer's successful retry)."""
    return any(transitions.order(remote, state) in ("same", "forward") for state in waiting)


def synthetic_event_id(kind: str, object_id: str, state_key: str, after: int) -> str:
    """Deterministic per (object, remote state, the local event it moves on from): runs that
    find the same gap dedupe, and a later return to a state gets a new id."""
    return objects.event_id_for("rec", kind, object_id, state_key, after)


def event_time(remote: Remote, observed: datetime) -> tuple[datetime, DatedBy]:
    """When the remote object's transition is dated (see the module docstring)."""
    modified, created = remote.modified, remote.created
    if modified is not None and (created is None or modified >= created):
        return as_utc(modified), "modified"
    return as_utc(observed), "observed"


def synthesise(
    finding: Finding,
    *,
    merchant_id: str | None,
    observed: datetime,
    event_id: str | None = None,
) -> tuple[bytes, str, DatedBy]:
    """The body of the event the processor would have sent for ``finding`` (compact JSON),
    its event id and how it was dated. Raises :class:`ValueError` when the remote object
    cannot be encoded (an unpaired surrogate in its metadata, nesting too deep to encode)."""
    remote = finding.remote
    if finding.verdict != "missed" or finding.event_type is None or remote.state is None:
        raise ValueError("only a missed transition is synthesised")
    after = finding.local.event_pk if finding.local is not None else 0
    event_id = event_id or synthetic_event_id(
        remote.kind, remote.object_id, remote.state.key, after
    )
    when, dated_by = event_time(remote, observed)
    body = objects.event_body(
        remote.kind,
        remote.raw,
        event_id=event_id,
        event_type=finding.event_type,
        timestamp=when,
        merchant_id=merchant_id,
    )
    return body, event_id, dated_by
