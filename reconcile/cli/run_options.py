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

import receiver.core.transitions as transitions
from reconcile.cli.context import fail
from reconcile.recovery.sweep import DEFAULT_HORIZONS, DEFAULT_STATUS_HORIZONS, SweepPolicy
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


def _horizons() -> tuple[dict[str, timedelta], dict[tuple[str, str], timedelta]]:
    """The sweep's horizons per kind (``payment=30``) and per status of a kind
    (``payment.succeeded=7``: how long a captured payment is followed for a void after
    capture), from ``HOOKLEDGER_SWEEP_HORIZON_DAYS``."""
    horizons = dict(DEFAULT_HORIZONS)
    status_horizons = dict(DEFAULT_STATUS_HORIZONS)
    raw = os.environ.get("HOOKLEDGER_SWEEP_HORIZON_DAYS", "")
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        name, sep, days = part.partition("=")
        kind, dot, status = name.strip().partition(".")
        kind = kind.strip().rstrip("s")
        status = status.strip()
        try:
            value = float(days)
        except ValueError:
            value = -1.0
        model = transitions.lifecycle(kind)
        known = not dot or (model is not None and model.knows(status))
        if not sep or kind not in horizons or value <= 0 or not known:
            fail(
                "HOOKLEDGER_SWEEP_HORIZON_DAYS takes kind=days and kind.status=days pairs, "
                "e.g. 'payment=30,dispute=180,payment.succeeded=7' (kinds: "
                f"{', '.join(horizons)})"
            )
        if dot:
            status_horizons[(kind, status)] = timedelta(days=value)
        else:
            horizons[kind] = timedelta(days=value)
    return horizons, status_horizons


def sweep_policy() -> SweepPolicy:
    minimum = _env_float("HOOKLEDGER_SWEEP_MIN_INTERVAL_SECONDS", 600.0)
    if minimum <= 0:
        fail("HOOKLEDGER_SWEEP_MIN_INTERVAL_SECONDS must be positive")
    horizons, status_horizons = _horizons()
    return SweepPolicy(
        horizons=horizons,
        status_horizons=status_horizons,
        min_interval=timedelta(seconds=minimum),
    )


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
