"""The transition model: per object kind, which moves are forward (pure, no I/O).

Every object kind has a lifecycle: a directed graph over its statuses (``edges``). A move
from ``a`` to ``b`` is *forward* when ``b`` can be reached from ``a`` and ``a`` cannot be
reached back from ``b``; *backward* in the opposite case; *open* when the model cannot
tell (both reachable, as in ``requires_capture`` <-> ``processing`` around an asynchronous
capture that may fail, or neither, as between the terminal ``succeeded`` and ``failed``).
The staleness guard orders events by the model; event times only settle what the model
leaves open.

Disputes also have a *stage* (``pre_dispute`` < ``dispute`` < ``pre_arbitration`` <
``arbitration`` < ``dispute_reversal``): a later stage is forward whatever its status, so a
dispute reopened at ``pre_arbitration`` on the same ``dispute_id`` moves forward from
``dispute_won``.

**The transition key.** An object's *state* is its status (plus, for a dispute, its stage);
its key (:attr:`State.key`) identifies a transition: each (object, state) is dispatched to
the handlers at most once, however it arrives (webhook, processor retry, reconciler, API
response, requeue). It is deliberately *not* the event type: two statuses that share one
event type (``partially_captured_and_capturable`` and ``partially_captured`` are both
``payment_captured``) are two transitions, and so is ``dispute_opened`` at a new stage.
(The processor itself sends at most one webhook per (object, event type), so the second of
those reaches a merchant only by reconciliation.) An object that comes back to a state it
had already reached (a failed capture returns a payment to ``requires_capture``) moves the
projection but does not run that state's handlers a second time.

Sources: the statuses are Hyperswitch's enums (``hyperswitch-facts.md`` section 5), the
moves its flows: asynchronous capture and void pass through ``processing``
(CaptureInitiated / VoidInitiated), a manual-capture authorisation expires after 7 days, a
failed payment can be confirmed again (manual retry), a captured payment can be voided
after capture (``cancelled_post_capture``), a payout can be reversed after ``success``, a
refund can fail after ``succeeded``, a mandate can be revoked at any time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

import receiver.core.status as statuses
from receiver.core.clock import as_utc

Order = Literal["same", "forward", "backward", "open", "unknown"]

#: Dispute stages, earliest first (Hyperswitch ``DisputeStage``).
DISPUTE_STAGES: Final = (
    "pre_dispute",
    "dispute",
    "pre_arbitration",
    "arbitration",
    "dispute_reversal",
)
#: The stage of a dispute whose object names none (Hyperswitch's default).
DEFAULT_DISPUTE_STAGE: Final = "dispute"


@dataclass(frozen=True, slots=True)
class State:
    """Where an object of ``kind`` stands: its status and, for a dispute, its stage."""

    kind: str
    status: str
    stage: str | None = None

    @property
    def key(self) -> str:
        """The transition key within the object: ``status``, or ``stage/status`` for a dispute."""
        return f"{self.stage}/{self.status}" if self.stage is not None else self.status

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """One kind's statuses, the moves between them, and which statuses are settled.

    ``settled`` statuses are where an object stops changing in practice: the open-object
    sweep stops re-fetching it there (the guard still accepts any modelled move).
    """

    kind: str
    edges: Mapping[str, frozenset[str]]
    settled: frozenset[str]
    stages: tuple[str, ...] = ()

    @property
    def statuses(self) -> frozenset[str]:
        return frozenset(self.edges)

    def knows(self, status: str | None) -> bool:
        return status is not None and status in self.edges

    def reachable(self, start: str, goal: str) -> bool:
        """True when ``goal`` can be reached from ``start`` in one or more moves."""
        return goal in _closure(self)[start]

    def order(self, current: State, incoming: State) -> Order:
        """How ``incoming`` relates to ``current`` (both of this kind)."""
        if not (self.knows(current.status) and self.knows(incoming.status)):
            return "same" if current.key == incoming.key else "unknown"
        if self.stages:
            before = _stage_index(self, current.stage)
            after = _stage_index(self, incoming.stage)
            if before is None or after is None:
                return "same" if current.key == incoming.key else "unknown"
            if after != before:
                return "forward" if after > before else "backward"
        if current.status == incoming.status:
            return "same"
        ahead = self.reachable(current.status, incoming.status)
        behind = self.reachable(incoming.status, current.status)
        if ahead and not behind:
            return "forward"
        if behind and not ahead:
            return "backward"
        return "open"

    def is_settled(self, state: State) -> bool:
        """True when the sweep need not re-fetch an object in ``state`` (see ``settled``)."""
        if state.status not in self.settled:
            return False
        if self.stages and state.status in _REOPENABLE_DISPUTE:
            # A decided dispute can be taken to a later stage, until the last one.
            return state.stage == self.stages[-1]
        return True


def _stage_index(lifecycle: Lifecycle, stage: str | None) -> int | None:
    try:
        return lifecycle.stages.index(stage or DEFAULT_DISPUTE_STAGE)
    except ValueError:
        return None


_CLOSURES: dict[str, dict[str, frozenset[str]]] = {}


def _closure(lifecycle: Lifecycle) -> dict[str, frozenset[str]]:
    cached = _CLOSURES.get(lifecycle.kind)
    if cached is None or cached.keys() != lifecycle.edges.keys():
        cached = {}
        for start in lifecycle.edges:
            seen: set[str] = set()
            todo = list(lifecycle.edges[start])
            while todo:
                status = todo.pop()
                if status in seen:
                    continue
                seen.add(status)
                todo.extend(lifecycle.edges.get(status, ()))
            cached[start] = frozenset(seen)
        _CLOSURES[lifecycle.kind] = cached
    return cached


def _graph(moves: Mapping[str, Iterable[str]]) -> dict[str, frozenset[str]]:
    graph = {status: frozenset(targets) for status, targets in moves.items()}
    for targets in list(graph.values()):
        for status in targets:
            graph.setdefault(status, frozenset())
    return graph


# -- payments (IntentStatus) ----------------------------------------------------------------

#: Before an authorisation; moves among them go both ways (3-D Secure, manual review,
#: asynchronous authorisation), so the model leaves their order to event time. ``processing``
#: is also where an asynchronous capture or void waits, hence its moves onwards.
_PAYMENT_PENDING = frozenset(
    {
        "requires_payment_method",
        "requires_confirmation",
        "requires_customer_action",
        "requires_merchant_action",
        "conflicted",
        "processing",
    }
)
_PAYMENT_AUTHORISED = frozenset({"requires_capture", "partially_authorized_and_requires_capture"})
_PAYMENT_PARTLY_CAPTURED = frozenset(
    {"partially_captured_and_capturable", "partially_captured_and_processing"}
)
_PAYMENT_CAPTURED = frozenset({"succeeded", "partially_captured"})
_PAYMENT_ONWARD = (
    _PAYMENT_PENDING
    | _PAYMENT_AUTHORISED
    | _PAYMENT_PARTLY_CAPTURED
    | _PAYMENT_CAPTURED
    | {"failed", "cancelled", "expired"}
)

PAYMENT = Lifecycle(
    kind="payment",
    edges=_graph(
        {
            **{status: _PAYMENT_ONWARD - {status} for status in _PAYMENT_PENDING},
            # A failed payment may be confirmed again (manual retry).
            "failed": _PAYMENT_ONWARD - {"failed"},
            # Capture or void (asynchronous ones pass through processing), partial capture,
            # expiry after 7 days, a failed capture.
            "requires_capture": {"processing"}
            | _PAYMENT_PARTLY_CAPTURED
            | _PAYMENT_CAPTURED
            | {"failed", "cancelled", "expired"},
            "partially_authorized_and_requires_capture": {"requires_capture", "processing"}
            | _PAYMENT_PARTLY_CAPTURED
            | _PAYMENT_CAPTURED
            | {"failed", "cancelled", "expired"},
            "partially_captured_and_capturable": {
                "partially_captured_and_processing",
                "partially_captured",
                "succeeded",
                "cancelled_post_capture",
            },
            "partially_captured_and_processing": {
                "partially_captured_and_capturable",
                "partially_captured",
                "succeeded",
            },
            "succeeded": {"cancelled_post_capture"},
            "partially_captured": {"cancelled_post_capture"},
            "cancelled": set(),
            "expired": set(),
            "cancelled_post_capture": set(),
        }
    ),
    # A captured payment (succeeded, partially_captured) can still be voided after capture
    # (``POST /payments/{id}/cancel_post_capture``, until the connector settles it): not
    # settled, as a succeeded refund or a successful payout is not. The sweep follows it
    # for a shorter reach than the open states' (reconcile.recovery.sweep.CAPTURED_REACH).
    settled=frozenset({"failed", "cancelled", "expired", "cancelled_post_capture"}),
)

# -- refunds (API enum; the internal one is normalised first) --------------------------------

REFUND = Lifecycle(
    kind="refund",
    edges=_graph(
        {
            "pending": {"review", "succeeded", "failed"},
            "review": {"succeeded", "failed"},
            # Some connectors report a refund's failure after its success.
            "succeeded": {"failed"},
            "failed": set(),
        }
    ),
    settled=frozenset({"failed"}),
)

# -- disputes ---------------------------------------------------------------------------------

_DISPUTE_DECIDED = frozenset(
    {"dispute_accepted", "dispute_cancelled", "dispute_expired", "dispute_won", "dispute_lost"}
)
#: Decided statuses a later stage (pre-arbitration, arbitration) can follow.
_REOPENABLE_DISPUTE: Final = frozenset({"dispute_won", "dispute_lost"})

DISPUTE = Lifecycle(
    kind="dispute",
    edges=_graph(
        {
            "dispute_opened": _DISPUTE_DECIDED | {"dispute_challenged"},
            "dispute_challenged": _DISPUTE_DECIDED,
            **{status: frozenset[str]() for status in _DISPUTE_DECIDED},
        }
    ),
    settled=_DISPUTE_DECIDED,
    stages=DISPUTE_STAGES,
)

# -- payouts ------------------------------------------------------------------------------------

_PAYOUT_SETUP = (
    "requires_creation",
    "requires_vendor_account_creation",
    "requires_payout_method_data",
    "requires_confirmation",
    "requires_fulfillment",
)
_PAYOUT_ENDS = frozenset({"failed", "cancelled", "expired", "ineligible"})

PAYOUT = Lifecycle(
    kind="payout",
    edges=_graph(
        {
            **{
                status: set(_PAYOUT_SETUP[index + 1 :])
                | {"pending", "initiated", "success"}
                | _PAYOUT_ENDS
                for index, status in enumerate(_PAYOUT_SETUP)
            },
            "initiated": {"pending", "success", "failed", "cancelled", "expired"},
            "pending": {"success", "failed", "cancelled", "expired"},
            # A payout can be reversed days after its success.
            "success": {"reversed"},
            "reversed": set(),
            **{status: frozenset[str]() for status in _PAYOUT_ENDS},
        }
    ),
    settled=_PAYOUT_ENDS | {"reversed"},
)

# -- mandates -----------------------------------------------------------------------------------

MANDATE = Lifecycle(
    kind="mandate",
    edges=_graph(
        {
            "pending": {"active", "inactive", "revoked"},
            "active": {"inactive", "revoked"},
            "inactive": {"active", "revoked"},
            "revoked": set(),
        }
    ),
    settled=frozenset({"revoked"}),
)

# -- invoices (subscriptions) ----------------------------------------------------------------

INVOICE = Lifecycle(
    kind="invoice",
    edges=_graph({"payment_pending": {"invoice_paid"}, "invoice_paid": set()}),
    settled=frozenset({"invoice_paid"}),
)

LIFECYCLES: Final[Mapping[str, Lifecycle]] = {
    lifecycle.kind: lifecycle for lifecycle in (PAYMENT, REFUND, DISPUTE, PAYOUT, MANDATE, INVOICE)
}


def lifecycle(kind: str) -> Lifecycle | None:
    return LIFECYCLES.get(kind)


def make_state(kind: str, status: str, stage: str | None = None) -> State:
    """The state of an object of ``kind``: the status normalised (refunds arrive in two
    enums) and, for a dispute, the stage (its default when the object names none)."""
    normalized = statuses.normalize_status(kind, status) or status
    if kind == "dispute":
        return State(kind, normalized, stage or DEFAULT_DISPUTE_STAGE)
    return State(kind, normalized, None)


@dataclass(frozen=True, slots=True)
class Reading:
    """What an event says about its object: the state it reports, and a note when the event
    type and the object's status disagree."""

    state: State | None
    note: str | None = None


