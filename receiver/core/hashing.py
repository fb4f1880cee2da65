"""Hashing a webhook body while keeping the GIL.

CPython's ``hashlib`` (and ``hmac``) releases the GIL while it hashes 2,048 bytes or more in
one call, so that other threads may run meanwhile. For a webhook body of a few kilobytes the
hashing takes a few microseconds, and the release is all cost: on a web worker whose other
threads are busy, the thread that let go then waits for the GIL to come back, and each hand-over
is a context switch (a delivery hashes its body two or three times: the signature, the stored
body hash). Fed in pieces under that size, the same digest is computed holding the GIL. A body
large enough for the hashing to be worth sharing the machine is still hashed in one call.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

#: hashlib keeps the GIL for an update shorter than this (``HASHLIB_GIL_MINSIZE``, 2,048).
PIECE = 2047
#: Above this, hashed in one call (the GIL released: long enough to be worth it).
KEEP_GIL_UP_TO = 64 * 1024


class _Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...


H = TypeVar("H", bound=_Hasher)


def feed(hasher: H, data: bytes) -> H:
    """``hasher.update(data)``, holding the GIL unless ``data`` is large; returns ``hasher``."""
    if len(data) <= PIECE or len(data) > KEEP_GIL_UP_TO:
        hasher.update(data)
        return hasher
    view = memoryview(data)
    for start in range(0, len(view), PIECE):
        hasher.update(view[start : start + PIECE])
    return hasher
