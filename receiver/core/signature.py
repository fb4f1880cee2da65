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

from receiver.core.errors import (
    ConfigurationError,
    SignatureError,
    SignatureMalformed,
    SignatureMissing,
)
from receiver.core.hashing import feed

SIGNATURE_HEADER = "X-Webhook-Signature-512"
_SIGNATURE_LENGTH = 128


#: The longest secret id: ids are stored with each event (``secret_id``, 64 characters).
MAX_SECRET_ID_LENGTH = 64


@dataclass(frozen=True, slots=True)
class Secret:
    """A signing secret with an id (for rotation telemetry). The value never appears in reprs.

    The id must be 1 to 64 printable characters without surrounding spaces. Build secrets from
    text with :meth:`of` or :func:`parse_secrets`, which strip surrounding spaces and refuse
    empty or non-printable values; a ``bytes`` value is taken as it is (it must not be empty).
    """

    id: str
    value: bytes = field(repr=False)

    def __post_init__(self) -> None:
        _check_id(self.id)
        if not self.value:
            raise ConfigurationError(f"webhook secret {self.id!r} is empty")

    @classmethod
    def of(cls, secret_id: str, value: str | bytes) -> Secret:
        """A secret from configuration: the id and a text value are stripped of surrounding
        spaces (a key pasted as ``"primary: key"`` would otherwise never match); a text value
        must be printable."""
        secret_id = secret_id.strip() if isinstance(secret_id, str) else secret_id
        if isinstance(value, str):
            value = value.strip()
            _check_id(secret_id)
            if value and not value.isprintable():
                raise ConfigurationError(
                    f"webhook secret {secret_id!r} contains a non-printable character"
                )
            value = value.encode("utf-8")
        return cls(secret_id, value)


def _check_id(secret_id: object) -> None:
    if not isinstance(secret_id, str) or not secret_id.strip():
        raise ConfigurationError("a webhook secret needs a non-empty id")
    if len(secret_id) > MAX_SECRET_ID_LENGTH:
        raise ConfigurationError(
            f"webhook secret id {secret_id[:16]!r}... is {len(secret_id)} characters long; "
            f"ids are at most {MAX_SECRET_ID_LENGTH}"
        )
    if not secret_id.isprintable():
        raise ConfigurationError(f"webhook secret id {secret_id!r} has a non-printable character")
    if secret_id != secret_id.strip():
        raise ConfigurationError(f"webhook secret id {secret_id!r} has surrounding spaces")


def sign(body: bytes, secret: str | bytes | Secret) -> str:
    """Return the lowercase hex HMAC-SHA512 of ``body`` as the processor sends it."""
    key = (
        secret.value
        if isinstance(secret, Secret)
        else (secret.encode("utf-8") if isinstance(secret, str) else secret)
    )
    return _mac(body, key).hexdigest()


def _mac(body: bytes, key: bytes) -> hmac.HMAC:
    """The HMAC-SHA512 of ``body`` under ``key`` (fed holding the GIL: see
    :mod:`receiver.core.hashing`)."""
    return feed(hmac.new(key, None, hashlib.sha512), body)


def parse_secrets(spec: str | Mapping[str, str] | Iterable[Secret] | None) -> tuple[Secret, ...]:
    """Turn configuration into secrets, or raise :class:`ConfigurationError` (one line, never
    showing a secret).

    Accepts a mapping ``{id: secret}``, an iterable of :class:`Secret`, or a string
    ``"id1:secret1,id2:secret2"`` (a bare ``"secret"`` gets the id ``default``). Ids and text
    values are stripped of surrounding spaces; empty ids or values, ids over 64 characters,
    non-printable characters and duplicate ids are refused.
    """
    if spec is None:
        return ()
    if isinstance(spec, str):
        secrets: list[Secret] = []
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue  # "a:x," or "a:x,,b:y": an empty entry, not an empty secret
            secret_id, sep, value = part.partition(":")
            secrets.append(Secret.of(secret_id, value) if sep else Secret.of("default", part))
        found: tuple[Secret, ...] = tuple(secrets)
    elif isinstance(spec, Mapping):
        found = tuple(Secret.of(k, v) for k, v in spec.items())
    else:
        found = tuple(spec)
        for secret in found:
            if not isinstance(secret, Secret):
                raise ConfigurationError(
                    "webhook secrets must be a string 'id:secret,...', a mapping or Secret objects"
                )
    ids = [s.id for s in found]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ConfigurationError(
            f"webhook secret ids must be unique: {', '.join(map(repr, duplicates))} repeated"
        )
    return found


def verify(body: bytes, signature: str | None, secrets: Iterable[Secret]) -> str:
    """Verify ``signature`` over ``body`` against every secret; return the matching secret's id.

    Every secret is compared in constant time (no early exit on a match, so timing does not
    reveal which secret matched). Upper-case hex is accepted. Raises :class:`SignatureError`.

    The digests are compared as bytes: the header's 128 hex digits decoded (case does not
    matter to ``bytes.fromhex``; 64 bytes only from 128 ASCII hex digits, white space inside
    giving fewer) against each secret's raw digest, rather than each digest written as hex
    and the header lowered and encoded to match it.
    """
    candidates = tuple(secrets)
    if not candidates:
        raise ConfigurationError("no webhook secret is configured")
    given = signature.strip() if signature is not None else ""
    if not given:
        raise SignatureMissing("missing X-Webhook-Signature-512 header")
    given_digest = b""
    if len(given) == _SIGNATURE_LENGTH:
        try:
            given_digest = bytes.fromhex(given)
        except ValueError:
            pass
    if len(given_digest) != _SIGNATURE_LENGTH // 2:
        raise SignatureMalformed("malformed X-Webhook-Signature-512 header")
    matched: str | None = None
    for secret in candidates:
        if hmac.compare_digest(_mac(body, secret.value).digest(), given_digest) and matched is None:
            matched = secret.id
    if matched is None:
        raise SignatureError("signature does not match any configured secret")
    return matched
