"""Signed multipart messages over pyzmq.

A message is one *envelope* frame, then one frame per out-of-band buffer::

    envelope = signature(32) | sequence(8) | meta length(4) | meta | payload

- ``meta`` is a small pickle of a :mod:`._messages` message as a plain tuple
  (what to do, call id, names), so a receiver can always answer "which call
  failed" even if the payload cannot be unpickled;
- ``payload`` is the (cloud)pickle of the arguments or value; the buffer
  frames are its out-of-band buffers (tensors, arrays, large bytes);
- ``signature`` is HMAC-SHA256 over the rest of the envelope and every buffer
  frame, each buffer prefixed by its length so frame boundaries cannot be
  shifted; ``sequence`` is the sender's message counter: a receiver accepts
  each number once (:class:`ReplayWindow`), which stops replays. Two threads
  of one sender may encode in one order and send in the other, so numbers
  are accepted out of order within a window, never twice. A buffer of 8 MiB
  or more enters the HMAC as the SHA-256 digests of its 2 MiB chunks, hashed on a small thread pool
  (hashlib releases the GIL): as strong, since SHA-256 is collision
  resistant, and it uses every core on big tensors.

A small call is thus a single frame. Nothing is unpickled before the
signature and the sequence check pass; frames that fail are dropped and
counted in :class:`WireStats`. A message is encoded (pickled and signed) once,
however many ranks it is sent to.

Out-of-band buffers are sent zero-copy, straight from the caller's memory
(a copy of 64 MiB costs more than the transfer itself here). So a tensor
must not be modified until its call's future completes: modified in flight,
its frame no longer matches the signature and is dropped (and counted in
``dropped_bad_signature``).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import pickle
import secrets
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import zmq

from ._messages import Message, UnknownMessage, from_wire, to_wire
from ._serialize import dumps, loads

KEY_BYTES = 32
_SIG_BYTES = 32
_SEQ_BYTES = 8
_META_LEN_BYTES = 4
_PREFIX_BYTES = _SIG_BYTES + _SEQ_BYTES + _META_LEN_BYTES
# Frames below this are copied into zmq (cheaper than pinning a Python object).
_ZERO_COPY_BYTES = 1 << 16
# pyzmq's send_multipart combines IntFlag enums on every frame; plain ints are
# several times cheaper on the per-call path.
_SNDMORE = int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


_CHUNKED_FRAME_BYTES = 8 << 20
_CHUNK_BYTES = 2 << 20
_hash_pool: ThreadPoolExecutor | None = None
_hash_pool_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _hash_pool
    with _hash_pool_lock:
        if _hash_pool is None:
            workers = max(2, min(8, os.cpu_count() or 2))
            _hash_pool = ThreadPoolExecutor(workers, thread_name_prefix="monarch_nb-hash")
        return _hash_pool


def _chunk_digests(view: memoryview) -> bytes:
    chunks = [view[i : i + _CHUNK_BYTES] for i in range(0, view.nbytes, _CHUNK_BYTES)]
    return b"".join(_pool().map(lambda c: hashlib.sha256(c).digest(), chunks))


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
    unknown_messages: int = 0  # signed by a peer, but of a kind we do not know (reported)
    bytes_in_band: int = 0  # pickle bytes encoded
    bytes_out_of_band: int = 0  # buffer bytes encoded as their own frames

    def snapshot(self) -> WireStats:
        return WireStats(**self.__dict__)


class Encoded:
    """A signed message ready to send any number of times."""

    __slots__ = ("frames", "nbytes", "zero_copy")

    def __init__(self, frames: list[Any], nbytes: int) -> None:
        self.frames = frames
        self.nbytes = nbytes
        self.zero_copy = [memoryview(f).nbytes >= _ZERO_COPY_BYTES for f in frames]

    def send(self, socket: zmq.Socket, identity: bytes | None = None) -> None:
        """Send on ``socket`` (to ``identity`` first, for a ROUTER)."""
        send = socket.send
        if identity is not None:
            send(identity, _SNDMORE)
        last = len(self.frames) - 1
        for i, (frame, zero_copy) in enumerate(zip(self.frames, self.zero_copy, strict=True)):
            send(frame, _SNDMORE if i < last else 0, copy=not zero_copy)


def receive(socket: zmq.Socket) -> list[zmq.Frame] | None:
    """One whole multipart message without blocking, or None if none is waiting.

    Asks ``ZMQ_EVENTS`` first: ending every batch on a ``zmq.Again`` exception
    costs more than a no-op call's whole handling.
    """
    if not int(socket.getsockopt(_EVENTS)) & _POLLIN:
        return None
    frame = socket.recv(copy=False)
    frames = [frame]
    while frame.more:
        frame = socket.recv(copy=False)
        frames.append(frame)
    return frames


class Signer:
    """Signs and verifies messages with one key; tracks the send sequence."""

    def __init__(self, key: bytes, stats: WireStats) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"signing key must be {KEY_BYTES} bytes, got {len(key)}")
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self._sequence = itertools.count(1)
        self.stats = stats

    def _digest(self, signed: Any, buffers: Sequence[Any]) -> bytes:
        mac = self._mac.copy()
        mac.update(signed)
        for frame in buffers:
            view = memoryview(frame)
            mac.update(view.nbytes.to_bytes(8, "little"))
            if view.nbytes >= _CHUNKED_FRAME_BYTES:
                mac.update(_chunk_digests(view.cast("B")))
            else:
                mac.update(view)
        return mac.digest()

    def encode(self, message: Message, payload: Any = None, *, by_value: bool = True) -> Encoded:
        """Pickle and sign a message once; raises whatever pickling raises."""
        meta_bytes = pickle.dumps(to_wire(message), protocol=5)
        body: bytes = b""
        buffers: list[pickle.PickleBuffer] = []
        if payload is not None:
            body, buffers = dumps(payload, by_value=by_value)
        raw = [b.raw() for b in buffers]  # zero-copy: see the module docstring
        signed = b"".join(
            (
                next(self._sequence).to_bytes(_SEQ_BYTES, "little"),
                len(meta_bytes).to_bytes(_META_LEN_BYTES, "little"),
                meta_bytes,
                body,
            )
        )
        frames = [self._digest(signed, raw) + signed, *raw]
        oob = sum(r.nbytes for r in raw)
        self.stats.encoded += 1
        self.stats.bytes_in_band += len(signed)
        self.stats.bytes_out_of_band += oob
        return Encoded(frames, len(body) + oob)

    def verify(self, frames: Sequence[Any], window: ReplayWindow) -> Message | None:
        """Check signature and freshness; the message, or None (counted).

        ``frames`` are ``zmq.Frame`` objects or buffers, identity already removed.
        Raises :class:`UnknownMessage` (counted) for a verified message of an
        unknown kind: the caller reports it.
        """
        if not frames:
            self.stats.dropped_malformed += 1
            return None
        envelope = memoryview(frames[0])
        if envelope.nbytes < _PREFIX_BYTES:
            self.stats.dropped_malformed += 1
            return None
        meta_end = _PREFIX_BYTES + int.from_bytes(
            envelope[_PREFIX_BYTES - 4 : _PREFIX_BYTES], "little"
        )
        if meta_end > envelope.nbytes:
            self.stats.dropped_malformed += 1
            return None
        expected = self._digest(envelope[_SIG_BYTES:], frames[1:])
        if not hmac.compare_digest(expected, envelope[:_SIG_BYTES]):
            self.stats.dropped_bad_signature += 1
            return None
        number = int.from_bytes(envelope[_SIG_BYTES : _SIG_BYTES + _SEQ_BYTES], "little")
        if not window.accept(number):
            self.stats.dropped_replayed += 1
            return None
        self.stats.received += 1
        try:
            meta = pickle.loads(envelope[_PREFIX_BYTES:meta_end])
            return from_wire(meta)
        except Exception as exc:
            self.stats.unknown_messages += 1
            if isinstance(exc, UnknownMessage):
                raise
            raise UnknownMessage(f"a signed message could not be read: {exc!r}") from exc


# How far out of order a sender's sequence numbers may arrive (bits kept).
REPLAY_WINDOW = 1024
_WINDOW_MASK = (1 << REPLAY_WINDOW) - 1


class ReplayWindow:
    """The sequence numbers already accepted from one sender.

    Each number is accepted once; a number more than ``REPLAY_WINDOW`` below
    the highest seen is refused (too old to tell apart from a replay).
    """

    __slots__ = ("highest", "seen")

    def __init__(self) -> None:
        self.highest = 0
        self.seen = 1  # bit i set: number ``highest - i`` was accepted

    def accept(self, number: int) -> bool:
        highest = self.highest
        if number > highest:
            shift = number - highest
            self.seen = ((self.seen << shift) | 1) & _WINDOW_MASK if shift < REPLAY_WINDOW else 1
            self.highest = number
            return True
        bit = 1 << (highest - number)
        if highest - number >= REPLAY_WINDOW or self.seen & bit:
            return False
        self.seen |= bit
        return True


def decode_payload(frames: Sequence[Any]) -> Any:
    """Unpickle the payload of a verified message (buffers stay zero-copy)."""
    envelope = memoryview(frames[0])
    meta_end = _PREFIX_BYTES + int.from_bytes(envelope[_PREFIX_BYTES - 4 : _PREFIX_BYTES], "little")
    body = envelope[meta_end:]
    if body.nbytes == 0:
        return None
    return loads(body, [memoryview(f) for f in frames[1:]])
