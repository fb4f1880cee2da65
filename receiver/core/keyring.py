"""Data at rest: AES-256-GCM under data keys identified by id, and the keyed body hash (pure:
no I/O, no clock, no configuration read).

The inbox keeps what it must (the raw bytes, for audit, re-verification and replay) and keeps
it sealed. A :class:`Keyring` holds the configured data keys (``HOOKLEDGER_DATA_KEYS``,
``"k2:<base64>,k1:<base64>"``); the **first** is the primary: new data is sealed with it,
and data sealed with any configured key is opened.

Why AES-256-GCM rather than Fernet: GCM authenticates *associated data*, so a body is bound
to the event it belongs to (its ``event_id``) and a ciphertext moved to another row by
someone who can write to the database does not open; the sealed blob carries the key id in
the clear, so rotation knows what to re-seal without trying keys; it is 256-bit, with a
28-byte overhead and no base64 inflation for binary columns. Fernet is AES-128-CBC with
HMAC, base64 text, a timestamp we have no use for, and no associated data.

Each configured key is a 32-byte master key. Three sub-keys are derived from it with HKDF
(SHA-256), so no key is used for two purposes: one encrypts (AES-256-GCM, a random 96-bit
nonce per message), one keys the body hash (HMAC-SHA-256), one keys the order index's
digests of the shop's order references (HMAC-SHA-256, :mod:`receiver.core.order_refs`).
The body hash detects a re-delivery of the same event with another body; unkeyed, it would
let anyone holding a database copy confirm a guessed payload ("did customer X pay 49.00 on
day Y?"), keyed it does not; the order index's digests likewise name no order.

Formats:

- bytes (bodies): ``b"\\x00HL" + version (1) + len(key id) + key id + nonce (12) +
  ciphertext and tag``. A JSON body never starts with NUL, so a stored body that does not
  start with the magic is a plaintext body from before encryption was turned on;
- text (error texts, headers): tokens ``{enc1:<key id>:<base64url(nonce + ciphertext)>}``
  that may sit inside plaintext (``"deferred: {enc1:...}"``), so hookledger's own words
  around them stay searchable.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from receiver.core.errors import ConfigurationError, DataKeyMissing, DataNotAuthentic
from receiver.core.hashing import feed

#: Bytes of a data key (AES-256).
KEY_BYTES = 32
#: What a sealed body starts with (a JSON body never starts with NUL).
MAGIC = b"\x00HL"
VERSION = 1
NONCE_BYTES = 12
#: Key ids: short, and safe inside text tokens and SQL ``LIKE`` patterns (after escaping).
KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
#: A sealed piece of text.
TOKEN = re.compile(r"\{enc1:([A-Za-z0-9_.-]{1,32}):([A-Za-z0-9_-]+)\}")
TOKEN_START = "{enc1:"

_ENCRYPT_INFO = b"hookledger/v1/encrypt"
_HASH_INFO = b"hookledger/v1/body-hash"
_REFERENCE_INFO = b"hookledger/v1/order-reference"


def generate_key() -> str:
    """A new random data key, base64 (as ``HOOKLEDGER_DATA_KEYS`` takes it)."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode("ascii")


