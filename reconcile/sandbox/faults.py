"""Fault injection for the sandbox: webhook faults, API faults and the rate limit window.

Faults are chosen by probability with a seeded :class:`random.Random` (so a run with the same
seed and the same requests injects the same faults), or deterministically with "once" rules
that hit the next ``count`` matching events or requests. Both are set from Python
(:meth:`FaultController.configure`, :meth:`FaultController.once`) or over HTTP
(``POST /__sandbox/faults``, see :meth:`FaultController.configure_from_json`).

Webhook faults (decided once per event, when it is emitted):

- ``drop``: never delivered.
- ``duplicate``: delivered twice (two identical requests, each with its own retries).
- ``delay``: the first attempt waits ``delay_seconds``.
- ``reorder``: held back and delivered right after the next event.
- ``corrupt_signature``: ``X-Webhook-Signature-512`` does not match the body (on every retry too).

API faults (decided per request, on every route except ``/__sandbox/*``):

- ``error`` (probability ``error_rate``): 500/502/503 with a ``CE_01`` body, nothing done.
- ``rate_limit``: 429 ``RL_01`` with ``Retry-After`` and ``X-RateLimit-Reset`` = now + N s.
- ``timeout``: sleep ``timeout_seconds`` before handling (set it above the client's timeout).
- ``error_after_processing``: the request is handled, then answered with a 5xx (the caller
  cannot tell whether it worked; a retried create gets ``HE_01``).

List faults (not probabilities: the list endpoints they name misbehave on every request, or a
once-rule's next ``count`` list requests do). Endpoint names: ``payments`` (both
``/payments/list`` dialects), ``refunds``, ``payouts`` (both dialects), ``disputes``,
``events`` (``POST /events/{merchant_id}``), or ``all``:

- ``ignore_filters``: every filter, time bound, offset and cursor is ignored; the answer is
  the newest ``limit`` rows of everything (``total_count`` counts everything).
- ``repeat_pages``: paging is ignored, so the first page comes back whatever the offset or
  cursor: ``offset`` is 0, ``starting_after``/``ending_before`` are dropped and so is the
  *upper* time bound (``created.lte``/``.lt``/``created``, ``end_time``, ``created_lte``,
  ``created_before``), the one a newest-first paginator moves; the lower bound and the other
  filters still apply.

``ApiFaultConfig(ignore_filters=("payments",), repeat_pages=("all",))`` or
``{"api": {"ignore_filters": ["payments"]}}`` over HTTP; once-rules match the list route by
``path`` (``once("repeat_pages", path="/refunds/list")``).

Every applied fault is counted in :meth:`FaultController.stats` (event ids for webhook faults).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Final

from reconcile.sandbox.errors import invalid

WEBHOOK_FAULTS: Final = ("drop", "duplicate", "delay", "reorder", "corrupt_signature")
API_FAULTS: Final = ("error", "rate_limit", "timeout", "error_after_processing")
LIST_FAULTS: Final = ("ignore_filters", "repeat_pages")
LIST_ENDPOINTS: Final = ("payments", "refunds", "payouts", "disputes", "events")
ERROR_STATUSES: Final = (500, 502, 503)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookFaultConfig:
    """Probabilities (0..1) of each webhook fault; ``event_types`` limits them (empty: all)."""

    drop: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    delay_seconds: float = 1.0
    reorder: float = 0.0
    corrupt_signature: float = 0.0
    event_types: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiFaultConfig:
    """Probabilities (0..1) of each API fault; ``paths`` limits them to path prefixes."""

    error_rate: float = 0.0
    error_statuses: tuple[int, ...] = ERROR_STATUSES
    rate_limit: float = 0.0
    rate_limit_reset_seconds: int = 2
    timeout: float = 0.0
    timeout_seconds: float = 2.0
    error_after_processing: float = 0.0
    paths: tuple[str, ...] = ()
    #: List endpoints (``LIST_ENDPOINTS`` names or ``"all"``) that ignore their filters.
    ignore_filters: tuple[str, ...] = ()
    #: List endpoints that answer the first page whatever the offset or cursor.
    repeat_pages: tuple[str, ...] = ()


@dataclass(slots=True, kw_only=True)
class OnceRule:
    """A deterministic fault for the next ``count`` matching events or requests."""

    fault: str
    count: int = 1
    event_type: str | None = None
    path: str | None = None
    method: str | None = None
    status: int | None = None
    seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True, slots=True)
class WebhookFaultPlan:
    """The faults applied to one emitted event."""

    drop: bool = False
    duplicate: bool = False
    delay_seconds: float = 0.0
    reorder: bool = False
    corrupt_signature: bool = False


@dataclass(frozen=True, slots=True)
class ApiFaultPlan:
    """The faults applied to one API request."""

    sleep_seconds: float = 0.0
    error_status: int | None = None
    rate_limit_reset_seconds: int | None = None
    error_after_status: int | None = None
    #: ``"ignore_filters"`` or ``"repeat_pages"`` for a list request, else ``None``.
    list_fault: str | None = None


NO_API_FAULT: Final = ApiFaultPlan()


@dataclass(slots=True)
class _Applied:
    webhooks: dict[str, list[str]] = field(
        default_factory=lambda: {name: [] for name in WEBHOOK_FAULTS}
    )
    api: dict[str, int] = field(
        default_factory=lambda: {name: 0 for name in API_FAULTS + LIST_FAULTS}
    )


class FaultController:
    """Decides and records faults. Shares the sandbox's lock (one lock for all state)."""

    def __init__(self, lock: threading.RLock, seed: int = 0) -> None:
        self._lock = lock
        self._seed = seed
        self._random = random.Random(seed)
        self._webhooks = WebhookFaultConfig()
        self._api = ApiFaultConfig()
        self._once: list[OnceRule] = []
        self._applied = _Applied()

    # -- configuration -------------------------------------------------------------------

    def configure(
        self,
        *,
        webhooks: WebhookFaultConfig | None = None,
        api: ApiFaultConfig | None = None,
        seed: int | None = None,
    ) -> None:
        """Replace the webhook and/or API fault configuration; ``seed`` re-seeds the RNG."""
        for config in (webhooks, api):
            if config is not None:
                _check_probabilities(config)
        with self._lock:
            if webhooks is not None:
                self._webhooks = webhooks
            if api is not None:
                self._api = api
            if seed is not None:
                self._seed = seed
                self._random = random.Random(seed)

    def once(self, fault: str, count: int = 1, **match: Any) -> None:
        """Apply ``fault`` to the next ``count`` matching events (webhook faults) or requests.

        Webhook faults match on ``event_type``; ``delay`` takes ``seconds``. API faults
        (``error``, ``rate_limit``, ``timeout``, ``error_after_processing``) match on ``path``
        (a prefix) and ``method``; ``error`` takes ``status``, the others ``seconds``. List
        faults (``ignore_filters``, ``repeat_pages``) match list requests by ``path``/``method``.
        """
        rule = _once_rule({"fault": fault, "count": count, **match})
        with self._lock:
            self._once.append(rule)

    def reset(self) -> None:
        """No faults at all (the counters are kept; the RNG restarts from the seed)."""
        with self._lock:
            self._webhooks = WebhookFaultConfig()
            self._api = ApiFaultConfig()
            self._once.clear()
            self._random = random.Random(self._seed)

    def configure_from_json(self, body: Mapping[str, Any]) -> None:
        """Apply an HTTP configuration body.

        ``{"seed": 1, "reset": true, "webhooks": {...WebhookFaultConfig fields},
        "api": {...ApiFaultConfig fields}, "once": [{"fault": "drop", "count": 1, ...}]}``.
        A section that is given replaces that section wholesale; ``reset`` clears everything
        first. Raises :class:`~reconcile.sandbox.errors.SandboxError` (IR_04) on a bad body.
        """
        unknown = set(body) - {"seed", "reset", "webhooks", "api", "once"}
        if unknown:
            raise invalid(f"unknown fault settings: {', '.join(sorted(unknown))}")
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise invalid("seed must be an integer")
        webhooks = _config_from_json(WebhookFaultConfig, body.get("webhooks"), "webhooks")
        api = _config_from_json(ApiFaultConfig, body.get("api"), "api")
        once_raw = body.get("once", [])
        if not isinstance(once_raw, list):
            raise invalid("once must be a list of rules")
        rules = [_once_rule(item) for item in once_raw]
        with self._lock:
            if body.get("reset"):
                self.reset()
            self.configure(webhooks=webhooks, api=api, seed=seed)
            self._once.extend(rules)

    def to_json(self) -> dict[str, Any]:
        """The current configuration, in the shape :meth:`configure_from_json` accepts."""
        with self._lock:
            return {
                "seed": self._seed,
                "webhooks": _config_to_json(self._webhooks),
                "api": _config_to_json(self._api),
                "once": [rule.to_json() for rule in self._once],
            }

    # -- decisions -------------------------------------------------------------------------

    def plan_webhook(self, event_id: str, event_type: str) -> WebhookFaultPlan:
        """Decide (and record) the faults for one newly emitted event."""
        with self._lock:
            chosen: dict[str, float] = {}
            for rule in self._take_once(WEBHOOK_FAULTS, event_type=event_type):
                chosen[rule.fault] = (
                    rule.seconds if rule.seconds is not None else self._webhooks.delay_seconds
                )
            config = self._webhooks
            if not config.event_types or event_type in config.event_types:
                for name in WEBHOOK_FAULTS:
                    probability = float(getattr(config, name))
                    if probability > 0 and self._random.random() < probability:
                        chosen.setdefault(name, config.delay_seconds)
            for name in chosen:
                self._applied.webhooks[name].append(event_id)
            if "drop" in chosen:
                return WebhookFaultPlan(drop=True)
            return WebhookFaultPlan(
                duplicate="duplicate" in chosen,
                delay_seconds=chosen.get("delay", 0.0),
                reorder="reorder" in chosen,
                corrupt_signature="corrupt_signature" in chosen,
            )

    def plan_api(self, method: str, path: str) -> ApiFaultPlan:
        """Decide (and record) the faults for one API request."""
        with self._lock:
            if not self._once and not _any_api_fault(self._api):
                return NO_API_FAULT
            plan = ApiFaultPlan()
            endpoint = list_endpoint(method, path)
            kinds = API_FAULTS + LIST_FAULTS if endpoint is not None else API_FAULTS
            for rule in self._take_once(kinds, path=path, method=method):
                plan = _apply_rule(plan, rule, self._api)
            config = self._api
            if endpoint is not None and plan.list_fault is None:
                for name in LIST_FAULTS:
                    names = getattr(config, name)
                    if endpoint in names or "all" in names:
                        plan = replace(plan, list_fault=name)
                        break
            if not config.paths or path.startswith(config.paths):
                if self._hit(config.timeout) and not plan.sleep_seconds:
                    plan = replace(plan, sleep_seconds=config.timeout_seconds)
                if self._hit(config.rate_limit) and plan.rate_limit_reset_seconds is None:
                    plan = replace(plan, rate_limit_reset_seconds=config.rate_limit_reset_seconds)
                if self._hit(config.error_rate) and plan.error_status is None:
                    plan = replace(plan, error_status=self._random.choice(config.error_statuses))
                if self._hit(config.error_after_processing) and plan.error_after_status is None:
                    plan = replace(
                        plan, error_after_status=self._random.choice(config.error_statuses)
                    )
            # What is answered first wins; only faults that really shape the answer count.
            if plan.rate_limit_reset_seconds is not None:
                plan = replace(plan, error_status=None, error_after_status=None)
            elif plan.error_status is not None:
                plan = replace(plan, error_after_status=None)
            self._count(plan)
            return plan

    def stats(self) -> dict[str, Any]:
        """What was applied: event ids per webhook fault and counts per API fault."""
        with self._lock:
            return {
                "webhooks": {name: list(ids) for name, ids in self._applied.webhooks.items()},
                "api": dict(self._applied.api),
            }

    # -- helpers ---------------------------------------------------------------------------

    def _hit(self, probability: float) -> bool:
        return probability > 0 and self._random.random() < probability

    def _take_once(self, kinds: Iterable[str], **subject: str) -> list[OnceRule]:
        taken: list[OnceRule] = []
        for rule in list(self._once):
            if rule.fault not in kinds or not _matches(rule, **subject):
                continue
            if any(t.fault == rule.fault for t in taken):
                continue
            taken.append(rule)
            rule.count -= 1
            if rule.count <= 0:
                self._once.remove(rule)
        return taken

    def _count(self, plan: ApiFaultPlan) -> None:
        applied = self._applied.api
        applied["timeout"] += plan.sleep_seconds > 0
        applied["rate_limit"] += plan.rate_limit_reset_seconds is not None
        applied["error"] += plan.error_status is not None
        applied["error_after_processing"] += plan.error_after_status is not None
        if plan.list_fault is not None:
            applied[plan.list_fault] += 1


