"""Helpers of the hardening suite: wire counters, the documented frame layout, polling."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from polling import wait_until  # noqa: F401  (the chaos tests import it from here)


def wire_stats(procs: Any) -> Any:
    """The controller's wire counters (a WireStats snapshot), through the public API."""
    return procs.status().wire


# The wire format, as documented in monarch_nb/_wire/_signed.py:
#   header = signature(32) | sequence(8) | flags(1) | sender(16)
#   body   = meta length(4) | meta | payload
# in one frame (header + body), then one frame per buffer. The signature is
# HMAC-SHA256(key, sequence | flags | sender | content digest), the content
# digest SHA-256 over the body and each buffer, each prefixed by its length
# (8 bytes, little endian). Flags: 1 upstream (a rank to its controller),
# 2 buffers by length only (trusted links); other bits are malformed. A
# sender is its routing identity if 16 bytes long, else the first 16 bytes of
# SHA-256(b"monarch_nb sender\0" + identity).
SIG_BYTES, SEQ_BYTES, FLAGS_BYTES, SENDER_BYTES, META_LEN_BYTES = 32, 8, 1, 16, 4
HEADER_BYTES = SIG_BYTES + SEQ_BYTES + FLAGS_BYTES + SENDER_BYTES
PREFIX_BYTES = HEADER_BYTES + META_LEN_BYTES
UPSTREAM, KNOWN_FLAGS = 1, 3
NOBODY = bytes(SENDER_BYTES)  # a sender tag no rank seals with


def sender_tag(identity: bytes) -> bytes:
    if len(identity) == SENDER_BYTES:
        return identity
    return hashlib.sha256(b"monarch_nb sender\0" + identity).digest()[:SENDER_BYTES]


def envelope(
    signature: bytes,
    sequence: int,
    meta: bytes,
    payload: bytes = b"",
    *,
    sender: bytes = NOBODY,
    flags: int = UPSTREAM,
) -> bytes:
    """Raw first-frame bytes with the given (possibly bogus) signature."""
    return _header(signature, sequence, flags, sender) + _body(meta, payload)


def _header(signature: bytes, sequence: int, flags: int, sender: bytes) -> bytes:
    return signature + sequence.to_bytes(SEQ_BYTES, "little") + bytes((flags,)) + sender


def _body(meta: bytes, payload: bytes = b"") -> bytes:
    return len(meta).to_bytes(META_LEN_BYTES, "little") + meta + payload


def sign_raw(
    key: bytes, sequence: int, meta: bytes, buffers: tuple[bytes, ...] = (), *, sender: bytes
) -> list:
    """A correctly signed upstream message from ``sender`` (a tag) built from raw
    bytes, its buffers hashed (small buffers only)."""
    content = hashlib.sha256()
    for frame in (_body(meta), *buffers):
        content.update(len(frame).to_bytes(8, "little"))
        content.update(frame)
    trailer = _header(b"", sequence, UPSTREAM, sender)
    signature = hmac.new(key, trailer + content.digest(), hashlib.sha256).digest()
    return [envelope(signature, sequence, meta, sender=sender), *buffers]
