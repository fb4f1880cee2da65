"""What users build instead of hookledger: a Flask view that verifies the signature and
enqueues the body to RQ (Redis), and a job that runs the same no-op handler.

``create_app()`` is served by gunicorn like hookledger's app (:mod:`bench.yardstick`); the
queue is named by ``HLBENCH_RQ_QUEUE`` on the Redis at ``HLBENCH_REDIS_URL``. The end-to-end
bench (:mod:`bench.endtoend`) runs ``rq worker --worker-class rq.SimpleWorker`` on it.
"""

from __future__ import annotations

import json
import os

from flask import Flask, Response

from bench.yardstick import _ping, first_secret, verified_delivery

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

    secret = first_secret()
    queue = Queue(
        os.environ["HLBENCH_RQ_QUEUE"],
        connection=Redis.from_url(os.environ.get("HLBENCH_REDIS_URL", REDIS_URL)),
    )
    app = Flask("bench_rq")

    @app.post("/webhooks/")
    def receive() -> tuple[Response, int] | Response:
        body, event_id = verified_delivery(secret)
        queue.enqueue(handle, body, job_id=f"{queue.name}-{event_id}")
        return Response(b'{"status":"ok"}', mimetype="application/json")

    app.add_url_rule("/ping", "ping", _ping)
    return app
