"""Fixtures of the sandbox processor tests: sandboxes and a webhook sink on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from reconcile.sandbox import SandboxServer
from tests.sandbox.sandbox_support import API_KEY, FAST_RETRIES, SECRET, Api, WebhookSink
from tests.support import serve


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    receiver = WebhookSink()
    with serve(receiver.app) as base_url:
        receiver.url = base_url + "/webhooks"
        yield receiver


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


@pytest.fixture
def start_sandbox() -> Iterator[Callable[..., SandboxServer]]:
    """Start sandbox servers (``api_key`` and fast retries by default); stopped afterwards."""
    servers: list[SandboxServer] = []

    def start(**options: Any) -> SandboxServer:
        options.setdefault("retry_schedule", FAST_RETRIES)
        options.setdefault("webhook_secret", SECRET)
        server = SandboxServer(options.pop("api_key", API_KEY), **options)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(start_sandbox: Callable[..., SandboxServer]) -> SandboxServer:
    """A sandbox without a webhook URL."""
    return start_sandbox()


@pytest.fixture
def hooked(start_sandbox: Callable[..., SandboxServer], sink: WebhookSink) -> SandboxServer:
    """A sandbox that delivers webhooks to ``sink``."""
    return start_sandbox(webhook_url=sink.url)


@pytest.fixture
def api(server: SandboxServer, session: requests.Session) -> Api:
    return Api(session, server.base_url)


@pytest.fixture
def hooked_api(hooked: SandboxServer, session: requests.Session) -> Api:
    return Api(session, hooked.base_url)
