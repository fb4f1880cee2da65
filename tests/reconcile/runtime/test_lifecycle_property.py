"""Property test: random lifecycles of every kind over 120 days, webhooks lost, duplicated,
delayed and reordered, the reconcile schedule running throughout.

Hypothesis draws a set of stories (a payment paid, declined or held for manual capture that
is captured, captured asynchronously, voided or left to expire; refunds that succeed, wait
or fail days later; disputes decided weeks later and taken to pre-arbitration; payouts that
pass through ``initiated`` and may be reversed; mandates revoked months later), each step
at a drawn day, and a webhook fault mix. The world (sandbox processor and receiver, in one
process, under freezegun) then lives through 120 days with the reconcile schedule: an
incremental run every 12 hours and the nightly wide run at 02:00 (the default schedule's
shape; its 10-minute incremental interval would be 17,000 runs an example, so the test runs
it at a coarser rate: the lists' windows are then wider, and the sweep does the same work).
At the end, and throughout:

- the merchant-side projection equals the processor's state for every object;
- every transition dispatched reached the handlers exactly once (and nothing else did);
- no report claimed ``ok`` while an object it covered was out of step;
- no run spent more requests than its budgets allow (counted at the transport).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import receiver.core.objects as objects
import receiver.core.status as statuses
from receiver.extension import WebhookReceiver
from reconcile.core.report import Report
from reconcile.runtime.runner import ReconcileOptions
from reconcile.sandbox.errors import SandboxError
from reconcile.sandbox.faults import WebhookFaultConfig
from tests.conftest import build_app, fresh_database
from tests.reconcile.world import CARD_ASYNC, World, world

pytestmark = [pytest.mark.storage, pytest.mark.slow]

DAYS = 120
DAY = timedelta(days=1)
EXAMPLES = int(os.environ.get("HOOKLEDGER_PROPERTY_EXAMPLES", "5"))
INCREMENTAL = ReconcileOptions(sweep_budget=200, max_requests=200)
NIGHTLY = ReconcileOptions(mode="wide", sweep_budget=1000, max_requests=200)
CARD_DECLINED = "4000000000000002"
CARD_PROCESSING = "4000000000000077"


@dataclass(frozen=True)
class Step:
    day: int
    action: str
    story: int
    arg: int = 0


def _story(index: int) -> st.SearchStrategy[list[Step]]:
    day = st.integers(min_value=0, max_value=60)
    late = st.integers(min_value=1, max_value=20)

    def payment(d: int, shape: str, k: int) -> list[Step]:
        steps = [Step(d, shape, index)]
        if shape in ("capture", "capture_async", "void"):
            steps.append(Step(d + min(k, 6), f"do_{shape}", index))
        return steps

    payments = st.builds(
        payment,
        day,
        st.sampled_from(
            ["paid", "declined", "processing", "capture", "capture_async", "void", "expire"]
        ),
        late,
    )

    def refund(d: int, amount: int, fail: bool, k: int) -> list[Step]:
        steps = [Step(d, "paid", index), Step(d + 1, "refund", index, amount)]
        if fail:
            steps.append(Step(d + 1 + k, "refund_fail", index))
        return steps

    refunds = st.builds(refund, day, st.sampled_from([1000, 1077, 1088]), st.booleans(), late)

    def dispute(d: int, end: str, k: int, escalate: bool, k2: int) -> list[Step]:
        steps = [Step(d, "paid", index), Step(d + 1, "dispute", index)]
        steps.append(Step(d + 1 + k, f"dispute_{end}", index))
        if escalate and end in ("win", "lose"):
            steps.append(Step(d + 1 + k + k2, "dispute_pre_arbitration", index))
            steps.append(Step(d + 1 + k + 2 * k2, "dispute_lose", index))
        return steps

    disputes = st.builds(
        dispute,
        day,
        st.sampled_from(["win", "lose", "accept", "challenge"]),
        st.integers(min_value=1, max_value=45),
        st.booleans(),
        late,
    )

    def payout(d: int, amount: int, reverse: bool, k: int) -> list[Step]:
        steps = [Step(d, "payout", index, amount)]
        if reverse:
            steps.append(Step(d + k, "payout_reverse", index))
        return steps

    payouts = st.builds(payout, day, st.sampled_from([4000, 4055]), st.booleans(), late)

    def mandate(d: int, revoke: bool, k: int) -> list[Step]:
        steps = [Step(d, "mandate", index)]
        if revoke:
            steps.append(Step(d + k * 3, "mandate_revoke", index))
        return steps

    mandates = st.builds(mandate, day, st.booleans(), late)
    return st.one_of(payments, refunds, disputes, payouts, mandates)


@st.composite
def plans(draw: st.DrawFn) -> tuple[list[Step], WebhookFaultConfig, bool]:
    count = draw(st.integers(min_value=2, max_value=6))
    steps = [step for i in range(count) for step in draw(_story(i))]
    faults = WebhookFaultConfig(
        drop=draw(st.sampled_from([0.0, 0.2, 0.5])),
        duplicate=draw(st.sampled_from([0.0, 0.2])),
        delay=draw(st.sampled_from([0.0, 0.3])),
        delay_seconds=draw(st.sampled_from([30.0, 3600.0])),
        reorder=draw(st.sampled_from([0.0, 0.2])),
    )
    return steps, faults, draw(st.booleans())


class Actor:
    """Plays the stories' steps on the sandbox."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.payment: dict[int, str] = {}
        self.refund: dict[int, str] = {}
        self.dispute: dict[int, str] = {}
        self.payout: dict[int, str] = {}
        self.mandate: dict[int, str] = {}

    def play(self, step: Step) -> None:
        sb = self.w.sandbox
        pid = f"pay_s{step.story}"
        if step.action in (
            "paid",
            "declined",
            "processing",
            "capture",
            "capture_async",
            "void",
            "expire",
        ):
            card = {
                "declined": CARD_DECLINED,
                "processing": CARD_PROCESSING,
                "capture_async": CARD_ASYNC,
            }.get(step.action, "4242424242424242")
            manual = step.action in ("capture", "capture_async", "void", "expire")
            self.w.pay(pid, card=card, manual=manual)
            self.payment[step.story] = pid
        elif step.action in ("do_capture", "do_capture_async"):
            sb.capture_payment(pid, {})
        elif step.action == "do_void":
            sb.cancel_payment(pid, {})
        elif step.action == "refund":
            made = sb.create_refund({"payment_id": pid, "amount": step.arg})
            self.refund[step.story] = made["refund_id"]
        elif step.action == "refund_fail":
            sb.fail_refund(self.refund[step.story])
        elif step.action == "dispute":
            self.dispute[step.story] = sb.open_dispute(pid)["dispute_id"]
        elif step.action.startswith("dispute_"):
            action = step.action.removeprefix("dispute_")
            sb.dispute_action(self.dispute[step.story], action)
        elif step.action == "payout":
            made = sb.create_payout(
                {"amount": step.arg, "currency": "USD", "payout_type": "bank", "auto_fulfill": True}
            )
            self.payout[step.story] = made["payout_id"]
        elif step.action == "payout_reverse":
            sb.reverse_payout(self.payout[step.story])
        elif step.action == "mandate":
            self.mandate[step.story] = sb.create_mandate(card_number="4242424242424242")[
                "mandate_id"
            ]
        elif step.action == "mandate_revoke":
            sb.revoke_mandate(self.mandate[step.story])
        else:  # pragma: no cover - a strategy bug
            raise AssertionError(step.action)

    def objects(self) -> Iterator[tuple[str, str]]:
        for name, ids in (
            ("payment", self.payment),
            ("refund", self.refund),
            ("dispute", self.dispute),
            ("payout", self.payout),
            ("mandate", self.mandate),
        ):
            for object_id in ids.values():
                yield name, object_id


