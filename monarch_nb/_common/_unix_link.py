"""A controller's link to its local workers on a plain Unix stream socket, no libzmq.

libzmq hands every message to an I/O thread of its own on each side: about
80 us of the 119 us a raw pyzmq round trip takes here, where a plain Unix
socket's round trip is 38 us (``benchmarks/bench_floor.py``). On this link
the thread that sends writes the socket itself and the thread that receives
reads it: no hand-off when the kernel's buffer has room, which is always the
case for the control path's small messages.

It stands in for the two zmq sockets it replaces, as far as the wire uses
them (:mod:`._sockets` dispatches to it): :class:`LinkRouter` for the
controller's ROUTER (messages come as ``[identity, *frames]`` and go to the
identity in their first part), :class:`LinkDealer` for a worker's DEALER.
It is the local meshes' link by default; ``MONARCH_NB_LINK=zmq`` puts them
back on libzmq's ``ipc://`` socket.

Framing: a message is a frame count (u32), each frame's length (u64), then
the frames. A large frame is received straight into a buffer of its own
(zero-copy from then on, as a zmq frame was); small ones are sliced out of a
read buffer, a few hundred messages a read at most (the rest waits there,
and the socket's events and ``take`` say so: no poll of the fd would).

Who may connect: the socket lives in the tree's private (0700) run
directory, and the listener also checks the connecting process's uid
(``SO_PEERCRED``); a connection's first message names its identity.

Sends never wait: what the kernel does not take at once (a large frame,
a slow reader) queues on the connection and a flusher thread writes it when
the socket can take more, so two sides sending big messages to each other
cannot deadlock, as a zmq socket with no high-water mark could not.

Write-behind: a caller that sends several calls before it waits for any
(a gather over several actor meshes) has all but the first held per worker
and written in one write when it waits, or a few milliseconds later
(:meth:`LinkRouter.flush_behind`); otherwise a worker woken by the first
went back to sleep before the next came, and 128 processes on two cores
woke once a call. libzmq's I/O thread coalesced them the same way, by
writing whatever had queued for a worker when it got to it.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from ._extensions import load_extension

if TYPE_CHECKING:
    from ._wire import Signer

SCHEME = "unixlink://"
_POLLIN, _POLLOUT = 1, 2  # as zmq.POLLIN / zmq.POLLOUT
_COUNT = struct.Struct("<I")
_READ_CHUNK = 256 << 10
_OWN_BUFFER_BYTES = 64 << 10  # frames this large are read into a buffer of their own
_MAX_FRAMES = 1 << 16  # the wire's default (MONARCH_NB_MAX_MESSAGE_FRAMES): take() passes its own
# Messages one read of a connection parses at most; the rest waits in its buffer
# (bytes) or the kernel's. Each parsed message is a list the garbage collector
# tracks: a pipelining caller's thousands of replies, parsed at once, outlived
# enough collections to be promoted to the oldest generation, which then ran a
# full collection (every object in the process, torch's 170,000) every other
# burst of 10,000 calls. A few hundred are handled and gone before then.
_READ_MESSAGES = 256
_IOV_MAX = 1024  # buffers one sendmsg takes (Linux's UIO_MAXIOV)
# How long a caller's sends may wait behind (LinkRouter.write_behind) when it
# does not wait for a reply first: messages fired and forgotten in a row.
_WRITE_BEHIND_S = 0.002
# Messages a worker may have waiting behind: that many go in one write at once
# (a pipelining caller's thousands of calls flow in batches, not after the timer).
_BEHIND_BATCH = 64
_SEND_BUFFER_BYTES = 4 << 20
_MAX_IDENTITY_BYTES = 256
_DEALER_LINGER_MS = 2000
_fastlink = load_extension("_fastlink")
_log = logging.getLogger("monarch_nb")


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


class _BufferPool:
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


class _Connection:
    """One connected stream: parses whole messages out of it, queues what it
    could not send at once."""

    def __init__(self, sock: socket.socket, pool: _BufferPool) -> None:
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
        self._max_frames = _MAX_FRAMES
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
        self, signer: Signer, meta: tuple[Any, ...], payload_bytes: bytes
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
        max_frames: int = _MAX_FRAMES,
        limit: int = _READ_MESSAGES,
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
                    named = bool(out) and _is_name(out[0])  # read with what follows it
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


class _Flusher:
    """A thread that writes connections' backlogs when their sockets can take more,
    and runs what is due later (the router's write-behind)."""

    def __init__(self, name: str) -> None:
        self._waiting: set[_Connection] = set()
        self._due: list[tuple[float, Callable[[], None]]] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def want(self, conn: _Connection) -> None:
        with self._lock:
            if self._closed:  # the socket closed: its connections' backlogs went with it
                return
            self._waiting.add(conn)
            self._wake()

    def later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on this thread in ``delay_s`` seconds."""
        with self._lock:
            if self._closed:
                return
            self._due.append((time.monotonic() + delay_s, fn))
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    def close(self) -> None:
        with self._lock:
            if self._closed:  # (the thread may have closed the pipe already)
                return
            self._closed = True
            self._wake()

    def _run_due(self) -> float | None:
        """Run what is due; milliseconds until the next, None if nothing waits."""
        with self._lock:
            if not self._due:
                return None
            now = time.monotonic()
            ready = [fn for when, fn in self._due if when <= now]
            self._due = [(when, fn) for when, fn in self._due if when > now]
            next_ms = min((when - now) * 1000 for when, _ in self._due) if self._due else None
        for fn in ready:
            try:
                fn()
            except Exception:  # (a bug) this thread must go on writing backlogs
                _log.exception("monarch_nb: a Unix link's timer failed")
        return next_ms

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        registered: set[int] = set()
        while not self._closed:
            next_ms = self._run_due()
            with self._lock:
                waiting = list(self._waiting)
            for conn in waiting:
                if conn.eof or not conn.flush():
                    with self._lock:
                        if not conn.backlog or conn.eof:
                            self._waiting.discard(conn)
            with self._lock:
                fds = {c.fd for c in self._waiting if not c.eof}
            for fd in registered - fds:
                poller.unregister(fd)
            for fd in fds - registered:
                poller.register(fd, select.POLLOUT)
            registered = fds
            timeout = 1000.0 if fds else None
            if next_ms is not None:
                timeout = next_ms if timeout is None else min(timeout, next_ms)
            for fd, _ in poller.poll(timeout):
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
        # Under the lock: close() sets _closed and then wakes us, both under it,
        # and this loop reads _closed without it, so it may end (on a timeout)
        # between the two. Closed outside the lock, the wake-up would write to a
        # closed fd number, or to whatever file opened next with that number.
        with self._lock:
            os.close(self._wake_r)
            os.close(self._wake_w)


class _LinkSocket:
    """What the two ends share: zmq-socket-like multipart sends, and ``closed``."""

    closed = False

    def __init__(self) -> None:
        self._parts: list[Any] = []  # a multipart message being sent (SNDMORE)
        self._ready: collections.deque[list[Any]] = collections.deque()
        # Connections whose last read stopped at _READ_MESSAGES: read again before
        # (or without) the poller's word, which may never come for what waits
        # in their buffers.
        self._unread: set[_Connection] = set()
        self._flusher: _Flusher | None = None
        self._flusher_lock = threading.Lock()
        self._pool = _BufferPool()  # used by whoever receives, under the wire's lock
        self.dropped_unreported = 0  # messages over the frame cap, not yet told (take_dropped)

    def take_dropped(self) -> int:
        """How many messages over the frame cap were refused since the last ask
        (each ended its connection)."""
        dropped, self.dropped_unreported = self.dropped_unreported, 0
        return dropped

    def send(self, data: Any, flags: int = 0, copy: bool = True, track: bool = False) -> None:
        """As ``zmq.Socket.send``: parts with ``zmq.SNDMORE`` wait for the last."""
        self._parts.append(data if copy is False or isinstance(data, bytes) else bytes(data))
        if flags & 2:  # zmq.SNDMORE
            return
        parts, self._parts = self._parts, []
        self.send_parts(parts)

    def send_parts(self, parts: list[Any]) -> None:
        raise NotImplementedError

    def _queued(self, conn: _Connection) -> None:
        flusher = self._flusher_thread()
        if flusher is not None:
            flusher.want(conn)

    def _flusher_thread(self) -> _Flusher | None:
        """The flusher, started on first use; None once this socket is closed
        (one started then would never be closed)."""
        with self._flusher_lock:
            if self._flusher is None and not self.closed:
                self._flusher = _Flusher("monarch_nb-link-flush")
            return self._flusher

    def take(
        self, frames: int, messages: int, max_frames: int = _MAX_FRAMES
    ) -> tuple[list[list[Any]], bool]:
        """Up to ``messages`` whole messages (``frames`` in all, about); and whether
        more may wait. A message of more than ``max_frames`` frames breaks its
        connection: only a peer of our own uid can send one, and no sender of ours
        does (the wire refuses to send it)."""
        if not self._ready:
            self._read(max_frames)
        done: list[list[Any]] = []
        ready = self._ready
        while ready and len(done) < messages and frames > 0:
            message = ready.popleft()
            frames -= len(message)
            done.append(message)
        return done, bool(ready or self._unread)

    def _read(self, max_frames: int) -> None:
        """Read what the connections hold into ``_ready`` (a router's reads; a
        dealer reads in its own take)."""
        raise NotImplementedError

    def events(self) -> int:
        """As ``ZMQ_EVENTS``, which the wire asks after each send because asking
        took the zmq fd's (edge-triggered) notice: here nothing takes a notice,
        the fd stays readable while the kernel holds input, so input counts
        only once read and parsed into whole messages no fd announces."""
        return _POLLOUT | (_POLLIN if self._ready or self._unread else 0)

    def getsockopt(self, option: int) -> Any:
        import zmq

        if option == zmq.FD:
            return self.fileno()
        if option == zmq.EVENTS:
            return self.events()
        raise ValueError(f"a Unix link has no socket option {option}")

    def setsockopt(self, option: int, value: Any) -> None:
        pass  # the zmq options the wire sets (linger, high-water marks) mean nothing here

    def fileno(self) -> int:
        raise NotImplementedError

    def _close_flusher(self) -> None:
        with self._flusher_lock:  # after _first_close: no flusher starts after this
            flusher = self._flusher
        if flusher is not None:
            flusher.close()

    def _first_close(self) -> bool:
        """Mark closed; True for the one caller that closes (two threads may both
        close a socket, a shutdown and a teardown; each fd must close once)."""
        with self._flusher_lock:
            if self.closed:
                return False
            self.closed = True
            return True


class LinkRouter(_LinkSocket):
    """The controller's end: a listener in the run directory and one connection
    per worker, all polled through one epoll descriptor (:meth:`fileno`)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._listener.bind(path)
        self._listener.listen(1024)
        self._listener.setblocking(False)
        self._epoll = select.epoll()
        self._epoll.register(self._listener.fileno(), select.EPOLLIN)
        self._by_fd: dict[int, _Connection] = {}
        self._by_identity: dict[bytes, _Connection] = {}
        self._lock = threading.Lock()  # the tables, for senders on other threads
        # Write-behind: while ``write_behind`` is set (by the controller, around a
        # caller's sends), messages wait here, per connection, in order, until
        # flush_behind() (the caller waits) or _WRITE_BEHIND_S later. See send_to.
        self.write_behind = False
        self._behind: dict[_Connection, list[Sequence[Any]]] = {}
        self._behind_lock = threading.Lock()

    @property
    def address(self) -> str:
        return SCHEME + self.path

    def getsockopt_string(self, option: int) -> str:
        return self.address

    def fileno(self) -> int:
        return self._epoll.fileno()

    def send_parts(self, parts: list[Any]) -> None:
        identity = bytes(parts[0])
        self.send_to(identity, parts[1:])

    def send_to(self, identity: bytes, frames: Sequence[Any], immutable: bool = False) -> None:
        """One message to ``identity``: dropped if no such worker is connected (as a
        ROUTER drops it). Written at once, unless ``write_behind`` is set or earlier
        messages to that worker wait behind (they go first). ``immutable``: the
        caller knows every frame is ``bytes``."""
        conn = self._by_identity.get(identity)
        if conn is None or conn.eof:
            return
        if self.write_behind or self._behind:
            with self._behind_lock:
                if self.write_behind or conn in self._behind:
                    self._hold(conn, frames, immutable)
                    return
        if conn.send(frames):
            self._queued(conn)

    def send_frame(self, identities: Sequence[bytes], frame: bytes) -> None:
        """:meth:`send_to` of the one-frame message ``frame`` (``bytes``: held
        without a copy) to each of ``identities``: most calls and casts."""
        assert frame.__class__ is bytes, "send_frame holds the frame: bytes only"
        message = [frame]  # (never changed: ranks of a cast may hold it)
        for identity in identities:
            self.send_to(identity, message, True)

    def _hold(self, conn: _Connection, frames: Sequence[Any], immutable: bool = False) -> None:
        """Queue ``frames`` behind ``conn``'s waiting messages (under _behind_lock).
        They all go at once when a worker has a batch, or when this message has a
        frame of the caller's own memory (a tensor's bytes, not copied): held, it
        would send what the caller writes into it next. ``immutable``: the caller
        knows every frame is bytes."""
        behind = self._behind
        if not behind:
            flusher = self._flusher_thread()
            if flusher is not None:  # (closed: nothing would be written anyway)
                flusher.later(_WRITE_BEHIND_S, self.flush_behind)
        waiting = behind.get(conn)
        if waiting is None:
            waiting = behind[conn] = []
        waiting.append(frames)
        if len(waiting) >= _BEHIND_BATCH or not (immutable or all(map(is_immutable, frames))):
            del behind[conn]
            if conn.send_many(waiting):
                self._queued(conn)

    def flush_behind(self) -> None:
        """Write the messages waiting behind: each worker's in one write.

        Why they wait: a worker woken by one message goes back to sleep before
        the next comes, so a caller sending several calls in a row (a gather of
        eight actor meshes) woke each of 128 processes eight times, on two
        cores; libzmq's I/O thread coalesced them into a write a worker. The
        dict empties only after the writes: a sender that finds it non-empty
        waits for the lock, so nothing overtakes what waited."""
        with self._behind_lock:
            behind = self._behind
            if not behind:
                return
            for conn, messages in behind.items():
                if conn.send_many(messages):
                    self._queued(conn)
            behind.clear()

    def _read(self, max_frames: int) -> None:
        listener = self._listener.fileno()
        events = self._epoll.poll(0)
        for fd, _ in events:  # a loop, not any(): no generator to run per reply
            if fd == listener:
                self._accept()  # and read what the new connections sent already
                events = [(fd, ev) for fd, ev in self._epoll.poll(0) if fd != listener]
                break
        conns = [self._by_fd.get(fd) for fd, _ in events]
        if self._unread:
            conns.extend(self._unread.difference(conns))
            self._unread.clear()
        for conn in conns:
            if conn is None:
                continue
            named = conn.identity_frame
            if named is not None:  # (most reads) each message comes with who sent it
                if conn.read(self._ready, max_frames, _READ_MESSAGES, named):  # type: ignore[arg-type]
                    self._unread.add(conn)
            else:
                messages: list[list[Any]] = []
                if conn.read(messages, max_frames):
                    self._unread.add(conn)
                for message in messages:
                    if conn.identity is None:
                        if not _is_name(message):
                            conn.eof = True  # not a worker's greeting
                            break
                        if not self._introduce(conn, bytes(message[0])):
                            conn.eof = True
                            break
                    else:
                        self._ready.append([conn.identity_frame, *message])
            if conn.dropped_oversized:
                self.dropped_unreported += conn.dropped_oversized
                conn.dropped_oversized = 0
            if conn.eof:
                self._forget(conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():  # the 0700 directory already stops them: belt and braces
                sock.close()
                continue
            conn = _Connection(sock, self._pool)
            conn.introduced_by_name = True
            with self._lock:
                self._by_fd[conn.fd] = conn
            self._epoll.register(conn.fd, select.EPOLLIN | select.EPOLLRDHUP)

    def _introduce(self, conn: _Connection, identity: bytes) -> bool:
        """Name ``conn``; False (the caller hangs up) if a live connection has
        that name: as a zmq ROUTER, the first keeps it. Ranks never reconnect (a
        restarted rank has a new random name), so a second is an impostor."""
        with self._lock:
            if identity in self._by_identity:
                return False
            conn.identity, conn.identity_frame = identity, LinkFrame(identity)
            self._by_identity[identity] = conn
        return True

    def _forget(self, conn: _Connection) -> None:
        self._unread.discard(conn)
        with self._lock:
            self._by_fd.pop(conn.fd, None)
            if conn.identity is not None and self._by_identity.get(conn.identity) is conn:
                del self._by_identity[conn.identity]
        try:
            self._epoll.unregister(conn.fd)
        except (OSError, ValueError):
            pass
        conn.close()

    def close(self, linger: int | None = None) -> None:
        if self.closed:
            return
        self.flush_behind()  # sent before the close, as zmq's linger (0 here) would try
        if not self._first_close():
            return
        self._close_flusher()
        for conn in list(self._by_fd.values()):
            conn.close()
        self._listener.close()
        self._epoll.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class LinkDealer(_LinkSocket):
    """A worker's end: one connection to the controller, its identity sent first."""

    def __init__(self, address: str, identity: bytes) -> None:
        super().__init__()
        if not address.startswith(SCHEME):
            raise ValueError(f"not a Unix link address: {address!r}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.connect(address[len(SCHEME) :])
        self._conn = _Connection(sock, self._pool)
        self._quiet_w: int | None = None
        self.send_parts([identity])

    def fileno(self) -> int:
        return self._conn.fd

    def send_parts(self, parts: list[Any]) -> None:
        if self._conn.send(parts):
            self._queued(self._conn)

    def send_small(self, signer: Signer, meta: tuple[Any, ...], payload_bytes: bytes) -> int | None:
        """Send ``signer.seal_small(meta, payload_bytes)``, sealed and written in one
        step (see ``_Connection.send_small``), and return the events after it (as
        ``_sockets.send_one`` on a zmq socket): a rank's every reply. None, nothing
        sent, where it is too big for that."""
        queued = self._conn.send_small(signer, meta, payload_bytes)
        if queued is None:
            return None
        if queued:
            self._queued(self._conn)
        return self.events()

    def take(
        self, frames: int, messages: int, max_frames: int = _MAX_FRAMES
    ) -> tuple[list[list[Any]], bool]:
        if self._ready:  # (the base's take reads nothing then: this is the only read)
            return super().take(frames, messages, max_frames)
        # A rank's every call: nothing parsed waits, so the read parses into the
        # list it returns, no more messages than asked for (no queue between).
        done: list[list[Any]] = []
        conn = self._conn
        if conn.eof:
            return done, False
        self._unread.discard(conn)
        if conn.read(done, max_frames, min(messages, _READ_MESSAGES)):
            self._unread.add(conn)
        if conn.dropped_oversized:
            self.dropped_unreported += conn.dropped_oversized
            conn.dropped_oversized = 0
        if conn.eof:
            # The controller is gone (the worker's watchdog ends us next). Whoever
            # polls the fd read it once: keep the number, make it quiet, or an
            # end-of-file would wake every poll on it for good.
            quiet, self._quiet_w = os.pipe2(os.O_CLOEXEC)
            os.dup2(quiet, conn.fd)
            os.close(quiet)
        if len(done) > 1:  # over the frame budget: the rest waits, in order
            for i, message in enumerate(done):
                frames -= len(message)
                if frames <= 0:
                    self._ready.extend(done[i + 1 :])
                    del done[i + 1 :]
                    break
        return done, bool(self._ready or self._unread)

    def close(self, linger: int | None = None) -> None:
        """Close, first sending what still queues for up to ``linger`` ms (as a zmq
        socket's ``LINGER``, which a worker's socket had at 2 s): a rank's last
        words (a large reply, its output) still reach the controller."""
        if not self._first_close():
            return
        self._close_flusher()
        self._conn.drain(_DEALER_LINGER_MS if linger is None else linger)
        self._conn.close()
        if self._quiet_w is not None:
            os.close(self._quiet_w)


def _is_name(message: list[Any]) -> bool:
    """Whether ``message``, a connection's first, can be a worker's name (one frame
    of a few bytes). The router takes the name once a read returns; a large frame
    read after a name in the same read is a worker's, not a stranger's."""
    return len(message) == 1 and len(message[0]) <= _MAX_IDENTITY_BYTES


def is_link(socket: Any) -> TypeGuard[_LinkSocket]:
    """Whether ``socket`` is one end of a Unix link (else a zmq socket)."""
    return isinstance(socket, _LinkSocket)