class RateLimiter:
    """A fixed one-minute window on wall time, as ``X-RateLimit-*`` headers describe it."""

    def __init__(self, limit_per_minute: int) -> None:
        if limit_per_minute < 1:
            raise ValueError("the rate limit must be at least 1 request per minute")
        self.limit = limit_per_minute
        self._lock = threading.Lock()
        self._window = 0
        self._used = 0

    def hit(self) -> tuple[bool, int, int]:
        """Count one request: ``(allowed, remaining, reset_unix_time)``."""
        with self._lock:
            reset = self._roll()
            allowed = self._used < self.limit
            if allowed:
                self._used += 1
            return allowed, self.limit - self._used, reset

    def peek(self) -> tuple[int, int]:
        """``(remaining, reset_unix_time)`` without counting a request."""
        with self._lock:
            reset = self._roll()
            return self.limit - self._used, reset

    def _roll(self) -> int:
        window = int(time.time()) // 60
        if window != self._window:
            self._window = window
            self._used = 0
        return (window + 1) * 60


# -- validation helpers ---------------------------------------------------------------------


def list_endpoint(method: str, path: str) -> str | None:
    """The ``LIST_ENDPOINTS`` name of a list request, or ``None`` for any other request."""
    method = method.upper()
    path = path.rstrip("/")
    if path in ("/payments/list", "/payouts/list") and method in ("GET", "POST"):
        return path.split("/")[1]
    if path == "/refunds/list" and method == "POST":
        return "refunds"
    if path == "/disputes/list" and method == "GET":
        return "disputes"
    parts = path.split("/")
    if method == "POST" and len(parts) == 3 and parts[1] == "events" and parts[2]:
        return "events"
    return None


