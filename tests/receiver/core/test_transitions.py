"""The transition model and the guard built on it (pure: no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import receiver.core.guard as guard
import receiver.core.transitions as transitions
from receiver.core.guard import ADOPTED, Arrival, CutOver, Projected, decide
from receiver.core.status import STATUS_FOR_EVENT
from receiver.core.transitions import State, make_state, order, read_event

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)

#: Every status of Hyperswitch's enums (hyperswitch-facts.md section 5), per kind.
ENUMS = {
    "payment": (
        "succeeded failed cancelled cancelled_post_capture processing requires_customer_action "
        "requires_merchant_action requires_payment_method requires_confirmation requires_capture "
        "partially_captured partially_captured_and_capturable "
        "partially_authorized_and_requires_capture partially_captured_and_processing conflicted "
        "expired"
    ).split(),
    "refund": ["succeeded", "failed", "pending", "review"],
    "payout": (
        "success failed cancelled initiated expired reversed pending ineligible requires_creation "
        "requires_confirmation requires_payout_method_data requires_fulfillment "
        "requires_vendor_account_creation"
    ).split(),
    "dispute": (
        "dispute_opened dispute_expired dispute_accepted dispute_cancelled dispute_challenged "
        "dispute_won dispute_lost"
    ).split(),
    "mandate": ["active", "inactive", "pending", "revoked"],
}


def at(kind: str, status: str, stage: str | None = None) -> State:
    return make_state(kind, status, stage)


def projected(state: State, minutes: int = 0, pk: int = 1) -> Projected:
    return Projected(state=state, event_time=T0 + timedelta(minutes=minutes), event_pk=pk)


def verdict(
    current: Projected | None,
    incoming: State,
    minutes: int = 10,
    *,
    pk: int = 9,
    owner: int | None = None,
    **kw: object,
) -> guard.Verdict:
    return decide(
        event_pk=pk,
        incoming=incoming,
        event_time=T0 + timedelta(minutes=minutes),
        replay=False,
        transition_owner=owner,
        current=current,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("kind", sorted(ENUMS))
def test_the_model_knows_every_status_of_the_processors_enums(kind: str) -> None:
    model = transitions.lifecycle(kind)
    assert model is not None
    assert set(ENUMS[kind]) == set(model.statuses)
    # Every status the model knows is reachable from somewhere or a start.
    for status in model.statuses:
        assert status in model.edges


def test_every_event_type_implies_a_status_the_model_knows() -> None:
    for event_type, (kind, status) in STATUS_FOR_EVENT.items():
        model = transitions.lifecycle(kind)
        assert model is not None and model.knows(status), event_type


@pytest.mark.parametrize(
    ("kind", "before", "after"),
    [
        ("payment", "requires_payment_method", "succeeded"),
        ("payment", "processing", "succeeded"),
        ("payment", "requires_capture", "succeeded"),
        ("payment", "requires_capture", "expired"),
        ("payment", "partially_captured_and_capturable", "partially_captured"),
        ("payment", "partially_captured_and_capturable", "succeeded"),
        ("payment", "failed", "succeeded"),  # a manual retry after a decline
        ("payment", "succeeded", "cancelled_post_capture"),
        ("refund", "pending", "succeeded"),
        ("refund", "succeeded", "failed"),  # a refund failing days after its success
        ("payout", "initiated", "success"),
        ("payout", "success", "reversed"),
        ("mandate", "active", "revoked"),
        ("dispute", "dispute_opened", "dispute_challenged"),
        ("dispute", "dispute_challenged", "dispute_lost"),
    ],
)
def test_forward_moves(kind: str, before: str, after: str) -> None:
    assert order(at(kind, before), at(kind, after)) == "forward"
    assert order(at(kind, after), at(kind, before)) == "backward"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # An asynchronous capture or void: Hyperswitch maps CaptureInitiated and
        # VoidInitiated to processing; a failed capture returns to requires_capture.
        ("requires_capture", "processing"),
        ("partially_captured_and_capturable", "partially_captured_and_processing"),
        ("requires_customer_action", "processing"),
    ],
)
def test_moves_the_model_leaves_to_event_time(before: str, after: str) -> None:
    assert order(at("payment", before), at("payment", after)) == "open"
    current = projected(at("payment", before), minutes=5)
    assert verdict(current, at("payment", after), minutes=6).decision == "dispatch"
    older = verdict(current, at("payment", after), minutes=4)
    assert older.decision == "stale"
    assert older.reason and "not newer" in older.reason


def test_async_capture_is_dispatched_not_stale() -> None:
    # Regression (reconciliation issue, item 3): requires_capture -> processing was stale.
    current = projected(at("payment", "requires_capture"))
    result = verdict(current, at("payment", "processing"))
    assert result.decision == "dispatch"
    assert result.claim == "processing"
    assert result.projection == at("payment", "processing")


def test_two_statuses_sharing_an_event_type_are_two_transitions() -> None:
    # Regression: partially_captured_and_capturable -> partially_captured (both
    # payment_captured) never moved the projection.
    capturable = at("payment", "partially_captured_and_capturable")
    final = at("payment", "partially_captured")
    assert capturable.key != final.key
    result = verdict(projected(capturable), final)
    assert result.decision == "dispatch" and result.projection == final


def test_a_dispute_reopened_at_a_later_stage_is_dispatched() -> None:
    # Regression: a dispute reopened at pre_arbitration on the same dispute_id was never
    # dispatched (its event type dispute_opened had been).
    won = at("dispute", "dispute_won", "dispute")
    reopened = at("dispute", "dispute_opened", "pre_arbitration")
    assert reopened.key == "pre_arbitration/dispute_opened"
    assert at("dispute", "dispute_opened").key == "dispute/dispute_opened"
    assert order(won, reopened) == "forward"
    result = verdict(projected(won), reopened)
    assert result.decision == "dispatch" and result.claim == "pre_arbitration/dispute_opened"
    # ... and a late webhook from the first stage is stale against it.
    late = verdict(projected(reopened), at("dispute", "dispute_challenged", "dispute"))
    assert late.decision == "stale"


def test_decided_disputes_are_followed_until_the_last_stage() -> None:
    assert not transitions.is_settled(at("dispute", "dispute_won", "dispute"))
    assert not transitions.is_settled(at("dispute", "dispute_lost", "pre_arbitration"))
    assert transitions.is_settled(at("dispute", "dispute_won", "dispute_reversal"))
    assert transitions.is_settled(at("dispute", "dispute_accepted"))


def test_an_event_type_that_disagrees_with_its_objects_status_is_judged_by_the_type() -> None:
    # A payout_success webhook whose object still says initiated (a stale snapshot).
    reading = read_event("payout", "payout_success", "initiated")
    assert reading.state == at("payout", "success")
    assert reading.note and "disagrees" in reading.note
    # The precise status wins when it is the one the event type is about.
    assert read_event("payment", "payment_captured", "partially_captured_and_capturable").state == (
        at("payment", "partially_captured_and_capturable")
    )
    assert read_event("payout", "payout_processing", "pending").note is None
    assert read_event("refund", "refund_succeeded", "success").state == at("refund", "succeeded")
    current = projected(at("payout", "initiated"))
    result = decide(
        event_pk=9,
        incoming=reading.state,
        event_time=T0,
        replay=False,
        transition_owner=None,
        current=current,
        note=reading.note,
    )
    assert result.decision == "dispatch" and result.projection == at("payout", "success")


def test_a_retry_of_the_owner_is_dispatched_while_the_projection_stands_at_it() -> None:
    current = projected(at("payment", "requires_capture"), pk=9)
    assert verdict(current, at("payment", "requires_capture"), pk=9, owner=9).decision == (
        "dispatch"
    )


def test_a_requeued_event_overtaken_while_dead_is_stale() -> None:
    # Regression (item 4): a dead payment_authorized requeued after payment_succeeded was
    # dispatched and moved the order backwards.
    current = projected(at("payment", "succeeded"), pk=12)
    result = verdict(current, at("payment", "requires_capture"), pk=9, owner=9)
    assert result.decision == "stale"
    assert result.reason and "overtaken" in result.reason and "#12" in result.reason
    assert result.projection is None


def test_a_second_event_of_a_dispatched_state_is_a_duplicate() -> None:
    current = projected(at("payment", "succeeded"), pk=3)
    result = verdict(current, at("payment", "succeeded"), owner=3)
    assert result.decision == "duplicate" and result.projection is None


def test_a_return_to_an_earlier_state_moves_the_projection_without_handlers() -> None:
    # requires_capture (dispatched by #3) -> processing (#5) -> requires_capture again
    # (a failed capture): the projection follows, the handlers do not run again.
    current = projected(at("payment", "processing"), minutes=5, pk=5)
    result = verdict(current, at("payment", "requires_capture"), minutes=6, owner=3)
    assert result.decision == "duplicate"
    assert result.projection == at("payment", "requires_capture")
    assert result.claim is None


def test_backwards_is_stale_with_a_reason() -> None:
    current = projected(at("payment", "succeeded"))
    result = verdict(current, at("payment", "requires_capture"), minutes=60)
    assert result.decision == "stale"
    assert result.reason == "requires_capture would move succeeded backwards"


def test_unknown_statuses_are_dispatched_once_without_moving_the_projection() -> None:
    current = projected(at("payment", "succeeded"))
    result = verdict(current, State("payment", "brand_new_status"))
    assert result.decision == "dispatch" and result.projection is None
    assert result.claim == "brand_new_status"


CUT = CutOver(at=T0, recorded_at=T0 + timedelta(hours=1))


def arrival(source: str = "webhook", minutes: int = 120) -> Arrival:
    return Arrival(
        source=source,
        received_at=T0 + timedelta(minutes=minutes),
        historical=source in ("webhook", "reconcile", "recovered"),
    )


def test_an_event_from_before_the_cutover_is_recorded_not_dispatched() -> None:
    result = verdict(None, at("payment", "succeeded"), minutes=-30, cutover=CUT, arrival=arrival())
    assert result.decision == "stale"
    assert result.reason and "before the cut-over" in result.reason
    assert result.claim == "succeeded" and result.projection == at("payment", "succeeded")


def test_the_cutover_does_not_touch_events_received_before_it_was_recorded() -> None:
    early = arrival(minutes=30)  # stored before adoption recorded the cut-over
    result = verdict(None, at("payment", "succeeded"), minutes=-30, cutover=CUT, arrival=early)
    assert result.decision == "dispatch"


def test_the_cutover_does_not_apply_to_backfills() -> None:
    result = verdict(
        None, at("payment", "succeeded"), minutes=-30, cutover=CUT, arrival=arrival("backfill")
    )
    assert result.decision == "dispatch"


def observed(created_minutes: int | None = None) -> Arrival:
    return Arrival(
        source="api",
        received_at=T0 + timedelta(minutes=120),
        historical=False,
        observed=True,
        object_created=T0 + timedelta(minutes=created_minutes)
        if created_minutes is not None
        else None,
    )


def test_an_api_observation_of_history_hookledger_has_no_record_of_is_recorded() -> None:
    """Issue 20, item 8: observing an object older than adoption's reach."""
    old = verdict(
        None, at("payment", "succeeded"), minutes=-60 * 24 * 60, cutover=CUT, arrival=observed()
    )
    assert old.decision == "stale" and old.reason and "before the cut-over" in old.reason
    new = verdict(None, at("payment", "succeeded"), minutes=30, cutover=CUT, arrival=observed())
    assert new.decision == "dispatch"
    # A dispute carries no modification time (observe dates it now): its creation decides.
    won = at("dispute", "dispute_won")
    assert verdict(None, won, minutes=120, cutover=CUT, arrival=observed(-90_000)).decision == (
        "stale"
    )
    assert verdict(None, won, minutes=120, cutover=CUT, arrival=observed(30)).decision == (
        "dispatch"
    )
    # An object hookledger knows is judged as usual.
    known = projected(at("payment", "requires_capture"), minutes=-60 * 24 * 60, pk=4)
    assert (
        verdict(known, at("payment", "succeeded"), minutes=-30, cutover=CUT, arrival=observed())
    ).decision == "dispatch"


