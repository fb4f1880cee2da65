"""The sweep's horizons read from ``HOOKLEDGER_SWEEP_HORIZON_DAYS`` (a kind's, or one
status's of a kind: issue 28, hole 8)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reconcile.cli.run_options import sweep_policy
from reconcile.recovery.sweep import CAPTURED_REACH

DAY = timedelta(days=1)


def test_a_captured_payment_is_followed_for_its_own_reach_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HOOKLEDGER_SWEEP_HORIZON_DAYS", raising=False)
    policy = sweep_policy()
    assert policy.horizon("payment") == 30 * DAY
    for status in ("succeeded", "partially_captured"):
        assert policy.horizon("payment", status) == CAPTURED_REACH == 14 * DAY
    assert policy.horizon("payment", "requires_payment_method") == 2 * DAY
    assert policy.horizon("refund", "succeeded") == 30 * DAY


def test_kind_and_status_horizons_are_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKLEDGER_SWEEP_HORIZON_DAYS", "payments=20, payment.succeeded=7")
    policy = sweep_policy()
    assert policy.horizon("payment") == 20 * DAY
    assert policy.horizon("payment", "succeeded") == 7 * DAY
    assert policy.horizon("payment", "partially_captured") == 14 * DAY
    # A status reach never outlives its kind's.
    monkeypatch.setenv("HOOKLEDGER_SWEEP_HORIZON_DAYS", "payment=10")
    assert sweep_policy().horizon("payment", "succeeded") == 10 * DAY


@pytest.mark.parametrize(
    "spec", ["payment.sucesful=7", "payment.=7", "invoice=3", "payment.succeeded=0", "payment"]
)
def test_a_bad_horizon_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], spec: str
) -> None:
    monkeypatch.setenv("HOOKLEDGER_SWEEP_HORIZON_DAYS", spec)
    with pytest.raises(SystemExit) as stopped:
        sweep_policy()
    assert stopped.value.code == 2
    assert "kind.status=days" in capsys.readouterr().err
