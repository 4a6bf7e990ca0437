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

Layout: this module holds the two ends (the zmq-socket face, the router's
table of workers and its write-behind, the dealer); one connection (framing,
sends, reads) is :mod:`._link_connection`, the thread that writes what waits
is :mod:`._link_flusher`. Both sit below this one, and the wire above.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import struct
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from ._link_connection import MAX_FRAMES as _MAX_FRAMES
from ._link_connection import READ_MESSAGES as _READ_MESSAGES
from ._link_connection import BufferPool as _BufferPool
from ._link_connection import Connection as _Connection
from ._link_connection import LinkBuffer as LinkBuffer
from ._link_connection import LinkFrame as LinkFrame
from ._link_connection import is_immutable as is_immutable
from ._link_connection import is_name as _is_name
from ._link_flusher import Flusher as _Flusher

if TYPE_CHECKING:
    from ._link_connection import SmallSealer

SCHEME = "unixlink://"
_POLLIN, _POLLOUT = 1, 2  # as zmq.POLLIN / zmq.POLLOUT
# How long a caller's sends may wait behind (LinkRouter.write_behind) when it
# does not wait for a reply first: messages fired and forgotten in a row.
_WRITE_BEHIND_S = 0.002
# Messages a worker may have waiting behind: that many go in one write at once
# (a pipelining caller's thousands of calls flow in batches, not after the timer).
_BEHIND_BATCH = 64
_DEALER_LINGER_MS = 2000


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

    def send_small(
        self, signer: SmallSealer, meta: tuple[Any, ...], payload_bytes: bytes
    ) -> int | None:
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


def is_link(socket: Any) -> TypeGuard[_LinkSocket]:
    """Whether ``socket`` is one end of a Unix link (else a zmq socket)."""
    return isinstance(socket, _LinkSocket)
