"""``python -m bench [--quick] [--only receive|dispatch|reconcile] [--rounds N] ...``"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
import traceback
from pathlib import Path

from bench import report
from bench.accounts import FairnessConfig
from bench.common import GunicornConfig, Section, environment_facts, log, temp_dir
from bench.dispatch import DispatchConfig
from bench.drain import DrainConfig
from bench.endtoend import EndToEndConfig
from bench.growing import GrowingConfig
from bench.receive import ReceiveConfig
from bench.reconcile import ReconcileConfig
from bench.reconcile_accounts import AccountsConfig
from bench.slow_handler import SlowHandlerConfig

BENCHES = ("receive", "dispatch", "reconcile", "endtoend", "slowhandler")
RESULTS = Path(__file__).with_name("RESULTS.md")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark hookledger's receive, dispatch and reconcile paths side by side "
        "with yardsticks; print medians and ratios; regenerate bench/RESULTS.md.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run (< 3 min)")
    parser.add_argument(
        "--only",
        action="append",
        choices=BENCHES,
        help="run only this bench (repeatable)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds per comparison")
    profile = parser.add_mutually_exclusive_group()
    profile.add_argument(
        "--profile", action="store_true", default=None, help="always profile (py-spy)"
    )
    profile.add_argument(
        "--no-profile",
        dest="profile",
        action="store_false",
        help="never profile (default: profile where a target is missed; never with --quick)",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="Markdown report path; default bench/RESULTS.md for a full run of every bench, "
        "none with --quick/--only; '-' for none",
    )
    parser.add_argument(
        "--backend",
        action="append",
        choices=("sqlite", "postgresql"),
        help="receive: only this database (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def configs(
    args: argparse.Namespace,
) -> tuple[ReceiveConfig, DispatchConfig, ReconcileConfig]:
    quick = args.quick
    profile = False if (quick and args.profile is None) else args.profile
    rounds = args.rounds or (2 if quick else 3)
    backends = tuple(args.backend or ("sqlite", "postgresql"))
    receive = ReceiveConfig(
        accounts=100 if quick else 1000,
        backends=backends,
        # Issue 9: at least 5 alternating rounds of at least 8 s (full mode).
        rounds=args.rounds or (2 if quick else 5),
        duration=2.0 if quick else 8.0,
        warmup=1.0 if quick else 2.0,
        rate_rounds=1 if quick else 5,
        rate_duration=2.0 if quick else 8.0,
        ping_seconds=1.0 if quick else 3.0,
        gunicorn=GunicornConfig(workers=2, worker_class="gthread", threads=4),
        profile=profile,
        duplicate_pool=1000 if quick else 3000,
    )
    dispatch = DispatchConfig(
        run_seconds=1.5 if quick else 4.0,
        min_events=200 if quick else 500,
        rounds=rounds if args.rounds else (1 if quick else 3),
        profile=profile,
        drain=DrainConfig(
            events=10_000 if quick else 100_000,
            slice_events=1_000 if quick else 10_000,
            steady_seconds=5.0 if quick else 20.0,
        ),
        growing=GrowingConfig(batches=4 if quick else 10, events=2_000 if quick else 10_000),
        accounts=100 if quick else 1000,
        fairness=FairnessConfig(
            flood=10_000 if quick else 100_000, quiet_seconds=5.0 if quick else 20.0
        ),
    )
    reconcile = ReconcileConfig(
        sizes=(1_000, 3_000) if quick else (10_000, 100_000),
        rounds=rounds,
        tracemalloc=not quick,
        profile=profile,
        accounts=AccountsConfig(sizes=(10, 100) if quick else (10, 100, 1000)),
    )
    return receive, dispatch, reconcile


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    needs_wrk = not args.only or {"receive", "endtoend", "dispatch"} & set(args.only)
    if shutil.which("wrk") is None and needs_wrk:
        print(
            "bench: wrk is required for the receive, dispatch and endtoend benches"
            " (apt-get install wrk)",
            file=sys.stderr,
        )
        return 2
    receive_cfg, dispatch_cfg, reconcile_cfg = configs(args)
    chosen = [b for b in BENCHES if not args.only or b in args.only]
    command = "python -m bench" + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")
    facts = environment_facts()
    facts["mode"] = "quick" if args.quick else "full"
    started = time.monotonic()
    sections: list[Section] = []
    with temp_dir() as workdir:
        for name in chosen:
            log(f"=== {name} ===")
            began = time.monotonic()
            try:
                sections.append(_run(name, workdir, receive_cfg, dispatch_cfg, reconcile_cfg))
            except Exception as exc:  # noqa: BLE001 - report it and go on with the others
                # The package is edited while benches run: one broken path must not hide the
                # figures of the others.
                detail = "".join(traceback.format_exception(exc)[-6:])
                log(f"=== {name} FAILED: {type(exc).__name__}: {exc}")
                sections.append(
                    Section(name=name, seconds=time.monotonic() - began, error=detail.strip())
                )
                continue
            log(f"=== {name} done in {sections[-1].seconds:.0f} s ===")
    seconds = time.monotonic() - started
    load_end = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print()
    print(report.text_table(sections))
    print(f"\n{len(chosen)} bench(es) in {seconds / 60:.1f} min; load average now {load_end}")
    failed = [s.name for s in sections if s.error]
    if failed:
        print(f"FAILED: {', '.join(failed)} (see the log above)")
    output = args.output
    if output is None and not args.quick and not args.only:
        output = str(RESULTS)
    if output and output != "-":
        text = report.markdown(
            sections, facts=facts, command=command, seconds=seconds, load_end=load_end
        )
        report.write(Path(output), text)
        print(f"wrote {output}")
    return 1 if failed else 0


def _run(
    name: str,
    workdir: Path,
    receive_cfg: ReceiveConfig,
    dispatch_cfg: DispatchConfig,
    reconcile_cfg: ReconcileConfig,
) -> Section:
    if name == "receive":
        from bench import receive

        return receive.run(receive_cfg, workdir)
    if name == "dispatch":
        from bench import dispatch

        return dispatch.run(dispatch_cfg, workdir)
    if name == "slowhandler":
        from bench import slow_handler

        return slow_handler.run(
            SlowHandlerConfig(
                backends=receive_cfg.backends, rounds=1 if receive_cfg.duration < 6.0 else 2
            ),
            workdir,
        )
    if name == "endtoend":
        from bench import endtoend

        return endtoend.run(
            EndToEndConfig(
                events=2_000 if receive_cfg.duration < 6.0 else 20_000,
                rounds=receive_cfg.rounds,
                profile=dispatch_cfg.profile,
            ),
            workdir,
        )
    from bench import reconcile

    return reconcile.run(reconcile_cfg, workdir)


if __name__ == "__main__":
    sys.exit(main())