def _any_api_fault(config: ApiFaultConfig) -> bool:
    return any(
        (
            config.error_rate,
            config.rate_limit,
            config.timeout,
            config.error_after_processing,
            config.ignore_filters,
            config.repeat_pages,
        )
    )


def _matches(rule: OnceRule, **subject: str) -> bool:
    if rule.event_type is not None and subject.get("event_type") != rule.event_type:
        return False
    if rule.path is not None and not subject.get("path", "").startswith(rule.path):
        return False
    return rule.method is None or subject.get("method", "").upper() == rule.method.upper()


def _apply_rule(plan: ApiFaultPlan, rule: OnceRule, config: ApiFaultConfig) -> ApiFaultPlan:
    if rule.fault in LIST_FAULTS:
        return plan if plan.list_fault is not None else replace(plan, list_fault=rule.fault)
    if rule.fault == "timeout":
        seconds = rule.seconds if rule.seconds is not None else config.timeout_seconds
        return replace(plan, sleep_seconds=seconds)
    if rule.fault == "rate_limit":
        reset = int(rule.seconds) if rule.seconds is not None else config.rate_limit_reset_seconds
        return replace(plan, rate_limit_reset_seconds=reset)
    status = rule.status or config.error_statuses[0]
    if rule.fault == "error":
        return replace(plan, error_status=status)
    return replace(plan, error_after_status=status)