def _remote_key(w: World, kind: str, object_id: str) -> str | None:
    getter = {
        "payment": w.sandbox.get_payment,
        "refund": w.sandbox.get_refund,
        "dispute": w.sandbox.get_dispute,
        "payout": w.sandbox.get_payout,
        "mandate": w.sandbox.get_mandate,
    }[kind]
    state = objects.state_of(kind, getter(object_id))
    return state.key if state is not None else None


def _out_of_step(w: World, actor: Actor) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    """Objects whose projection is not the processor's (event-worthy) state."""
    wrong = {}
    for kind, object_id in actor.objects():
        remote = _remote_key(w, kind, object_id)
        status = remote.rsplit("/", 1)[-1] if remote else None
        if remote is None or statuses.event_type_for_status(kind, status) is None:
            continue  # a state the processor sends no event for: nothing to project yet
        local = w.projected(kind, object_id)
        if local != remote:
            wrong[(kind, object_id)] = (local, remote)
    return wrong


class CountingAdapter(requests.adapters.BaseAdapter):
    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.count = 0

    def send(self, request: Any, **kw: Any) -> Any:
        self.count += 1
        return self.inner.send(request, **kw)

    def close(self) -> None:
        self.inner.close()


def _budget(options: ReconcileOptions, w: World) -> int:
    lists = options.max_requests * 4
    confirm = 100
    events = 1000 if w.reconciler.events is not None else 0
    return lists + confirm + options.sweep_budget + events


