"""A forged-request flood, as its own process: ``python -m tests.reliability._flood_client
URL THREADS RATE STOP_FILE OUT_FILE [PAUSE_FILE]``. Each thread posts a body with a
signature no secret made, RATE requests a second (0: as fast as the server answers), while
PAUSE_FILE does not exist, until STOP_FILE exists; then the counts of answers by status go to
OUT_FILE as JSON."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter

import requests

BODY = json.dumps(
    {"event_id": "evt_forged", "event_type": "payment_succeeded", "content": {"object": {}}}
).encode()


def main() -> None:
    url, threads, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    stop, out = sys.argv[4], sys.argv[5]
    pause = sys.argv[6] if len(sys.argv) > 6 else None
    counts: Counter[int] = Counter()
    lock = threading.Lock()

    def flood(k: int) -> None:
        session = requests.Session()
        headers = {"X-Webhook-Signature-512": f"{k:02x}" * 64, "Content-Type": "application/json"}
        next_at = time.monotonic()
        while not os.path.exists(stop):
            if pause is not None and os.path.exists(pause):
                time.sleep(0.005)
                next_at = time.monotonic()
                continue
            if rate:
                next_at += 1 / rate
                time.sleep(max(0.0, next_at - time.monotonic()))
            try:
                code = session.post(url, data=BODY, headers=headers, timeout=10).status_code
            except requests.RequestException:
                code = 0
            with lock:
                counts[code] += 1

    workers = [threading.Thread(target=flood, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    with open(f"{out}.ready", "w") as ready:
        ready.write("ready")
    for worker in workers:
        worker.join()
    with open(out, "w") as handle:
        json.dump({str(k): v for k, v in counts.items()}, handle)


if __name__ == "__main__":
    main()
