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
import time
from dataclasses import dataclass

import zmq

# A listening socket's handshake deadline: a CURVE handshake on a working
# network takes milliseconds; a stranger holding a connection open without
# finishing one is dropped after this (libzmq's default is 30 s).
HANDSHAKE_MS = 5_000
# Connections still in their handshake that one endpoint holds at most.
MAX_PENDING = 64
# Monitor events handled per readable() call: the owner's loop has other work.
_BUDGET = 512
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
    because too many others were still in their handshake), and how many are
    pending now, per listening port."""

    accepted: int
    refused: int
    pending: dict[int, int]


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
    """Caps the connections of ``sock`` that have not finished their handshake
    (see the module docstring). Make it before ``sock.bind`` (it sets the
    socket's ``HANDSHAKE_IVL``, which each endpoint copies when bound); the
    owner polls :attr:`monitor` and calls :meth:`readable` when it is.

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
    ) -> None:
        self.max_pending = max_pending
        self._window = handshake_ms / 1000
        self._log = logger
        self._who = who
        sock.setsockopt(zmq.HANDSHAKE_IVL, handshake_ms)
        address = f"inproc://monarch_nb-handshake-guard-{next(_monitor_ids)}"
        self.monitor: zmq.Socket = sock.get_monitor_socket(_EVENTS, address)
        self._sock = sock
        self._endpoints: dict[int, _Endpoint] = {}
        self.accepted = 0
        self.refused = 0

    def readable(self) -> None:
        """Handle the monitor's events (up to a budget: call again while it is
        readable), shutting down connections accepted past the cap."""
        now = time.monotonic()
        for _ in range(_BUDGET):
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2 or len(frames[0]) != 6:
                continue
            event, value = struct.unpack("=HI", frames[0])
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
            elif event == zmq.EVENT_DISCONNECTED:
                endpoint.young.pop(value, None)
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                endpoint.succeeded.append(now)

    def _refuse(self, fd: int, port: int) -> None:
        """Shut down accepted connection ``fd`` (still libzmq's to close): checked
        first to be a TCP connection on ``port``, not a listener, since the event
        may be stale and the fd number reused by then."""
        try:
            conn = socket.socket(fileno=fd)
        except OSError:
            return  # closed meanwhile, or no longer a socket
        try:
            if (
                conn.family in (socket.AF_INET, socket.AF_INET6)
                and not conn.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)  # a listener
                and conn.getsockname()[1] == port
            ):
                # A reset rather than a FIN and TIME_WAIT once libzmq closes it.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # ended meanwhile: nothing to refuse
        finally:
            conn.detach()  # the fd stays libzmq's
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

    def statistics(self) -> GuardStats:
        now = time.monotonic()
        pending = {port: e.pending(now, self._window) for port, e in self._endpoints.items()}
        return GuardStats(self.accepted, self.refused, pending)

    def close(self) -> None:
        """Stop watching (the socket itself stays open)."""
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass  # the socket or its context is closed already
        self.monitor.close(0)


def _port_of(endpoint: bytes) -> int | None:
    """The port of a ``tcp://host:port`` endpoint, else None."""
    if not endpoint.startswith(b"tcp://"):
        return None
    try:
        return int(endpoint.rpartition(b":")[2])
    except ValueError:
        return None
