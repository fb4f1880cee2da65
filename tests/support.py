"""Test helpers shared by several test folders."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from flask import Flask
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server


class _Quiet(WSGIRequestHandler):
    def log(self, type: str, message: str, *args: object) -> None:
        pass


@contextmanager
def serve(app: Flask) -> Iterator[str]:
    """Serve ``app`` on an ephemeral loopback port in a thread; yield its base URL."""
    server: BaseWSGIServer = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
