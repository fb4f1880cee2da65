"""The shipped alert rules (receiver/alerts/hookledger.rules.yml): promtool checks them and
runs their unit tests (hookledger.rules.test.yml: each alert firing on its incident and
quiet on a normal day); each alert says what to run and what to read; every metric they
read is one hookledger exports."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import click

from receiver.alerts import RULES_FILE
from receiver.cli.commands import make_program
from receiver.web.metrics import NAMES
from reconcile.cli.commands import cli as reconcile_program
from tests.receiver.alerts.rules_files import UNIT_TESTS, alerts, expressions, tool, with_for

ROOT = Path(__file__).resolve().parents[3]

#: One alert for each thing the README promises to alert on.
EXPECTED = {
    "HookledgerNoWorkerAlive",
    "HookledgerOldestOpenEventTooOld",
    "HookledgerDeadLetters",
    "HookledgerDeliveriesRefusedStorage",
    "HookledgerDeliveriesRefusedBusy",
    "HookledgerBadSignatures",
    "HookledgerReconcileNotSucceeding",
    "HookledgerReconcileDrift",
    "HookledgerMetricsDatabaseUnreadable",
    "HookledgerTargetDown",
}


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [tool("promtool"), "check", "rules", str(RULES_FILE)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(EXPECTED)} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    assert len(UNIT_TESTS) == 2
    done = subprocess.run(
        [tool("promtool"), "test", "rules", *(p.name for p in UNIT_TESTS)],
        capture_output=True,
        text=True,
        cwd=UNIT_TESTS[0].parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(UNIT_TESTS), done.stdout


def test_the_unit_tests_have_a_firing_and_a_quiet_case_for_every_alert() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    current = None
    lines = [line for path in UNIT_TESTS for line in path.read_text().splitlines()]
    for line in lines:
        name = re.match(r"\s+alertname: (\w+)", line)
        if name:
            current = name.group(1)
            continue
        expected = re.match(r"\s+exp_alerts:\s*(.*?)\s*(#.*)?$", line)
        if expected and current is not None:
            (quiet if expected.group(1) == "[]" else firing).add(current)
            current = None
    assert {a.name for a in alerts()} == EXPECTED
    assert firing == EXPECTED, EXPECTED - firing
    assert quiet == EXPECTED, EXPECTED - quiet
    # The unit tests read the shipped file, not a copy.
    shipped = "../../../receiver/alerts/hookledger.rules.yml"
    for path in UNIT_TESTS:
        assert f"rule_files:\n  - {shipped}\n" in path.read_text(), path
    assert (UNIT_TESTS[0].parent / shipped).resolve() == RULES_FILE.resolve()


def test_every_alert_says_how_bad_what_it_means_what_to_run_and_what_to_read() -> None:
    prose = re.sub(r"^```.*?^```", "", (ROOT / "README.md").read_text(), flags=re.M | re.S)
    headings = set(re.findall(r"^#+ (.+?)\s*$", prose, flags=re.MULTILINE))
    for alert in alerts():
        assert alert.field("severity") in {"critical", "warning"}, alert.name
        assert alert.field("summary"), alert.name
        assert alert.field("description"), alert.name
        runbook = alert.field("runbook") or ""
        assert re.search(r"`(hookledger|reconcile) [^`]+`", runbook), (alert.name, runbook)
        read = runbook.split("README: ", 1)[1].rstrip(".")
        for section in re.split(r"; ", read):
            for part in re.sub(r" \(.*\)$", "", section).split(" > "):
                assert part in headings, (alert.name, part)
        # Every threshold is explained: a comment above the expression.
        assert re.search(r"^\s+# ", alert.text, re.MULTILINE), alert.name


def test_the_rules_read_only_metrics_hookledger_exports() -> None:
    suffixes = ("", "_bucket", "_count", "_sum")
    exported = {name + s for name in NAMES for s in suffixes}
    for alert in alerts():
        used = set(re.findall(r"\bhookledger_\w+", expressions(alert)))
        assert used, alert.name
        assert used <= exported, (alert.name, used - exported)


def test_the_shortened_copy_changes_only_the_for_durations() -> None:
    text = RULES_FILE.read_text()
    short = with_for(text, "1s")
    assert short != text
    assert [expressions(a) for a in alerts(short)] == [expressions(a) for a in alerts(text)]
    assert "for: 1s" in short and "for: 2m" in text


def _parses(program: click.Group, argv: list[str]) -> None:
    """Parse ``argv`` as ``program`` would, down to the command it names, without running
    it: an unknown command or option, or a missing argument, raises click's usage error."""
    ctx = program.make_context(program.name, argv)
    command: click.Command = program
    while isinstance(command, click.Group):
        # (the subcommand's name and its arguments: click keeps the name apart)
        rest = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        if not rest:
            return
        name, found, args = command.resolve_command(ctx, rest)
        assert found is not None, argv
        ctx = found.make_context(name, args, parent=ctx)
        command = found


def test_every_command_a_runbook_names_runs_as_written() -> None:
    """What on-call copies from an alert at night must parse as written: each command of each
    runbook is parsed by the real program (the placeholders filled in), and a `hookledger`
    command names the app it needs (`--app`: without it the program cannot load the app)."""
    fill = {
        "<your app>": "examples.shop.app:create_app",
        "{{ $labels.account }}": "eu",
        "<event id>": "evt_1",
    }
    seen = 0
    for alert in alerts():
        runbook = alert.field("runbook") or ""
        for command in re.findall(r"`((?:hookledger|reconcile) [^`]+)`", runbook):
            for placeholder, value in fill.items():
                command = command.replace(placeholder, value)
            argv = shlex.split(command)
            if argv[0] == "hookledger":
                assert argv[1] == "--app", (alert.name, command)
                _parses(make_program(), argv[1:])
            else:
                _parses(reconcile_program, argv[1:])
            seen += 1
    assert seen >= 15, seen
