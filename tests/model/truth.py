"""What the world model checks, and the moves whose outcome it checks on the spot: the
worker's drain, the shop's ``observe``, a ``reconcile`` run, and the quiet end.

The invariants (see :mod:`tests.model.test_world_model`):

- :func:`nothing_twice`: no (account, object, transition) reached the handlers twice,
  counting hookledger's committed dispatches and the earlier system's;
- :func:`each_account_its_own`: no handler saw another account's object or merchant, and
  no account projects an object that is not its own;
- :func:`check_run`: a report says ``ok`` only when every object it covered equals the
  processor (or waits in the inbox), and the exit code says what the report found;
- :func:`quiet_and_final`: once quiet, after a final reconcile, every object equals the
  processor and every state an object ended in after its account went live reached the
  handlers exactly once.

Every failure message carries the world's log (what the rules did, in order) and, for an
object, its story in the inbox.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

import receiver.core.objects as objects
from receiver.core.accounts import DEFAULT_ACCOUNT
from receiver.core.clock import as_utc
from receiver.core.errors import HookledgerError
from receiver.core.guard import ADOPTED
from receiver.storage.tables import InboxEvent, Transition
from tests.model.processor import Thing, announced, api_object, things
from tests.model.shop import WorkerKilled
from tests.model.world import START, Account, Run, World

__all__ = ["START"]

Key = tuple[str, str, str, str]


class ModelFailure(AssertionError):
    """An invariant of the world model does not hold."""


def fail(w: World, message: str) -> ModelFailure:
    tail = "\n".join(w.log[-60:])
    return ModelFailure(f"{message}\n--- what happened (latest last) ---\n{tail}")


# -- the worker ---------------------------------------------------------------------------


def drain(w: World, *, limit: int = 500) -> None:
    """A worker runs every due event's handlers (``hookledger worker --burst``). A worker a
    handler killed is gone: its leases stay until they expire. The database never fails
    in this world: a storage error out of a batch is hookledger's (a handler ended its
    transaction, say), and ``--burst`` would never exit."""
    worker = w.shop.worker()
    for _ in range(limit):
        try:
            if not worker.run_once():
                return
        except WorkerKilled:
            w.note(f"worker {worker.name} killed mid-batch")
            return
        except SQLAlchemyError as exc:
            raise fail(
                w,
                f"the worker's batch failed on a healthy database ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200]}); hookledger worker --burst takes it for a "
                "storage outage and never exits",
            ) from exc
    raise fail(w, f"the worker still had due events after {limit} batches")


# -- the shop's own code -------------------------------------------------------------------


def observe(w: World, i: int, *, with_account: bool, dispatch: bool) -> None:
    """The shop looks an object up at the processor and feeds the answer to ``observe``,
    naming its account or not. Without ``account=`` a seller's object must be refused, or
    filed under its own account (routed by merchant and profile), never under another."""
    live = [t for t in w.things() if w.accounts[t.account].adopted]
    if not live:
        return
    thing = live[i % len(live)]
    resource = api_object(w.merchants[thing.merchant].sandbox, thing.kind, thing.object_id)
    kwargs: dict[str, Any] = {"account": thing.account} if with_account else {}
    where = f"account={thing.account}" if with_account else "no account"
    try:
        seen = w.shop.hooks.observe(resource, dispatch=dispatch, app=w.app, **kwargs)
    except WorkerKilled:
        w.note(f"observe {thing.kind}:{thing.object_id} ({where}): the process died")
        return
    except SQLAlchemyError as exc:
        raise fail(
            w, f"observe(dispatch=True) failed on a healthy database: {type(exc).__name__}"
        ) from exc
    except (HookledgerError, ValueError) as exc:
        if with_account:
            raise
        w.note(f"observe {thing.kind}:{thing.object_id} ({where}): refused ({exc})")
        return
    w.note(
        f"observe {thing.account}'s {thing.kind}:{thing.object_id} ({where}, "
        f"dispatch={dispatch}): {seen.stored} {seen.status}"
    )
    if seen.pk is not None:
        filed = w.inbox_account(seen.pk)
        if filed != thing.account:
            raise fail(
                w,
                f"observe ({where}) filed {thing.account}'s {thing.kind}:{thing.object_id} "
                f"under account {filed}",
            )


# -- reconcile --------------------------------------------------------------------------


def reconcile(
    w: World, target: int | None, *, wide: bool, dry_run: bool, fail_path: str | None
) -> None:
    """``reconcile run`` for one account or all, incremental or wide, perhaps a dry run,
    perhaps with the processor failing a list; then the run is checked."""
    known = [a for a in w.accounts.values() if a.on_hookledger or a.id == DEFAULT_ACCOUNT]
    chosen = None if target is None else known[target % len(known)]
    options = ["--mode", "wide"] if wide else []
    if dry_run:
        options.append("--dry-run")
    merchants = [a.merchant for a in known] if chosen is None else [chosen.merchant]
    if fail_path is not None:
        for merchant in merchants:
            merchant.sandbox.faults.once("error", count=3, path=fail_path, status=500)
    try:
        run_accounts(
            w, chosen, options, note=f" (processor failing {fail_path})" if fail_path else ""
        )
    finally:
        for merchant in merchants:
            merchant.sandbox.faults.reset()


def run_accounts(
    w: World, account: Account | None, options: list[str], *, note: str = ""
) -> list[Run]:
    """``reconcile run --json OPTIONS`` for ``account``, or ``--all-accounts``; each run
    checked (:func:`check_run`)."""
    if account is None:
        args = ["run", "--all-accounts", "--json", *options]
        covered = [a for a in w.accounts.values() if a.on_hookledger or a.id == DEFAULT_ACCOUNT]
    else:
        args = ["--account", account.id, "run", "--json", *options]
        covered = [account]
    run = w.reconcile(*args)
    w.note(f"reconcile {' '.join(args)}{note}: exit {run.code}")
    check_run(w, run, covered)
    return [run]


def check_run(w: World, run: Run, accounts: list[Account]) -> None:
    """Each account's part of ``run``: the exit code its report calls for, and an ``ok``
    only when every object the report covered equals the processor."""
    data = run.json()
    for account in accounts:
        if data is not None and "accounts" in data:
            report = data["accounts"].get(account.id)
            if report is None:
                raise fail(w, f"reconcile --all-accounts left out account {account.id}")
            code = report["exit_code"] if "exit_code" in report else _code_of(report)
            if report.get("status") == "failed":
                report = None
        else:
            report, code = data, run.code
        if not account.adopted or account.stage == "adopting":
            if code != 6:
                raise fail(w, f"account {account.id} is not adopted, yet its run exits {code}")
            continue
        if report is None:
            raise fail(w, f"account {account.id}'s run failed: exit {code}: {run.stderr.strip()}")
        failures = report["totals"].get("failures", 0)
        status = report["status"]
        # A dry run exits as the real run reading the same would (its ``outcome``).
        outcome = report.get("outcome", status)
        expected = 4 if failures else {"ok": 0, "unresolved": 1}.get(outcome)
        if code != expected:
            raise fail(
                w,
                f"account {account.id}: a {'dry ' if report['dry_run'] else ''}run whose report "
                f"is {status} with {failures} incomplete read(s) exits {code}, not {expected}",
            )
        if status == "ok":
            ok_means_in_step(w, account, report)


def _code_of(report: dict[str, Any]) -> int:
    if report["totals"].get("failures", 0):
        return 4
    return {"ok": 0, "unresolved": 1}.get(report.get("outcome", report["status"]), 0)


def ok_means_in_step(w: World, account: Account, report: dict[str, Any]) -> None:
    projected = w.projections()
    waiting = w.open_objects()
    wrong = []
    for thing in things(account.merchant):
        if thing.account != account.id:
            continue
        part = report["kinds"].get(f"{thing.kind}s")
        if part is None:
            continue
        start, end = (datetime.fromisoformat(t) for t in part["window"])
        obj = api_object(account.merchant.sandbox, thing.kind, thing.object_id)
        created = objects.created_time(thing.kind, obj)
        if created is None or not start <= created <= end:
            continue
        remote = w.truth(thing)
        key = (account.id, thing.kind, thing.object_id)
        if not announced(thing.kind, remote) or key in waiting:
            continue
        if projected.get(key) != remote:
            wrong.append(f"{thing.kind}:{thing.object_id} {projected.get(key)} != {remote}")
    if wrong:
        raise fail(
            w,
            f"account {account.id}'s report says ok, but objects it covered are not the "
            f"processor's: {wrong}",
        )


# -- after every step -------------------------------------------------------------------


def handled(w: World) -> Counter[Key]:
    """How often each transition reached the handlers: hookledger's committed dispatches
    and the earlier system's (once each)."""
    counts: Counter[Key] = Counter(w.shop.dispatched())
    counts.update(w.network.earlier.handled)
    return counts


