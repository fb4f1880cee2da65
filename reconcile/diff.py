"""The reconciliation diff (pure, no I/O): remote object vs local projection -> what to do.

For each remote object the processor lists, compare its status with the latest status the
merchant's side has projected from events. A remote transition the projection has not seen
becomes a synthesised event with a deterministic id and the remote object as
``content.object``; it then goes through the receiver's inbox like any webhook, so dedupe,
the staleness guard, the handler ledger and the transition-once rule all apply.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Final, Literal

from receiver import status as statuses
from receiver.clock import as_utc
from receiver.events import parse_timestamp
from receiver.factories import encode, format_timestamp

Verdict = Literal["in_sync", "missed", "no_event", "local_ahead", "unknown_status"]


@dataclass(frozen=True, slots=True)
class KindSpec:
    """Where a kind's content type, id, status and change time live in its API object."""

    content_type: str
    id_field: str
    status_field: str
    time_fields: tuple[str, ...]  # newest first


KINDS: Final[Mapping[str, KindSpec]] = {
    "payment": KindSpec(
        "payment_details", "payment_id", "status", ("modified_at", "updated", "created")
    ),
    "refund": KindSpec(
        "refund_details",
        "refund_id",
        "status",
        ("updated_at", "modified_at", "created_at", "created"),
    ),
    "payout": KindSpec(
        "payout_details", "payout_id", "status", ("modified_at", "updated_at", "created")
    ),
    "dispute": KindSpec(
        "dispute_details",
        "dispute_id",
        "dispute_status",
        ("modified_at", "updated_at", "created_at", "created"),
    ),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """The verdict for one remote object."""

    kind: str
    object_id: str
    remote_status: str | None
    local_status: str | None
    verdict: Verdict
    event_type: str | None = None


def object_id_of(kind: str, remote: Mapping[str, Any]) -> str | None:
    value = remote.get(KINDS[kind].id_field)
    return value if isinstance(value, str) and value else None


def status_of(kind: str, remote: Mapping[str, Any]) -> Any:
    """The remote object's status (a dispute's is ``dispute_status``)."""
    spec = KINDS[kind]
    return remote.get(spec.status_field, remote.get("status"))


def compare(kind: str, object_id: str, remote_status: Any, local_status: str | None) -> Finding:
    """Decide what a remote object's status means against the local projection."""
    remote, verdict, event_type = _verdict(
        kind, remote_status if isinstance(remote_status, str) else None, local_status
    )
    return Finding(
        kind=kind,
        object_id=object_id,
        remote_status=remote,
        local_status=local_status,
        verdict=verdict,
        event_type=event_type,
    )


@lru_cache(maxsize=4096)
def _verdict(
    kind: str, remote_status: str | None, local_status: str | None
) -> tuple[str | None, Verdict, str | None]:
    """``compare`` for a pair of statuses (cached: a run meets a handful of pairs, many times
    each): the normalised remote status, the verdict and the event type of a missed one."""
    remote = statuses.normalize_status(kind, remote_status)
    remote_rank = statuses.rank(kind, remote)
    if remote is None or remote_rank is None:
        return remote, "unknown_status", None
    if local_status == remote:
        return remote, "in_sync", None
    local_rank = statuses.rank(kind, local_status)
    if local_rank is not None and local_rank > remote_rank:
        return remote, "local_ahead", None
    event_type = statuses.event_type_for_status(kind, remote)
    if event_type is None:
        # A status the processor emits no event for (requires_payment_method, pending...):
        # nothing to dispatch; the object simply has not reached an event-worthy state.
        return remote, "no_event", None
    return remote, "missed", event_type


def synthetic_event_id(kind: str, object_id: str, event_type: str) -> str:
    """Deterministic: the same missed transition always gets the same id (runs dedupe)."""
    digest = hashlib.sha256(f"{kind}\x1f{object_id}\x1f{event_type}".encode()).hexdigest()
    return f"rec_{digest[:32]}"


def event_time(kind: str, remote: Mapping[str, Any], fallback: datetime) -> datetime:
    """When the remote object last changed (its modified time), else ``fallback``."""
    for field in KINDS[kind].time_fields:
        parsed = parse_timestamp(remote.get(field))
        if parsed is not None:
            return parsed
    return as_utc(fallback)


def synthesise(
    finding: Finding, remote: Mapping[str, Any], *, merchant_id: str | None, now: datetime
) -> bytes:
    """The body of the event the processor would have sent for ``finding`` (compact JSON)."""
    if finding.verdict != "missed" or finding.event_type is None:
        raise ValueError("only a missed transition is synthesised")
    content_type = KINDS[finding.kind].content_type
    merchant = merchant_id or remote.get("merchant_id")
    body = {
        "merchant_id": merchant if isinstance(merchant, str) else None,
        "event_id": synthetic_event_id(finding.kind, finding.object_id, finding.event_type),
        "event_type": finding.event_type,
        "content": {"type": content_type, "object": dict(remote)},
        "timestamp": format_timestamp(event_time(finding.kind, remote, now)),
    }
    return encode(body)
