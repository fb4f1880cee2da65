"""What ``reconcile adopt`` reports: per kind, what it listed, recorded as already seen,
left to the objects' own history, dispatched because it changed since the history ended,
and how far back it read; the report as a dict and as a table for people.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(kw_only=True, slots=True)
class KindAdoption:
    """What adoption did for one kind."""

    history: tuple[datetime, datetime]
    reached: datetime | None = None
    finished: bool = False
    listed: int = 0
    recorded: Counter[str] = field(default_factory=Counter)
    own_history: int = 0
    #: Objects whose state changed after the earlier system's history ended (at or after
    #: the deploy, or after the cut-over, before adoption read them): dispatched, by state.
    dispatched: Counter[str] = field(default_factory=Counter)
    followed: int = 0
    unknown_status: int = 0
    bad_rows: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    requests: int = 0
    #: Objects of other business profiles (not this account's), skipped, by profile id.
    other_profiles: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "history": [self.history[0].isoformat(), self.history[1].isoformat()],
            "reached": self.reached.isoformat() if self.reached else None,
            "finished": self.finished,
            "listed": self.listed,
            "recorded": dict(sorted(self.recorded.items())),
            "recorded_total": sum(self.recorded.values()),
            "own_history": self.own_history,
            "dispatched": dict(sorted(self.dispatched.items())),
            "followed": self.followed,
            "unknown_status": self.unknown_status,
            "bad_rows": self.bad_rows,
            "incomplete": self.incomplete,
            "requests": self.requests,
            "other_profiles": dict(sorted(self.other_profiles.items())),
        }


@dataclass(kw_only=True, slots=True)
class AdoptionReport:
    mode: str
    dry_run: bool
    cutover_at: datetime | None
    #: Where the earlier system's history ends (the cut-over, the stated deploy, or just
    #: before the first delivery hookledger was sent, whichever is earliest): what changed
    #: since is dispatched.
    history_ends: datetime | None = None
    #: The deploy stated to the first run (``--deployed-at``), if any.
    deployed_at: datetime | None = None
    #: The first webhook delivery hookledger was sent, if any.
    first_delivery: datetime | None = None
    kinds: dict[str, KindAdoption] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return all(k.finished for k in self.kinds.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "dry_run": self.dry_run,
            "cutover_at": self.cutover_at.isoformat() if self.cutover_at else None,
            "history_ends": self.history_ends.isoformat() if self.history_ends else None,
            "deployed_at": self.deployed_at.isoformat() if self.deployed_at else None,
            "first_delivery": self.first_delivery.isoformat() if self.first_delivery else None,
            "finished": self.finished,
            "kinds": {name: k.as_dict() for name, k in self.kinds.items()},
        }


def render_adoption(report: dict[str, Any]) -> str:
    """An adoption report as a table for people."""
    head = (
        f"adoption ({report['mode']}{', dry run' if report['dry_run'] else ''}): "
        f"{'finished' if report['finished'] else 'not finished: run `reconcile adopt` again'}"
    )
    if report["cutover_at"]:
        head += f"; cut-over {report['cutover_at']}"
    ends = report.get("history_ends")
    if ends and ends != report["cutover_at"]:
        why = "the deploy" if ends == report.get("deployed_at") else "the first delivery"
        head += f"; history ends {ends} ({why})"
    lines = [head]
    for name, k in report["kinds"].items():
        line = (
            f"{name:<9} listed {k['listed']}, recorded {k['recorded_total']}, with history of "
            f"their own {k['own_history']}, followed {k['followed']}, requests {k['requests']}"
        )
        if not k["finished"]:
            line += f", read back to {k['reached'] or 'the cut-over'}"
        lines.append(line)
        for state, n in k["recorded"].items():
            lines.append(f"{'':<9} recorded {n} x {state}")
        for state, n in k.get("dispatched", {}).items():
            lines.append(f"{'':<9} changed since, dispatched {n} x {state}")
        others = k.get("other_profiles") or {}
        if others:
            shown = ", ".join(f"{profile} {n}" for profile, n in others.items())
            lines.append(
                f"{'':<9} skipped {sum(others.values())} of other profiles' (not this "
                f"account's): {shown}"
            )
        for label in ("incomplete", "bad_rows"):
            for item in k[label]:
                lines.append(f"{'':<9} {label}: {item}")
    return "\n".join(lines)


__all__ = ["AdoptionReport", "KindAdoption", "render_adoption"]
