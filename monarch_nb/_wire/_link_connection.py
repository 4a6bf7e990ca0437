"""One connection of the Unix link (:mod:`._unix_link`): its framing, its sends, its reads.

Framing: a message is a frame count (u32), each frame's length (u64), then
the frames. A large frame is received straight into a buffer of its own
(zero-copy from then on, as a zmq frame was); small ones are sliced out of a
read buffer, a few hundred messages a read at most (the rest waits there,
and the socket's events and ``take`` say so: no poll of the fd would).

Sends never wait: what the kernel does not take at once (a large frame, a
slow reader) queues on the connection, for the flusher thread
(:mod:`._link_flusher`) to write when the socket can take more.

The per-message work runs in C (:mod:`._fastlink`) where it is built, else in
Python, with the same bytes. This module sits below the wire: the signer it
seals a rank's replies with is known here only as :class:`SmallSealer`.
"""

from __future__ import annotations

import collections
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from ._extensions import load_extension

_COUNT = struct.Struct("<I")
_READ_CHUNK = 256 << 10
_OWN_BUFFER_BYTES = 64 << 10  # frames this large are read into a buffer of their own
MAX_FRAMES = 1 << 16  # the wire's default (MONARCH_NB_MAX_MESSAGE_FRAMES): take() passes its own
# Messages one read of a connection parses at most; the rest waits in its buffer
# (bytes) or the kernel's. Each parsed message is a list the garbage collector
# tracks: a pipelining caller's thousands of replies, parsed at once, outlived
# enough collections to be promoted to the oldest generation, which then ran a
# full collection (every object in the process, torch's 170,000) every other
# burst of 10,000 calls. A few hundred are handled and gone before then.
READ_MESSAGES = 256
_IOV_MAX = 1024  # buffers one sendmsg takes (Linux's UIO_MAXIOV)
_SEND_BUFFER_BYTES = 4 << 20
_MAX_IDENTITY_BYTES = 256
_fastlink = load_extension("_fastlink")


def _header(count: int) -> struct.Struct:
    return struct.Struct(f"<I{count}Q")


_HEADERS = [_header(n) for n in range(17)]


def _header_of(frames: Sequence[Any]) -> bytes:
    """The frame count and each frame's length, as a message begins."""
    lengths = [len(f) if f.__class__ is bytes else memoryview(f).nbytes for f in frames]
    count = len(lengths)
    return (_HEADERS[count] if count < len(_HEADERS) else _header(count)).pack(count, *lengths)


_MAX_FRAME_BYTES = 1 << 40


def is_immutable(frame: Any) -> bool:
    """Whether ``frame``'s bytes can never change: ``bytes``, or a view of bytes.
    Anything else (a tensor's or an array's own memory, a bytearray) the caller
    may change once its send returns, so what is sent later must be a copy."""
    return frame.__class__ is bytes or (
        frame.__class__ is memoryview and frame.obj.__class__ is bytes
    )


class LinkFrame(bytes):
    """A connection's name as the first frame of what it sent: ``bytes`` with
    pyzmq's ``Frame.bytes``, which the controller reads of a sender's identity."""

    __slots__ = ()

    @property
    def bytes(self) -> bytes:
        return self


class LinkBuffer(bytearray):
    """A large received frame, read straight into its own memory (a subclass: a
    ``bytearray`` cannot be weakly referenced, and the tests follow one)."""


class BufferPool:
    """Received frames' buffers, used again once nobody holds them.

    Without it, a MiB-sized frame's buffer and the ``bytes`` Python copies it
    into came from the main thread's heap one after the other, and glibc gave
    the freed top back to the kernel each time: 256 page faults per MiB, on
    each side, per echo (libzmq's buffers came from its I/O thread's heap).
    A buffer whose only reference is the pool's is free (a tensor or a view
    made from a frame holds a reference). Small frames only, and a few, so
    what the pool keeps is bounded (4 x 4 MiB).
    """

    MAX_BYTES = 4 << 20
    MAX_COUNT = 4

    def __init__(self) -> None:
        self._buffers: list[LinkBuffer] = []

    def take(self, n: int) -> LinkBuffer:
        if n > self.MAX_BYTES:
            return LinkBuffer(n)
        buffers = self._buffers
        free = -1
        for i in range(len(buffers)):  # (enumerate's tuple would hold a reference)
            # 2: the list's reference and getrefcount's argument
            if sys.getrefcount(buffers[i]) == 2:
                if len(buffers[i]) == n:
                    return buffers[i]
                free = i
        buffer = LinkBuffer(n)
        if len(buffers) < self.MAX_COUNT:
            buffers.append(buffer)
        elif free >= 0:
            buffers[free] = buffer  # a free one of another size makes room
        return buffer