def nothing_twice(w: World) -> None:
    twice = {k: n for k, n in handled(w).items() if n > 1 and not by_design(w, k)}
    if twice:
        stories = "\n".join(story(w, k) for k in twice)
        raise fail(w, f"transitions dispatched more than once: {twice}\n{stories}")


def by_design(w: World, key: Key) -> bool:
    """A transition the earlier system handled that hookledger dispatched once more, where
    the README says it may ("Going live on an existing account"): a webhook hookledger
    stored between the deploy and adoption is its own; and a change in the five minutes
    before the first delivery hookledger was sent, when that came before the cut-over."""
    if key not in w.network.earlier.handled or w.shop.dispatched().get(key, 0) != 1:
        return False
    account = w.accounts[key[0]]
    if account.cutover_at is None:
        return True  # stored and dispatched before adoption: hookledger's own
    (event_id,) = w.shop.event_ids(key)
    table = InboxEvent.__table__  # type: ignore[attr-defined]
    with w.engine.connect() as conn:
        row = conn.execute(
            sa.select(table.c.source, table.c.received_at).where(
                table.c.account == account.id, table.c.event_id == event_id
            )
        ).one()
    if row[0] == "webhook" and as_utc(row[1]) < account.cutover_at:
        return True
    first = w.first_delivery.get(account.id)
    if first is None or first >= account.cutover_at:
        return False
    reached = [t for state, t in w.moves.get(key[:3], []) if state == key[3]]
    return any(t >= first - timedelta(minutes=5) for t in reached)


