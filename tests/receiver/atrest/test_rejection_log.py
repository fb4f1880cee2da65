"""The rejected-deliveries log cannot be blinded: whatever a request declares, and whatever
one row does to the database, the rows of the requests around it are stored.

Through a real HTTP server (Werkzeug's threaded server, in this process so the test can hold
the log's writer while the requests arrive: they are then written in one batch, as a burst
within the writer's interval would be) and raw sockets, since an HTTP client library would
not send a ``Content-Length`` it cannot honour.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from flask import Flask
from werkzeug.serving import make_server

from receiver import WebhookReceiver
from receiver.atrest.rejected_deliveries import MAX_SIZE, RejectionLog, declared_size
from tests.conftest import AppFactory, backend

pytestmark = pytest.mark.storage

FORGED = b'{"event_id": "evt_forged"}'
FORGED_SIGNATURE = "ab" * 64


def _log(app: Flask) -> RejectionLog:
    return WebhookReceiver.state(app).store.rejections


@contextmanager
def _serving(app: Flask) -> Iterator[int]:
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        thread.join(timeout=10)


@contextmanager
def _one_batch(log: RejectionLog) -> Iterator[None]:
    """Hold the writer while rows are queued, then write them: one batch."""
    with log._write_lock:
        yield
    log.flush()


def _raw_post(port: int, content_length: str, body: bytes = b"") -> int:
    """POST over a raw socket with ``Content-Length`` exactly as given; the HTTP status."""
    head = (
        "POST /webhooks/ HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\n"
        f"Content-Length: {content_length}\r\n"
        "Content-Type: application/json\r\n"
        f"X-Webhook-Signature-512: {FORGED_SIGNATURE}\r\n"
        "Connection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + body)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_a_declared_length_is_parsed_and_clamped() -> None:
    assert declared_size("1234") == 1234
    assert declared_size(" 42 ") == 42
    assert declared_size(0) == 0
    assert declared_size("99999999999999999999") == MAX_SIZE == 2**63 - 1
    assert declared_size(2**64) == MAX_SIZE
    for refused in ("-1", -1, "abc", "", "1e9", "+5", "0x10", "١٢", None, 1.5, True):
        assert declared_size(refused) is None, refused


@pytest.mark.parametrize("declared", ["99999999999999999999", "18446744073709551616"])
def test_a_declared_length_past_bigint_blinds_nothing(make_app: AppFactory, declared: str) -> None:
    app, _ = make_app(max_body_bytes=1000)
    log = _log(app)
    with _serving(app) as port, _one_batch(log):
        answers = [
            _raw_post(port, str(len(FORGED)), FORGED),
            _raw_post(port, declared),  # refused unread: 413 on its declared length
            _raw_post(port, str(len(FORGED)), FORGED),
            _raw_post(port, "-1"),
            _raw_post(port, "12abc"),
            _raw_post(port, str(len(FORGED)), FORGED),
        ]
    assert answers == [401, 413, 401, 401, 401, 401]
    rows = list(reversed(log.rows()))
    assert [(r.reason, r.http_status, r.size) for r in rows] == [
        ("signature_mismatch", 401, len(FORGED)),
        ("too_large", 413, MAX_SIZE),
        ("signature_mismatch", 401, len(FORGED)),
        ("signature_mismatch", 401, 0),  # the server read no body for a negative length
        ("signature_mismatch", 401, 0),  # nor for one that is not a number
        ("signature_mismatch", 401, len(FORGED)),
    ]
    assert log.summary()["not_recorded"] == 0


def _poison(engine: sa.Engine, remote_addr: str) -> None:
    """A trigger that makes the database refuse one row (the ones from ``remote_addr``)."""
    with engine.begin() as conn:
        if backend() == "postgresql":
            conn.execute(
                sa.text(
                    "CREATE FUNCTION hl_test_poison() RETURNS trigger AS $$ BEGIN "
                    f"IF NEW.remote_addr = '{remote_addr}' THEN RAISE EXCEPTION 'poison row'; "
                    "END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
                )
            )
            conn.execute(
                sa.text(
                    "CREATE TRIGGER hl_test_poison BEFORE INSERT ON hookledger_rejection "
                    "FOR EACH ROW EXECUTE FUNCTION hl_test_poison()"
                )
            )
        else:
            conn.execute(
                sa.text(
                    "CREATE TRIGGER hl_test_poison BEFORE INSERT ON hookledger_rejection "
                    f"WHEN NEW.remote_addr = '{remote_addr}' "
                    "BEGIN SELECT RAISE(ABORT, 'poison row'); END"
                )
            )


def test_a_row_the_database_refuses_loses_only_itself_and_is_counted(
    make_app: AppFactory,
) -> None:
    app, _ = make_app()
    log = _log(app)
    _poison(log.storage.engine, "10.6.6.6")
    with _one_batch(log):
        for addr in ("10.0.0.1", "10.0.0.2", "10.6.6.6", "10.0.0.3", "10.0.0.4"):
            assert log.record(
                reason="signature_mismatch",
                http_status=401,
                remote_addr=addr,
                size=10,
                header_names=["x-webhook-signature-512"],
            )
    stored = [r.remote_addr for r in reversed(log.rows())]
    assert stored == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    log.flush()  # the count of what was lost goes with the next row
    assert log.summary() == {
        "rows": 4,
        "not_recorded": 1,
        "by_reason": {"signature_mismatch": 4},
        "by_secret_ids": {"-": 4},
    }
