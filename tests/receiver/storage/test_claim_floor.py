"""Claims walk each account's open events from a floor (issue 29, item 6): on PostgreSQL the
index over open events keeps the entries of done events until a vacuum, so a full scan
learns where each account's open events begin and the next claims start there. No event may
be stranded by it: one written late with an earlier time, and an account's first open event,
are claimed within the floors' bounds (:data:`receiver.storage.queue.FLOOR_CLAIMS` claims, or
:data:`receiver.storage.queue.FLOOR_LIFETIME`), while other events keep the claims busy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from receiver.core.events import parse_event
from receiver.storage.queue import ACCOUNTS_PER_CLAIM, FLOOR_CLAIMS
from receiver.store import Store
from receiver.testing.factories import build_event, encode

pytestmark = pytest.mark.storage


def _insert(store: Store, n: int, prefix: str, *, account: str = "default") -> list[int]:
    pks = []
    for i in range(n):
        body = encode(
            build_event(
                "payment_succeeded", object_id=f"pay_{prefix}_{i}", event_id=f"evt_{prefix}_{i}"
            )
        )
        inserted = store.inbox.insert(parse_event(body), body, account=account)
        assert inserted.pk is not None
        pks.append(inserted.pk)
    return pks


def _claims(store: Store, n: int) -> list[int]:
    """The inbox ids ``n`` claims of one event each lease (kept: each claim takes another)."""
    claimed: list[int] = []
    for _ in range(n):
        claimed += [c.pk for c in store.queue.claim_batch("floor-worker", 60, limit=1)]
    return claimed


def test_an_event_written_below_the_floor_is_claimed_within_its_bounds(
    engine: sa.Engine, store: Store
) -> None:
    """An event whose transaction committed after the full scan with a time before the floor
    (a long transaction, a clock behind): the walks from the floor do not see it, the next
    full scan does, even while the floor's walks keep finding others."""
    _insert(store, FLOOR_CLAIMS + 8, "flood")
    assert len(_claims(store, 1)) == 1  # a full scan: the floors are learnt
    (late,) = _insert(store, 1, "late")
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE hookledger_event SET next_attempt_at = :at WHERE id = :pk"),
            {"at": datetime.now(UTC) - timedelta(hours=1), "pk": late},
        )
    assert late in _claims(store, FLOOR_CLAIMS + 1)


def test_an_accounts_first_open_event_is_claimed_within_the_floors_bounds(
    engine: sa.Engine, store: Store
) -> None:
    """Another account's first open event, stored after the full scan: the walks from the
    floors know only the accounts that scan saw; the next full scan sees it."""
    _insert(store, FLOOR_CLAIMS + 8, "flood")
    assert len(_claims(store, 1)) == 1
    (other,) = _insert(store, 1, "other", account="acct_other")
    assert other in _claims(store, FLOOR_CLAIMS + 1)


def test_a_claim_that_finds_nothing_from_the_floors_scans_in_full(
    engine: sa.Engine, store: Store
) -> None:
    """Once the floors' walks find nothing due, the claim scans in full at once: an event
    below the floor is not left waiting for the bounds when nothing else is."""
    _insert(store, 2, "few")
    assert len(_claims(store, 2)) == 2
    (late,) = _insert(store, 1, "late")
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE hookledger_event SET next_attempt_at = :at WHERE id = :pk"),
            {"at": datetime.now(UTC) - timedelta(hours=1), "pk": late},
        )
    assert _claims(store, 1) == [late]


def _block_behind_a_retry(engine: sa.Engine, store: Store) -> int:
    """An object whose head waits an hour for its retry and whose next event is due: the
    walks find that event every time, and no claim can take it (order within the object)."""
    at = datetime.now(UTC) - timedelta(minutes=5)
    heads = []
    for i in range(2):
        body = encode(
            build_event(
                "payment_processing" if i == 0 else "payment_succeeded",
                object_id="pay_blocked",
                event_id=f"evt_blocked_{i}",
                timestamp=at + timedelta(seconds=i),
            )
        )
        inserted = store.inbox.insert(parse_event(body), body, account="acct_blocked")
        assert inserted.pk is not None
        heads.append(inserted.pk)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE hookledger_event SET next_attempt_at = :at WHERE id = :pk"),
            {"at": datetime.now(UTC) + timedelta(hours=1), "pk": heads[0]},
        )
    return heads[1]


