"""One client process of the duplicate storm (a processor node delivering and re-delivering).

``python -m tests.reliability._storm_client BODIES URLS COPIES GO OUT``: writes ``OUT.ready``,
waits until the file ``GO`` exists (so that every client starts at once), then posts every
body of the JSON list in ``BODIES`` ``COPIES`` times, signed like the processor signs (hex
HMAC-SHA512 with the first secret of ``HOOKLEDGER_SECRETS``), spreading requests over the
comma-separated ``URLS`` round-robin. All clients walk the events in the same order (forward,
then backward, ...) so that copies of one event race each other. Writes
``[[index, url, status, result], ...]`` as JSON to ``OUT``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import time
from pathlib import Path

import requests


def main(argv: list[str]) -> int:
    bodies_file, urls_arg, copies_arg, go_file, out_file = argv
    bodies = [b.encode("utf-8") for b in json.loads(Path(bodies_file).read_text())]
    urls = urls_arg.split(",")
    # Signed as the processor does (hex HMAC-SHA512 of the raw body), without the package.
    secret = os.environ["HOOKLEDGER_SECRETS"].split(",")[0].split(":", 1)[1].encode()
    Path(out_file + ".ready").write_text("ready")
    deadline = time.monotonic() + 60
    while not Path(go_file).exists():
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.01)
    results: list[tuple[int, str, int, str]] = []
    n = 0
    with requests.Session() as session:
        for copy in range(int(copies_arg)):
            order = range(len(bodies)) if copy % 2 == 0 else range(len(bodies) - 1, -1, -1)
            for i in order:
                url = urls[n % len(urls)]
                n += 1
                body = bodies[i]
                headers = {
                    "X-Webhook-Signature-512": hmac.new(secret, body, hashlib.sha512).hexdigest(),
                    "Content-Type": "application/json",
                }
                try:
                    response = session.post(url, data=body, headers=headers, timeout=30)
                except requests.RequestException as exc:
                    results.append((i, url, -1, f"{type(exc).__name__}: {exc}"))
                    continue
                try:
                    result = str(response.json().get("status"))
                except ValueError:
                    result = response.text[:200]
                results.append((i, url, response.status_code, result))
    Path(out_file).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
