"""Run the sandbox processor: ``python -m reconcile.sandbox --api-key snd_... [options]``.

Every option can come from an environment variable (shown in ``--help``); prefer the
environment for ``SANDBOX_API_KEY``, ``SANDBOX_ADMIN_API_KEY`` and ``SANDBOX_WEBHOOK_SECRET``
so they stay out of the process list. Without an admin key the events API answers 401.
Prints the base URL on stdout, serves until SIGTERM or SIGINT, then exits 0. Binds to
loopback only unless ``--allow-remote`` is given.

Several merchants on one base URL (:mod:`reconcile.sandbox.merchants`; the ``api-key``
picks the merchant): each ``--merchant MERCHANT_ID:API_KEY[:WEBHOOK_SECRET[:WEBHOOK_URL]]``
(repeatable) or each entry of ``SANDBOX_MERCHANTS``, a JSON object ``{"<merchant_id>":
{"api_key", "admin_api_key", "webhook_secret", "webhook_url", "profile_id"}}`` (only
``api_key`` required; the environment keeps the keys out of the process list), is one more
merchant, beside the one of ``--api-key`` when it is given. Their profile id is
``pro_<merchant_id>`` unless given; ``--admin-api-key`` is every merchant's admin key unless
an entry names its own; ``--retry-schedule`` and ``--seed`` apply to all.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from receiver.core.errors import HookledgerError
from reconcile.sandbox.merchants import MerchantsServer
from reconcile.sandbox.server import SandboxServer, ServingBase
from reconcile.sandbox.state import Sandbox
from reconcile.sandbox.webhooks import parse_retry_schedule

MERCHANT_FORMAT = "MERCHANT_ID:API_KEY[:WEBHOOK_SECRET[:WEBHOOK_URL]]"
_MERCHANT_KEYS = frozenset(
    {"api_key", "admin_api_key", "webhook_secret", "webhook_url", "profile_id"}
)


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
    parser.add_argument(
        "--merchant",
        action="append",
        default=[],
        metavar="MERCHANT",
        help=f"{MERCHANT_FORMAT}: one more merchant on the same base URL (repeatable); env "
        "SANDBOX_MERCHANTS: "
        '{"<merchant_id>": {"api_key", "admin_api_key", "webhook_secret", "webhook_url", '
        '"profile_id"}}',
    )
    parser.add_argument("--quiet", action="store_true", help="no access log")
    return parser


def parse_merchant(value: str, position: int) -> dict[str, Any]:
    """One ``--merchant`` value as :func:`merchant_options` entries (the value is never
    repeated in an error: it holds a key)."""
    merchant_id, _, rest = value.partition(":")
    api_key, _, rest = rest.partition(":")
    secret, _, url = rest.partition(":")
    if not merchant_id or not api_key or (rest and not secret):
        raise ValueError(f"--merchant #{position}: expected {MERCHANT_FORMAT}")
    return {
        "merchant_id": merchant_id,
        "api_key": api_key,
        "webhook_secret": secret or None,
        "webhook_url": url or None,
    }


def merchant_options(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The merchants of ``--merchant`` and ``SANDBOX_MERCHANTS``, as keyword arguments of
    :class:`~reconcile.sandbox.state.Sandbox` (``merchant_id`` among them)."""
    found = [parse_merchant(value, n) for n, value in enumerate(args.merchant, start=1)]
    raw = _env("SANDBOX_MERCHANTS")
    if raw:
        try:
            table = json.loads(raw)
        except ValueError:
            table = None
        if not isinstance(table, dict):
            raise ValueError("SANDBOX_MERCHANTS must be a JSON object of merchant ids")
        for merchant_id, entry in table.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("api_key"), str):
                raise ValueError(f"SANDBOX_MERCHANTS[{merchant_id!r}] needs an api_key")
            unknown = sorted(set(entry) - _MERCHANT_KEYS)
            if unknown:
                raise ValueError(
                    f"SANDBOX_MERCHANTS[{merchant_id!r}]: unknown setting(s) {unknown}; "
                    f"known: {sorted(_MERCHANT_KEYS)}"
                )
            found.append({"merchant_id": merchant_id, **entry})
    for options in found:
        options.setdefault("profile_id", f"pro_{options['merchant_id']}")
        options.setdefault("admin_api_key", args.admin_api_key or None)
        if options.get("webhook_url") and not options.get("webhook_secret"):
            raise ValueError(f"merchant {options['merchant_id']!r}: a webhook URL needs a secret")
    return found


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _problem(args: argparse.Namespace, merchants: list[dict[str, Any]]) -> str | None:
    """What is wrong with the configuration, in one line without a key (``None``: nothing)."""
    if not args.api_key and not merchants:
        return "an api key is required (--api-key or SANDBOX_API_KEY, or --merchant)"
    if args.webhook_url and not args.webhook_secret:
        return "a webhook URL needs a webhook secret (--webhook-secret or SANDBOX_WEBHOOK_SECRET)"
    if not _is_loopback(args.host) and not args.allow_remote:
        return f"refusing to bind {args.host}: not loopback (pass --allow-remote)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        merchants = merchant_options(args)
        problem = _problem(args, merchants)
    except ValueError as exc:
        merchants, problem = [], str(exc)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        schedule = parse_retry_schedule(args.retry_schedule)
        serving = {
            "host": args.host,
            "port": args.port,
            "tick_interval": args.tick_interval or None,
            "access_log": not args.quiet,
        }
        server: ServingBase
        if merchants:
            sandboxes = [
                Sandbox(retry_schedule=schedule, seed=args.seed, **options) for options in merchants
            ]
            if args.api_key:
                single = Sandbox(
                    args.api_key,
                    admin_api_key=args.admin_api_key or None,
                    webhook_url=args.webhook_url,
                    webhook_secret=args.webhook_secret,
                    merchant_id=args.merchant_id,
                    retry_schedule=schedule,
                    seed=args.seed,
                )
                sandboxes.insert(0, single)
            server = MerchantsServer(sandboxes, **serving)
        else:
            server = SandboxServer(
                args.api_key,
                admin_api_key=args.admin_api_key or None,
                webhook_url=args.webhook_url,
                webhook_secret=args.webhook_secret,
                merchant_id=args.merchant_id,
                retry_schedule=schedule,
                seed=args.seed,
                **serving,
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
