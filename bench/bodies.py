"""Signed webhook bodies for the load generators: realistic, unique, fast to make.

One realistic Hyperswitch body is built with the package's own test kit
(:func:`receiver.testing.factories.build_event` + :func:`~receiver.testing.factories.encode`) and
used as a template: each body gets a unique ``event_id`` and ``payment_id`` by byte substitution of
fixed-length placeholders, then its own HMAC-SHA512 signature.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from receiver.testing.factories import DEFAULT_MERCHANT_ID, build_event, encode

SECRET_ID = "primary"
SECRET = "whsec_bench_0123456789abcdef"
SECRETS_SPEC = f"{SECRET_ID}:{SECRET}"

_EVT = "evt_" + "E" * 32
_OBJ = "pay_" + "O" * 20


def sign(body: bytes, secret: str = SECRET) -> str:
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha512).hexdigest()


class Template:
    """A body with placeholders for its event id and object id (and optionally its time)."""

    def __init__(
        self,
        event_type: str = "payment_succeeded",
        at: datetime | None = None,
        merchant_id: str | None = None,
    ):
        self.event_type = event_type
        raw = encode(
            build_event(
                event_type,
                object_id=_OBJ,
                event_id=_EVT,
                timestamp=at or datetime(2026, 1, 1, tzinfo=UTC),
                merchant_id=merchant_id or DEFAULT_MERCHANT_ID,
            )
        )
        if raw.count(_EVT.encode()) != 1:
            raise RuntimeError("the event id placeholder must occur exactly once")
        self._head, _, rest = raw.partition(_EVT.encode())
        self._parts = rest.split(_OBJ.encode())

    def body(self, event_id: str, object_id: str) -> bytes:
        if len(event_id) != len(_EVT) or len(object_id) != len(_OBJ):
            raise ValueError("ids must keep the placeholder lengths")
        return self._head + event_id.encode() + object_id.encode().join(self._parts)


def new_event_id() -> str:
    return "evt_" + uuid.uuid4().hex


def new_object_id(prefix: str = "pay_") -> str:
    return prefix + uuid.uuid4().hex[:20]


def signed_bodies(n: int, template: Template | None = None) -> Iterator[tuple[str, bytes]]:
    """``n`` (signature, body) pairs, each with a fresh event id and payment id."""
    tpl = template or Template()
    for _ in range(n):
        body = tpl.body(new_event_id(), new_object_id())
        yield sign(body), body


def write_pool(path: Path, n: int, *, accounts: int = 0) -> Path:
    """Write ``n`` signed bodies as ``<signature> <body>`` lines (bodies are one-line JSON).
    ``accounts``: the bodies are the sellers' of :func:`seller_accounts` in turn (each its
    merchant id, signed with its secret); 0: the default account's."""
    with path.open("wb") as out:
        if not accounts:
            for signature, body in signed_bodies(n):
                out.write(signature.encode() + b" " + body + b"\n")
            return path
        sellers = [
            (Template(merchant_id=seller_merchant(i)), seller_secret(i)) for i in range(accounts)
        ]
        for k in range(n):
            template, secret = sellers[k % accounts]
            body = template.body(new_event_id(), new_object_id())
            out.write(sign(body, secret).encode() + b" " + body + b"\n")
    return path


def seller_merchant(i: int) -> str:
    return f"mer_seller{i:04d}"


def seller_secret(i: int) -> str:
    return f"whsec_seller{i:04d}_0123456789abcdef"


def seller_accounts(n: int) -> dict[str, dict[str, object]]:
    """``n`` sellers as ``HOOKLEDGER_ACCOUNTS`` would give them: ``seller0000``..., each its
    merchant id and its own webhook secret."""
    return {
        f"seller{i:04d}": {
            "merchant_id": seller_merchant(i),
            "secrets": f"primary:{seller_secret(i)}",
        }
        for i in range(n)
    }


@dataclass(frozen=True, slots=True)
class ChainEvent:
    event_id: str
    event_type: str
    object_id: str
    status: str
    event_time: datetime
    body: bytes


_CHAIN = (
    ("payment_processing", "processing"),
    ("payment_authorized", "requires_capture"),
    ("payment_captured", "partially_captured"),
    ("payment_succeeded", "succeeded"),
)


def chain_bodies(objects: int, per_object: int, start: datetime) -> Iterator[ChainEvent]:
    """Bodies for the dispatch benchmark: ``per_object`` events per payment, each moving the
    payment forward (processing -> authorized -> captured -> succeeded), one second apart, so
    every one of them is dispatched (none is stale)."""
    if not 1 <= per_object <= len(_CHAIN):
        raise ValueError(f"1 to {len(_CHAIN)} events per object")
    chain = _CHAIN[len(_CHAIN) - per_object :]
    steps = [
        (
            event_type,
            status,
            start + timedelta(seconds=i),
            Template(event_type, at=start + timedelta(seconds=i)),
        )
        for i, (event_type, status) in enumerate(chain)
    ]
    for _ in range(objects):
        object_id = new_object_id()
        for event_type, status, at, tpl in steps:
            event_id = new_event_id()
            yield ChainEvent(
                event_id, event_type, object_id, status, at, tpl.body(event_id, object_id)
            )