def _check_run(
    w: World, actor: Actor, counter: CountingAdapter, options: ReconcileOptions
) -> Report:
    before = counter.count
    report = w.run(options)
    spent = counter.count - before
    assert spent <= _budget(options, w), (spent, report.as_dict())
    if report.status == "ok":
        # Everything the run covered agrees with the processor (nothing changes remotely
        # while a run runs here); an object it did not cover may still wait for its check.
        covered = _covered(report, actor)
        wrong = {k: v for k, v in _out_of_step(w, actor).items() if k in covered}
        assert not wrong, ("an ok report with objects out of step", wrong, report.as_dict())
    return report


def _covered(report: Report, actor: Actor) -> set[tuple[str, str]]:
    """Objects created inside the run's list windows (their creation is in the sandbox)."""
    sandbox_getters = {
        "payment": actor.w.sandbox.get_payment,
        "refund": actor.w.sandbox.get_refund,
        "dispute": actor.w.sandbox.get_dispute,
        "payout": actor.w.sandbox.get_payout,
    }
    names = {"payment": "payments", "refund": "refunds", "dispute": "disputes", "payout": "payouts"}
    covered = set()
    for kind, object_id in actor.objects():
        if kind not in names or names[kind] not in report.kinds:
            continue
        created = objects.created_time(kind, sandbox_getters[kind](object_id))
        start, end = report.kinds[names[kind]].window
        if created is not None and start <= created < end:
            covered.add((kind, object_id))
    return covered


def _live(w: World, actor: Actor, steps: list[Step], counter: CountingAdapter) -> None:
    by_day: dict[int, list[Step]] = {}
    for step in steps:
        by_day.setdefault(step.day, []).append(step)
    start = w.now()
    for day in range(DAYS):
        morning = start + day * DAY
        for hour, step in enumerate(by_day.get(day, [])):
            w.advance(morning + timedelta(hours=1, minutes=7 * hour) - w.now())
            try:
                actor.play(step)
            except SandboxError:  # a move the object's state no longer allows (say, a
                pass  # capture after the authorisation expired): the processor refuses it
            w.settle()
        w.advance(morning + timedelta(hours=12) - w.now())
        _check_run(w, actor, counter, INCREMENTAL)
        w.advance(morning + timedelta(hours=17) - w.now())  # 02:00 UTC from a 09:00 start
        _check_run(w, actor, counter, NIGHTLY)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(plan=plans())
def test_random_lifecycles_over_120_days_end_in_the_processors_state(
    plan: tuple[list[Step], WebhookFaultConfig, bool], tmp_path: Path
) -> None:
    steps, faults, events_api = plan
    with fresh_database(tmp_path) as url:

        def factory(hooks: Any = None, **config: Any) -> Any:
            return build_app(url, hooks, **config)

        with world(
            factory,
            events_api=events_api,
            faults=faults,
            start=datetime(2026, 2, 2, 9, 0, tzinfo=UTC),
        ) as w:
            counter = CountingAdapter(w.client._session.get_adapter("http://sandbox.test"))
            w.client._session.mount("http://sandbox.test", counter)
            actor = Actor(w)
            _live(w, actor, steps, counter)
            # Settle: no more faults, a few more days of the schedule.
            w.sandbox.faults.reset()
            for _ in range(9):
                w.advance(DAY)
                _check_run(w, actor, counter, NIGHTLY)
            assert _out_of_step(w, actor) == {}
            # Every transition dispatched reached the handlers once, and nothing else did.
            assert all(n == 1 for n in w.handled.values()), w.handled
            dispatched = _dispatched(w)
            assert set(w.handled) == dispatched, set(w.handled) ^ dispatched
            WebhookReceiver.state(w.app).store.engine.dispose()


def _dispatched(w: World) -> set[tuple[str, str, str]]:
    import sqlalchemy as sa

    from receiver.storage.tables import InboxEvent, Transition

    t: sa.Table = Transition.__table__  # type: ignore[attr-defined]
    e: sa.Table = InboxEvent.__table__  # type: ignore[attr-defined]
    with w.store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.c.object_kind, t.c.object_id, t.c.state)
            .select_from(t.join(e, e.c.id == t.c.event_pk))
            .where(e.c.status == "done")
        ).all()
    return {(r[0], r[1], r[2]) for r in rows}


# -- a go-live during traffic (issue 20, items 4-8) ------------------------------------------

GO_LIVE_PAYMENTS = ReconcileOptions(kinds=["payments"], sweep_budget=200, max_requests=200)


