"""Helpers of the hardening suite: wire counters, the documented frame layout, polling."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from polling import wait_until  # noqa: F401  (the chaos tests import it from here)


def wire_stats(procs: Any) -> Any:
    """The controller's wire counters (a WireStats snapshot), through the public API."""
    return procs.status().wire


# The wire format, as documented in monarch_nb/_common/_wire.py:
#   header = signature(32) | sequence(8);  body = meta length(4) | meta | payload
# in one frame (header + body), then one frame per buffer. The signature is
# HMAC-SHA256(key, sequence | content digest), the content digest SHA-256 over
# the body and each buffer, each prefixed by its length (8 bytes, little endian).
SIG_BYTES, SEQ_BYTES, META_LEN_BYTES = 32, 8, 4
PREFIX_BYTES = SIG_BYTES + SEQ_BYTES + META_LEN_BYTES


def envelope(signature: bytes, sequence: int, meta: bytes, payload: bytes = b"") -> bytes:
    """Raw first-frame bytes with the given (possibly bogus) signature."""
    return signature + sequence.to_bytes(SEQ_BYTES, "little") + _body(meta, payload)


def _body(meta: bytes, payload: bytes = b"") -> bytes:
    return len(meta).to_bytes(META_LEN_BYTES, "little") + meta + payload


def sign_raw(key: bytes, sequence: int, meta: bytes, buffers: tuple[bytes, ...] = ()) -> list:
    """A correctly signed multipart message built from raw bytes (small buffers only)."""
    content = hashlib.sha256()
    for frame in (_body(meta), *buffers):
        content.update(len(frame).to_bytes(8, "little"))
        content.update(frame)
    number = sequence.to_bytes(SEQ_BYTES, "little")
    signature = hmac.new(key, number + content.digest(), hashlib.sha256).digest()
    return [envelope(signature, sequence, meta), *buffers]