def each_account_its_own(w: World) -> None:
    if w.shop.violations:
        raise fail(w, "a handler saw another account's object: " + "; ".join(w.shop.violations))
    owned = {(t.account, t.kind, t.object_id) for t in w.things()}
    foreign = [key for key in w.projections() if key not in owned]
    if foreign:
        raise fail(w, f"accounts project objects that are not theirs: {foreign}")


def story(w: World, key: Key) -> str:
    """An object's events in the inbox, and who handled the transition."""
    account, kind, object_id, state = key
    table = InboxEvent.__table__  # type: ignore[attr-defined]
    with w.engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                table.c.id,
                table.c.source,
                table.c.event_type,
                table.c.object_status,
                table.c.status,
                table.c.event_time,
                table.c.received_at,
            )
            .where(
                table.c.account == account,
                table.c.object_kind == kind,
                table.c.object_id == object_id,
            )
            .order_by(table.c.id)
        ).all()
    earlier = "handled" if key in w.network.earlier.handled else "not handled"
    lines = [f"  {key}: earlier system {earlier}"]
    lines += [
        f"    #{r[0]} {r[1]} {r[2]} ({r[3]}) -> {r[4]}; happened {r[5]}, received {r[6]}"
        for r in rows
    ]
    moves = w.moves.get((account, kind, object_id), [])
    lines.append("    at the processor: " + ", ".join(f"{s} {t:%m-%d %H:%M}" for s, t in moves))
    return "\n".join(lines)


# -- the end ------------------------------------------------------------------------------


