"""The staleness guard and the transition-once rule, as a pure decision (no I/O).

Given what the store knows about an object (its projected status and which event already
dispatched this transition), decide whether an incoming event is dispatched, and if so what
the object's projection becomes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from receiver import status as statuses
from receiver.clock import as_utc

Decision = Literal["dispatch", "stale", "duplicate"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Projected:
    """An object's projected state: its latest status, that status's rank and event time."""

    status: str
    rank: int
    event_time: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    decision: Decision
    reason: str | None = None
    #: For a dispatched event: record the transition (object, event type) as owned by it.
    claim_transition: bool = False
    #: For a dispatched event with a ranked status: the object's new projection.
    projection: Projected | None = None


DISPATCH_UNGUARDED = Verdict(decision="dispatch")


def decide(
    *,
    event_pk: int,
    kind: str | None,
    object_id: str | None,
    event_type: str | None,
    status: str | None,
    event_time: datetime | None,
    replay: bool,
    transition_owner: int | None,
    current: Projected | None,
) -> Verdict:
    """Decide what to do with an event of a known object.

    - a replay, or an event whose object is unknown, is dispatched unguarded;
    - a transition (object, event type) already dispatched by another event is a duplicate;
      the same event retrying keeps its claim;
    - a status ranked below the projected one is stale, as is the same status again, or an
      equally ranked status (say ``failed`` vs ``succeeded``) whose event is not newer;
    - anything else is dispatched, claims its transition and moves the projection.
    """
    if replay or kind is None or object_id is None:
        return DISPATCH_UNGUARDED
    if transition_owner is not None:
        if transition_owner == event_pk:
            return DISPATCH_UNGUARDED  # a retry of the event that owns the transition
        return Verdict(
            decision="duplicate",
            reason=f"transition {event_type} already dispatched by #{transition_owner}",
        )
    incoming = statuses.normalize_status(kind, status)
    incoming_rank = statuses.rank(kind, incoming)
    if current is not None and incoming is not None and incoming_rank is not None:
        reason = _stale_reason(current, incoming, incoming_rank, event_time)
        if reason is not None:
            return Verdict(decision="stale", reason=reason)
    projection = None
    if incoming is not None and incoming_rank is not None:
        projection = Projected(status=incoming, rank=incoming_rank, event_time=event_time)
    return Verdict(
        decision="dispatch", claim_transition=event_type is not None, projection=projection
    )


def _stale_reason(
    current: Projected, incoming: str, incoming_rank: int, event_time: datetime | None
) -> str | None:
    if incoming_rank < current.rank:
        return f"{incoming} would move {current.status} backwards"
    if incoming_rank == current.rank:
        if incoming == current.status:
            return f"already {current.status}"
        if event_time is not None and current.event_time is not None:
            if as_utc(event_time) <= as_utc(current.event_time):
                return f"{incoming} is older than {current.status}"
    return None
