"""Webhook signatures: HMAC-SHA512 over the exact raw body bytes (pure, no I/O).

The processor (Hyperswitch) sends ``X-Webhook-Signature-512: <hex(HMAC-SHA512(key, body))>``
with a lowercase, 128-character hex digest, no prefix and no timestamp. The key is the
business profile's ``payment_response_hash_key`` used as its UTF-8 bytes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from receiver.errors import ConfigurationError, SignatureError

SIGNATURE_HEADER = "X-Webhook-Signature-512"
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_SIGNATURE_LENGTH = 128


@dataclass(frozen=True, slots=True)
class Secret:
    """A signing secret with an id (for rotation telemetry). The value never appears in reprs."""

    id: str
    value: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not self.id:
            raise ConfigurationError("a webhook secret needs a non-empty id")
        if not self.value:
            raise ConfigurationError(f"webhook secret {self.id!r} is empty")

    @classmethod
    def of(cls, secret_id: str, value: str | bytes) -> Secret:
        return cls(secret_id, value.encode("utf-8") if isinstance(value, str) else value)


def sign(body: bytes, secret: str | bytes | Secret) -> str:
    """Return the lowercase hex HMAC-SHA512 of ``body`` as the processor sends it."""
    key = (
        secret.value
        if isinstance(secret, Secret)
        else (secret.encode("utf-8") if isinstance(secret, str) else secret)
    )
    return hmac.new(key, body, hashlib.sha512).hexdigest()


def parse_secrets(spec: str | Mapping[str, str] | Iterable[Secret] | None) -> tuple[Secret, ...]:
    """Turn configuration into secrets.

    Accepts a mapping ``{id: secret}``, an iterable of :class:`Secret`, or a string
    ``"id1:secret1,id2:secret2"`` (a bare ``"secret"`` gets the id ``default``).
    """
    if spec is None:
        return ()
    if isinstance(spec, str):
        secrets: list[Secret] = []
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            secret_id, sep, value = part.partition(":")
            secrets.append(Secret.of(secret_id, value) if sep else Secret.of("default", part))
        found: tuple[Secret, ...] = tuple(secrets)
    elif isinstance(spec, Mapping):
        found = tuple(Secret.of(k, v) for k, v in spec.items())
    else:
        found = tuple(spec)
    ids = [s.id for s in found]
    if len(set(ids)) != len(ids):
        raise ConfigurationError("webhook secret ids must be unique")
    return found


def verify(body: bytes, signature: str | None, secrets: Iterable[Secret]) -> str:
    """Verify ``signature`` over ``body`` against every secret; return the matching secret's id.

    Every secret is compared in constant time (no early exit on a match, so timing does not
    reveal which secret matched). Upper-case hex is accepted. Raises :class:`SignatureError`.
    """
    candidates = tuple(secrets)
    if not candidates:
        raise ConfigurationError("no webhook secret is configured")
    if signature is None or not signature.strip():
        raise SignatureError("missing X-Webhook-Signature-512 header")
    given = signature.strip()
    if len(given) != _SIGNATURE_LENGTH or not _HEX_DIGITS.issuperset(given):
        raise SignatureError("malformed X-Webhook-Signature-512 header")
    given_bytes = given.lower().encode("ascii")
    matched: str | None = None
    for secret in candidates:
        expected = sign(body, secret).encode("ascii")
        if hmac.compare_digest(expected, given_bytes) and matched is None:
            matched = secret.id
    if matched is None:
        raise SignatureError("signature does not match any configured secret")
    return matched