def test_a_claim_that_claims_nothing_from_the_floors_scans_in_full(
    engine: sa.Engine, store: Store
) -> None:
    """The floors' walks find only an event that waits behind its object's retry: that claim
    takes nothing, so it scans in full at once; another account's first event and an event
    below the floor are not left waiting for the floors' bounds while nothing else runs."""
    _block_behind_a_retry(engine, store)
    assert _claims(store, 1) == []  # a full scan: the floors are learnt
    (other,) = _insert(store, 1, "other", account="acct_other")
    assert _claims(store, 1) == [other]
    (late,) = _insert(store, 1, "late", account="acct_blocked")
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE hookledger_event SET next_attempt_at = :at WHERE id = :pk"),
            {"at": datetime.now(UTC) - timedelta(hours=1), "pk": late},
        )
    assert _claims(store, 1) == [late]


def test_an_event_behind_its_objects_retry_is_claimed_once_its_head_is_done(
    engine: sa.Engine, store: Store
) -> None:
    """The floors start past an object's later event that waits behind its head's retry
    (else every walk reads all done events since, :mod:`test_dispatch_plans`); once the
    head has run, that event is below the floor and claimed within the floors' bounds."""
    follower = _block_behind_a_retry(engine, store)
    _insert(store, FLOOR_CLAIMS + 8, "flood", account="acct_blocked")
    assert len(_claims(store, 1)) == 1  # a full scan: the floors are learnt
    with engine.begin() as conn:
        (head,) = conn.execute(
            sa.text(
                "UPDATE hookledger_event SET next_attempt_at = :at WHERE event_id ="
                " 'evt_blocked_0' RETURNING id"
            ),
            {"at": datetime.now(UTC)},
        ).one()
    assert head in _claims(store, 2)
    _done(engine, head)
    assert follower in _claims(store, FLOOR_CLAIMS + 1)


def _done(engine: sa.Engine, pk: int) -> None:
    """The event ``pk`` done and its object's lease given back, as a worker leaves them."""
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE hookledger_event SET status = 'done' WHERE id = :pk"), {"pk": pk}
        )
        conn.execute(
            sa.text(
                "DELETE FROM hookledger_object_lease WHERE object_key ="
                " (SELECT object_key FROM hookledger_event WHERE id = :pk)"
            ),
            {"pk": pk},
        )


