"""Helpers of the hardening suite: wire counters, the documented frame layout, polling."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any

import pytest


def wire_stats(procs: Any) -> Any:
    """The controller's wire counters (a WireStats snapshot), through the public API."""
    return procs.status().wire


# The envelope of the wire format, as documented in monarch_nb/_common/_wire.py:
#   signature(32) | sequence(8) | meta length(4) | meta | payload
# with the HMAC-SHA256 over everything after the signature, then over each
# further frame prefixed by its length (8 bytes, little endian).
SIG_BYTES, SEQ_BYTES, META_LEN_BYTES = 32, 8, 4
PREFIX_BYTES = SIG_BYTES + SEQ_BYTES + META_LEN_BYTES


def envelope(signature: bytes, sequence: int, meta: bytes, payload: bytes = b"") -> bytes:
    """Raw envelope bytes with the given (possibly bogus) signature."""
    return (
        signature
        + sequence.to_bytes(SEQ_BYTES, "little")
        + len(meta).to_bytes(META_LEN_BYTES, "little")
        + meta
        + payload
    )


def sign_raw(key: bytes, sequence: int, meta: bytes, buffers: tuple[bytes, ...] = ()) -> list:
    """A correctly signed multipart message built from raw bytes (small buffers only)."""
    unsigned = envelope(b"", sequence, meta)
    mac = hmac.new(key, unsigned, hashlib.sha256)
    for frame in buffers:
        mac.update(len(frame).to_bytes(8, "little"))
        mac.update(frame)
    return [mac.digest() + unsigned, *buffers]


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it is truthy (returned), failing after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)
