"""A cap on the connections of a listening zmq socket that have not finished
their handshake.

libzmq accepts every TCP connection that reaches a bound endpoint and holds it
(an fd, its buffers) until the ZMTP/CURVE handshake ends or ``HANDSHAKE_IVL``
runs out; it has no option to bound how many it holds meanwhile. A keyless
peer that opens connections faster than they time out therefore takes every
fd of the process. :class:`HandshakeGuard` bounds them, per endpoint (per
listening port), from the socket's monitor:

- ``ACCEPTED`` carries the new connection's fd, ``DISCONNECTED`` the fd of one
  that ended; ``HANDSHAKE_SUCCEEDED`` says that one succeeded, not which.
- libzmq drops a connection whose handshake is not done within
  ``HANDSHAKE_IVL``, so the pending ones are among the connections accepted
  within the last interval and still open, less the handshakes that succeeded
  in it. Past ``max_pending`` a newly accepted connection is shut down at
  once (``shutdown(SHUT_RDWR)`` on its fd, which libzmq then reads as the end
  of the stream and closes): the authenticated links are never touched.
- Monitor events lost to the monitor's bounded queue only skew the count for
  one interval.

It also bounds what one connection may make the process buffer before it is
authenticated. libzmq's ``ZMQ_MAXMSGSIZE`` is one figure for a connection's
whole life, so it cannot be small before the handshake and large after: a
keyless peer may declare a frame of that size and trickle its bytes in, which
libzmq buffers until the frame is whole. So a thread of the guard reads each
unproven connection's ``TCP_INFO`` every ``CHECK_S`` and shuts down one that
brought more than ``pre_auth_bytes`` (64 KiB) before it was proven:

- on a CURVE socket, proven once this side has sent its READY (the
  handshake's last word, after ZAP said yes): a greeting, WELCOME and READY
  come to 301 bytes, while a peer that fails gets at most 64 + 170 + a 12-byte
  ERROR. A client sends nothing of its own before READY, so a legitimate one
  never comes near the budget;
- on a plain port (``"null"``, ``MONARCH_NB_BIND``), where the HMAC check of
  our messages is the only authentication, proven once this side has sent
  more than its greeting and READY (107 bytes): a message of ours, which goes
  only to a routing id we handed out, after that peer's signed hello.

What a keyless peer can make the process hold is then about
``max_pending * pre_auth_bytes`` plus what arrives within one check, not
``max_pending`` times the frame cap.

Why a monitor rather than an accept front of our own: a front would sit on
the path of every message of the authenticated link (the agent relays all of
a host's traffic); the monitor sees only connection events, off that path.
"""

from __future__ import annotations

import collections
import itertools
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import zmq

# A listening socket's handshake deadline: a CURVE handshake on a working
# network takes milliseconds; a stranger holding a connection open without
# finishing one is dropped after this (libzmq's default is 30 s).
HANDSHAKE_MS = 5_000
# Connections still in their handshake that one endpoint holds at most.
MAX_PENDING = 64
# Bytes a connection may bring before it is proven (see the module docstring):
# a CURVE handshake is under 1 KiB, a worker's signed hello a few hundred bytes.
PRE_AUTH_BYTES = 64 << 10
# How often the unproven connections' byte counts are read.
CHECK_S = 0.01
# What this side has sent on a connection once it is proven, more than.
_PROVEN_AFTER_SENT = {"curve": 256, "null": 160}
# struct tcp_info (Linux >= 4.1): tcpi_bytes_acked at 120 (what we sent and the
# peer acknowledged), tcpi_bytes_received at 128.
_TCP_INFO_LEN = 136
_TCP_BYTES_AT = 120
# Monitor events handled per readable() call: the owner's loop has other work.
_BUDGET = 512
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_EVENTS = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_monitor_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class GuardStats:
    """What one guard saw: connections accepted and refused (shut down at once
    because too many others were still in their handshake), how many are
    pending now, per listening port, and how many were shut down for bringing
    more than ``pre_auth_bytes`` before they were proven."""

    accepted: int
    refused: int
    pending: dict[int, int]
    over_budget: int = 0