def test_an_account_whose_events_come_one_at_a_time_is_walked_from_the_floors(
    engine: sa.Engine, store: Store
) -> None:
    """While another account floods the queue, an account whose events come one at a time
    (each done before the next arrives) has no open event at most full scans: its walk
    starts at the scan's time, so its next event is claimed by the next claim, not after the
    floors' bounds (up to a second each: with a flood, its events waited 0.2-0.55 s where
    they had waited 30-60 ms before the floors)."""
    _insert(store, FLOOR_CLAIMS * 3, "flood")
    (first,) = _insert(store, 1, "one", account="acct_b")
    statements: list[str] = []

    def hook(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", hook)
    try:
        assert _claims(store, 1) == [first]  # a full scan: acct_b comes first
        _done(engine, first)
        for _ in range(FLOOR_CLAIMS + 2):  # up to a full scan that sees no event of acct_b
            statements.clear()
            _claims(store, 1)
            if any(s.lstrip().startswith("WITH RECURSIVE") for s in statements):
                break
        else:
            pytest.fail("no full scan")
        (second,) = _insert(store, 1, "two", account="acct_b")
        statements.clear()
        assert _claims(store, 1) == [second]
        if engine.dialect.name == "postgresql":  # from the floors: no full scan
            assert not any(s.lstrip().startswith("WITH RECURSIVE") for s in statements)
    finally:
        sa.event.remove(engine, "before_cursor_execute", hook)


@pytest.mark.parametrize("step", [timedelta(hours=-1), timedelta(seconds=-0.5), timedelta(hours=1)])
def test_a_clock_moved_back_or_forward_strands_nothing(
    engine: sa.Engine, store: Store, step: timedelta
) -> None:
    """The worker's clock steps (NTP, a VM resumed) after the floors were learnt: a floor
    learnt in the future or in the past is not used, and an event stored at the new time,
    in another account, is claimed at the next claim."""
    from freezegun import freeze_time

    start = datetime.now(UTC)
    with freeze_time(start) as clock:
        _insert(store, FLOOR_CLAIMS * 2, "flood")
        assert len(_claims(store, 1)) == 1  # a full scan: the floors are learnt
        clock.move_to(start + step)
        (other,) = _insert(store, 1, "other", account="acct_b")
        assert _claims(store, 1) == [other]


@pytest.mark.parametrize("how", ["lease-expired", "released"])
def test_an_event_a_worker_lost_or_gave_back_is_claimed_within_the_floors_bounds(
    engine: sa.Engine, store: Store, how: str
) -> None:
    """An event in a worker's hands at a full scan is below the floors it learns (a slow
    handler's event must not hold them at its time); when that worker dies (its lease
    expires) or gives it back (a graceful stop), it is claimed within the floors' bounds,
    while other events keep the claims busy."""
    (early,) = _insert(store, 1, "early")
    with engine.begin() as conn:  # due for an hour: far below the floors to come
        conn.execute(
            sa.text("UPDATE hookledger_event SET next_attempt_at = :at WHERE id = :pk"),
            {"at": datetime.now(UTC) - timedelta(hours=1), "pk": early},
        )
    (lost,) = store.queue.claim_batch("lost-worker", 60, limit=1)
    assert lost.pk == early
    _insert(store, 2 * FLOOR_CLAIMS + 8, "flood")
    assert len(_claims(store, FLOOR_CLAIMS + 1)) == FLOOR_CLAIMS + 1  # a full scan meanwhile
    if how == "released":
        store.queue.release(lost)
    else:
        with engine.begin() as conn:
            past = {"at": datetime.now(UTC) - timedelta(seconds=1), "pk": early}
            conn.execute(
                sa.text("UPDATE hookledger_event SET lease_expires_at = :at WHERE id = :pk"), past
            )
            conn.execute(
                sa.text(
                    "UPDATE hookledger_object_lease SET expires_at = :at WHERE object_key ="
                    " (SELECT object_key FROM hookledger_event WHERE id = :pk)"
                ),
                past,
            )
    assert early in _claims(store, FLOOR_CLAIMS + 1)


@pytest.mark.parametrize("accounts", [ACCOUNTS_PER_CLAIM, ACCOUNTS_PER_CLAIM + 1])
def test_as_many_accounts_as_a_claim_takes_turns_between_walk_from_the_floors(
    engine: sa.Engine, store: Store, accounts: int
) -> None:
    """With exactly as many accounts with open events as a claim takes turns between, no
    turns are taken: the claims after a full scan walk from the floors (every claim scanned
    in full, as with more accounts, where each claim serves the next ones). One account
    more: every claim scans in full, and the next claim serves the accounts the last left."""
    names = [f"acct_{i:02d}" for i in range(accounts)]
    for name in names:
        _insert(store, 3, name, account=name)
    statements: list[str] = []

    def hook(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", hook)
    try:
        claimed = [c.account for c in store.queue.claim_batch("floor-worker", 60, limit=4)]
        statements.clear()
        claimed += [c.account for c in store.queue.claim_batch("floor-worker", 60, limit=4)]
        full = any(s.lstrip().startswith("WITH RECURSIVE") for s in statements)
    finally:
        sa.event.remove(engine, "before_cursor_execute", hook)
    if engine.dialect.name == "postgresql":
        assert full == (accounts > ACCOUNTS_PER_CLAIM)
    assert len(claimed) == 8
    if accounts > ACCOUNTS_PER_CLAIM:  # the second claim served the account the first left
        assert names[-1] in claimed[4:]
