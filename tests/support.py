"""Test helpers shared by several test folders."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest
from flask import Flask
from sqlalchemy import Engine
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


def reconcile_ready(engine: Engine) -> None:
    """Migrate the reconciler's tables and declare the sandbox account new (nothing before
    hookledger), as ``reconcile db upgrade`` and ``reconcile adopt --new-account`` do."""
    import receiver.storage.database as db
    from receiver.store import Store
    from reconcile.storage.store import RECONCILE_MIGRATIONS

    db.upgrade(engine, tree=RECONCILE_MIGRATIONS)
    Store(engine).operations.set_cutover("new_account", None)


def unavailable(*, fail: str, skip: str, module_level: bool = False) -> NoReturn:
    """What a test needs of the machine (PostgreSQL, Chromium, Prism, the shared OpenAPI
    contract) is missing: skip with ``skip`` (``module_level``: at a module's import), except
    under ``CI=true``, where it fails with ``fail``, so that CI never passes with tests
    skipped for want of a service."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(fail, pytrace=False)
    pytest.skip(skip, allow_module_level=module_level)
