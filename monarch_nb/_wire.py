"""Signed multipart messages over pyzmq.

A message is the frames ``[signature, sequence, meta, payload, *buffers]``:

- ``meta`` is a small pickle of plain types (what to do, call id, names), so a
  receiver can always answer "which call failed" even if the payload cannot be
  unpickled;
- ``payload`` is the (cloud)pickle of the arguments or value, and ``buffers``
  are its out-of-band frames (tensors, arrays, large bytes);
- ``signature`` is HMAC-SHA256 over every other frame, each prefixed by its
  length so frame boundaries cannot be shifted; ``sequence`` is the sender's
  message counter and must grow per sender, which stops replays.

Nothing is unpickled before the signature and the sequence check pass; frames
that fail are dropped and counted in :class:`WireStats`. A message is encoded
(pickled and signed) once, however many ranks it is sent to.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import pickle
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._serialize import dumps, loads

KEY_BYTES = 32
_SIG_BYTES = 32
_SEQ_BYTES = 8
_HEAD_FRAMES = 4  # signature, sequence, meta, payload


def new_key() -> bytes:
    """A fresh random per-mesh signing key."""
    return secrets.token_bytes(KEY_BYTES)


@dataclass
class WireStats:
    """Counters of one endpoint of the wire (mutable; snapshot with ``snapshot()``)."""

    encoded: int = 0  # messages pickled and signed
    sent: int = 0  # messages handed to a socket (a cast to N ranks counts N)
    received: int = 0  # messages that passed every check
    dropped_malformed: int = 0  # too few frames, or wrong sizes: not signed by us
    dropped_bad_signature: int = 0  # signature did not match the key
    dropped_replayed: int = 0  # signature fine but sequence number not fresh
    dropped_unknown_peer: int = 0  # identity not of any mesh we run
    bytes_in_band: int = 0  # pickle bytes encoded
    bytes_out_of_band: int = 0  # buffer bytes encoded as their own frames

    def snapshot(self) -> WireStats:
        return WireStats(**self.__dict__)


class Encoded:
    """A signed message ready to send any number of times."""

    __slots__ = ("frames", "nbytes")

    def __init__(self, frames: list[Any], nbytes: int) -> None:
        self.frames = frames
        self.nbytes = nbytes


class Signer:
    """Signs and verifies messages with one key; tracks the send sequence."""

    def __init__(self, key: bytes, stats: WireStats) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"signing key must be {KEY_BYTES} bytes, got {len(key)}")
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self._sequence = itertools.count(1)
        self.stats = stats

    def _digest(self, frames: Sequence[Any]) -> bytes:
        mac = self._mac.copy()
        for frame in frames:
            view = memoryview(frame)
            mac.update(view.nbytes.to_bytes(8, "little"))
            mac.update(view)
        return mac.digest()

    def encode(self, meta: tuple, payload: Any = None, *, by_value: bool = True) -> Encoded:
        """Pickle and sign a message once; raises whatever pickling raises."""
        meta_bytes = pickle.dumps(meta, protocol=5)
        if payload is None:
            body, buffers = b"", []
        else:
            body, buffers = dumps(payload, by_value=by_value)
        raw = [b.raw() for b in buffers]
        sequence = next(self._sequence).to_bytes(_SEQ_BYTES, "little")
        signed = [sequence, meta_bytes, body, *raw]
        frames = [self._digest(signed), *signed]
        oob = sum(r.nbytes for r in raw)
        self.stats.encoded += 1
        self.stats.bytes_in_band += len(body) + len(meta_bytes)
        self.stats.bytes_out_of_band += oob
        return Encoded(frames, len(body) + oob)

    def verify(self, frames: Sequence[Any], last_sequence: int) -> tuple[int, tuple] | None:
        """Check signature and freshness; returns ``(sequence, meta)`` or None (counted).

        ``frames`` are ``zmq.Frame`` objects or buffers, identity already removed.
        """
        if len(frames) < _HEAD_FRAMES:
            self.stats.dropped_malformed += 1
            return None
        signature, sequence = memoryview(frames[0]), memoryview(frames[1])
        if signature.nbytes != _SIG_BYTES or sequence.nbytes != _SEQ_BYTES:
            self.stats.dropped_malformed += 1
            return None
        if not hmac.compare_digest(self._digest(frames[1:]), signature):
            self.stats.dropped_bad_signature += 1
            return None
        number = int.from_bytes(sequence, "little")
        if number <= last_sequence:
            self.stats.dropped_replayed += 1
            return None
        self.stats.received += 1
        return number, pickle.loads(memoryview(frames[2]))


def decode_payload(frames: Sequence[Any]) -> Any:
    """Unpickle the payload of a verified message (buffers stay zero-copy)."""
    body = memoryview(frames[3])
    if body.nbytes == 0:
        return None
    return loads(body, [memoryview(f) for f in frames[4:]])