@st.composite
def go_live_plans(draw: st.DrawFn) -> tuple[list[tuple[int, str]], int, WebhookFaultConfig]:
    """Payments over a week: (hour, action) with actions paid/held/capture; the deploy at a
    drawn hour; adoption starts a drawn number of hours after it, in several runs."""
    steps = draw(
        st.lists(
            st.tuples(
                st.integers(min_value=0, max_value=7 * 24),
                st.sampled_from(["paid", "held", "capture"]),
            ),
            min_size=3,
            max_size=12,
        )
    )
    deploy = draw(st.integers(min_value=24, max_value=6 * 24))
    faults = WebhookFaultConfig(
        drop=draw(st.sampled_from([0.3, 0.0])),
        delay=draw(st.sampled_from([0.5, 0.0])),
        delay_seconds=draw(st.sampled_from([3 * 3600.0, 60.0])),
    )
    # Traffic right at the go-live: an authorisation before it, captured at the deploy with a
    # new payment, and more in the hours around it (adoption starts 1 to 6 hours after).
    steps += [(deploy - 3, "held"), (deploy, "paid"), (deploy, "capture")]
    near = draw(st.lists(st.integers(min_value=-2, max_value=8), min_size=2, max_size=6))
    actions = draw(
        st.lists(
            st.sampled_from(["capture", "paid", "held"]), min_size=len(near), max_size=len(near)
        )
    )
    steps += [(max(0, deploy + h), a) for h, a in zip(near, actions, strict=True)]
    return sorted(steps), deploy, faults


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(plan=go_live_plans(), lag=st.integers(min_value=1, max_value=6))
def test_a_go_live_during_traffic_writes_off_nothing_after_the_deploy(
    plan: tuple[list[tuple[int, str]], int, WebhookFaultConfig], lag: int, tmp_path: Path
) -> None:
    """Webhooks go to the earlier system until the deploy, then to hookledger (lost,
    delayed and retried at random); adoption starts ``lag`` hours after the deploy and runs
    in several small runs while payments keep changing. In the end every payment whose
    state was reached after the deploy was dispatched once, in that state, and nothing
    reached before the deploy (and not again after) reached the handlers."""
    from reconcile.runtime.adoption import Adopter, AdoptOptions

    steps, deploy, faults = plan
    with fresh_database(tmp_path) as url:

        def factory(hooks: Any = None, **config: Any) -> Any:
            return build_app(url, hooks, **config)

        start = datetime(2026, 2, 2, 9, 0, tzinfo=UTC)
        with world(factory, new_account=False, start=start) as w:
            w.sandbox.webhook_url = None  # the earlier system's
            w.sandbox.faults.configure(webhooks=faults)
            reached: dict[str, tuple[str, bool]] = {}  # payment -> (state, after the deploy)
            held: list[str] = []
            adopter = Adopter(w.client, w.store)
            options = AdoptOptions(kinds=["payments"], max_requests=1)
            deployed = adopted = False
            hours = sorted({h for h, _ in steps} | {deploy, deploy + lag} | {7 * 24 + 1})
            pending = list(steps)
            for hour in hours:
                w.advance(start + timedelta(hours=hour) - w.now())
                if hour >= deploy and not deployed:
                    w.sandbox.webhook_url = "http://merchant.test/webhooks/"
                    deployed = True
                if deployed and hour >= deploy + lag and not adopted:
                    adopted = adopter.adopt(options).finished  # one small run per step
                for step in [s for s in pending if s[0] == hour]:
                    pending.remove(step)
                    n = len(reached)
                    if step[1] in ("paid", "held"):
                        pid = f"pay_g{n}"
                        w.pay(pid, manual=step[1] == "held")
                        if step[1] == "held":
                            held.append(pid)
                    elif held:
                        pid = held.pop(0)
                        try:
                            w.sandbox.capture_payment(pid, {})
                        except SandboxError:
                            continue  # expired meanwhile
                    else:
                        continue
                    w.settle()
                    key = _remote_key(w, "payment", pid)
                    assert key is not None
                    reached[pid] = (key, deployed)
                if deployed and hour >= deploy + lag and not adopted:
                    adopted = adopter.adopt(options).finished  # runs go on amid traffic
            while not adopted:
                adopted = adopter.adopt(options).finished
            w.sandbox.faults.reset()
            for _ in range(9):  # authorisations expire, retries land, the schedule runs
                w.advance(DAY)
                w.run(GO_LIVE_PAYMENTS)
            assert all(n == 1 for n in w.handled.values()), w.handled
            for pid in reached:
                final = _remote_key(w, "payment", pid)
                state, after = reached[pid]
                if final != state:  # expired after the deploy: dispatched, whatever came before
                    assert w.handled[("payment", pid, str(final))] == 1, (pid, w.handled)
                elif after:
                    assert w.handled[("payment", pid, state)] == 1, (pid, w.handled)
                else:
                    assert not [k for k in w.handled if k[1] == pid], (pid, w.handled)
            WebhookReceiver.state(w.app).store.engine.dispose()
