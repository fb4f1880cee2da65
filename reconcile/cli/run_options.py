"""A reconcile run's tuning read from the environment: the overlap and lookback of the lists,
their request budgets and dialects, the sweep's budget, horizons and least interval
(``HOOKLEDGER_RECONCILE_*``, ``HOOKLEDGER_SWEEP_*``, ``HOOKLEDGER_PAYMENTS_LIST``,
``HOOKLEDGER_PAYOUTS_LIST``); a bad value is one line and exit 2.

The same options serve every account of ``--all-accounts``: nothing of one account is read
here. ``HOOKLEDGER_MERCHANT_ID`` is the default account's merchant id, which a run takes
from the installation's accounts (:meth:`reconcile.cli.context.Context.accounts`), each
account its own, as the merchant its recovered events name when their object names none.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from reconcile.cli.context import fail
from reconcile.recovery.sweep import DEFAULT_HORIZONS, SweepPolicy
from reconcile.runtime.runner import ReconcileOptions


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        fail(f"{name} must be a number, not {raw!r}")
    if value < 0:
        fail(f"{name} must not be negative")
    return value


def _horizons() -> dict[str, timedelta]:
    horizons = dict(DEFAULT_HORIZONS)
    raw = os.environ.get("HOOKLEDGER_SWEEP_HORIZON_DAYS", "")
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        kind, sep, days = part.partition("=")
        kind = kind.strip().rstrip("s")
        try:
            value = float(days)
        except ValueError:
            value = -1.0
        if not sep or kind not in horizons or value <= 0:
            fail(
                "HOOKLEDGER_SWEEP_HORIZON_DAYS takes kind=days pairs, e.g. "
                f"'payment=30,dispute=180' (kinds: {', '.join(horizons)})"
            )
        horizons[kind] = timedelta(days=value)
    return horizons


def sweep_policy() -> SweepPolicy:
    minimum = _env_float("HOOKLEDGER_SWEEP_MIN_INTERVAL_SECONDS", 600.0)
    if minimum <= 0:
        fail("HOOKLEDGER_SWEEP_MIN_INTERVAL_SECONDS must be positive")
    return SweepPolicy(horizons=_horizons(), min_interval=timedelta(seconds=minimum))


def options_from_env(**kwargs: Any) -> ReconcileOptions:
    env = os.environ
    try:
        return ReconcileOptions(
            overlap=timedelta(minutes=_env_float("HOOKLEDGER_RECONCILE_OVERLAP_MINUTES", 60)),
            lookback=timedelta(hours=_env_float("HOOKLEDGER_RECONCILE_LOOKBACK_HOURS", 48)),
            payments_dialect=env.get("HOOKLEDGER_PAYMENTS_LIST", "hyperswitch"),  # type: ignore[arg-type]
            payouts_dialect=env.get("HOOKLEDGER_PAYOUTS_LIST", "get"),  # type: ignore[arg-type]
            max_requests=int(_env_float("HOOKLEDGER_RECONCILE_MAX_REQUESTS", 2000)) or 1,
            sweep_budget=int(_env_float("HOOKLEDGER_SWEEP_BUDGET", 500)),
            sweep_policy=sweep_policy(),
            **kwargs,
        )
    except ValueError as exc:
        fail(str(exc))
