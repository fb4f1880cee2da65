"""Sending one webhook attempt, and what came back: a POST with ``requests`` (the threaded
mode) or a call of the clock-driven mode's sender (``send(url, body: bytes, headers:
dict[str, str]) -> int`` answering the HTTP status, raising for a transport failure).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import requests

from reconcile.sandbox.webhooks.envelope import request_headers

#: How much of a receiver's answer is kept per attempt.
MAX_RESPONSE_BODY: Final = 4096

#: ``send(url, body, headers) -> HTTP status`` (raise for a transport failure).
Sender = Callable[[str, bytes, dict[str, str]], int]


@dataclass(slots=True)
class Outcome:
    """What one attempt got: the status, the answer's body and headers, or the failure."""

    status_code: int | None = None
    body: str | None = None
    headers: list[tuple[str, str]] | None = None
    error: str | None = None


def post(
    session: requests.Session, url: str, body: bytes, signature: str, timeout: float
) -> Outcome:
    """POST once with ``requests``; the answer or the transport failure."""
    try:
        with session.post(
            url,
            data=body,
            headers=request_headers(signature),
            timeout=timeout,
            allow_redirects=False,
        ) as response:
            return Outcome(
                status_code=response.status_code,
                body=response.text[:MAX_RESPONSE_BODY],
                headers=list(response.headers.items()),
            )
    except requests.RequestException as exc:
        return Outcome(error=type(exc).__name__)


def send_with(sender: Sender, url: str | None, body: bytes, signature: str) -> Outcome:
    """Send once with a clock-driven mode's sender; the status or the failure."""
    if url is None:
        return Outcome(error="no webhook URL is configured")
    try:
        status = sender(url, body, request_headers(signature))
    except Exception as exc:  # noqa: BLE001 - any failure of the transport is a failed attempt
        return Outcome(error=type(exc).__name__)
    return Outcome(status_code=int(status))
