"""The receive view reads a body exactly as ``request.stream.read(cap + 1)`` did.

:func:`receiver.web.blueprint._read_body` reads the WSGI input itself (werkzeug's stream
zeroes a buffer of the cap's size for every read). These tests hold it to the former
reading, case by case: the same bytes, the same refusal (:class:`PayloadTooLarge`, or
werkzeug's :class:`ClientDisconnected`), and no more of the input read. Then the same edge
cases end to end: an oversized declared length refused unread, an oversized chunked body
refused after ``cap + 1`` bytes, an empty body.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask, request
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge
from werkzeug.test import EnvironBuilder

from receiver.core.errors import PayloadTooLarge
from receiver.core.signature import SIGNATURE_HEADER, sign
from receiver.testing.factories import build_event, encode
from receiver.web.blueprint import _read_body
from tests.conftest import SECRETS, AppFactory

CAP = 64


def _former_read_body(limit: int) -> bytes:
    """The reading this replaced (werkzeug's ``request.stream``)."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge()
    body = request.stream.read(limit + 1)
    if len(body) > limit:
        raise PayloadTooLarge()
    return body


class Unbuffered:
    """A server's input with ``read`` only (as gunicorn's), giving at most ``step`` bytes a
    read, or raising ``error`` on the first one."""

    def __init__(self, data: bytes, step: int = 1 << 30, error: Exception | None = None):
        self._data = io.BytesIO(data)
        self._step = step
        self._error = error

    def read(self, size: int = -1) -> bytes:
        if self._error is not None:
            raise self._error
        return self._data.read(min(size, self._step) if size >= 0 else self._step)

    def tell(self) -> int:
        return self._data.tell()


def _cases() -> Iterator[Any]:
    for size in (0, 1, CAP - 1, CAP, CAP + 1, 10 * CAP):
        body = bytes(range(256))[:size] if size <= 256 else b"z" * size
        yield pytest.param(body, str(size), False, id=f"declared-{size}")
        yield pytest.param(body, None, True, id=f"chunked-terminated-{size}")
        yield pytest.param(body, None, False, id=f"chunked-unterminated-{size}")
    yield pytest.param(b"abc", "10", False, id="declared-more-than-sent")
    yield pytest.param(b"", "5", False, id="declared-nothing-sent")
    yield pytest.param(b"a" * 40, "8", False, id="declared-less-than-sent")
    yield pytest.param(b"a" * 40, "x8", False, id="declared-not-a-number")
    yield pytest.param(b"a" * 40, "-8", False, id="declared-negative")
    yield pytest.param(b"a" * (CAP + 1), "3", True, id="declared-and-terminated")


def _environ(body: bytes, declared: str | None, terminated: bool, stream: Any) -> dict[str, Any]:
    environ = EnvironBuilder(path="/", method="POST").get_environ()
    environ["wsgi.input"] = stream
    environ.pop("CONTENT_LENGTH", None)
    if declared is not None:
        environ["CONTENT_LENGTH"] = declared
    if terminated:
        environ["wsgi.input_terminated"] = True
    return environ


def _outcome(app: Flask, environ: dict[str, Any], read: Any) -> tuple[Any, int]:
    with app.request_context(environ):
        try:
            result: Any = read(CAP)
        except (PayloadTooLarge, ClientDisconnected, RequestEntityTooLarge) as exc:
            result = type(exc)
    return result, environ["wsgi.input"].tell()


@pytest.mark.parametrize(("body", "declared", "terminated"), list(_cases()))
@pytest.mark.parametrize("kind", ["buffered", "unbuffered", "short-reads"])
@pytest.mark.parametrize("host_cap", [None, CAP // 2, CAP * 2], ids=lambda c: f"host-cap-{c}")
def test_the_body_is_read_as_the_stream_read_it(
    body: bytes, declared: str | None, terminated: bool, kind: str, host_cap: int | None
) -> None:
    """Whatever the server, the body and the host app's own cap (Flask's
    ``MAX_CONTENT_LENGTH``, refused with werkzeug's 413)."""
    app = Flask("read_body")
    app.config["MAX_CONTENT_LENGTH"] = host_cap

    def stream() -> Any:
        if kind == "buffered":
            return io.BytesIO(body)
        return Unbuffered(body, step=7 if kind == "short-reads" else 1 << 30)

    before = _outcome(app, _environ(body, declared, terminated, stream()), _former_read_body)
    after = _outcome(app, _environ(body, declared, terminated, stream()), _read_body)
    assert after == before


def test_chunked_bodies_are_chunked_even_with_a_content_length() -> None:
    app = Flask("read_body")
    for read in (_former_read_body, _read_body):
        environ = _environ(b"b" * (CAP + 1), "3", True, io.BytesIO(b"b" * (CAP + 1)))
        environ["HTTP_TRANSFER_ENCODING"] = "chunked"
        assert _outcome(app, environ, read) == (PayloadTooLarge, CAP + 1)


@pytest.mark.parametrize("error", [OSError("reset"), ValueError("closed")])
def test_a_failed_read_is_the_client_gone(error: Exception) -> None:
    app = Flask("read_body")
    for read in (_former_read_body, _read_body):
        environ = _environ(b"abc", "3", False, Unbuffered(b"abc", error=error))
        assert _outcome(app, environ, read) == (ClientDisconnected, 0)


# -- end to end ---------------------------------------------------------------------------


class Counting(io.BytesIO):
    """A request body that tells how far the app read into it."""


def _signed_event(size: int) -> bytes:
    event = build_event("payment_succeeded")
    event["content"]["object"]["metadata"] = {"pad": ""}
    event["content"]["object"]["metadata"] = {"pad": "p" * (size - len(encode(event)))}
    body = encode(event)
    assert len(body) == size
    return body


@pytest.mark.storage
def test_an_oversized_declared_body_is_refused_unread(make_app: AppFactory) -> None:
    app, _ = make_app(max_body_bytes=4096)
    body = _signed_event(4097)
    stream = Counting(body)
    response = app.test_client().post(
        "/webhooks/",
        input_stream=stream,
        content_length=len(body),
        headers={SIGNATURE_HEADER: sign(body, SECRETS["primary"])},
    )
    assert response.status_code == 413
    assert response.get_json()["error"]["code"] == "HL_13"
    assert stream.tell() == 0


@pytest.mark.storage
@pytest.mark.parametrize("size", [4096, 4097, 50_000])
def test_a_chunked_body_is_read_up_to_the_cap(make_app: AppFactory, size: int) -> None:
    app, _ = make_app(max_body_bytes=4096)
    body = _signed_event(size)
    stream = Counting(body)
    response = app.test_client().post(
        "/webhooks/",
        input_stream=stream,
        headers={SIGNATURE_HEADER: sign(body, SECRETS["primary"])},
        environ_overrides={"wsgi.input_terminated": True, "CONTENT_LENGTH": ""},
    )
    if size > 4096:
        assert response.status_code == 413
        assert response.get_json()["error"]["code"] == "HL_13"
        assert stream.tell() == 4097
    else:
        assert response.status_code == 200
        assert response.get_json()["status"] == "inserted"


@pytest.mark.storage
def test_an_empty_body_is_read_as_empty(make_app: AppFactory) -> None:
    app, _ = make_app()
    client = app.test_client()
    signed = client.post(
        "/webhooks/", data=b"", headers={SIGNATURE_HEADER: sign(b"", SECRETS["primary"])}
    )
    assert signed.status_code == 400
    assert signed.get_json()["error"]["code"] == "HL_04"
    unsigned = client.post("/webhooks/", data=b"", headers={SIGNATURE_HEADER: "0" * 128})
    assert unsigned.status_code == 401
