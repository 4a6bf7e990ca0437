"""Signed multipart messages over pyzmq.

A message is a *header* and a *body*, then one frame per out-of-band buffer::

    header = signature(32) | sequence(8) | flags(1) | sender(16)
    body   = meta length(4) | meta | payload

Header and body share the first frame, unless the body is 64 KiB or more
(then it is a frame of its own, sent zero-copy).

- ``meta`` is a small pickle of a :mod:`._messages` message as a plain tuple
  (what to do, call id, names), so a receiver can always answer "which call
  failed" even if the payload cannot be unpickled;
- ``payload`` is the (cloud)pickle of the arguments or value; the buffer
  frames are its out-of-band buffers (tensors, arrays, large bytes);
- ``sender`` names who sealed the message (:func:`sender_tag` of its routing
  identity, or :data:`CONTROLLER`) and ``flags`` its direction (*upstream*:
  towards the controller or the caller, as replies, heartbeats and output;
  *downstream*: calls, casts, commands) and how its bulk frames are covered.
  Both are signed: a receiver that knows whom a link leads to refuses a
  message sealed by anyone else, or sent the other way (a reflected message);
- the *content digest* is SHA-256 over the body and every buffer frame, each
  prefixed by its length so frame boundaries cannot be shifted. A buffer of
  8 MiB or more enters it as the SHA-256 digests of its 2 MiB chunks, hashed
  on a small thread pool (hashlib releases the GIL): as strong, since SHA-256
  is collision resistant, and it uses every core on big tensors;
- on a *trusted link* (an ``ipc://`` socket in the tree's private 0700 run
  directory, which only our uid can connect to, or a CURVE connection, which
  authenticates its peer and protects every frame's integrity) buffer frames
  enter the digest by their lengths only: the transport already guarantees
  they come, unchanged, from the peer that sent the signed body, and hashing
  them cost more than moving them. The body (every pickle byte) is always
  digested. The flag is signed, and a receiver whose link is not trusted
  (a plain TCP port, ``MONARCH_NB_BIND``) refuses a message that carries it;
- ``signature`` is HMAC-SHA256 under the mesh key over ``sequence``,
  ``flags``, ``sender`` and the content digest; ``sequence`` is the sender's
  message counter, and a receiver accepts each number once
  (:class:`ReplayWindow`), which stops replays.

Encoding (pickling and the content digest, the expensive part) happens
once, however many ranks a message goes to, and outside any lock.
*Sealing* (the next sequence number and the HMAC over 57 bytes) happens
at send time, under the lock that orders the sender's sends, so sequence
numbers leave each sender in order, whichever thread encoded first. A small
message (a body under 16 KiB, no buffer frames: a rank's reply, most calls)
is digested and sealed in one C step under that lock instead
(:meth:`Signer.seal_small`, or :meth:`Encoded.seal` of one encoded small;
the same bytes): the same hashing as before, moved under the lock (0.7 us
for a no-op's reply, at most ~20 us at the limit), where it saves a dozen
interpreted steps per message.

Nothing is unpickled before the signature, the sender, the direction and the
sequence check pass; frames that fail are dropped and counted in
:class:`WireStats`.

Out-of-band buffers are sent zero-copy, straight from the caller's memory
(a copy of 64 MiB costs more than the transfer itself here). So a tensor
must not be modified until its call's future completes: modified in flight,
its frame no longer matches the signature on an untrusted link and is
dropped (counted in ``dropped_bad_signature``), and on a trusted one it
arrives with whatever bytes it had when the socket read it.
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

from ._extensions import load_extension
from ._link_connection import is_immutable
from ._messages import BUILDABLE, Message, UnknownMessage, from_wire, to_wire
from ._serialize import dumps
from ._sockets import ASK_PYZMQ as _ASK_PYZMQ
from ._sockets import DRAINED as _DRAINED
from ._sockets import send_copied, send_each_copied, socket_events, take
from ._unix_link import is_link

_fastwire = load_extension("_fastwire")


KEY_BYTES = 32
# Sockets that face the network refuse frames above this size before buffering
# them (ZMQ_MAXMSGSIZE): an unauthenticated peer cannot make us hold more. A
# legitimate frame is one tensor argument or value: send larger ones by RDMABuffer.
MAX_FRAME_BYTES = int(os.environ.get("MONARCH_NB_MAX_FRAME_BYTES", str(1 << 30)))
# Frames in one message: a header, a body and one frame per out-of-band buffer (a
# tensor or array over 4 KiB). Receivers drop a message with more as it arrives,
# keeping none of it, so nobody can make them build millions of frame objects;
# senders refuse to make one (see Signer.encode), so no reply is lost to the cap.
MAX_FRAMES_PER_MESSAGE = int(os.environ.get("MONARCH_NB_MAX_MESSAGE_FRAMES", str(1 << 16)))
# Envelopes on a host agent's link (a frame before the message): relay it to the
# workers named after RELAY, or a message for/from the agent itself.
RELAY = b"R"
OWN = b"A"
_SIG_BYTES = 32
_SEQ_BYTES = 8
_FLAGS_BYTES = 1
SENDER_BYTES = 16
_META_LEN_BYTES = 4
# A body sealed in one step by Signer.seal_small at most (C hashes this much).
_SMALL_FRAME_BYTES = _fastwire.SMALL_HASH_LIMIT if _fastwire is not None else 0
_HEADER_BYTES = _SIG_BYTES + _SEQ_BYTES + _FLAGS_BYTES + SENDER_BYTES
_SENDER_AT = _SIG_BYTES + _SEQ_BYTES + _FLAGS_BYTES
# Header flags (signed).
_UPSTREAM = 1  # towards the controller or the caller (see the module docstring)
_BULK_BY_LENGTH = 2  # buffer frames digested by length only: a trusted link
_KNOWN_FLAGS = _UPSTREAM | _BULK_BY_LENGTH
# The sender tag of a controller (every other sender's is its routing identity).
CONTROLLER = bytes(SENDER_BYTES)
# Frames below this are copied into zmq (cheaper than pinning a Python object).
_ZERO_COPY_BYTES = 1 << 16
# pyzmq's send_multipart combines IntFlag enums on every frame; plain ints are
# several times cheaper on the per-call path.
_SNDMORE = int(zmq.SNDMORE)
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


def sender_tag(identity: bytes) -> bytes:
    """The 16-byte ``sender`` a process with routing ``identity`` seals with."""
    if len(identity) == SENDER_BYTES:
        return identity
    return hashlib.sha256(b"monarch_nb sender\0" + identity).digest()[:SENDER_BYTES]


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
    dropped_misdirected: int = 0  # sealed by another sender, sent the other way, or
    # with bulk frames left to a transport this link does not trust
    dropped_unknown_peer: int = 0  # identity not of any mesh we run
    dropped_oversized: int = 0  # more than MAX_FRAMES_PER_MESSAGE frames: not kept
    unknown_messages: int = 0  # signed by a peer, but of a kind we do not know (reported)
    bytes_in_band: int = 0  # pickle bytes encoded
    bytes_out_of_band: int = 0  # buffer bytes encoded as their own frames
    bytes_digested: int = 0  # buffer bytes hashed, sending and verifying
    missed_wakeups: int = 0  # a rank found work only at its idle recheck (should stay 0)
    replies_to_callers: int = 0  # replies a caller waiting in get() took itself (controller)

    def snapshot(self) -> WireStats:
        return WireStats(**self.__dict__)


# Encoded.copy of a message that is one small frame (header and body).
_ONE_COPIED_FRAME: tuple[bool, ...] = (True,)


def _copied_by_zmq(frames: Sequence[Any]) -> tuple[bool, ...]:
    """Per frame of a sealed message (its header, then ``frames``), whether zmq
    copies it: small ones (cheaper than pinning them), and any of memory the
    caller may change (a tensor's) however large, since libzmq's I/O thread
    reads what it does not copy after send() returns: what is sent is what the
    memory held at the call."""
    return (
        True,
        *(memoryview(f).nbytes < _ZERO_COPY_BYTES or not is_immutable(f) for f in frames),
    )


class Encoded:
    """A message pickled and digested once, ready to seal and send any number of times.

    A small one (``meta`` given: a body C hashes in one step, no buffers) is
    digested as it is sealed instead, in the same C call as its signature: a
    call's message is sealed once however many ranks it goes to, and the
    separate steps cost more than the hashing (as :meth:`Signer.seal_small`).
    """

    __slots__ = (
        "body",
        "buffers",
        "copy",
        "digest",
        "flags",
        "meta",
        "nbytes",
        "separate_body",
        "signer",
    )

    def __init__(
        self,
        signer: Signer,
        body: bytes,
        buffers: list[Any],
        digest: bytes,
        flags: int,
        meta: bytes | None = None,
    ) -> None:
        self.signer = signer  # whose key and sequence seal it
        self.body = body  # with ``meta``: the pickled payload only
        self.buffers = buffers
        self.digest = digest
        self.flags = flags
        self.meta = meta
        if meta is not None:
            self.separate_body = False
            self.nbytes = _META_LEN_BYTES + len(meta) + len(body)
            self.copy: tuple[bool, ...] = _ONE_COPIED_FRAME
            return
        self.separate_body = len(body) >= _ZERO_COPY_BYTES
        if not buffers and not self.separate_body:  # most messages: one small frame
            self.nbytes = len(body)
            self.copy = _ONE_COPIED_FRAME
            return
        sizes = [memoryview(b).nbytes for b in buffers]
        self.nbytes = len(body) + sum(sizes)
        # Decided once here, not on every send of a cast to many ranks.
        self.copy = _copied_by_zmq([body, *buffers] if self.separate_body else buffers)

    def seal(self) -> list[Any]:
        """The frames, with the sender's next sequence number and their signature.

        Call under the lock that orders this sender's sends; a sealed message
        may go to any number of receivers (each keeps its own replay window).
        """
        if self.meta is not None:
            return [self.signer.frame(self.flags, self.meta, self.body)]
        header = self.signer.header(self.flags, self.digest)
        if self.separate_body:
            return [header, self.body, *self.buffers]
        return [header + self.body, *self.buffers]

    def send(
        self,
        socket: zmq.Socket,
        identity: bytes | None = None,
        frames: list[Any] | None = None,
        envelope: bytes | None = None,
        copy: tuple[bool, ...] | None = None,
    ) -> None:
        """Send on ``socket`` (to ``identity`` first, for a ROUTER); seals unless
        ``frames`` (from :meth:`seal`) are given. ``envelope``, a frame between the
        identity and the message, tells a host agent what to do with it (relay).
        ``copy``: per frame, whether zmq copies it (default: :attr:`copy`)."""
        if frames is None:
            frames = self.seal()
        if self.copy is _ONE_COPIED_FRAME:  # most messages: in C, then pyzmq if need be
            parts = frames
            if envelope is not None:
                parts = [envelope, *parts]
            if identity is not None:
                parts = [identity, *parts]
            last = len(parts) - 1
            for i in range(send_copied(socket, parts), last + 1):
                socket.send(parts[i], _SNDMORE if i < last else 0)
            return
        if is_link(socket):  # frames as they are: the link copies what it cannot write now
            parts = frames
            if envelope is not None:
                parts = [envelope, *parts]
            socket.send_parts(parts if identity is None else [identity, *parts])
            return
        send = socket.send
        if identity is not None:
            send(identity, _SNDMORE)
        if envelope is not None:
            send(envelope, _SNDMORE)
        last = len(frames) - 1
        copies = self.copy if copy is None else copy
        for i, (frame, copied) in enumerate(zip(frames, copies, strict=True)):
            send(frame, _SNDMORE if i < last else 0, copy=copied)

    def send_each(self, socket: zmq.Socket, identities: list[bytes], frames: list[Any]) -> None:
        """Send sealed ``frames`` to each of ``identities`` on a ROUTER (a cast)."""
        if self.copy is _ONE_COPIED_FRAME:  # one call into C for the whole cast
            send_each_copied(socket, identities, frames[0])
            return
        copy = None
        if len(identities) > 1 and not all(map(is_immutable, frames)):
            # The caller's memory copied once for every rank, not once a rank
            # (by the link, or by zmq): a 64 MiB tensor cast to 8 ranks is one
            # more 64 MiB, not eight. The copies are bytes: sent without another.
            frames = [f if is_immutable(f) else bytes(f) for f in frames]
            copy = _copied_by_zmq(frames[1:])
        for identity in identities:
            self.send(socket, identity, frames, copy=copy)


def receive(socket: zmq.Socket, stats: WireStats | None = None) -> list[zmq.Frame] | None:
    """One whole multipart message without blocking, or None if none is waiting.

    Asks ``ZMQ_EVENTS`` first: ending every batch on a ``zmq.Again`` exception
    costs more than a no-op call's whole handling. A message of more than
    :data:`MAX_FRAMES_PER_MESSAGE` frames is dropped (counted in ``stats``) and the
    next one returned.
    """
    return Receiver(socket, stats).next()


class Receiver:
    """Whole messages from one socket, a bounded number of frames per :meth:`take`.

    The controller receives under the lock its callers send under (a zmq socket
    is one thread's at a time); taking a few thousand frames at a time lets it
    release the lock between takes however many frames a peer piles into one
    message, and a message over :data:`MAX_FRAMES_PER_MESSAGE` frames is dropped
    frame by frame as it arrives (counted), never held whole.
    """

    __slots__ = ("_dropping", "_link", "_partial", "socket", "stats")

    def __init__(self, socket: zmq.Socket, stats: WireStats | None = None) -> None:
        self.socket = socket
        self.stats = stats
        self._link = socket if is_link(socket) else None  # asked directly: a rank's every call
        self._partial: list[zmq.Frame] | None = None  # a message begun in an earlier take
        self._dropping = False

    def take(self, frames: int = 4096, messages: int = 64) -> tuple[list[list[zmq.Frame]], bool]:
        """Up to ``messages`` whole messages, reading at most ``frames`` frames; and
        whether the socket may hold more (False: it said it had nothing waiting)."""
        link = self._link
        if link is not None:  # no partial message kept here, nothing to fall back to
            done, more = link.take(frames, messages, MAX_FRAMES_PER_MESSAGE)
            if link.dropped_unreported:  # (an attribute: a rank's every call asks)
                dropped = link.take_dropped()
                if self.stats is not None:
                    self.stats.dropped_oversized += dropped
            return done, more
        taken = take(
            self.socket, self._partial, self._dropping, frames, messages, MAX_FRAMES_PER_MESSAGE
        )
        if taken is None:  # no C path
            return self._take(frames, messages, [])
        done, self._partial, self._dropping, dropped, status = taken
        if dropped and self.stats is not None:
            self.stats.dropped_oversized += dropped
        if status == _ASK_PYZMQ:  # libzmq refused: pyzmq raises, or takes one more
            return self._take(1, messages, done)
        return done, status != _DRAINED

    def next(self) -> list[Any] | None:
        """The next whole message, or None if none is waiting (see :func:`receive`)."""
        while True:
            messages, more = self.take(frames=MAX_FRAMES_PER_MESSAGE + 1, messages=1)
            if messages:
                return messages[0]
            if not more:
                return None

    def _take(
        self, frames: int, messages: int, done: list[list[Any]]
    ) -> tuple[list[list[Any]], bool]:
        """:meth:`take` through pyzmq, adding to ``done``."""
        socket = self.socket
        while frames > 0 and len(done) < messages:
            if self._partial is None:
                if not socket_events(socket) & _POLLIN:
                    return done, False
                self._partial = []
            frame = socket.recv(copy=False)
            frames -= 1
            if not self._dropping:
                self._partial.append(frame)
                if len(self._partial) > MAX_FRAMES_PER_MESSAGE:
                    self._partial.clear()
                    self._dropping = True
            if frame.more:
                continue
            if self._dropping:
                self._dropping = False
                if self.stats is not None:
                    self.stats.dropped_oversized += 1
            else:
                done.append(self._partial)
            self._partial = None
        return done, True


def forward(socket: zmq.Socket, frames: Sequence[Any], identity: bytes | None = None) -> None:
    """Send received ``frames`` on, unchanged (a host agent's relay): plain-int
    flags, and small frames copied (cheaper than pinning them), as :meth:`Encoded.send`."""
    send = socket.send
    if identity is not None:
        send(identity, _SNDMORE)
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        big = len(frame) >= _ZERO_COPY_BYTES
        send(frame if big else frame.bytes, _SNDMORE if i < last else 0, copy=not big)


class Signer:
    """Signs the messages one sender sends one way on one kind of link, and
    verifies those that come back the other way; tracks the send sequence.

    ``sender`` is this process's :func:`sender_tag` (or :data:`CONTROLLER`);
    ``upstream`` says which way it sends (it accepts only the other way);
    ``trusted_link``: the link authenticates its peer and protects integrity
    (``ipc://`` in the private run directory, or CURVE), so buffer frames are
    not hashed either way; see the module docstring.
    """

    def __init__(
        self,
        key: bytes,
        stats: WireStats,
        *,
        sender: bytes,
        upstream: bool,
        trusted_link: bool = False,
        first_sequence: int = 1,
    ) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"signing key must be {KEY_BYTES} bytes, got {len(key)}")
        if len(sender) != SENDER_BYTES:
            raise ValueError(f"a sender tag is {SENDER_BYTES} bytes, got {len(sender)}")
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self._key_state = _fastwire.key_state(key) if _fastwire is not None else b""
        self._sequence = itertools.count(first_sequence)
        self.stats = stats
        self.sender = sender
        self.upstream = upstream
        self.trusted_link = trusted_link
        self._flags = (_UPSTREAM if upstream else 0) | (_BULK_BY_LENGTH if trusted_link else 0)

    def header(self, flags: int, digest: bytes) -> bytes:
        """``signature | sequence | flags | sender`` for content with ``digest``,
        with the next number."""
        if _fastwire is not None:
            return _fastwire.header(
                self._key_state, next(self._sequence), flags, self.sender, digest
            )
        trailer = b"".join(
            (next(self._sequence).to_bytes(_SEQ_BYTES, "little"), bytes((flags,)), self.sender)
        )
        mac = self._mac.copy()
        mac.update(trailer)
        mac.update(digest)
        return mac.digest() + trailer

    def encode(self, message: Message, payload: Any = None, *, by_value: bool = True) -> Encoded:
        """Pickle a message and digest its content once; raises whatever pickling raises."""
        payload_bytes: bytes = b""
        buffers: list[pickle.PickleBuffer] = []
        if payload is not None:
            payload_bytes, buffers = dumps(payload, by_value=by_value)
        return self.encode_pickled(message, payload_bytes, buffers)

    def encode_pickled(
        self, message: Message, payload_bytes: bytes, buffers: list[pickle.PickleBuffer]
    ) -> Encoded:
        """:meth:`encode` of a payload already pickled (``dumps``)."""
        meta_bytes = pickle.dumps(to_wire(message), protocol=5)
        if not buffers and self._one_step(meta_bytes, payload_bytes):  # digested as sealed
            return Encoded(self, payload_bytes, buffers, b"", self._flags, meta_bytes)
        if len(buffers) > MAX_FRAMES_PER_MESSAGE - 4:  # header, body, identity, envelope
            raise pickle.PicklingError(
                f"this value holds {len(buffers):,} tensors or arrays over 4 KiB, each its own "
                f"frame, and one message carries at most {MAX_FRAMES_PER_MESSAGE - 4:,}: send "
                "fewer, larger ones (torch.cat, or a flat buffer), or move them with RDMABuffer"
            )
        raw = [b.raw() for b in buffers] if buffers else buffers  # zero-copy: see the top
        body = b"".join(
            (len(meta_bytes).to_bytes(_META_LEN_BYTES, "little"), meta_bytes, payload_bytes)
        )
        by_length = self.trusted_link
        digest = _content_digest(body, raw, by_length, self.stats)
        encoded = Encoded(self, body, raw, digest, self._flags)
        self.stats.encoded += 1
        self.stats.bytes_in_band += len(body)
        self.stats.bytes_out_of_band += encoded.nbytes - len(body)
        return encoded

    def seal_small(self, meta: tuple[Any, ...], payload_bytes: bytes) -> bytes | None:
        """The one sealed frame of the message ``meta`` (:func:`to_wire`'s tuple)
        with a payload already pickled and no buffer frames, in one step (what
        :meth:`encode_pickled` then :meth:`Encoded.seal` give, byte for byte);
        None, and no sequence number taken, where it is too big for that or the
        C path is unavailable.

        Call under the lock that orders this sender's sends: it takes the next
        sequence number.
        """
        meta_bytes = pickle.dumps(meta, protocol=5)
        if not self._one_step(meta_bytes, payload_bytes):
            return None
        return self.frame(self._flags, meta_bytes, payload_bytes)

    def seal_write(
        self, meta: tuple[Any, ...], payload_bytes: bytes, fd: int
    ) -> tuple[bytes, int] | None:
        """:meth:`seal_small`'s frame written to the Unix link's socket ``fd`` as
        one message, in one C step, without waiting: the frame and the bytes of
        the message the kernel did not take (0: all sent; -errno on an error);
        None, nothing numbered or written, where it is too big for that or the
        C path is unavailable.

        Call under the lock that orders this sender's sends, and the one that
        orders the socket's writes, with nothing of an earlier message waiting to
        be written (a rank's reply: see ``_link_connection.Connection.send_small``).
        """
        if _fastwire is None:
            return None
        sent = _fastwire.seal_write(
            self._key_state, self._sequence, self._flags, self.sender, meta, payload_bytes, fd
        )
        if sent is not None:
            self.stats.encoded += 1
            self.stats.bytes_in_band += len(sent[0]) - _HEADER_BYTES
        return sent

    def _one_step(self, meta_bytes: bytes, payload_bytes: bytes) -> bool:
        """Whether this body (no buffer frames) is digested and signed in one C call
        when sealed: it is within the C path's limit (counted as encoded, then)."""
        body_bytes = _META_LEN_BYTES + len(meta_bytes) + len(payload_bytes)
        if _fastwire is None or body_bytes > _SMALL_FRAME_BYTES:
            return False
        self.stats.encoded += 1
        self.stats.bytes_in_band += body_bytes
        return True

    def frame(self, flags: int, meta_bytes: bytes, payload_bytes: bytes) -> bytes:
        """The one sealed frame of a small body (``meta_bytes`` and ``payload_bytes``
        within the C path's limit), digested and signed in one C call, with the
        next sequence number (under the lock that orders this sender's sends)."""
        assert _fastwire is not None
        frame: bytes = _fastwire.frame(
            self._key_state, next(self._sequence), flags, self.sender, meta_bytes, payload_bytes
        )
        return frame

    def verify(
        self, frames: Sequence[Any], window: ReplayWindow, *, sender: bytes | None
    ) -> Message | None:
        """Check signature, sender, direction and freshness; the message, or None
        (counted).

        ``frames`` are ``zmq.Frame`` objects or buffers, identity already removed.
        ``sender`` is the tag of the peer this link leads to; None where the
        receiver cannot know it (replies on an outbox: the direction check
        still refuses our own requests sent back to us). Raises :class:`UnknownMessage` (counted)
        for a verified message of an unknown kind: the caller reports it.
        """
        stats = self.stats
        if _fastwire is not None:
            # Checked, fresh, unpickled and built in one C call (most messages).
            try:
                checked = _fastwire.admit(
                    self._key_state,
                    frames,
                    self.upstream,
                    self.trusted_link,
                    sender,
                    window,
                    BUILDABLE,
                )
            except Exception as exc:  # the signed, fresh meta did not unpickle (or build)
                stats.received += 1
                raise self._unreadable(exc) from exc
            if checked.__class__ is tuple:
                admitted, digested = checked
                if digested:
                    stats.bytes_digested += digested
                if admitted is None:
                    stats.dropped_bad_signature += 1
                    return None
                if admitted is False:
                    stats.dropped_replayed += 1
                    return None
                stats.received += 1
                if admitted.__class__ is not tuple:  # built (a message is never a tuple)
                    return admitted
                return self._read(admitted[0])  # (meta,): admit() did not build it
            if checked == _fastwire.MALFORMED:
                stats.dropped_malformed += 1
                return None
            if checked == _fastwire.MISDIRECTED:
                stats.dropped_misdirected += 1
                return None
            # FALL_BACK (content too big for the C path): hashlib below.
        signed = self._check_with_hashlib(frames, sender)
        if signed is None:
            return None
        sequence, meta_bytes = signed
        if not window.accept(sequence):
            stats.dropped_replayed += 1
            return None
        stats.received += 1
        try:
            meta = pickle.loads(meta_bytes)
        except Exception as exc:
            raise self._unreadable(exc) from exc
        return self._read(meta)

    def _read(self, meta: Any) -> Message:
        """The message a signed, fresh meta stands for (:func:`from_wire`), or
        :class:`UnknownMessage` raised (counted)."""
        try:
            return from_wire(meta)
        except UnknownMessage:
            self.stats.unknown_messages += 1
            raise
        except Exception as exc:
            raise self._unreadable(exc) from exc

    def _unreadable(self, exc: Exception) -> UnknownMessage:
        self.stats.unknown_messages += 1
        return UnknownMessage(f"a signed message could not be read: {exc!r}")

    def _check_with_hashlib(
        self, frames: Sequence[Any], sender: bytes | None
    ) -> tuple[int, Any] | None:
        """:meth:`verify`'s checks in Python, for content the C path does not take
        (or without it): ``(sequence, meta)`` of a signed message, else None (counted)."""
        split = _split(frames)
        if split is None:
            self.stats.dropped_malformed += 1
            return None
        header, body, buffers = split
        # The cheap checks first: a message not meant for this link costs no hashing.
        flags = header[_SIG_BYTES + _SEQ_BYTES]
        sealed_by = bytes(header[_SENDER_AT:])
        by_length = bool(flags & _BULK_BY_LENGTH)
        if flags & ~_KNOWN_FLAGS:
            self.stats.dropped_malformed += 1
            return None
        if (
            bool(flags & _UPSTREAM) == self.upstream
            or (by_length and not self.trusted_link)
            or (sender is not None and sealed_by != sender)
        ):
            self.stats.dropped_misdirected += 1
            return None
        mac = self._mac.copy()
        mac.update(header[_SIG_BYTES:])
        mac.update(_content_digest(body, buffers, by_length, self.stats))
        if not hmac.compare_digest(mac.digest(), header[:_SIG_BYTES]):
            self.stats.dropped_bad_signature += 1
            return None
        meta_end = _META_LEN_BYTES + int.from_bytes(body[:_META_LEN_BYTES], "little")
        sequence = int.from_bytes(header[_SIG_BYTES : _SIG_BYTES + _SEQ_BYTES], "little")
        return sequence, body[_META_LEN_BYTES:meta_end]


def _content_digest(
    body: Any, buffers: Sequence[Any], buffers_by_length: bool, stats: WireStats
) -> bytes:
    """SHA-256 of the body and the buffer frames (their lengths only on a trusted link)."""
    if _fastwire is not None:
        small = _fastwire.digest(body, buffers, buffers_by_length)
        if small is not None:
            stats.bytes_digested += small[1]
            return small[0]
    content = hashlib.sha256()
    for i, frame in enumerate((body, *buffers)):
        view = memoryview(frame)
        content.update(view.nbytes.to_bytes(8, "little"))
        if i and buffers_by_length:
            continue
        if i:
            stats.bytes_digested += view.nbytes
        if view.nbytes >= _CHUNKED_FRAME_BYTES:
            content.update(_chunk_digests(view.cast("B")))
        else:
            content.update(view)
    return content.digest()


def _split(frames: Sequence[Any]) -> tuple[memoryview, memoryview, list[Any]] | None:
    """``(header, body, buffer frames)`` of a message, or None if malformed."""
    if not frames:
        return None
    first = memoryview(frames[0])
    if first.nbytes < _HEADER_BYTES:
        return None
    if first.nbytes == _HEADER_BYTES:  # the body has a frame of its own
        if len(frames) < 2:
            return None
        body, buffers = memoryview(frames[1]), list(frames[2:])
    else:
        body, buffers = first[_HEADER_BYTES:], list(frames[1:])
    if body.nbytes < _META_LEN_BYTES:
        return None
    meta_end = _META_LEN_BYTES + int.from_bytes(body[:_META_LEN_BYTES], "little")
    if meta_end > body.nbytes:
        return None
    return first[:_HEADER_BYTES], body, buffers


# How far out of order a sender's sequence numbers may arrive (bits kept).
REPLAY_WINDOW = 1024
_WINDOW_MASK = (1 << REPLAY_WINDOW) - 1


class ReplayWindow:
    """The sequence numbers already accepted from one sender.

    Each number is accepted once; a number more than ``REPLAY_WINDOW`` below
    the highest seen is refused (too old to tell apart from a replay). With the
    C module, ``ReplayWindow`` is its ``Window``, the same rule in one C call
    (the tests hold the two to the same answers); this class is the pure-Python
    wire's.
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
        age = highest - number
        if age >= REPLAY_WINDOW:  # before the shift: a far-off number makes no huge int
            return False
        bit = 1 << age
        if self.seen & bit:
            return False
        self.seen |= bit
        return True


PyReplayWindow = ReplayWindow
if _fastwire is not None:
    assert _fastwire.REPLAY_WINDOW == REPLAY_WINDOW
    # Typed as the class above (same accept()); the C type at run time.
    ReplayWindow = _fastwire.Window  # type: ignore[misc]


def decode_payload(frames: Sequence[Any]) -> Any:
    """Unpickle the payload of a verified message (buffers stay zero-copy)."""
    if _fastwire is not None:  # the same, in one C call (every call and every reply)
        return _fastwire.payload(frames)
    # verify() checked the layout: no checks again (this runs on every call).
    first = memoryview(frames[0])
    if first.nbytes > _HEADER_BYTES:  # header and body share the first frame
        body, buffers = first[_HEADER_BYTES:], frames[1:]
    else:
        body, buffers = memoryview(frames[1]), frames[2:]
    payload = body[_META_LEN_BYTES + int.from_bytes(body[:_META_LEN_BYTES], "little") :]
    if payload.nbytes == 0:
        return None
    return pickle.loads(payload, buffers=[memoryview(f) for f in buffers] if buffers else ())
