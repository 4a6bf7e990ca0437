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
``MONARCH_NB_LINK=unix`` turns it on for local meshes (off by default).

Framing: a message is a frame count (u32), each frame's length (u64), then
the frames. A large frame is received straight into a buffer of its own
(zero-copy from then on, as a zmq frame was); small ones are sliced out of a
read buffer. Who may connect: the socket lives in the tree's private (0700)
run directory, and the listener also checks the connecting process's uid
(``SO_PEERCRED``); a connection's first message names its identity.

Sends never wait: what the kernel does not take at once (a large frame,
a slow reader) queues on the connection and a flusher thread writes it when
the socket can take more, so two sides sending big messages to each other
cannot deadlock, as a zmq socket with no high-water mark could not.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeGuard

from ._extensions import load_extension

SCHEME = "unixlink://"
_POLLIN, _POLLOUT = 1, 2  # as zmq.POLLIN / zmq.POLLOUT
_COUNT = struct.Struct("<I")
_READ_CHUNK = 256 << 10
_OWN_BUFFER_BYTES = 64 << 10  # frames this large are read into a buffer of their own
_MAX_FRAMES = 1 << 16
_SEND_BUFFER_BYTES = 4 << 20
_MAX_IDENTITY_BYTES = 256
_DEALER_LINGER_MS = 2000
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


class LinkFrame(bytes):
    """A small received frame: ``bytes`` with pyzmq's ``Frame.bytes``/``.buffer``."""

    __slots__ = ()

    @property
    def bytes(self) -> bytes:
        return self

    @property
    def buffer(self) -> memoryview:
        return memoryview(self)


class LinkBuffer(bytearray):
    """A large received frame, read straight into its own memory."""

    @property
    def bytes(self) -> bytes:
        return bytes(self)

    @property
    def buffer(self) -> memoryview:
        return memoryview(self)


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
            header = _header_of(frames)
            try:
                sent = self.sock.sendmsg([header, *frames])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.eof = True
                return False
            return self._queue([header, *frames], sent)

    def _queue(self, parts: list[Any], sent: int) -> bool:
        """Queue what is left of ``parts`` once ``sent`` bytes went; True if any is."""
        for part in parts:
            view = memoryview(part).cast("B")
            if sent >= view.nbytes:
                sent -= view.nbytes
                continue
            self.backlog.append(view[sent:])
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

    def read(self, out: list[list[Any]]) -> None:
        """Read what the socket has and append each whole message to ``out``."""
        self._short = False
        while not self.eof:
            if self._big is not None:
                if not self._read_big():
                    return
                continue
            if self._parse(out):
                continue
            # A read that did not fill the buffer took all there was: another
            # would only say so (EAGAIN); what comes later wakes the poller again.
            if self._short or not self._fill():
                return

    def _fill(self) -> bool:
        """Read more into the buffer; False if nothing came (or EOF)."""
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):
            self._grow(0)  # move the unread part to the front (or make room)
        room = len(self._buf) - self._end
        n = self._recv(self._view[self._end :])
        if n <= 0:
            return False
        self._end += n
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

    def _parse(self, out: list[list[Any]]) -> bool:
        """Take what the buffer holds of the current message; True if it made progress."""
        progress = False
        while True:
            if self._lengths is None:
                if _fastlink is not None:  # whole messages of small frames, in C
                    messages, self._start = _fastlink.parse(
                        self._buf, self._start, self._end, 1 << 30, _OWN_BUFFER_BYTES, _MAX_FRAMES
                    )
                    if messages:
                        out.extend(messages)
                        progress = True
                if self._end - self._start < 4:
                    return progress
                (count,) = _COUNT.unpack_from(self._buf, self._start)
                if count == 0 or count > _MAX_FRAMES:
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
                    if self.identity is None and self.introduced_by_name:
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
            out.append(self._frames)
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
    """A thread that writes connections' backlogs when their sockets can take more."""

    def __init__(self, name: str) -> None:
        self._waiting: set[_Connection] = set()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def want(self, conn: _Connection) -> None:
        with self._lock:
            self._waiting.add(conn)
        os.write(self._wake_w, b"x")

    def close(self) -> None:
        self._closed = True
        os.write(self._wake_w, b"x")

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        registered: set[int] = set()
        while not self._closed:
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
            for fd, _ in poller.poll(1000 if fds else None):
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
        os.close(self._wake_r)
        os.close(self._wake_w)


