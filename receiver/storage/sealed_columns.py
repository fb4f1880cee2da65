"""Which stored columns are sealed, and how (pure: row dicts in, row dicts out).

With a data key configured (:class:`receiver.core.keyring.Keyring`):

- ``hookledger_event.body`` and ``hookledger_event_conflict.body``: sealed bytes bound to
  the event id (a body moved to another event's row does not open);
- ``.headers`` (the allowlisted request headers, JSON): a sealed token bound to the event id;
- ``.body_sha256``: HMAC-SHA-256 of the body under the row's key (``key_id``), not a plain
  hash, so a database copy cannot confirm a guessed payload; duplicates and conflicts are
  still told apart (:func:`same_body`);
- ``hookledger_event.last_error`` and ``hookledger_handler_run.last_error``: handler
  tracebacks and deferral reasons quote payload values, so they are sealed too (a deferred
  event keeps its ``deferred: `` prefix in the clear, for ``hookledger events --deferred``);
- ``hookledger_rejection.body`` (only when an operator opts in).

What the worker needs to claim and order stays readable: event id and type, object kind, id,
status and stage, times, status, attempts, leases, source, secret id.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from receiver.core.errors import BodyRedacted
from receiver.core.keyring import Keyring
from receiver.storage.sql.base import Outcomes
from receiver.storage.tables import DEFERRED_PREFIX

#: Purposes (part of each seal's associated data: a sealed value opens only as what it is).
BODY = "body"
HEADERS = "headers"
ERROR = "error"
REJECTED_BODY = "rejected-body"

#: What a redacted row's body and headers hold.
REDACTED_BODY = b""
REDACTED_HEADERS = "{}"


def seal_event_row(keyring: Keyring, values: dict[str, Any]) -> dict[str, Any]:
    """Seal an inbox row built by :func:`receiver.storage.inbox.event_row` (its ``body`` and
    ``headers`` plaintext): the body, the headers, the keyed body hash and ``key_id``."""
    body: bytes = values["body"]
    event_id: str = values["event_id"]
    key_id = keyring.primary
    values["key_id"] = key_id
    if key_id is None:
        return values  # no data key: today's plaintext row (body_sha256 is plain SHA-256)
    values["body_sha256"] = keyring.digest(body, key_id)
    values["body"] = keyring.seal(body, purpose=BODY, context=event_id)
    values["headers"] = keyring.seal_text(values["headers"], purpose=HEADERS, context=event_id)
    return values


def same_body(
    keyring: Keyring, stored_key_id: str | None, stored_digest: str, values: dict[str, Any]
) -> bool | None:
    """Whether the row ``values`` (as :func:`seal_event_row` left it) has the same body as a
    stored row with ``stored_digest`` under ``stored_key_id``; ``None`` when that cannot be
    told (the stored row's key is not configured any more)."""
    if stored_key_id == values.get("key_id"):
        return bool(stored_digest == values["body_sha256"])
    if stored_key_id is not None and not keyring.has(stored_key_id):
        return None
    body = keyring.open(values["body"], purpose=BODY, context=values["event_id"])
    return bool(stored_digest == keyring.digest(body, stored_key_id))


def open_body(keyring: Keyring, body: bytes, event_id: str) -> bytes:
    """The plaintext of a stored body. Raises :class:`BodyRedacted` for a redacted one, or
    :class:`receiver.core.errors.DataUnavailable` when it cannot be opened."""
    if body == REDACTED_BODY:
        raise BodyRedacted()
    return keyring.open(body, purpose=BODY, context=event_id)


def open_headers(keyring: Keyring, headers: str, event_id: str) -> dict[str, str]:
    """The stored headers of an event (``{}`` once redacted). Raises when sealed headers
    cannot be opened."""
    text = keyring.open_text_strict(headers, purpose=HEADERS, context=event_id)
    loaded: dict[str, str] = json.loads(text)
    return loaded


def seal_error(keyring: Keyring, text: str | None) -> str | None:
    """An error text as stored (sealed, but a ``deferred: `` prefix)."""
    if text is None:
        return None
    return keyring.seal_text(text, purpose=ERROR, keep_prefix=DEFERRED_PREFIX)


def open_error(keyring: Keyring, text: str | None) -> str | None:
    """A stored error text for reading; a part that cannot be opened says why instead."""
    if text is None:
        return None
    return keyring.open_text(text, purpose=ERROR)


def seal_outcomes(keyring: Keyring, outcomes: Outcomes) -> Outcomes:
    """A dispatched batch's outcomes with their error texts sealed (the events' final
    ``last_error`` and the ledger rows'); unchanged without a data key."""
    if not keyring.enabled:
        return outcomes
    finals = [
        {**row, "b_error": seal_error(keyring, row["b_error"])} if row["b_error"] else row
        for row in outcomes.finals
    ]
    ledger = [
        {**row, "last_error": seal_error(keyring, row["last_error"])} if row["last_error"] else row
        for row in outcomes.ledger
    ]
    return replace(outcomes, finals=finals, ledger=ledger)