def read_event(
    kind: str, event_type: str | None, status: str | None, stage: str | None = None
) -> Reading:
    """The state an event of ``event_type`` about an object of ``kind`` reports.

    The object's status is used when it is the status the event type is about (it is the
    more precise of the two: ``payment_captured`` covers two statuses). When they disagree
    (the processor has sent a stale snapshot of the object, as in Hyperswitch issue #9278),
    the event type says what happened and is used; the note says so. An event type about
    another kind, or an unknown one, leaves the object's status in charge.
    """
    implied = statuses.STATUS_FOR_EVENT.get(event_type or "")
    if implied is not None and implied[0] != kind:
        implied = None
    if status is None:
        if implied is None:
            return Reading(None)
        return Reading(make_state(kind, implied[1], stage))
    state = make_state(kind, status, stage)
    if (
        implied is None
        or implied[1] == state.status
        or statuses.event_type_for_status(kind, state.status) == event_type
    ):
        return Reading(state)
    return Reading(
        make_state(kind, implied[1], stage),
        note=f"the object's status {state.status} disagrees with {event_type}: "
        f"judged as {implied[1]}",
    )


def order(current: State, incoming: State) -> Order:
    """How ``incoming`` relates to ``current`` in their kind's model."""
    model = LIFECYCLES.get(current.kind)
    if model is None or current.kind != incoming.kind:
        return "same" if current.key == incoming.key else "unknown"
    return model.order(current, incoming)


def is_settled(state: State) -> bool:
    model = LIFECYCLES.get(state.kind)
    return model is not None and model.is_settled(state)


def is_newer(incoming: datetime | None, current: datetime | None) -> bool:
    """For moves the model leaves open: is the incoming event strictly newer?"""
    if incoming is None or current is None:
        return current is None
    return as_utc(incoming) > as_utc(current)


__all__ = [
    "DEFAULT_DISPUTE_STAGE",
    "DISPUTE_STAGES",
    "LIFECYCLES",
    "Lifecycle",
    "Order",
    "Reading",
    "State",
    "is_newer",
    "is_settled",
    "lifecycle",
    "make_state",
    "order",
    "read_event",
]