def quiet_and_final(w: World) -> None:
    """The world goes quiet: every account goes live, every handler is well, the network
    delivers everything, the processor sends what it still has to; each day the scheduled
    (incremental) run and the nightly wide one, two days running. Then every object equals
    the processor, and every state an object ended in after its account went live reached
    the handlers exactly once."""
    w.note("--- the world goes quiet ---")
    w.shop.moods.clear()
    w.shop.notify_moods.clear()
    w.network.fates.clear()
    for account in list(w.accounts.values()):
        if account.stage == "history":
            w.deploy(account)
    for request in list(w.network.held):
        w.network.post(request)
    w.network.held.clear()
    deliver_everything(w)
    for account in list(w.accounts.values()):
        for _ in range(20):
            if account.stage == "live":
                break
            w.adopt(account)
        if account.stage != "live":
            raise fail(w, f"account {account.id}'s adoption never finished")
    deliver_everything(w)
    w.advance(timedelta(hours=2))
    drain(w)
    last: list[Run] | None = None
    for _ in range(2):
        w.advance(timedelta(days=1))
        deliver_everything(w)
        w.note("final reconcile:")
        # The scheduled run reads on from where the last one stopped (the wide run reads
        # only the last two days): an object created days ago whose webhook was lost is
        # caught there, as a shop running both would catch it.
        run_accounts(w, None, [])
        drain(w)
        last = run_accounts(w, None, ["--mode", "wide"])
        drain(w)
        nothing_twice(w)
        each_account_its_own(w)
    assert last is not None
    for run in last:
        if run.code != 0:
            raise fail(w, f"the final reconcile is not ok (exit {run.code}): {run.stdout[-3000:]}")
    if w.open_objects():
        raise fail(w, f"events still open in a quiet world: {sorted(w.open_objects())}")
    everything_in_step(w)
    nothing_lost(w)
    operators_find_each_object(w)


def deliver_everything(w: World) -> None:
    """The processor sends every attempt it has left (its retries, as time passes)."""
    for _ in range(100):
        w.deliver()
        drain(w)
        due = w.next_delivery()
        if due is None:
            return
        if due > w.now():
            w.frozen.move_to(due)
            for merchant in w.merchants.values():
                merchant.sandbox.tick()
            w.observe_processor()
    raise fail(w, "the processor still had webhooks to send after 100 rounds")


def everything_in_step(w: World) -> None:
    """Every object equals the processor, except where the README says no path can catch
    a lost webhook (:func:`out_of_reach`)."""
    projected = w.projections()
    wrong = []
    for thing in w.things():
        remote = w.truth(thing)
        if not announced(thing.kind, remote):
            continue
        if out_of_reach(w, thing, projected):
            continue
        local = projected.get((thing.account, thing.kind, thing.object_id))
        if local != remote:
            wrong.append(f"{thing.account} {thing.kind}:{thing.object_id} {local} != {remote}")
    if wrong:
        raise fail(w, f"after the final reconcile, objects differ from the processor: {wrong}")


def nothing_lost(w: World) -> None:
    """Every state an object ended in after its account went live reached the handlers
    once, except where the README says nothing can: a dispute, payout or mandate (no
    modification time) created before the history ended that changed before adoption read
    it, whose webhook was lost ("Going live", "Not covered")."""
    counts = handled(w)
    lost = []
    for thing in w.things():
        account = w.accounts[thing.account]
        state = w.truth(thing)
        if not announced(thing.kind, state) or account.deployed_at is None:
            continue
        moves = w.moves.get((thing.account, thing.kind, thing.object_id), [])
        if not moves or moves[-1][0] != state:
            raise fail(w, f"the model missed a move of {thing}")
        when = moves[-1][1]
        if when < account.deployed_at:
            continue
        key = (thing.account, thing.kind, thing.object_id, state or "")
        if counts.get(key, 0) == 1:
            continue
        if _not_covered(w, account, thing, when) or out_of_reach(w, thing, w.projections()):
            continue
        if _written_off_untold(w, account, when):
            continue
        lost.append(story(w, key))
    if lost:
        raise fail(
            w, "states reached after going live never reached the handlers:\n" + "\n".join(lost)
        )


