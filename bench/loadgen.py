"""An open-loop, rate-limited HTTP load generator (one process of several).

``python -m bench.loadgen --url URL --rate R --duration S --pool FILE --slice I/N``

Request ``i`` is *due* at ``t0 + i / rate``, whatever happened to the earlier ones (open
loop, as the processor sends webhooks): a scheduler thread releases each request at its due
time to a pool of sender threads, each with its own keep-alive connection. Latency is measured
from the due time, not from the moment a sender was free, so a slow server cannot hide its
queueing (no coordinated omission). Prints one JSON object: latencies (ms), statuses, how late
the scheduler released requests (``release_late_p99_ms``: whether the client kept up with the
rate) and how long requests waited for a free sender (``queued_p99_ms``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import sys
import threading
import time
from urllib.parse import urlsplit


def _load(pool: str, index: int, count: int, need: int) -> list[tuple[str, bytes]]:
    items: list[tuple[str, bytes]] = []
    with open(pool, "rb") as f:
        for n, line in enumerate(f):
            if n % count != index:
                continue
            signature, _, body = line.rstrip(b"\n").partition(b" ")
            items.append((signature.decode(), body))
            if len(items) >= need:
                break
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen")
    parser.add_argument("--url", required=True)
    parser.add_argument("--rate", type=float, required=True, help="requests/s of this process")
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--pool", default=None, help="signed bodies; without it: GET")
    parser.add_argument("--slice", default="0/1")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--start-at", type=float, default=None, help="time.time() to start")
    args = parser.parse_args(argv)

    parts = urlsplit(args.url)
    host, port, path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"
    total = max(1, int(args.rate * args.duration))
    index, count = (int(x) for x in args.slice.split("/"))
    items = _load(args.pool, index, count, total) if args.pool else []
    if args.pool and len(items) < total:
        print(f"pool too small: {len(items)} < {total}", file=sys.stderr)
        return 2

    jobs: queue.Queue[tuple[int, float] | None] = queue.Queue()
    latencies: list[float] = []
    lags: list[float] = []
    statuses: dict[str, int] = {}
    lock = threading.Lock()

    def sender() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        while (job := jobs.get()) is not None:
            i, due = job
            started = time.perf_counter()
            try:
                if items:
                    signature, body = items[i]
                    conn.request(
                        "POST",
                        path,
                        body=body,
                        headers={
                            "Content-Type": "application/json",
                            "X-Webhook-Signature-512": signature,
                        },
                    )
                else:
                    conn.request("GET", path)
                response = conn.getresponse()
                response.read()
                status = str(response.status)
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
            except (OSError, http.client.HTTPException) as exc:
                status = type(exc).__name__
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=30)
            done = time.perf_counter()
            with lock:
                latencies.append((done - due) * 1000.0)
                lags.append((started - due) * 1000.0)
                statuses[status] = statuses.get(status, 0) + 1
        conn.close()

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(args.threads)]
    for t in threads:
        t.start()
    if args.start_at is not None:
        time.sleep(max(0.0, args.start_at - time.time()))
    t0 = time.perf_counter()
    interval = 1.0 / args.rate
    late: list[float] = []
    for i in range(total):
        due = t0 + i * interval
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        late.append((time.perf_counter() - due) * 1000.0)
        jobs.put((i, due))
    for _ in threads:
        jobs.put(None)
    for t in threads:
        t.join(timeout=60)
    elapsed = time.perf_counter() - t0
    lags.sort()
    late.sort()
    print(
        json.dumps(
            {
                "sent": total,
                "elapsed": elapsed,
                "statuses": statuses,
                "latencies_ms": [round(x, 3) for x in latencies],
                "release_late_p99_ms": late[int(0.99 * (len(late) - 1))],
                "queued_p99_ms": lags[int(0.99 * (len(lags) - 1))] if lags else None,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
