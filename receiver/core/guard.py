"""The staleness guard and the transition-once rule, as a pure decision (no I/O).

Given what the store knows about an object (its projected state, and which event already
dispatched the incoming state's transition), decide whether an incoming event is
dispatched, and what the object's projection becomes. The order of states comes from the
transition model (:mod:`receiver.core.transitions`); event times only settle what it leaves open.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import receiver.core.transitions as transitions
from receiver.core.transitions import State

Decision = Literal["dispatch", "stale", "duplicate"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Projected:
    """An object's projected state, the time of the event that set it, and that event."""

    state: State
    event_time: datetime | None
    event_pk: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    decision: Decision
    reason: str | None = None
    #: For a dispatched event: the transition key (its state's) it now owns.
    claim: str | None = None
    #: The object's new projected state (a dispatched event, or a return to an earlier state).
    projection: State | None = None


DISPATCH_UNGUARDED = Verdict(decision="dispatch")

#: The owner of transitions recorded by adoption (no inbox event dispatched them).
ADOPTED = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class CutOver:
    """Where hookledger's history starts on an adopted account (``hookledger_cutover``)."""

    at: datetime
    recorded_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class Arrival:
    """How an event reached the inbox: its source and when it was stored."""

    source: str
    received_at: datetime
    #: Whether what it reports may have happened before a cut-over (webhooks, reconcile
    #: and recovered events; not API observations, backfills or replays).
    historical: bool


def owner_name(pk: int) -> str:
    return "adoption" if pk == ADOPTED else f"event #{pk}"


def decide(
    *,
    event_pk: int,
    incoming: State | None,
    event_time: datetime | None,
    replay: bool,
    transition_owner: int | None,
    current: Projected | None,
    note: str | None = None,
    cutover: CutOver | None = None,
    arrival: Arrival | None = None,
) -> Verdict:
    """Decide what to do with an event about an object.

    - A replay, or an event whose object or state is unknown, is dispatched unguarded.
    - A retry of the event that owns its transition (a handler failed, or an operator
      requeued it) is dispatched again only while the projection still stands at that
      event; once a later event has moved the object on, the retry is stale (it was
      overtaken while it waited, and running it now would move the order backwards).
    - A state some other event already dispatched is a duplicate; if the object has moved
      elsewhere since and now comes back to it (forward, or newer where the model leaves
      the order open), the projection follows but the handlers do not run again.
    - Otherwise: a backward move is stale, a forward move is dispatched, and a move the
      model leaves open is dispatched when its event is newer than the projection's.

    On an adopted account (``cutover``): an event stored after the cut-over was recorded
    that happened before it is recorded, not dispatched (stale, with the projection
    following if it moves forward): the shop's earlier system handled it. A state that
    adoption recorded and that an event shows happening at or after the cut-over (adoption
    read the object just after it changed) is dispatched by that event.

    ``note`` (the event type disagreeing with the object's status, say) is appended to any
    reason given.
    """
    if replay or incoming is None:
        return DISPATCH_UNGUARDED
    if cutover is not None and arrival is not None and arrival.historical:
        if _before_cutover(cutover, arrival, event_time):
            return _recorded_before_cutover(
                event_pk, incoming, event_time, transition_owner, current, cutover, note
            )
        if transition_owner == ADOPTED and event_time is not None and event_time >= cutover.at:
            transition_owner = None
            if current is not None and current.event_pk == ADOPTED:
                current = None
    verdict = _decide(event_pk, incoming, event_time, transition_owner, current)
    if note and verdict.reason:
        return Verdict(
            decision=verdict.decision,
            reason=f"{verdict.reason} ({note})",
            claim=verdict.claim,
            projection=verdict.projection,
        )
    return verdict


def _decide(
    event_pk: int,
    incoming: State,
    event_time: datetime | None,
    owner: int | None,
    current: Projected | None,
) -> Verdict:
    model = transitions.lifecycle(incoming.kind)
    known = model is not None and model.knows(incoming.status)
    if owner == event_pk:
        if current is None or current.event_pk == event_pk or not known:
            return Verdict(decision="dispatch")
        return Verdict(
            decision="stale",
            reason=f"overtaken while it waited: the object moved on to {current.state} "
            f"({owner_name(current.event_pk)})",
        )
    if owner is not None:
        if current is None or current.state.key == incoming.key or not known:
            return Verdict(
                decision="duplicate",
                reason=f"{incoming} was already dispatched by {owner_name(owner)}",
            )
        if _moves_to(current, incoming, event_time):
            return Verdict(
                decision="duplicate",
                reason=f"returns from {current.state} to {incoming}, first dispatched by "
                f"{owner_name(owner)}: the projection follows, the handlers do not run again",
                projection=incoming,
            )
        return Verdict(decision="stale", reason=_stale_reason(current, incoming))
    if not known:
        # A status the model does not know (a newer processor's): dispatched once, and the
        # projection is left where the model can still reason about it.
        return Verdict(decision="dispatch", claim=incoming.key)
    if current is None or _moves_to(current, incoming, event_time):
        return Verdict(decision="dispatch", claim=incoming.key, projection=incoming)
    if current.state.key == incoming.key:
        return Verdict(decision="duplicate", reason=f"already {incoming}")
    return Verdict(decision="stale", reason=_stale_reason(current, incoming))


def _before_cutover(cutover: CutOver, arrival: Arrival, event_time: datetime | None) -> bool:
    return (
        arrival.received_at >= cutover.recorded_at
        and event_time is not None
        and event_time < cutover.at
    )


def _recorded_before_cutover(
    event_pk: int,
    incoming: State,
    event_time: datetime | None,
    owner: int | None,
    current: Projected | None,
    cutover: CutOver,
    note: str | None,
) -> Verdict:
    reason = (
        f"{incoming} happened before the cut-over at {cutover.at.isoformat()}: "
        "recorded, not dispatched"
    )
    if note:
        reason = f"{reason} ({note})"
    moves = current is None or (
        current.state.key != incoming.key and _moves_to(current, incoming, event_time)
    )
    return Verdict(
        decision="stale",
        reason=reason,
        claim=incoming.key if owner is None else None,
        projection=incoming if moves else None,
    )


def _moves_to(current: Projected, incoming: State, event_time: datetime | None) -> bool:
    order = transitions.order(current.state, incoming)
    if order == "forward":
        return True
    if order == "open":
        return transitions.is_newer(event_time, current.event_time)
    return order == "unknown"


def _stale_reason(current: Projected, incoming: State) -> str:
    if transitions.order(current.state, incoming) == "open":
        return f"{incoming} is not newer than {current.state} ({owner_name(current.event_pk)})"
    if current.state.key == incoming.key:
        return f"already {incoming}"
    return f"{incoming} would move {current.state} backwards"
