"""Fixtures for the processor client tests: a fake processor on 127.0.0.1 and client factories."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from reconcile.client.events_api import EventsClient
from reconcile.client.processor import ProcessorClient
from reconcile.client.transport import RetryPolicy
from tests.reconcile.client._fakeapi import (
    ADMIN_KEY,
    API_KEY,
    NOW,
    FakeProcessor,
    Sleeps,
    start,
    stop,
)


@pytest.fixture
def fake() -> Iterator[FakeProcessor]:
    running = start(API_KEY)
    running.fake.now = datetime.fromtimestamp(NOW, UTC)  # the injected clock's "now"
    try:
        yield running.fake
    finally:
        stop(running)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def make_client(fake: FakeProcessor, sleeps: Sleeps) -> Iterator[Callable[..., ProcessorClient]]:
    """Build clients against the fake with recorded sleeps, a fixed clock and a seeded rng."""
    clients: list[ProcessorClient] = []

    def factory(**overrides: Any) -> ProcessorClient:
        options: dict[str, Any] = {
            "retry": RetryPolicy(),
            "sleep": sleeps,
            "clock": lambda: NOW,
            "rng": random.Random(1234),
            "connect_timeout": 2.0,
            "read_timeout": 5.0,
        }
        options.update(overrides)
        base_url = options.pop("base_url", fake.base_url)
        api_key = options.pop("api_key", API_KEY)
        client = ProcessorClient(base_url, api_key, **options)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.close()


@pytest.fixture
def client(make_client: Callable[..., ProcessorClient]) -> ProcessorClient:
    return make_client()


@pytest.fixture
def make_events(fake: FakeProcessor, sleeps: Sleeps) -> Iterator[Callable[..., EventsClient]]:
    """Build admin events clients against the fake, like ``make_client``."""
    clients: list[EventsClient] = []

    def factory(**overrides: Any) -> EventsClient:
        options: dict[str, Any] = {
            "environment": "sandbox",
            "retry": RetryPolicy(),
            "sleep": sleeps,
            "clock": lambda: NOW,
            "rng": random.Random(1234),
            "connect_timeout": 2.0,
            "read_timeout": 5.0,
        }
        options.update(overrides)
        base_url = options.pop("base_url", fake.base_url)
        admin_key = options.pop("admin_api_key", ADMIN_KEY)
        client = EventsClient(base_url, admin_key, **options)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.close()


@pytest.fixture
def events(make_events: Callable[..., EventsClient]) -> EventsClient:
    return make_events()