class _LinkSocket:
    """What the two ends share: zmq-socket-like multipart sends, and ``closed``."""

    closed = False

    def __init__(self) -> None:
        self._parts: list[Any] = []  # a multipart message being sent (SNDMORE)
        self._ready: collections.deque[list[Any]] = collections.deque()
        self._flusher: _Flusher | None = None
        self._flusher_lock = threading.Lock()
        self._pool = _BufferPool()  # used by whoever receives, under the wire's lock

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
        with self._flusher_lock:
            if self._flusher is None:
                self._flusher = _Flusher("monarch_nb-link-flush")
        self._flusher.want(conn)

    def take(self, frames: int, messages: int) -> tuple[list[list[Any]], bool]:
        """Up to ``messages`` whole messages; and whether more may wait."""
        if not self._ready:
            self._read()
        done: list[list[Any]] = []
        ready = self._ready
        while ready and len(done) < messages and frames > 0:
            message = ready.popleft()
            frames -= len(message)
            done.append(message)
        return done, bool(ready)

    def _read(self) -> None:
        raise NotImplementedError

    def events(self) -> int:
        """As ``ZMQ_EVENTS``, which the wire asks after each send because asking
        took the zmq fd's (edge-triggered) notice: here nothing takes a notice,
        the fd stays readable while the kernel holds input, so input counts
        only once read and parsed into whole messages no fd announces."""
        return _POLLOUT | (_POLLIN if self._ready else 0)

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
        if self._flusher is not None:
            self._flusher.close()


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

    def send_to(self, identity: bytes, frames: Sequence[Any]) -> None:
        """One message to ``identity``: dropped if no such worker is connected (as a
        ROUTER drops it)."""
        conn = self._by_identity.get(identity)
        if conn is None or conn.eof:
            return
        if conn.send(frames):
            self._queued(conn)

    def _read(self) -> None:
        listener = self._listener.fileno()
        events = self._epoll.poll(0)
        if any(fd == listener for fd, _ in events):
            self._accept()  # and read what the new connections sent already
            events = [(fd, ev) for fd, ev in self._epoll.poll(0) if fd != listener]
        for fd, _ in events:
            conn = self._by_fd.get(fd)
            if conn is None:
                continue
            messages: list[list[Any]] = []
            conn.read(messages)
            for message in messages:
                if conn.identity is None:
                    if len(message) != 1 or len(message[0]) > _MAX_IDENTITY_BYTES:
                        conn.eof = True  # not a worker's greeting
                        break
                    if not self._introduce(conn, bytes(message[0])):
                        conn.eof = True
                        break
                else:
                    self._ready.append([conn.identity_frame, *message])
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
        self.closed = True
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

    def _read(self) -> None:
        conn = self._conn
        if conn.eof:
            return
        conn.read(self._ready)  # type: ignore[arg-type]
        if conn.eof:
            # The controller is gone (the worker's watchdog ends us next). Whoever
            # polls the fd read it once: keep the number, make it quiet, or an
            # end-of-file would wake every poll on it for good.
            quiet, self._quiet_w = os.pipe2(os.O_CLOEXEC)
            os.dup2(quiet, conn.fd)
            os.close(quiet)

    def close(self, linger: int | None = None) -> None:
        """Close, first sending what still queues for up to ``linger`` ms (as a zmq
        socket's ``LINGER``, which a worker's socket had at 2 s): a rank's last
        words (a large reply, its output) still reach the controller."""
        if self.closed:
            return
        self.closed = True
        self._close_flusher()
        self._conn.drain(_DEALER_LINGER_MS if linger is None else linger)
        self._conn.close()
        if self._quiet_w is not None:
            os.close(self._quiet_w)


def is_link(socket: Any) -> TypeGuard[_LinkSocket]:
    """Whether ``socket`` is one end of a Unix link (else a zmq socket)."""
    return isinstance(socket, _LinkSocket)
