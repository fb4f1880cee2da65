"""Fixtures of the contract tests: the patched spec, one Prism mock per session, and clients.

Prism comes from ``.ci/prism-setup`` (or ``$HOOKLEDGER_PRISM``); the spec from
``../shared/reference/hyperswitch-openapi-v1.json`` (or ``$HOOKLEDGER_OPENAPI_SPEC``). Without
node, Prism or the spec the tests skip with the reason, except under ``CI=true``, where that
is a failure.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import pytest
import requests

from reconcile.client.events_api import EventsClient
from reconcile.client.processor import ProcessorClient
from reconcile.client.transport import RetryPolicy
from tests.contract import API_KEY
from tests.contract.patch_spec import require_spec, write_patched_spec
from tests.contract.prism import PrismServer, find_prism, start_prism
from tests.contract.recorder import ContractRecorder
from tests.support import unavailable

#: The paths the client and the example shop use: the mock serves only these (and the schemas
#: they reach), which halves Prism's start and first answers. A call to any other path is
#: answered 404 and reported; add the path here when the client starts using it.
CONTRACT_PATHS = (
    "/health",
    "/payments",
    "/payments/list",
    "/payments/{payment_id}",
    "/refunds/list",
    "/refunds/{refund_id}",
    "/payouts/list",
    "/payouts/{payout_id}",
    "/disputes/list",
    "/disputes/{dispute_id}",
    "/mandates/{mandate_id}",
    "/events/{merchant_id}",
    "/events/{merchant_id}/{event_id}/attempts",
    "/events/{merchant_id}/{event_id}/retry",
)
#: An admin API key (no prefix; Prism checks that ``api-key`` is present, not its value).
ADMIN_KEY = "contract_admin_key_0123456789"
#: The events client's clock: ten days after Prism's static event (2022-09-10T10:11:12Z), so
#: the window around it lies within the events API's 90 days.
EVENTS_NOW = datetime(2022, 9, 20, 12, 0, tzinfo=UTC).timestamp()


def _unavailable(reason: str) -> NoReturn:
    unavailable(
        fail=f"the contract tests need Prism under CI=true: {reason}",
        skip=f"contract tests skipped: {reason}",
    )


@pytest.fixture(scope="session")
def source_spec() -> Path:
    """Where the unpatched spec is (it is never copied into the repository)."""
    return require_spec("contract tests")


@pytest.fixture(scope="session")
def patched_spec(source_spec: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The patched spec (:data:`CONTRACT_PATHS` only), written once per session."""
    return write_patched_spec(tmp_path_factory.mktemp("contract"), source_spec, CONTRACT_PATHS)


@pytest.fixture(scope="session")
def spec(patched_spec: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(patched_spec.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture(scope="session")
def prism(patched_spec: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrismServer]:
    """``prism mock --errors`` of the patched spec on 127.0.0.1, stopped after the session."""
    if shutil.which("node") is None:
        _unavailable("node is not installed (Prism is a node program)")
    binary = find_prism()
    if binary is None or not binary.exists():
        _unavailable("Prism is not installed; run .ci/prism-setup (needs npm)")
    log = tmp_path_factory.mktemp("prism") / "prism.log"
    try:
        server = start_prism(binary, patched_spec, log)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def recorder(spec: dict[str, Any]) -> ContractRecorder:
    return ContractRecorder(spec)


@pytest.fixture
def make_client(
    prism: PrismServer, recorder: ContractRecorder
) -> Iterator[Callable[..., ProcessorClient]]:
    """Clients of the mock whose every exchange ``recorder`` sees; no retries.

    ``prefer`` sets Prism's ``Prefer`` header (``"example=seed"`` picks a named example).
    """
    sessions: list[requests.Session] = []
    clients: list[ProcessorClient] = []

    def factory(*, prefer: str | None = None, **options: Any) -> ProcessorClient:
        session = recorder.attach(requests.Session())
        if prefer:
            session.headers["Prefer"] = prefer
        sessions.append(session)
        options.setdefault("retry", RetryPolicy(max_attempts=1))
        options.setdefault("connect_timeout", 2.0)
        options.setdefault("read_timeout", 10.0)
        client = ProcessorClient(prism.base_url, API_KEY, session=session, **options)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.close()
    for session in sessions:
        session.close()


@pytest.fixture
def client(make_client: Callable[..., ProcessorClient]) -> ProcessorClient:
    return make_client()


@pytest.fixture
def events(prism: PrismServer, recorder: ContractRecorder) -> Iterator[EventsClient]:
    """An admin events client of the mock (no retries), its exchanges seen by ``recorder``."""
    session = recorder.attach(requests.Session())
    client = EventsClient(
        prism.base_url,
        ADMIN_KEY,
        environment="sandbox",
        session=session,
        retry=RetryPolicy(max_attempts=1),
        clock=lambda: EVENTS_NOW,
        connect_timeout=2.0,
        read_timeout=10.0,
    )
    yield client
    client.close()
    session.close()