def test_history_ends_at_the_first_delivery_when_it_came_before_the_cutover() -> None:
    """Issue 20, item 4: the deploy came before adoption; what happened since was sent to
    hookledger, and a retry of it that lands after the cut-over is dispatched."""
    deployed = CutOver(
        at=T0, recorded_at=T0 + timedelta(hours=1), first_delivery=T0 - timedelta(hours=2)
    )
    assert deployed.history_ends == T0 - timedelta(hours=2) - guard.DELIVERY_SLACK
    assert CutOver(at=T0, recorded_at=T0, first_delivery=T0 + timedelta(days=1)).history_ends == T0
    after_deploy = verdict(
        None, at("payment", "succeeded"), minutes=-60, cutover=deployed, arrival=arrival()
    )
    assert after_deploy.decision == "dispatch"
    before_deploy = verdict(
        None, at("payment", "succeeded"), minutes=-180, cutover=deployed, arrival=arrival()
    )
    assert before_deploy.decision == "stale"


def test_a_first_delivery_after_the_cutover_never_moves_history_back() -> None:
    """Issue 28, hole 3: the first delivery hookledger gets comes minutes after adoption
    (the processor's retry of an event the earlier system handled). History still ends at
    the cut-over: that retry, and any other of an event from before it, is recorded."""
    for minutes in (0, 1, 4, 5, 6, 60 * 24):
        late = CutOver(at=T0, recorded_at=T0, first_delivery=T0 + timedelta(minutes=minutes))
        assert late.history_ends == T0, minutes
    adopted = projected(at("payment", "succeeded"), minutes=-2, pk=ADOPTED)
    retried = verdict(
        adopted,
        at("payment", "succeeded"),
        minutes=-2,
        owner=ADOPTED,
        cutover=CutOver(at=T0, recorded_at=T0, first_delivery=T0 + timedelta(minutes=1)),
        arrival=arrival(minutes=1),
    )
    assert retried.decision != "dispatch"
    # A delivery just before the cut-over still moves history back (the deploy came first).
    early = CutOver(at=T0, recorded_at=T0, first_delivery=T0 - timedelta(seconds=1))
    assert early.history_ends == T0 - timedelta(seconds=1) - guard.DELIVERY_SLACK


