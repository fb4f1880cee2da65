"""Errors the sandbox processor answers with, in the processor's shape.

Every rejected request answers ``{"error": {"type", "code", "message"}}`` with the codes of the
processor interface (``processor-interface.md``, Errors):

=========  ======  ====================  =====================================================
code       status  type                  when
=========  ======  ====================  =====================================================
AU_01      401     authentication_error  ``api-key`` header missing or wrong
IR_01      400     invalid_request       a required field is missing
IR_04      400     invalid_request       a field has an invalid value (also bad JSON, unknown
                                         query parameters, limits out of range)
IR_05      404     invalid_request       the resource does not exist
IR_02      404     invalid_request       no such route
IR_03      405     invalid_request       the method is not allowed on that route
HE_01      400     invalid_request       ``payment_id`` / ``refund_id`` / ``payout_id`` /
                                         ``customer_id`` already exists (the first request was
                                         received; read the resource)
HE_00      400/409 invalid_request       the request conflicts with the resource's state (for
                                         example capturing a cancelled payment: 409)
RL_01      429     rate_limit_error      rate limit exceeded (real window or injected fault)
CE_01      5xx     connector_error       processor unavailable (injected fault)
=========  ======  ====================  =====================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from receiver.core.errors import HookledgerError


class SandboxError(HookledgerError):
    """The sandbox processor rejected the request."""

    def __init__(
        self,
        status: int,
        code: str,
        error_type: str,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.error_type = error_type
        self.headers: dict[str, str] = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON error body, ``{"error": {"type", "code", "message"}}``."""
        return {"error": {"type": self.error_type, "code": self.code, "message": self.message}}

    def __repr__(self) -> str:
        return f"SandboxError({self.status}, {self.code!r}, {self.message!r})"


def missing(field: str) -> SandboxError:
    """IR_01: a required field is missing."""
    return SandboxError(400, "IR_01", "invalid_request", f"Missing required param: {field}")


def invalid(message: str) -> SandboxError:
    """IR_04: a field holds an invalid value."""
    return SandboxError(400, "IR_04", "invalid_request", message)


def not_found(resource: str) -> SandboxError:
    """IR_05: the resource does not exist (404)."""
    return SandboxError(
        404, "IR_05", "invalid_request", f"{resource} does not exist in our records"
    )


def duplicate(message: str) -> SandboxError:
    """HE_01: the caller-supplied id is already taken."""
    return SandboxError(400, "HE_01", "invalid_request", message)


def conflict(message: str, status: int = 400) -> SandboxError:
    """HE_00: the request conflicts with the resource's current state."""
    return SandboxError(status, "HE_00", "invalid_request", message)


def unauthorized() -> SandboxError:
    """AU_01: the ``api-key`` header is missing or wrong."""
    return SandboxError(
        401, "AU_01", "authentication_error", "API key not provided or invalid API key used"
    )


def rate_limited(limit: int, reset_at: int, retry_after: int) -> SandboxError:
    """RL_01 (429) with ``Retry-After`` and ``X-RateLimit-*`` headers."""
    return SandboxError(
        429,
        "RL_01",
        "rate_limit_error",
        "Rate limit exceeded, retry after the reset time",
        headers={
            "Retry-After": str(max(retry_after, 0)),
            "X-RateLimit-Limit": str(limit),
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": str(reset_at),
        },
    )


def processor_unavailable(status: int) -> SandboxError:
    """CE_01 (500/502/503): the processor is unavailable."""
    return SandboxError(
        status, "CE_01", "connector_error", "Processor unavailable, retry the request later"
    )
