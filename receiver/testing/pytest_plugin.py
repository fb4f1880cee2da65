"""pytest plugin installed with hookledger: the ``webhook_client`` fixture.

It needs an ``app`` fixture (your Flask app with ``WebhookReceiver.init_app`` applied and its
schema migrated, for example ``HOOKLEDGER_DATABASE_URL=sqlite://`` plus
``HOOKLEDGER_AUTO_MIGRATE=1``).
"""

from __future__ import annotations

import pytest
from flask import Flask

from receiver.testing import WebhookTestClient


@pytest.fixture
def webhook_client(app: Flask) -> WebhookTestClient:
    """A client that posts signed events to ``app`` and runs its handlers inline."""
    return WebhookTestClient(app)