def _derive(master: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(master)


@dataclass(frozen=True, slots=True)
class DataKey:
    """A 32-byte data key with an id. The key never appears in reprs or messages."""

    id: str
    value: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not KEY_ID.match(self.id):
            shown = self.id[:40] if isinstance(self.id, str) else type(self.id).__name__
            raise ConfigurationError(
                f"data key id {shown!r} must be 1 to 32 letters, digits, '_', '.' or '-'"
            )
        if not isinstance(self.value, bytes) or len(self.value) != KEY_BYTES:
            raise ConfigurationError(
                f"data key {self.id!r} must be {KEY_BYTES} bytes (base64 of 32 random bytes: "
                "`hookledger keys new` prints one)"
            )

    @classmethod
    def of(cls, key_id: str, encoded: str | bytes) -> DataKey:
        """A key from configuration: ``encoded`` is base64 (standard or URL-safe, padding
        optional) of 32 bytes; a ``bytes`` value is taken as it is."""
        key_id = key_id.strip()
        if isinstance(encoded, bytes):
            return cls(key_id, encoded)
        text = encoded.strip()
        try:
            raw = base64.urlsafe_b64decode(
                text.replace("+", "-").replace("/", "_") + "=" * (-len(text) % 4)
            )
        except (binascii.Error, ValueError):
            raise ConfigurationError(f"data key {key_id!r} is not valid base64") from None
        return cls(key_id, raw)


def parse_data_keys(spec: str | Mapping[str, str | bytes] | Iterable[DataKey] | None) -> Keyring:
    """The keyring of ``HOOKLEDGER_DATA_KEYS``: ``"id:base64,id2:base64"`` (the first is the
    primary), a mapping ``{id: key}`` (in order) or :class:`DataKey` objects. Raises
    :class:`ConfigurationError` in one line that never shows a key."""
    if spec is None:
        return Keyring()
    keys: list[DataKey] = []
    if isinstance(spec, str):
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            key_id, sep, value = part.partition(":")
            if not sep:
                raise ConfigurationError(
                    "HOOKLEDGER_DATA_KEYS takes 'id:base64key' entries, comma-separated"
                )
            keys.append(DataKey.of(key_id, value))
    elif isinstance(spec, Mapping):
        keys = [DataKey.of(k, v) for k, v in spec.items()]
    else:
        for key in spec:
            if not isinstance(key, DataKey):
                raise ConfigurationError(
                    "data keys must be a string 'id:base64,...', a mapping or DataKey objects"
                )
            keys.append(key)
    return Keyring(keys)


@dataclass(frozen=True, slots=True)
class _Derived:
    aead: AESGCM
    hash_key: bytes
    reference_key: bytes


class Keyring:
    """The configured data keys; the first is the primary.

    Without keys (``Keyring()``) nothing is sealed: :meth:`seal` returns its input and the
    body hash is plain SHA-256, as before encryption existed. Opening accepts plaintext
    (rows written before encryption was turned on) and anything sealed with a configured key.
    """

    __slots__ = ("_derived", "_ids", "primary")

    def __init__(self, keys: Sequence[DataKey] = ()) -> None:
        ids = [k.id for k in keys]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ConfigurationError(
                f"data key ids must be unique: {', '.join(map(repr, repeated))} repeated"
            )
        self._ids: tuple[str, ...] = tuple(ids)
        self._derived: dict[str, _Derived] = {
            k.id: _Derived(
                aead=AESGCM(_derive(k.value, _ENCRYPT_INFO)),
                hash_key=_derive(k.value, _HASH_INFO),
                reference_key=_derive(k.value, _REFERENCE_INFO),
            )
            for k in keys
        }
        #: The id of the key new data is sealed with (``None``: no key, nothing sealed).
        self.primary: str | None = ids[0] if ids else None

    def __repr__(self) -> str:
        return f"Keyring(ids={list(self._ids)!r}, primary={self.primary!r})"

    @property
    def enabled(self) -> bool:
        """Whether data is sealed (a key is configured)."""
        return self.primary is not None

    @property
    def ids(self) -> tuple[str, ...]:
        """The configured key ids, primary first."""
        return self._ids

    def has(self, key_id: str | None) -> bool:
        return key_id is not None and key_id in self._derived

    # -- bytes ----------------------------------------------------------------------------

    def seal(self, plaintext: bytes, *, purpose: str, context: str = "") -> bytes:
        """``plaintext`` sealed with the primary key, bound to ``purpose`` and ``context``
        (the event id): it opens only with the same two. Without a key, ``plaintext``."""
        if self.primary is None:
            return plaintext
        header = MAGIC + bytes((VERSION, len(self.primary))) + self.primary.encode("ascii")
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._derived[self.primary].aead.encrypt(
            nonce, plaintext, header + _aad(purpose, context)
        )
        return header + nonce + sealed

    def open(self, data: bytes, *, purpose: str, context: str = "") -> bytes:
        """The plaintext of ``data`` (``data`` itself when it was never sealed).

        Raises :class:`DataKeyMissing` when its key is not configured and
        :class:`DataNotAuthentic` when it does not open (a wrong key value, altered data, or
        a ciphertext moved to another row)."""
        key_id = sealed_with(data)
        if key_id is None:
            return bytes(data)
        derived = self._derived.get(key_id)
        if derived is None:
            raise DataKeyMissing(key_id)
        start = len(MAGIC) + 2 + len(key_id)
        header, nonce = data[:start], data[start : start + NONCE_BYTES]
        try:
            return derived.aead.decrypt(
                nonce, bytes(data[start + NONCE_BYTES :]), bytes(header) + _aad(purpose, context)
            )
        except InvalidTag:
            raise DataNotAuthentic(key_id) from None

    # -- text -----------------------------------------------------------------------------

    def seal_text(
        self, text: str, *, purpose: str, context: str = "", keep_prefix: str = ""
    ) -> str:
        """``text`` as one token sealed with the primary key, bound to ``purpose`` and
        ``context`` (unchanged without a key). A ``keep_prefix`` it starts with stays in the
        clear before the token (so that, say, ``deferred: `` stays searchable)."""
        if self.primary is None or not text:
            return text
        prefix = keep_prefix if keep_prefix and text.startswith(keep_prefix) else ""
        rest = text[len(prefix) :]
        if not rest:
            return text
        return prefix + self._token(rest, purpose, context)

    def open_text(self, text: str, *, purpose: str, context: str = "") -> str:
        """``text`` with each sealed token replaced by its plaintext. Never raises: a token
        that cannot be opened is replaced by a note saying why (for listings)."""
        if TOKEN_START not in text:
            return text

        def opened(match: re.Match[str]) -> str:
            try:
                return self._open_token(match, purpose, context)
            except DataKeyMissing as exc:
                return f"[sealed with data key {exc.key_id!r}, which is not configured]"
            except DataNotAuthentic as exc:
                return f"[sealed text that does not open with data key {exc.key_id!r}]"

        return TOKEN.sub(opened, text)

    def open_text_strict(self, text: str, *, purpose: str, context: str = "") -> str:
        """Like :meth:`open_text`, but a token that does not open raises as :meth:`open`."""
        if TOKEN_START not in text:
            return text
        return TOKEN.sub(lambda match: self._open_token(match, purpose, context), text)

    def reseal_text(
        self, text: str, *, purpose: str, context: str = "", keep_prefix: str = ""
    ) -> tuple[str, bool]:
        """``text`` with every token sealed by another key than the primary sealed again by
        the primary, and plaintext (no token at all) sealed; returns ``(text, changed)``.
        Raises like :meth:`open` for a token that does not open."""
        if self.primary is None:
            return text, False
        if TOKEN_START not in text:
            sealed = self.seal_text(text, purpose=purpose, context=context, keep_prefix=keep_prefix)
            return sealed, sealed != text
        changed = False

        def again(match: re.Match[str]) -> str:
            nonlocal changed
            if match.group(1) == self.primary:
                return match.group(0)
            changed = True
            return self._token(self._open_token(match, purpose, context), purpose, context)

        return TOKEN.sub(again, text), changed

    def _token(self, text: str, purpose: str, context: str) -> str:
        assert self.primary is not None
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._derived[self.primary].aead.encrypt(
            nonce,
            text.encode("utf-8", "surrogatepass"),
            _text_aad(self.primary, purpose, context),
        )
        encoded = base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=").decode("ascii")
        return f"{{enc1:{self.primary}:{encoded}}}"

    def _open_token(self, match: re.Match[str], purpose: str, context: str) -> str:
        key_id, encoded = match.group(1), match.group(2)
        derived = self._derived.get(key_id)
        if derived is None:
            raise DataKeyMissing(key_id)
        try:
            raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            plain = derived.aead.decrypt(
                raw[:NONCE_BYTES], raw[NONCE_BYTES:], _text_aad(key_id, purpose, context)
            )
            return plain.decode("utf-8", "surrogatepass")
        except (InvalidTag, binascii.Error, ValueError):
            raise DataNotAuthentic(key_id) from None

    # -- the body hash --------------------------------------------------------------------

    def digest(self, body: bytes, key_id: str | None) -> str:
        """The body hash stored with a row: HMAC-SHA-256 under ``key_id``'s hash key, or
        plain SHA-256 for ``None`` (no key). Raises :class:`DataKeyMissing` for a key id
        that is not configured."""
        if key_id is None:
            return feed(hashlib.sha256(), body).hexdigest()
        derived = self._derived.get(key_id)
        if derived is None:
            raise DataKeyMissing(key_id)
        return feed(hmac.new(derived.hash_key, None, hashlib.sha256), body).hexdigest()

    # -- the order index ------------------------------------------------------------------

    def reference_digest(self, reference: str, key_id: str | None) -> str:
        """What the order index stores for a shop's order reference
        (:mod:`receiver.core.order_refs`): HMAC-SHA-256 under ``key_id``'s reference key (a
        key of its own, derived for this purpose alone), or plain SHA-256 for ``None`` (no
        data key: the bodies it comes from are in the clear too). Raises
        :class:`DataKeyMissing` for a key id that is not configured."""
        data = reference.encode("utf-8", "surrogatepass")
        if key_id is None:
            return hashlib.sha256(data).hexdigest()
        derived = self._derived.get(key_id)
        if derived is None:
            raise DataKeyMissing(key_id)
        return hmac.digest(derived.reference_key, data, "sha256").hex()

    def reference_digests(self, reference: str) -> dict[str | None, str]:
        """The digests ``reference`` may be indexed under: one per configured key, and the
        plain one (rows indexed before a data key was configured)."""
        keys: list[str | None] = [*self._ids, None]
        return {key_id: self.reference_digest(reference, key_id) for key_id in keys}


def sealed_with(data: bytes | None) -> str | None:
    """The id of the key ``data`` was sealed with (``None``: plaintext, or nothing)."""
    if not data or data[: len(MAGIC)] != MAGIC or len(data) < len(MAGIC) + 2:
        return None
    size = data[len(MAGIC) + 1]
    raw = data[len(MAGIC) + 2 : len(MAGIC) + 2 + size]
    try:
        return bytes(raw).decode("ascii")
    except UnicodeDecodeError:
        return "?"


def _aad(purpose: str, context: str) -> bytes:
    return purpose.encode("ascii") + b"\x00" + context.encode("utf-8", "surrogatepass")


def _text_aad(key_id: str, purpose: str, context: str) -> bytes:
    return b"enc1\x00" + key_id.encode("ascii") + b"\x00" + _aad(purpose, context)


__all__ = [
    "KEY_BYTES",
    "DataKey",
    "Keyring",
    "generate_key",
    "parse_data_keys",
    "sealed_with",
]
