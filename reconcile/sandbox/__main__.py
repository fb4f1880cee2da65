"""Run the sandbox processor: ``python -m reconcile.sandbox --api-key snd_... [options]``.

Every option can come from an environment variable (shown in ``--help``); prefer the
environment for ``SANDBOX_API_KEY``, ``SANDBOX_ADMIN_API_KEY`` and ``SANDBOX_WEBHOOK_SECRET``
so they stay out of the process list. Without an admin key the events API answers 401.
Prints the base URL on stdout, serves until SIGTERM or SIGINT, then exits 0. Binds to
loopback only unless ``--allow-remote`` is given.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from receiver.core.errors import HookledgerError
from reconcile.sandbox.server import SandboxServer
from reconcile.sandbox.webhooks import parse_retry_schedule


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reconcile.sandbox",
        description="A stateful local sandbox of the Hyperswitch payment processor API.",
    )
    parser.add_argument(
        "--host", default=_env("SANDBOX_HOST", "127.0.0.1"), help="env SANDBOX_HOST"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(_env("SANDBOX_PORT", "8081") or 8081),
        help="env SANDBOX_PORT (0 picks a free port)",
    )
    parser.add_argument(
        "--api-key",
        default=_env("SANDBOX_API_KEY"),
        help="env SANDBOX_API_KEY; must start with snd_",
    )
    parser.add_argument(
        "--admin-api-key",
        default=_env("SANDBOX_ADMIN_API_KEY"),
        help="env SANDBOX_ADMIN_API_KEY: the key of the events API (/events/...); none: 401",
    )
    parser.add_argument(
        "--webhook-url", default=_env("SANDBOX_WEBHOOK_URL"), help="env SANDBOX_WEBHOOK_URL"
    )
    parser.add_argument(
        "--webhook-secret",
        default=_env("SANDBOX_WEBHOOK_SECRET"),
        help="env SANDBOX_WEBHOOK_SECRET; required with a webhook URL",
    )
    parser.add_argument(
        "--merchant-id",
        default=_env("SANDBOX_MERCHANT_ID", "merchant_sandbox"),
        help="env SANDBOX_MERCHANT_ID",
    )
    parser.add_argument(
        "--retry-schedule",
        default=_env("SANDBOX_RETRY_SCHEDULE", "hyperswitch"),
        help="env SANDBOX_RETRY_SCHEDULE: 'hyperswitch', 'none' or delays like '0.2x3,1'",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=int(_env("SANDBOX_SEED", "0") or 0),
        help="env SANDBOX_SEED: seed of the fault RNG",
    )
    parser.add_argument(
        "--tick-interval",
        type=float,
        default=float(_env("SANDBOX_TICK_INTERVAL", "0") or 0),
        help="env SANDBOX_TICK_INTERVAL: seconds between automatic ticks (0: only on request)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        default=(_env("SANDBOX_ALLOW_REMOTE", "") or "").lower() in {"1", "true", "yes"},
        help="env SANDBOX_ALLOW_REMOTE: allow binding a non-loopback address",
    )
    parser.add_argument("--quiet", action="store_true", help="no access log")
    return parser


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = None
    if not args.api_key:
        problem = "an api key is required (--api-key or SANDBOX_API_KEY)"
    elif args.webhook_url and not args.webhook_secret:
        problem = (
            "a webhook URL needs a webhook secret (--webhook-secret or SANDBOX_WEBHOOK_SECRET)"
        )
    elif not _is_loopback(args.host) and not args.allow_remote:
        problem = f"refusing to bind {args.host}: not loopback (pass --allow-remote)"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        schedule = parse_retry_schedule(args.retry_schedule)
        server = SandboxServer(
            args.api_key,
            admin_api_key=args.admin_api_key or None,
            webhook_url=args.webhook_url,
            webhook_secret=args.webhook_secret,
            merchant_id=args.merchant_id,
            retry_schedule=schedule,
            seed=args.seed,
            host=args.host,
            port=args.port,
            tick_interval=args.tick_interval or None,
            access_log=not args.quiet,
        )
        server.start()
    except (HookledgerError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(server.base_url, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