class _Endpoint:
    """One listening port's connections accepted within the last interval."""

    def __init__(self) -> None:
        self.young: dict[int, float] = {}  # fd -> when accepted, oldest first
        self.succeeded: collections.deque[float] = collections.deque()

    def pending(self, now: float, window: float) -> int:
        young, succeeded = self.young, self.succeeded
        while young:
            fd, accepted = next(iter(young.items()))
            if now - accepted < window:
                break
            del young[fd]  # past the deadline: handshaken, or being dropped by libzmq
        while succeeded and now - succeeded[0] >= window:
            succeeded.popleft()
        return max(0, len(young) - len(succeeded))


class HandshakeGuard:
    """Caps the connections of ``sock`` that have not finished their handshake,
    and what each may bring before it is proven (see the module docstring).
    Make it before ``sock.bind`` (it sets the socket's ``HANDSHAKE_IVL``, which
    each endpoint copies when bound); the owner polls :attr:`monitor` and calls
    :meth:`readable` when it is. ``mechanism`` is the listening endpoints':
    ``"curve"``, or ``"null"`` for a plain port.

    The guard owns the socket's one monitor (libzmq allows one per socket): an
    owner that wants to hear of failed handshakes too adds a listener with
    :meth:`on_handshake_failed`.

    Example::

        guard = HandshakeGuard(sock, logger=log, who="agent 0")
        sock.bind("tcp://0.0.0.0:7000")
        poller.register(guard.monitor, zmq.POLLIN)
        ...  # when the poller reports guard.monitor: guard.readable()
    """

    def __init__(
        self,
        sock: zmq.Socket,
        *,
        logger: logging.Logger,
        who: str,
        max_pending: int = MAX_PENDING,
        handshake_ms: int = HANDSHAKE_MS,
        mechanism: Literal["curve", "null"] = "curve",
        pre_auth_bytes: int = PRE_AUTH_BYTES,
    ) -> None:
        self.max_pending = max_pending
        self.pre_auth_bytes = pre_auth_bytes
        self._proven_after = _PROVEN_AFTER_SENT[mechanism]
        self._window = handshake_ms / 1000
        self._log = logger
        self._who = who
        sock.setsockopt(zmq.HANDSHAKE_IVL, handshake_ms)
        address = f"inproc://monarch_nb-handshake-guard-{next(_monitor_ids)}"
        self.monitor: zmq.Socket = sock.get_monitor_socket(_EVENTS, address)
        self._sock = sock
        self._endpoints: dict[int, _Endpoint] = {}
        self._listeners: list[Callable[[str], None]] = []
        self.accepted = 0
        self.refused = 0
        self.over_budget = 0
        # Connections not proven yet (fd -> (listening port, watch serial)), for
        # the budget thread. The serial tells a connection from an earlier one
        # with the same fd number: the thread must not forget a new connection
        # because the one it checked before under that number ended.
        self._unproven: dict[int, tuple[int, int]] = {}
        self._serials = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def on_handshake_failed(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(endpoint)`` from :meth:`readable` each time a handshake
        of the socket fails (a connection it accepted, or one it made); returns
        the function that removes it."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def readable(self) -> bool:
        """Handle the monitor's events, shutting down connections accepted past
        the cap. Returns True where a budget of events was spent and more may
        wait: the owner calls again (soon, after its other work)."""
        now = time.monotonic()
        for _ in range(_BUDGET):
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return False
            if len(frames) != 2 or len(frames[0]) != 6:
                continue
            event, value = struct.unpack("=HI", frames[0])
            if event & _HANDSHAKE_FAILED:
                for listener in list(self._listeners):
                    listener(frames[1].decode(errors="replace"))
            port = _port_of(frames[1])
            if port is None:  # not TCP (ipc://, inproc://): nothing to guard
                continue
            endpoint = self._endpoints.get(port)
            if endpoint is None:
                endpoint = self._endpoints[port] = _Endpoint()
            if event == zmq.EVENT_ACCEPTED:
                self.accepted += 1
                endpoint.young.pop(value, None)  # a reused fd goes last
                if endpoint.pending(now, self._window) >= self.max_pending:
                    self._refuse(value, port)
                else:
                    endpoint.young[value] = now
                    self._watch_bytes(value, port)
            elif event == zmq.EVENT_DISCONNECTED:
                endpoint.young.pop(value, None)
                with self._lock:
                    self._unproven.pop(value, None)
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                endpoint.succeeded.append(now)
        return True

    def _refuse(self, fd: int, port: int) -> None:
        """Shut down accepted connection ``fd``, one past the cap."""
        _shut_down(fd, port)
        self.refused += 1
        if self.refused == 1:
            self._log.warning(
                "%s: %d connections on port %d have not finished their handshake "
                "within %g s; closing new ones until they do (a client without the "
                "key is flooding this endpoint: firewall it if it is reachable by others)",
                self._who,
                self.max_pending,
                port,
                self._window,
            )

    # -- the pre-authentication byte budget (its own thread) ----------------------

    def _watch_bytes(self, fd: int, port: int) -> None:
        if self.pre_auth_bytes <= 0:
            return
        with self._lock:
            self._unproven[fd] = (port, next(self._serials))
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._check_budgets, name="monarch_nb-handshake-guard", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _check_budgets(self) -> None:
        """Every CHECK_S while any connection is unproven: forget the proven,
        shut down those past the budget."""
        while True:
            self._wake.wait()
            with self._lock:
                if self._closed:
                    return
                unproven = list(self._unproven.items())
                if not unproven:
                    self._wake.clear()
                    continue
            done = []
            for fd, watched in unproven:
                port = watched[0]
                counts = _tcp_bytes(fd, port)
                if counts is None:  # closed meanwhile, or no counts on this kernel
                    done.append((fd, watched))
                    continue
                sent, received = counts
                if sent > self._proven_after:
                    done.append((fd, watched))
                elif received > self.pre_auth_bytes:
                    done.append((fd, watched))
                    self._over_budget(fd, port, received)
            with self._lock:
                for fd, watched in done:
                    # Only the connection checked: once it ended, its fd number
                    # may already belong to a new one, watched under a new serial.
                    if self._unproven.get(fd) == watched:
                        del self._unproven[fd]
            time.sleep(CHECK_S)

    def _over_budget(self, fd: int, port: int, received: int) -> None:
        _shut_down(fd, port)
        self.over_budget += 1
        if self.over_budget == 1:
            self._log.warning(
                "%s: a connection on port %d sent %d bytes before authenticating "
                "(at most %d are taken before then); closed, as are the next such "
                "(a client without the key: firewall this endpoint if it is reachable "
                "by others)",
                self._who,
                port,
                received,
                self.pre_auth_bytes,
            )

    def statistics(self) -> GuardStats:
        now = time.monotonic()
        pending = {port: e.pending(now, self._window) for port, e in self._endpoints.items()}
        return GuardStats(self.accepted, self.refused, pending, self.over_budget)

    def close(self) -> None:
        """Stop watching (the socket itself stays open)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass  # the socket or its context is closed already
        self.monitor.close(0)


def _tcp_socket(fd: int, port: int) -> socket.socket | None:
    """A socket object over accepted connection ``fd`` (still libzmq's: the caller
    detaches it), checked first to be a TCP connection on ``port``, not a
    listener, since the event may be stale and the fd number reused by then."""
    try:
        conn = socket.socket(fileno=fd)
    except OSError:
        return None  # closed meanwhile, or no longer a socket
    try:
        if (
            conn.family in (socket.AF_INET, socket.AF_INET6)
            and not conn.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)  # a listener
            and conn.getsockname()[1] == port
        ):
            return conn
    except OSError:
        pass  # ended meanwhile
    conn.detach()
    return None


def _shut_down(fd: int, port: int) -> None:
    """Shut down accepted connection ``fd`` (``shutdown(SHUT_RDWR)``, which libzmq
    then reads as the end of the stream and closes)."""
    conn = _tcp_socket(fd, port)
    if conn is None:
        return
    try:
        # A reset rather than a FIN and TIME_WAIT once libzmq closes it.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # ended meanwhile: nothing to refuse
    finally:
        conn.detach()  # the fd stays libzmq's


def _tcp_bytes(fd: int, port: int) -> tuple[int, int] | None:
    """(bytes sent and acknowledged, bytes received) of accepted connection
    ``fd``; None where it is gone or the kernel does not count them."""
    conn = _tcp_socket(fd, port)
    if conn is None:
        return None
    try:
        info = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    finally:
        conn.detach()
    if len(info) < _TCP_INFO_LEN:
        return None
    sent, received = struct.unpack_from("=QQ", info, _TCP_BYTES_AT)
    return sent, received


def _port_of(endpoint: bytes) -> int | None:
    """The port of a ``tcp://host:port`` endpoint, else None."""
    if not endpoint.startswith(b"tcp://"):
        return None
    try:
        return int(endpoint.rpartition(b":")[2])
    except ValueError:
        return None