def is_name(message: list[Any]) -> bool:
    """Whether ``message``, a connection's first, can be a worker's name (one frame
    of a few bytes). The router takes the name once a read returns; a large frame
    read after a name in the same read is a worker's, not a stranger's."""
    return len(message) == 1 and len(message[0]) <= _MAX_IDENTITY_BYTES


class SmallSealer(Protocol):
    """What a connection needs of the wire's signer (``_wire.Signer``) to seal a
    small message and write it in one step: the link sits below the wire."""

    def seal_small(self, meta: tuple[Any, ...], payload_bytes: bytes) -> bytes | None: ...

    def seal_write(
        self, meta: tuple[Any, ...], payload_bytes: bytes, fd: int
    ) -> tuple[bytes, int] | None: ...


class Connection:
    """One connected stream: parses whole messages out of it, queues what it
    could not send at once."""

    def __init__(self, sock: socket.socket, pool: BufferPool) -> None:
        sock.setblocking(False)
        self._pool = pool
        # A Unix stream charges what is in flight to the sender's buffer: room
        # for a MiB-sized message in one write, where the kernel allows it
        # (net.core.wmem_max caps it), saves the flusher thread's hand-off.
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER_BYTES)
        except OSError:
            pass
        self.sock = sock
        self.fd = sock.fileno()
        self.identity: bytes | None = None
        self.identity_frame: LinkFrame | None = None
        self.introduced_by_name = False  # the router's side: the first message names it
        self.send_lock = threading.Lock()
        self.backlog: collections.deque[memoryview] = collections.deque()
        self.eof = False
        self._buf = bytearray(_READ_CHUNK)
        self._view = memoryview(self._buf)
        self._start = 0  # unread bytes are _buf[_start:_end]
        self._end = 0
        self._lengths: list[int] | None = None  # of the message being read
        self._frames: list[Any] = []
        self._big: LinkBuffer | None = None  # a large frame being read into
        self._big_got = 0
        self._short = False  # the last read took less than it had room for
        self._max_frames = MAX_FRAMES
        self.dropped_oversized = 0  # messages over max_frames (each ended the stream)

    # -- sending (any thread, under send_lock) -----------------------------------------

    def send(self, frames: Sequence[Any]) -> bool:
        """Send one message without waiting; True if some of it waits for the
        flusher (the kernel's buffer was full, or earlier messages wait)."""
        with self.send_lock:
            if self.eof:  # the peer is gone: dropped, as a zmq socket would queue it forever
                return False
            if self.backlog:
                self._queue([_header_of(frames), *frames], 0)
                return True
            if _fastlink is not None:
                left = _fastlink.send(self.fd, frames)
                if left is not None:
                    if left > 0:  # the kernel's buffer is full: the flusher sends the rest
                        parts = [_header_of(frames), *frames]
                        self._queue(parts, sum(memoryview(p).nbytes for p in parts) - left)
                    elif left < 0:
                        self.eof = True
                    return left > 0
            return self._write_parts([_header_of(frames), *frames])

    def send_small(
        self, signer: SmallSealer, meta: tuple[Any, ...], payload_bytes: bytes
    ) -> bool | None:
        """:meth:`send` of ``signer.seal_small(meta, payload_bytes)``, sealed and
        written in one C step where nothing waits to be written (a rank's every
        reply); None, nothing sent or numbered, where it is too big for that."""
        with self.send_lock:
            if self.eof:  # (as send: dropped, and no number taken)
                return False
            if not self.backlog:
                sent = signer.seal_write(meta, payload_bytes, self.fd)
                if sent is None:
                    return None
                frame, left = sent
                if left > 0:  # the kernel's buffer is full: the flusher sends the rest
                    parts = [_header_of([frame]), frame]
                    return self._queue(parts, len(parts[0]) + len(frame) - left)
                if left < 0:
                    self.eof = True
                return False
            behind = signer.seal_small(meta, payload_bytes)  # queued after what waits
            if behind is None:
                return None
            return self._queue([_header_of([behind]), behind], 0)

    def send_many(self, messages: Sequence[Sequence[Any]]) -> bool:
        """Send ``messages`` in one write where the kernel takes them; as :meth:`send`."""
        with self.send_lock:
            if self.eof:
                return False
            left = None
            if _fastlink is not None and not self.backlog and isinstance(messages, list):
                left = _fastlink.send_many(self.fd, messages)
                if left is not None and left <= 0:  # all sent (most often), or an error
                    if left < 0:  # (never cleared here: the reader may have set it meanwhile)
                        self.eof = True
                    return False
            parts: list[Any] = []
            for frames in messages:
                parts.append(_header_of(frames))
                parts.extend(frames)
            if left is not None:  # the kernel's buffer is full: the flusher sends the rest
                return self._queue(parts, sum(memoryview(p).nbytes for p in parts) - left)
            if self.backlog:
                return self._queue(parts, 0)
            return self._write_parts(parts)

    def _write_parts(self, parts: list[Any]) -> bool:
        """Write what the kernel takes of ``parts`` and queue the rest (under send_lock)."""
        try:
            # At most _IOV_MAX buffers a write (more fail, EMSGSIZE): the flusher
            # writes the rest of a message of many frames.
            sent = self.sock.sendmsg(parts[:_IOV_MAX])
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.eof = True
            return False
        return self._queue(parts, sent)

    def _queue(self, parts: list[Any], sent: int) -> bool:
        """Queue what is left of ``parts`` once ``sent`` bytes went; True if any is.

        What is left of a frame the caller may change (a tensor's memory) is
        copied: the send returns now, and the caller may then fill the tensor
        with its next values; what it sent is what the tensor held at the send.
        """
        for part in parts:
            view = memoryview(part).cast("B")
            if sent >= view.nbytes:
                sent -= view.nbytes
                continue
            rest = view[sent:]
            self.backlog.append(rest if is_immutable(part) else memoryview(bytes(rest)))
            sent = 0
        return bool(self.backlog)

    def drain(self, linger_ms: int) -> None:
        """Send the backlog, waiting for the socket up to ``linger_ms``."""
        deadline = time.monotonic() + linger_ms / 1000
        poller = select.poll()
        poller.register(self.fd, select.POLLOUT)
        while self.flush() and not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            poller.poll(max(1, int(left * 1000)))

    def flush(self) -> bool:
        with self.send_lock:
            return self._write()

    def _write(self) -> bool:
        backlog = self.backlog
        while backlog:
            try:
                sent = self.sock.sendmsg(list(backlog)[:64])
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                self.eof = True
                backlog.clear()
                return False
            while sent:
                head = backlog[0]
                if sent >= head.nbytes:
                    sent -= head.nbytes
                    backlog.popleft()
                else:
                    backlog[0] = head[sent:]
                    sent = 0
        return False

    # -- receiving (the receiving thread) ----------------------------------------------

    def read(
        self,
        out: list[list[Any]],
        max_frames: int = MAX_FRAMES,
        limit: int = READ_MESSAGES,
        first: Any = None,
    ) -> bool:
        """Read what the socket has and append each whole message to ``out`` (a
        list of its frames, after ``first`` if that is not None), about ``limit``
        messages at most; a message of more than ``max_frames`` frames breaks the
        stream. True if it stopped at ``limit``: more may wait, in this buffer,
        where no poll of the fd announces it."""
        self._max_frames = max_frames
        self._short = False
        stop = len(out) + limit
        while not self.eof:
            if self._big is not None:
                if not self._read_big():
                    return False
                continue
            # A parse stops only where the buffer runs out (or a big frame begins,
            # above): it runs once per read, and not on an empty buffer between
            # messages (it needs 4 bytes there), which on a rank's path for a small
            # call were two parses in vain.
            if self._start != self._end or self._lengths is not None:
                self._parse(out, stop, first)
                if len(out) >= stop and not self.eof:
                    return True
                if self._big is not None:
                    continue
            # A read that did not fill the buffer took all there was: another
            # would only say so (EAGAIN); what comes later wakes the poller again.
            if self.eof or self._short or not self._fill(out, stop, first):
                return False
            if len(out) >= stop:  # (the C read parsed as it read)
                return True
        return False

    def _fill(self, out: list[list[Any]], stop: int, first: Any) -> bool:
        """Read more into the buffer; False if nothing came (or EOF). Between
        messages, in C, the whole messages it completes are parsed into ``out``
        as it reads (up to ``stop`` in all), in one call: a rank's every call
        and the controller's every reply come this way."""
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):
            self._grow(0)  # move the unread part to the front (or make room)
        room = len(self._buf) - self._end
        if _fastlink is not None and self._lengths is None:
            messages, self._start, self._end, n = _fastlink.recv_parse(
                self.fd,
                self._buf,
                self._start,
                self._end,
                stop - len(out),
                _OWN_BUFFER_BYTES,
                self._max_frames,
                first,
            )
            if messages:
                out.extend(messages)
            if n < 0:
                self.eof = True
        else:
            n = self._recv(self._view[self._end :])
            if n > 0:
                self._end += n
        if n <= 0:
            return False
        self._short = n < room
        return True

    def _recv(self, into: memoryview) -> int:
        """Bytes read into ``into``; 0 if none wait, -1 at end of file."""
        try:
            n = self.sock.recv_into(into)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            n = 0
        if n == 0:
            self.eof = True
            return -1
        return n

    def _take_bytes(self, n: int) -> memoryview | None:
        if self._end - self._start < n:
            return None
        view = self._view[self._start : self._start + n]
        self._start += n
        return view

    def _parse(self, out: list[list[Any]], stop: int, first: Any) -> bool:
        """Take what the buffer holds of the current message, until ``out`` holds
        ``stop`` messages; True if it made progress."""
        progress = False
        while True:
            if self._lengths is None:
                if _fastlink is not None:  # whole messages of small frames, in C
                    messages, self._start = _fastlink.parse(
                        self._buf,
                        self._start,
                        self._end,
                        stop - len(out),
                        _OWN_BUFFER_BYTES,
                        self._max_frames,
                        first,
                    )
                    if messages:
                        out.extend(messages)
                        progress = True
                if self._end - self._start < 4 or len(out) >= stop:
                    return progress
                (count,) = _COUNT.unpack_from(self._buf, self._start)
                if count == 0 or count > self._max_frames:
                    # Not skipped: its lengths alone may be more than we would
                    # allocate. Counted as zmq's receiver counts what it drops.
                    self.dropped_oversized += count > self._max_frames
                    self._broken()
                    return False
                if self._end - self._start < 4 + 8 * count:
                    if 4 + 8 * count > len(self._buf):  # a header larger than the buffer
                        self._grow(4 + 8 * count)
                    return progress
                lengths = list(struct.unpack_from(f"<{count}Q", self._buf, self._start + 4))
                if any(n > _MAX_FRAME_BYTES for n in lengths):
                    self._broken()
                    return False
                self._start += 4 + 8 * count
                self._lengths = lengths
                self._frames = []
                progress = True
            while len(self._frames) < len(self._lengths):
                n = self._lengths[len(self._frames)]
                if n >= _OWN_BUFFER_BYTES:
                    named = bool(out) and is_name(out[0])  # read with what follows it
                    if self.identity is None and self.introduced_by_name and not named:
                        self._broken()  # a name is a few bytes: nothing big before it
                        return False
                    try:
                        big = self._pool.take(n)
                    except MemoryError:
                        self._broken()
                        return False
                    have = min(n, self._end - self._start)
                    big[:have] = self._view[self._start : self._start + have]
                    self._start += have
                    self._big, self._big_got = big, have
                    if have < n:
                        return True
                    self._big = None
                    self._frames.append(big)
                    continue
                view = self._take_bytes(n)
                if view is None:
                    if n > len(self._buf):
                        self._grow(n)
                    return progress
                self._frames.append(bytes(view))
                progress = True
            out.append(self._frames if first is None else [first, *self._frames])
            self._lengths, self._frames = None, []
            progress = True

    def _read_big(self) -> bool:
        big = self._big
        assert big is not None
        view = memoryview(big)
        while self._big_got < len(big):
            n = self._recv(view[self._big_got :])
            if n <= 0:
                return False
            self._big_got += n
        self._frames.append(big)
        self._big = None
        return True

    def _grow(self, n: int) -> None:
        """Move the unread bytes to the front of a buffer of at least ``n`` bytes
        with room for more."""
        unread = self._end - self._start
        if n <= len(self._buf) and unread < len(self._buf):
            self._buf[:unread] = self._buf[self._start : self._end]
        else:
            buf = bytearray(max(n, 2 * len(self._buf)))
            buf[:unread] = self._buf[self._start : self._end]
            self._buf, self._view = buf, memoryview(buf)
        self._start, self._end = 0, unread

    def _broken(self) -> None:
        # Only our own uid can connect: a malformed stream is a bug, not input.
        self.eof = True

    def close(self) -> None:
        # Under the send lock: a sender that looked the connection up before it
        # closed must not write to its fd number, which a new connection may get.
        with self.send_lock:
            self.eof = True
            self.backlog.clear()
            self.sock.close()
