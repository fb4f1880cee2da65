"""Hashing in pieces (keeping the GIL) gives the same digests as hashing at once."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from receiver.core.hashing import KEEP_GIL_UP_TO, PIECE, feed
from receiver.core.keyring import DataKey, Keyring
from receiver.core.signature import sign
from receiver.storage.inbox import body_sha256

SIZES = [0, 1, PIECE - 1, PIECE, PIECE + 1, 2 * PIECE, 3220, KEEP_GIL_UP_TO, KEEP_GIL_UP_TO + 1]


@pytest.mark.parametrize("size", SIZES)
def test_the_digests_are_those_of_one_call(size: int) -> None:
    body = bytes((i * 7 + 3) % 256 for i in range(size))
    assert feed(hashlib.sha256(), body).hexdigest() == hashlib.sha256(body).hexdigest()
    assert body_sha256(body) == hashlib.sha256(body).hexdigest()
    key = b"whsec_test"
    assert sign(body, key) == hmac.new(key, body, hashlib.sha512).hexdigest()
    assert Keyring().digest(body, None) == hashlib.sha256(body).hexdigest()
    ring = Keyring((DataKey("k1", bytes(range(32))),))
    hash_key = ring._derived["k1"].hash_key
    assert ring.digest(body, "k1") == hmac.new(hash_key, body, hashlib.sha256).hexdigest()
