"""The staleness guard and the transition-once rule, as a pure decision (no I/O).

Given what the store knows about an object (its projected state, and which event already
dispatched the incoming state's transition), decide whether an incoming event is
dispatched, and what the object's projection becomes. The order of states comes from the
transition model (:mod:`receiver.core.transitions`); event times only settle what it leaves open.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

import receiver.core.objects as objects
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
    #: Whom ``claim`` and ``projection`` are recorded for: the event (``None``), or
    #: :data:`ADOPTED` (an observation hookledger cannot date after the history's end is
    #: recorded as adoption records what it reads: a later event dated after the history's
    #: end still dispatches the state).
    owner: int | None = None


DISPATCH_UNGUARDED = Verdict(decision="dispatch")

#: The owner of transitions recorded by adoption (no inbox event dispatched them).
ADOPTED = 0


#: How long before hookledger's first delivery attempt the processor may have emitted the
#: event that attempt carried (its first attempt follows the event within seconds).
DELIVERY_SLACK: Final = timedelta(minutes=5)


@dataclass(frozen=True, kw_only=True, slots=True)
class CutOver:
    """Where hookledger's history starts on an adopted account (``hookledger_cutover``).

    ``at``: when adoption began reading. ``first_delivery``: the first webhook delivery
    hookledger stored or was attempted with (a signed request, even one answered 503), if
    any: the deploy that pointed the processor at hookledger came before it.
    ``deployed_at``: that deploy, as the operator stated it to adoption's first run
    (``reconcile adopt --deployed-at``), if stated.
    """

    at: datetime
    recorded_at: datetime
    first_delivery: datetime | None = None
    deployed_at: datetime | None = None

    @property
    def history_ends(self) -> datetime:
        """Where the earlier system's history ends: the cut-over, or the deploy when one
        was stated before it, or, when hookledger was sent webhooks before that,
        ``DELIVERY_SLACK`` before the first of them. Everything at or after it was sent to
        hookledger (the processor's first attempt at an event follows it within seconds,
        and a retry carries the event's original time).

        Only a delivery *before* the cut-over (and before the stated deploy) moves
        history's end back (the deploy came before it). A first delivery after it tells
        nothing about the deploy: it may be the processor's retry of an event the earlier
        system handled (a delivery the deploy made fail), which adoption recorded as seen;
        taking it would move history's end back before the cut-over and dispatch that
        event again."""
        ends = self.at
        if self.deployed_at is not None and self.deployed_at < ends:
            ends = self.deployed_at
        if self.first_delivery is not None and self.first_delivery < ends:
            ends = self.first_delivery - DELIVERY_SLACK
        return ends


@dataclass(frozen=True, kw_only=True, slots=True)
class Arrival:
    """How an event reached the inbox: its source and when it was stored."""

    source: str
    received_at: datetime
    #: Whether what it reports may have happened before a cut-over (webhooks, reconcile
    #: and recovered events; not API observations, backfills or replays).
    historical: bool
    #: The shop's own API observation (``observe()``), and its object's creation time.
    observed: bool = False
    object_created: datetime | None = None


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

    On an adopted account (``cutover``), for an event stored after the cut-over was
    recorded: one that happened before the earlier system's history ends
    (:attr:`CutOver.history_ends`) is recorded, not dispatched (stale, with the projection
    following if it moves forward): the shop's earlier system handled it. So is an API
    observation of an object hookledger has no record of, when its state is from before
    then (an order older than adoption's reach, looked up): by its modification time, or,
    for a kind whose objects carry none, by its creation; and, for an object that carries
    neither (a mandate), whenever it was observed: nothing shows it is not the earlier
    system's. Such an observation not dated by a modification time is recorded as adoption
    records what it reads (owner :data:`ADOPTED`), not as the observation's own: it
    cannot tell when the state was reached, so a webhook or undelivered event that shows
    it happening after the history ends still dispatches it (below). A state that adoption
    recorded, that the object still stands at, and that an event shows happening after the
    history ends (adoption read a dispute, payout or mandate, which carry no modification
    time, just after it changed) is dispatched by that event; once the object has moved on, a
    return to that state is a return (the handlers do not run).

    ``note`` (the event type disagreeing with the object's status, say) is appended to any
    reason given.
    """
    if replay or incoming is None:
        return DISPATCH_UNGUARDED
    if cutover is not None and arrival is not None:
        dated = _before_cutover(cutover, arrival, event_time, incoming, current)
        if dated is not None:
            return _recorded_before_cutover(
                event_pk, incoming, event_time, transition_owner, current, cutover, note, dated
            )
        if (
            arrival.historical
            and transition_owner == ADOPTED
            and current is not None
            and current.event_pk == ADOPTED
            and current.state.key == incoming.key
            and event_time is not None
            and event_time >= cutover.history_ends
        ):
            transition_owner = None
            current = None
    verdict = _decide(event_pk, incoming, event_time, transition_owner, current)
    if note and verdict.reason:
        return Verdict(
            decision=verdict.decision,
            reason=f"{verdict.reason} ({note})",
            claim=verdict.claim,
            projection=verdict.projection,
            owner=verdict.owner,
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


#: How an event was found to be from before the history's end (:func:`_before_cutover`).
Dating = Literal["time", "creation", "undated"]


def _before_cutover(
    cutover: CutOver,
    arrival: Arrival,
    event_time: datetime | None,
    incoming: State,
    current: Projected | None,
) -> Dating | None:
    """How the event is known to be from before the history's end (``None``: it is not)."""
    if arrival.received_at < cutover.recorded_at:
        return None
    ends = cutover.history_ends
    if arrival.historical:
        return "time" if event_time is not None and event_time < ends else None
    if not arrival.observed or current is not None:
        return None
    spec = objects.KINDS.get(incoming.kind)
    if spec is None or spec.modified_fields:
        return "time" if event_time is not None and event_time < ends else None
    # A kind whose objects carry no modification time is dated when it was observed: its
    # creation is all that tells an object the earlier system had. One that carries no
    # creation either (a mandate: ``MandateResponse`` has no time at all) cannot be told
    # from the earlier system's history: recorded too (never dispatched by an observation
    # alone), and its webhook, dated, dispatches it if it came after the history's end.
    if arrival.object_created is None:
        return "undated"
    return "creation" if arrival.object_created < ends else None


def _recorded_before_cutover(
    event_pk: int,
    incoming: State,
    event_time: datetime | None,
    owner: int | None,
    current: Projected | None,
    cutover: CutOver,
    note: str | None,
    dated: Dating,
) -> Verdict:
    ends = cutover.history_ends.isoformat()
    if dated == "undated":
        reason = (
            f"{incoming} carries no time and hookledger has no record of the object: "
            f"recorded as adoption records what it reads, not dispatched (it may be the "
            f"earlier system's, before {ends}); its webhook dispatches it if that shows it "
            "after the cut-over"
        )
    else:
        reason = (
            f"{incoming} happened before the cut-over (hookledger's history starts at "
            f"{ends}): recorded, not dispatched"
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
        # An observation dated by creation or not at all cannot tell when its state was
        # reached: recorded as adoption's, so a dated later event may still dispatch it.
        owner=ADOPTED if dated != "time" else None,
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