def test_a_return_to_the_state_adoption_recorded_is_a_return() -> None:
    """Issue 20, item 7: adopted at requires_capture, moved on after go-live (an
    asynchronous capture), back to requires_capture when it fails."""
    processing = projected(at("payment", "processing"), minutes=10, pk=5)
    back = verdict(
        processing,
        at("payment", "requires_capture"),
        minutes=20,
        owner=ADOPTED,
        cutover=CUT,
        arrival=arrival(),
    )
    assert back.decision == "duplicate" and back.projection == at("payment", "requires_capture")


def test_a_state_adoption_absorbed_after_the_cutover_is_dispatched_by_its_event() -> None:
    adopted = Projected(state=at("payment", "succeeded"), event_time=T0, event_pk=ADOPTED)
    after = verdict(
        adopted,
        at("payment", "succeeded"),
        minutes=5,
        owner=ADOPTED,
        cutover=CUT,
        arrival=arrival(),
    )
    assert after.decision == "dispatch"
    before = verdict(
        adopted,
        at("payment", "succeeded"),
        minutes=-5,
        owner=ADOPTED,
        cutover=CUT,
        arrival=arrival(),
    )
    assert before.decision == "stale"
    plain = verdict(adopted, at("payment", "succeeded"), minutes=5, owner=ADOPTED)
    assert plain.decision == "duplicate" and plain.reason and "adoption" in plain.reason


