"""Fixtures of the sandbox processor tests: sandboxes and a webhook sink on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import requests

from reconcile.sandbox import FrozenClock, Sandbox, SandboxServer, create_app, mount_wsgi
from tests.reconcile.sandbox.sandbox_support import (
    ADMIN_KEY,
    API_KEY,
    BASE_URL,
    FAST_RETRIES,
    HOOK_URL,
    SECRET,
    Api,
    RecordingSender,
    WebhookSink,
)
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


T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FrozenClock:
    """A frozen sandbox clock at 2026-03-01T12:00:00Z."""
    return FrozenClock(T0)


@pytest.fixture
def sender() -> RecordingSender:
    return RecordingSender()


@pytest.fixture
def sb(clock: FrozenClock, sender: RecordingSender) -> Sandbox:
    """An in-process sandbox on the frozen clock, delivering webhooks to ``sender``."""
    return Sandbox(
        API_KEY,
        admin_api_key=ADMIN_KEY,
        webhook_url=HOOK_URL,
        webhook_secret=SECRET,
        now=clock,
        send=sender,
        public_url=BASE_URL,
    )


@pytest.fixture
def inproc(sb: Sandbox) -> Iterator[Api]:
    """An :class:`Api` over ``sb``'s app through the in-process transport (no socket)."""
    with requests.Session() as s:
        mount_wsgi(s, BASE_URL, create_app(sb))
        yield Api(s, BASE_URL)
