"""The data-at-rest settings: data keys, retention, the rejected-deliveries log, the maximum
event age on receipt (pure: parsed from values handed in, never read at import time).

==================================  =========================================================
``HOOKLEDGER_DATA_KEYS``            ``id:base64key,...``; the first is the primary
``HOOKLEDGER_RETENTION_DAYS``       ``redact=30,done=90,dead=180,conflicts=90,rejected=14``
``HOOKLEDGER_REJECTIONS``           record rejected deliveries (default on)
``HOOKLEDGER_REJECTIONS_PER_MINUTE``  rows a web process writes a minute (default 60)
``HOOKLEDGER_REJECTIONS_MAX_ROWS``  rows the table keeps (default 10000)
``HOOKLEDGER_REJECTIONS_BODY_BYTES``  keep the first N bytes of a rejected body, sealed
                                    (default 0: never; needs a data key)
``HOOKLEDGER_MAX_EVENT_AGE``        refuse events older than this many seconds on receipt
                                    (default off)
``HOOKLEDGER_ORDER_FIELDS``         the shop's order reference fields indexed for search
                                    (default ``metadata.order_id,merchant_order_reference_id``)
==================================  =========================================================
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from receiver.core.clock import as_utc
from receiver.core.errors import ConfigurationError, EventTooOld
from receiver.core.events import Event
from receiver.core.keyring import Keyring, parse_data_keys
from receiver.core.order_refs import OrderFields

log = logging.getLogger("receiver.atrest")

#: Setting name (after ``HOOKLEDGER_``) -> help, for ``--help`` and the README.
DOCUMENTED: Mapping[str, str] = {
    "DATA_KEYS": "data keys sealing stored bodies, headers and error texts, "
    "'id:base64key,id2:base64key' (the first is the primary; `hookledger keys new` prints a "
    "key). Without one, payloads are stored in the clear",
    "RETENTION_DAYS": "ages in days, 'redact=30,done=90,dead=180,conflicts=90,rejected=14' "
    "('never' keeps): bodies redacted, then finished events, dead letters, conflicts and "
    "rejected deliveries deleted",
    "REJECTIONS": "record rejected deliveries in hookledger_rejection (default on)",
    "REJECTIONS_PER_MINUTE": "rejected deliveries a web process records a minute; the rest "
    "are counted (default 60)",
    "REJECTIONS_MAX_ROWS": "rows hookledger_rejection keeps, oldest dropped (default 10000)",
    "REJECTIONS_BODY_BYTES": "keep the first N bytes of a rejected body, sealed with the data "
    "key (default 0: never)",
    "MAX_EVENT_AGE": "refuse (400) an event whose timestamp is older than this many seconds "
    "(default off; keep it above the processor's ~24 h of retries)",
    "ORDER_FIELDS": "the shop's order reference fields, dotted paths into the event's object "
    "(default 'metadata.order_id,merchant_order_reference_id'; 'none': no order index): "
    "indexed as keyed digests for `hookledger events --order` and the console's search",
}

#: The processor retries a delivery with the same bytes for about a day.
PROCESSOR_RETRY_WINDOW = timedelta(hours=25)
#: The least HOOKLEDGER_MAX_EVENT_AGE accepted.
MIN_EVENT_AGE = timedelta(hours=1)


@dataclass(frozen=True, kw_only=True, slots=True)
class RetentionPolicy:
    """How long stored data is kept, in days (``None``: kept).

    - ``redact``: the body, headers and error texts of finished events (done, stale,
      duplicate) and of conflict records are dropped; rows, ledger, transitions and
      projections stay, so dedupe and the guard hold for redacted history;
    - ``done``: finished events are deleted, with their ledger rows;
    - ``dead``: dead letters are deleted (until then they keep their bodies, so an operator
      can requeue them);
    - ``conflicts``: conflict records are deleted;
    - ``rejected``: rejected-delivery records are deleted.
    """

    redact: float | None = 30.0
    done: float | None = 90.0
    dead: float | None = 180.0
    conflicts: float | None = 90.0
    rejected: float | None = 14.0

    def __post_init__(self) -> None:
        for item in fields(self):
            days = getattr(self, item.name)
            if days is not None and (not math.isfinite(days) or days < 1):
                raise ConfigurationError(
                    f"retention {item.name}={days:g}: ages are at least 1 day (the processor "
                    "retries a delivery for about 24 h), or 'never'"
                )

    @classmethod
    def parse(cls, spec: str | Mapping[str, Any] | RetentionPolicy | None) -> RetentionPolicy:
        """``"redact=30,done=90,dead=never"`` (the kinds left out keep their defaults)."""
        if spec is None or isinstance(spec, RetentionPolicy):
            return spec or cls()
        if isinstance(spec, str):
            pairs: dict[str, Any] = {}
            for part in (p.strip() for p in spec.split(",")):
                if not part:
                    continue
                name, sep, value = part.partition("=")
                if not sep:
                    raise ConfigurationError(
                        "HOOKLEDGER_RETENTION_DAYS takes kind=days pairs, e.g. "
                        "'redact=30,done=90,dead=180,conflicts=90,rejected=14'"
                    )
                pairs[name.strip()] = value.strip()
        else:
            pairs = dict(spec)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(pairs) - known)
        if unknown:
            raise ConfigurationError(
                f"HOOKLEDGER_RETENTION_DAYS: unknown kind {unknown[0]!r} "
                f"(kinds: {', '.join(sorted(known))})"
            )
        return cls(**{name: _days(name, value) for name, value in pairs.items()})

    def describe(self) -> str:
        """``redact=30,done=90,...`` as :meth:`parse` takes it."""
        return ",".join(
            f"{f.name}={'never' if getattr(self, f.name) is None else f'{getattr(self, f.name):g}'}"
            for f in fields(self)
        )

    def age(self, kind: str) -> timedelta | None:
        days = getattr(self, kind)
        return None if days is None else timedelta(days=days)


def _days(name: str, value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.lower() in ("never", "off", "")):
        return None
    try:
        days = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"HOOKLEDGER_RETENTION_DAYS: {name}={value!r} is not a number of days or 'never'"
        ) from None
    return None if days == 0 else days


@dataclass(frozen=True, kw_only=True, slots=True)
class RejectionPolicy:
    """How rejected deliveries are recorded (:mod:`receiver.atrest.rejected_deliveries`)."""

    enabled: bool = True
    #: Rows one process writes a minute (a token bucket holding a minute's worth); the
    #: rejections over it are counted in the next row's ``suppressed``.
    per_minute: int = 60
    #: Rows the table keeps; the oldest are deleted as new ones come.
    max_rows: int = 10_000
    #: 0: no body. N: the first N bytes of a rejected body, sealed (needs a data key).
    body_bytes: int = 0

    def __post_init__(self) -> None:
        if self.per_minute < 1 or self.max_rows < 1:
            raise ConfigurationError("REJECTIONS_PER_MINUTE and REJECTIONS_MAX_ROWS must be >= 1")
        if not 0 <= self.body_bytes <= 65_536:
            raise ConfigurationError("REJECTIONS_BODY_BYTES must be between 0 and 65536")


@dataclass(frozen=True, kw_only=True, slots=True)
class DataAtRest:
    """The data-at-rest part of :class:`receiver.config.settings.Settings`."""

    keyring: Keyring = field(default_factory=Keyring)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    rejections: RejectionPolicy = field(default_factory=RejectionPolicy)
    #: Refuse events whose timestamp is older than this on receipt (``None``: off).
    max_event_age: timedelta | None = None
    #: The shop's order reference fields the order index holds (:mod:`receiver.core.order_refs`).
    order_fields: OrderFields = field(default_factory=OrderFields)

    @classmethod
    def resolve(cls, get: Callable[..., Any]) -> DataAtRest:
        """From ``get(name, default)`` (``name`` without the ``HOOKLEDGER_`` prefix)."""
        keyring = _keyring(get("DATA_KEYS"))
        try:
            rejections = RejectionPolicy(
                enabled=_bool(get("REJECTIONS", True)),
                per_minute=int(get("REJECTIONS_PER_MINUTE", 60)),
                max_rows=int(get("REJECTIONS_MAX_ROWS", 10_000)),
                body_bytes=int(get("REJECTIONS_BODY_BYTES", 0)),
            )
            raw_age = get("MAX_EVENT_AGE")
            age = float(raw_age) if raw_age not in (None, "") else 0.0
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"invalid hookledger setting: {exc}") from exc
        if rejections.body_bytes and not keyring.enabled:
            raise ConfigurationError(
                "HOOKLEDGER_REJECTIONS_BODY_BYTES keeps rejected bodies sealed: it needs a data "
                "key (HOOKLEDGER_DATA_KEYS)"
            )
        max_age = timedelta(seconds=age) if age else None
        if max_age is not None and max_age < MIN_EVENT_AGE:
            raise ConfigurationError(
                "HOOKLEDGER_MAX_EVENT_AGE is at least 3600 seconds (the processor retries a "
                "delivery for about 24 h; set it above that)"
            )
        return cls(
            keyring=keyring,
            retention=RetentionPolicy.parse(get("RETENTION_DAYS")),
            rejections=rejections,
            max_event_age=max_age,
            order_fields=OrderFields.parse(get("ORDER_FIELDS")),
        )

    def warn(self, where: str) -> None:
        """Start-up warnings (logged once by ``init_app`` or a command)."""
        if not self.keyring.enabled:
            log.warning(
                "%s: no data key (HOOKLEDGER_DATA_KEYS): webhook bodies, headers and error "
                "texts are stored in the clear",
                where,
                extra={"action": "no_data_key"},
            )
        if self.max_event_age is not None and self.max_event_age < PROCESSOR_RETRY_WINDOW:
            log.warning(
                "%s: HOOKLEDGER_MAX_EVENT_AGE (%g s) is shorter than the processor's retries "
                "(about 24 h): a delivery it retries late is refused, and only the reconciler "
                "recovers it",
                where,
                self.max_event_age.total_seconds(),
                extra={"action": "max_event_age"},
            )


def _keyring(spec: Any) -> Keyring:
    if isinstance(spec, Keyring):
        return spec
    return parse_data_keys(spec)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in {"1", "true", "yes", "on"}


def from_environment(environ: Mapping[str, str] | None = None) -> DataAtRest:
    """The settings from ``HOOKLEDGER_*`` environment variables (the reconciler's commands
    and the scheduler, which have no Flask app)."""
    env = os.environ if environ is None else environ
    return DataAtRest.resolve(lambda name, default=None: env.get("HOOKLEDGER_" + name, default))


def check_event_age(event: Event, max_age: timedelta | None, now: Callable[[], datetime]) -> None:
    """Raise :class:`EventTooOld` when ``event``'s own timestamp is older than ``max_age``
    at ``now()``.

    An event without a timestamp is not judged. Off by default: the processor retries a
    delivery with the same bytes (and the same timestamp) for about a day, so a limit below
    that refuses its late retries (the reconciler then recovers them)."""
    if max_age is None or event.timestamp is None:
        return
    if as_utc(now()) - as_utc(event.timestamp) > max_age:
        raise EventTooOld(
            f"the event is older than HOOKLEDGER_MAX_EVENT_AGE ({max_age.total_seconds():g} s)"
        )