def _check_probabilities(config: WebhookFaultConfig | ApiFaultConfig) -> None:
    names = WEBHOOK_FAULTS if isinstance(config, WebhookFaultConfig) else API_FAULTS
    for name in names:
        attr = "error_rate" if name == "error" else name
        value = getattr(config, attr)
        if not 0.0 <= value <= 1.0:
            raise invalid(f"{attr} must be a probability between 0 and 1")
    if isinstance(config, ApiFaultConfig):
        for name in LIST_FAULTS:
            unknown = set(getattr(config, name)) - {*LIST_ENDPOINTS, "all"}
            if unknown:
                raise invalid(
                    f"{name} takes list endpoints among {', '.join(LIST_ENDPOINTS)} or all; "
                    f"unknown: {', '.join(sorted(unknown))}"
                )
        if not config.error_statuses or any(s not in ERROR_STATUSES for s in config.error_statuses):
            raise invalid("error_statuses must be a non-empty list of 500, 502, 503")
        if config.timeout_seconds < 0 or config.rate_limit_reset_seconds < 0:
            raise invalid("timeout_seconds and rate_limit_reset_seconds must not be negative")
    elif config.delay_seconds < 0:
        raise invalid("delay_seconds must not be negative")


def _config_from_json(
    cls: type[WebhookFaultConfig] | type[ApiFaultConfig], raw: object, section: str
) -> Any:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise invalid(f"{section} must be an object")
    known = {f.name: f for f in fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise invalid(f"unknown {section} fault settings: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if name in {"event_types", "paths", "error_statuses", *LIST_FAULTS}:
            if not isinstance(value, list) or not all(
                isinstance(v, int if name == "error_statuses" else str) for v in value
            ):
                raise invalid(f"{section}.{name} must be a list")
            values[name] = tuple(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            values[name] = int(value) if name == "rate_limit_reset_seconds" else float(value)
        else:
            raise invalid(f"{section}.{name} must be a number")
    config = cls(**values)
    _check_probabilities(config)
    return config


def _config_to_json(config: WebhookFaultConfig | ApiFaultConfig) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}


def _once_rule(raw: object) -> OnceRule:
    if not isinstance(raw, dict):
        raise invalid("a once rule must be an object")
    known = {f.name for f in fields(OnceRule)}
    unknown = set(raw) - known
    if unknown:
        raise invalid(f"unknown once-rule fields: {', '.join(sorted(unknown))}")
    fault = raw.get("fault")
    faults = WEBHOOK_FAULTS + API_FAULTS + LIST_FAULTS
    if fault not in faults:
        raise invalid(f"fault must be one of {', '.join(faults)}")
    count = raw.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise invalid("count must be a positive integer")
    status = raw.get("status")
    if status is not None and status not in ERROR_STATUSES:
        raise invalid("status must be 500, 502 or 503")
    seconds = raw.get("seconds")
    if seconds is not None and (
        not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0
    ):
        raise invalid("seconds must be a non-negative number")
    strings = {}
    for name in ("event_type", "path", "method"):
        value = raw.get(name)
        if value is not None and not isinstance(value, str):
            raise invalid(f"{name} must be a string")
        strings[name] = value
    return OnceRule(
        fault=str(fault),
        count=count,
        status=status,
        seconds=None if seconds is None else float(seconds),
        **strings,
    )
