"""Explicit backfills (``reconcile backfill``): dispatch, on request, transitions adoption
recorded as already seen, for the objects created in a window, with a dry run that counts
them first (adoption is in :mod:`reconcile.runtime.adoption`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Table, delete, select

import receiver.core.status as statuses
from receiver.core.guard import ADOPTED
from receiver.storage.tables import Projection, Source, Transition
from receiver.store import Store
from reconcile.core.errors import ProcessorError
from reconcile.core.report import KindReport
from reconcile.recovery.recover import Recovery, RecoveryOptions
from reconcile.recovery.sweep import FollowedObjects
from reconcile.runtime.adoption import AdoptOptions, adoption_pager
from reconcile.runtime.runner import KIND_NAMES, LISTED_KINDS, Reconciler, truncate_ms

P: Table = Projection.__table__  # type: ignore[attr-defined]
T: Table = Transition.__table__  # type: ignore[attr-defined]


@dataclass(kw_only=True, slots=True)
class BackfillReport:
    dry_run: bool
    window: tuple[datetime, datetime]
    kinds: dict[str, KindReport] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "window": [self.window[0].isoformat(), self.window[1].isoformat()],
            "kinds": {name: k.as_dict() for name, k in self.kinds.items()},
            "total": sum(sum(k.recovered.values()) for k in self.kinds.values()),
        }


class Backfill:
    """Dispatch, on request, transitions adoption recorded as already seen.

    For the objects created in ``[since, until]`` whose projection adoption recorded, the
    current state is read again from the processor and dispatched to the handlers (inbox
    source ``backfill``, exempt from the cut-over). A dry run counts them and changes
    nothing.
    """

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler

    def __repr__(self) -> str:
        return "Backfill()"

    def run(
        self,
        since: datetime,
        until: datetime,
        *,
        kinds: Sequence[str] = LISTED_KINDS,
        dry_run: bool = True,
        options: AdoptOptions | None = None,
    ) -> BackfillReport:
        r = self.reconciler
        options = options or AdoptOptions()
        window = (truncate_ms(since), min(truncate_ms(until), truncate_ms(r.clock())))
        report = BackfillReport(dry_run=dry_run, window=window)
        followed = FollowedObjects(
            r.inbox.engine, policy=options.sweep_policy, clock=r.clock, account=r.store.account
        )
        ownership = r.ownership()
        recovery = Recovery(
            r.inbox,
            r.store,
            followed,
            options=RecoveryOptions(dry_run=dry_run, source=Source.BACKFILL),
            clock=r.clock,
            ownership=ownership,
        )
        for name in kinds:
            kind = KIND_NAMES[name]
            part = KindReport(window=window)
            report.kinds[name] = part
            pager = adoption_pager(
                r.client,
                name,
                *window,
                options.max_requests,
                options,
                ownership.profile_filter,
            )
            try:
                rows = list(pager)
            except ProcessorError as exc:
                part.remote_errors.append(f"{type(exc).__name__}: {exc}")
                continue
            remotes = recovery.read(kind, rows, part)
            adopted = _adopted(r.inbox, r.store.account, kind, [x.object_id for x in remotes])
            chosen = [x for x in remotes if x.object_id in adopted]
            part.pages, part.requests = pager.pages, pager.requests
            if dry_run:
                # What adoption recorded is, to the diff, in sync: count what a backfill would
                # dispatch (each object's current state, where the processor sends an event).
                for remote in chosen:
                    part.checked += 1
                    event_type = (
                        statuses.event_type_for_status(kind, remote.state.status)
                        if remote.state is not None
                        else None
                    )
                    if event_type is None:
                        part.no_event += 1
                    else:
                        part.recovered[event_type] += 1
                continue
            _forget(r.inbox, r.store.account, kind, [x.object_id for x in chosen])
            recovery.process(kind, chosen, part, confirm_ahead=False)
        return report


def _adopted(inbox: Store, account: str, kind: str, object_ids: Sequence[str]) -> set[str]:
    if not object_ids:
        return set()
    with inbox.deferred.connect() as conn:
        rows = conn.execute(
            select(P.c.object_id).where(
                P.c.account == account,
                P.c.object_kind == kind,
                P.c.object_id.in_(list(object_ids)),
                P.c.event_pk == ADOPTED,
            )
        ).scalars()
        return set(rows)


def _forget(inbox: Store, account: str, kind: str, object_ids: Sequence[str]) -> None:
    """Drop what adoption recorded for ``object_ids`` so their states dispatch again."""
    if not object_ids:
        return
    with inbox.engine.begin() as conn:
        conn.execute(
            delete(T).where(
                T.c.account == account,
                T.c.object_kind == kind,
                T.c.object_id.in_(list(object_ids)),
                T.c.event_pk == ADOPTED,
            )
        )
        conn.execute(
            delete(P).where(
                P.c.account == account,
                P.c.object_kind == kind,
                P.c.object_id.in_(list(object_ids)),
                P.c.event_pk == ADOPTED,
            )
        )


__all__ = ["Backfill", "BackfillReport"]