def test_a_recovered_dispute_lost_after_a_delivered_won_is_dispatched() -> None:
    """Regression (reconciliation issue, item 2): recovered events were dated at the
    dispute's creation, so a recovered dispute_lost was judged older than the delivered
    dispute_won and marked stale. Dated when observed, it is newer, and the two decided
    states are an order the model leaves to time."""
    won = projected(at("dispute", "dispute_won"), minutes=60)
    assert order(won.state, at("dispute", "dispute_lost")) == "open"
    observed_later = verdict(won, at("dispute", "dispute_lost"), minutes=60 * 24 * 30)
    assert observed_later.decision == "dispatch"
    dated_at_creation = verdict(won, at("dispute", "dispute_lost"), minutes=0)
    assert dated_at_creation.decision == "stale"  # what the old dating did


def test_the_diff_recovers_a_later_decided_state_rather_than_calling_it_local_ahead() -> None:
    import reconcile.core.diff as diff

    remote = diff.read_remote(
        "dispute",
        {"dispute_id": "dp_1", "dispute_status": "dispute_lost", "dispute_stage": "dispute"},
    )
    assert isinstance(remote, diff.Remote)
    local = diff.Local(at("dispute", "dispute_won"), event_pk=4)
    finding = diff.compare(remote, local)
    assert (finding.verdict, finding.event_type) == ("missed", "dispute_lost")
    # The pre-arbitration case: a stage the local side never saw is forward, not ahead.
    reopened = diff.read_remote(
        "dispute",
        {
            "dispute_id": "dp_1",
            "dispute_status": "dispute_opened",
            "dispute_stage": "pre_arbitration",
        },
    )
    assert isinstance(reopened, diff.Remote)
    assert diff.compare(reopened, local).verdict == "missed"
    behind = diff.read_remote(
        "dispute",
        {"dispute_id": "dp_1", "dispute_status": "dispute_opened", "dispute_stage": "dispute"},
    )
    assert isinstance(behind, diff.Remote)
    assert diff.compare(behind, local).verdict == "local_ahead"


