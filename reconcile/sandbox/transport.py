"""In-process HTTP for tests: a ``requests`` transport adapter that serves from a WSGI app.

No socket, no thread per server: a request sent through a mounted
:class:`requests.Session` is turned into a WSGI environ and handed to the app in the calling
thread, and the app's answer becomes an ordinary :class:`requests.Response` (status, reason,
headers, body, JSON, encoding, ``url``, ``elapsed``). Query strings, percent-encoded paths,
redirects (``allow_redirects``) and error answers behave as over HTTP. With a ``timeout``,
the app runs in a helper thread and a slow answer raises :class:`requests.ReadTimeout`, like
a socket read would (the app still finishes its work, as a real server would).

::

    sandbox = Sandbox("snd_key", send=wsgi_sender(receiver_app.wsgi_app))
    session = requests.Session()
    mount_wsgi(session, "http://sandbox.test", create_app(sandbox))
    client = ProcessorClient("http://sandbox.test", "snd_key", session=session)

:func:`wsgi_sender` builds the ``send(url, body, headers) -> int`` callable of the sandbox's
clock-driven webhook delivery over the same adapter, so webhooks go straight into a Flask
app (for example hookledger's receiver).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from time import perf_counter
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers
from werkzeug.test import EnvironBuilder, run_wsgi_app

WSGIApp = Callable[..., Iterable[bytes]]

__all__ = ["WSGIAdapter", "mount_wsgi", "wsgi_sender"]


class WSGIAdapter(BaseAdapter):
    """A ``requests`` transport adapter that answers from ``app`` (a WSGI callable)."""

    def __init__(self, app: WSGIApp) -> None:
        super().__init__()
        self.app = app

    def __repr__(self) -> str:
        return f"WSGIAdapter({self.app!r})"

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """Serve ``request`` from the app; raise ``ReadTimeout`` past the read timeout."""
        environ = _environ(request)
        started = perf_counter()
        read_timeout = timeout[1] if isinstance(timeout, tuple) else timeout
        if read_timeout is None:
            status, headers, body = _call(self.app, environ)
        else:
            status, headers, body = _call_with_timeout(self.app, environ, read_timeout, request)
        response = requests.Response()
        code, _, reason = status.partition(" ")
        response.status_code = int(code)
        response.reason = reason
        response.headers = CaseInsensitiveDict(headers)
        response.encoding = get_encoding_from_headers(response.headers)
        response._content = body
        # Already read: iter_content() and .text serve the body from _content.
        setattr(response, "_content_consumed", True)  # noqa: B010 - private to requests
        response.raw = io.BytesIO(body)
        response.url = request.url or ""
        response.request = request
        setattr(response, "connection", self)  # noqa: B010 - typed as HTTPAdapter
        response.elapsed = timedelta(seconds=perf_counter() - started)
        return response

    def close(self) -> None:
        """Nothing to release."""


def mount_wsgi(session: requests.Session, base_url: str, wsgi_app: WSGIApp) -> None:
    """Route every request of ``session`` under ``base_url`` to ``wsgi_app`` in-process.

    ``base_url`` is a scheme and host (``http://sandbox.test``), optionally with a path
    prefix; the path of a request is passed to the app unchanged (the app sees the whole
    path, as it would behind a real server at that origin).
    """
    session.mount(base_url.rstrip("/") + "/", WSGIAdapter(wsgi_app))
    session.mount(base_url.rstrip("/"), WSGIAdapter(wsgi_app))


def wsgi_sender(
    wsgi_app: WSGIApp, *, timeout: float | None = None
) -> Callable[[str, bytes, dict[str, str]], int]:
    """A ``send(url, body, headers) -> status`` that POSTs into ``wsgi_app`` in-process.

    For ``Sandbox(send=...)``: whatever the URL's host, the request goes to ``wsgi_app``;
    an exception the app lets escape (or a ``timeout``) is a transport failure for the
    sandbox, as a dropped connection would be.
    """
    session = requests.Session()
    adapter = WSGIAdapter(wsgi_app)
    session.mount("http://", adapter)
    session.mount("https://", adapter)

    def send(url: str, body: bytes, headers: dict[str, str]) -> int:
        response = session.post(
            url, data=body, headers=headers, timeout=timeout, allow_redirects=False
        )
        return response.status_code

    return send


def _environ(request: requests.PreparedRequest) -> dict[str, Any]:
    url = urlsplit(request.url or "")
    body = request.body
    if body is not None and not isinstance(body, bytes | str):
        body = b"".join(
            chunk if isinstance(chunk, bytes) else str(chunk).encode() for chunk in body
        )
    headers = [
        (name, value) for name, value in request.headers.items() if name.lower() != "content-length"
    ]
    builder = EnvironBuilder(
        path=url.path or "/",
        base_url=f"{url.scheme}://{url.netloc}",
        query_string=url.query,
        method=request.method or "GET",
        headers=headers,
        data=body if body is not None else b"",
    )
    try:
        environ: dict[str, Any] = builder.get_environ()
    finally:
        builder.close()
    # The path arrives percent-encoded, as on the wire; WSGI wants it decoded.
    environ["REQUEST_URI"] = environ["RAW_URI"] = url.path + (f"?{url.query}" if url.query else "")
    return environ


def _call(app: WSGIApp, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    """Run the app; an exception it lets escape is a dropped connection, as over HTTP."""
    try:
        app_iter, status, headers = run_wsgi_app(app, environ, buffered=True)
        try:
            body = b"".join(app_iter)
        finally:
            close = getattr(app_iter, "close", None)
            if close is not None:
                close()
    except Exception as exc:
        raise requests.ConnectionError(
            f"the in-process WSGI app failed: {type(exc).__name__}"
        ) from exc
    return status, list(headers.items()), body


def _call_with_timeout(
    app: WSGIApp, environ: dict[str, Any], timeout: float, request: requests.PreparedRequest
) -> tuple[str, list[tuple[str, str]], bytes]:
    result: list[tuple[str, list[tuple[str, str]], bytes]] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(_call(app, environ))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=run, name="wsgi-transport", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise requests.ReadTimeout(
            f"in-process WSGI app did not answer within {timeout} s", request=request
        )
    if failure:
        raise failure[0]
    return result[0]