def out_of_reach(w: World, thing: Thing, projected: dict[tuple[str, str, str], str]) -> bool:
    """What no path catches when its webhook is lost, as the README's table says ("What
    each path catches, and what nothing can"): a mandate hookledger never saw, or saw only
    through the shop's ``observe()`` on an adopted account (a mandate carries no time: the
    observation is recorded as adoption's, "Going live"), in the state it ends in (mandates
    have no list; the events API finds it if it was sent after the deploy), and, without
    the events API, a void after capture near or past 14 days after the payment's creation
    (the sweep's reach for a captured payment)."""
    account = w.accounts[thing.account]
    key = (thing.account, thing.kind, thing.object_id)
    moves = w.moves[key]
    if thing.kind == "mandate" and (
        key not in projected or _recorded_as_adoptions(w, key, projected[key])
    ):
        deployed = account.deployed_at
        return not account.events_api or (deployed is not None and moves[-1][1] < deployed)
    if thing.kind == "payment" and not account.events_api:
        state, when = moves[-1]
        # Its checks are spaced by age, at most a day apart: one may come after day 14.
        return state == "cancelled_post_capture" and when - moves[0][1] > timedelta(days=13)
    return False


def _recorded_as_adoptions(w: World, key: tuple[str, str, str], state: str) -> bool:
    """Whether ``state`` of the object is owned by adoption (no event dispatched it)."""
    table = Transition.__table__  # type: ignore[attr-defined]
    with w.engine.connect() as conn:
        owner = conn.execute(
            sa.select(table.c.event_pk).where(
                table.c.account == key[0],
                table.c.object_kind == key[1],
                table.c.object_id == key[2],
                table.c.state == state,
            )
        ).scalar()
    return owner == ADOPTED


def _written_off_untold(w: World, account: Account, when: datetime) -> bool:
    """What the README says adoption not told the deploy writes off ("Going live"): it
    ends history five minutes before the first delivery hookledger was sent, so a change
    between the deploy and then (every attempt at its webhook lost before that first
    delivery) is taken for the earlier system's."""
    if account.told_deploy or account.deployed_at is None:
        return False
    ends = w.history_end(account)
    return ends is not None and account.deployed_at <= when < ends


def _not_covered(w: World, account: Account, thing: Thing, when: datetime) -> bool:
    """What the README says nothing dispatches when its webhook is lost ("Going live",
    "Not covered"): without the events API, a dispute, payout or mandate created before the
    history ended that changed before adoption read it."""
    if account.events_api or thing.kind not in ("dispute", "payout", "mandate"):
        return False
    ends = w.history_end(account)
    if ends is None:
        return False
    created = w.moves[(thing.account, thing.kind, thing.object_id)][0][1]
    live = account.live_at or w.now()
    return created < ends and when <= live


def operators_find_each_object(w: World) -> None:
    """``hookledger events --account A --object kind:id`` (the README's form) lists every
    event of that object in that account, and nothing else."""
    table = InboxEvent.__table__  # type: ignore[attr-defined]
    with w.engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                table.c.account, table.c.object_kind, table.c.object_id, table.c.event_id
            ).where(table.c.object_kind.is_not(None))
        ).all()
    stored: dict[tuple[str, str, str], set[str]] = {}
    for row in rows:
        stored.setdefault((row[0], row[1], row[2]), set()).add(row[3])
    cli = w.app.test_cli_runner()
    for (account, kind, object_id), events in sorted(stored.items()):
        args = ["hookledger", "events", "--account", account, "--object", f"{kind}:{object_id}"]
        result = cli.invoke(args=[*args, "--limit", "1000", "--json"])
        listed = {r["event_id"] for r in json.loads(result.output)["listed"]}
        if listed != events:
            raise fail(
                w,
                f"{' '.join(args[1:])} lists {sorted(listed)}, not the object's events "
                f"{sorted(events)}",
            )