def test_the_diff_counts_a_state_reached_by_a_dead_letter_apart_from_in_sync() -> None:
    """Issue 20, item 10 (pure side): the projection shows the processor's state, but the
    event that put it there is dead-lettered: not in sync."""
    import reconcile.core.diff as diff

    remote = diff.read_remote("payment", {"payment_id": "pay_1", "status": "succeeded"})
    assert isinstance(remote, diff.Remote)
    done = diff.Local(at("payment", "succeeded"), event_pk=7)
    dead = diff.Local(at("payment", "succeeded"), event_pk=7, dead=True)
    assert diff.compare(remote, done).verdict == "in_sync"
    assert diff.compare(remote, dead).verdict == "dead_letter"


def test_what_waits_in_the_inbox_reaches_the_remote_state_or_leaves_it_short() -> None:
    """Issue 20, item 9 (pure side): a waiting payment_failed from before the customer's
    successful retry leaves the projection short of ``succeeded``."""
    import reconcile.core.diff as diff

    succeeded = at("payment", "succeeded")
    assert not diff.reaches(succeeded, [at("payment", "failed")])
    assert not diff.reaches(succeeded, [])
    assert diff.reaches(succeeded, [at("payment", "failed"), succeeded])
    # A waiting event past a listing read before it arrived: it takes the object further.
    assert diff.reaches(at("payment", "requires_capture"), [succeeded])
