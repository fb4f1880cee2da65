"""What users build instead of hookledger: a Flask view that verifies the signature and
enqueues the body to RQ (Redis), and a job that runs the same no-op handler.

``create_app()`` is served by gunicorn like hookledger's app (:mod:`bench.yardstick`); the
queue is named by ``HLBENCH_RQ_QUEUE`` on the Redis at ``HLBENCH_REDIS_URL``. The end-to-end
bench (:mod:`bench.endtoend`) runs ``rq worker --worker-class rq.SimpleWorker`` on it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

from flask import Flask, Response, request

from bench.yardstick import SIGNATURE_HEADER, _ping

REDIS_URL = "redis://127.0.0.1:6379/0"


def handle(body: bytes) -> None:
    """The job: parse the event and run the same trivial handler as hookledger's."""
    event = json.loads(body)
    noop(event)


def noop(event: dict[str, object]) -> None:
    """A trivial handler (as :func:`bench.yardstick.noop`)."""


def create_app() -> Flask:
    from redis import Redis
    from rq import Queue

    spec = os.environ["HOOKLEDGER_SECRETS"].split(",")[0]
    secret = spec.partition(":")[2].encode("utf-8")
    queue = Queue(
        os.environ["HLBENCH_RQ_QUEUE"],
        connection=Redis.from_url(os.environ.get("HLBENCH_REDIS_URL", REDIS_URL)),
    )
    app = Flask("bench_rq")

    @app.post("/webhooks/")
    def receive() -> tuple[Response, int] | Response:
        body = request.get_data(cache=False)
        given = (request.headers.get(SIGNATURE_HEADER) or "").lower().encode("ascii", "replace")
        expected = hmac.new(secret, body, hashlib.sha512).hexdigest().encode("ascii")
        if not hmac.compare_digest(expected, given):
            return Response(b'{"error":"signature"}', mimetype="application/json"), 401
        try:
            event_id = json.loads(body)["event_id"]
        except (ValueError, KeyError, TypeError):
            return Response(b'{"error":"body"}', mimetype="application/json"), 400
        queue.enqueue(handle, body, job_id=f"{queue.name}-{event_id}")
        return Response(b'{"status":"ok"}', mimetype="application/json")

    app.add_url_rule("/ping", "ping", _ping)
    return app
