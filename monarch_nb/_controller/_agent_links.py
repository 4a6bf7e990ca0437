"""The controller's links to host agents: their socket, its guard, and who each agent is.

Host agents' CURVE links have a ROUTER socket of their own, made when a host
mesh first needs one: nothing from the network shares a socket (or a
routing-id table) with local workers, and its frames are always capped. The
socket is guarded by the controller's send lock, as a send relays calls to
remote ranks through it (see :mod:`._client`); what arrives on it the
controller verifies and dispatches, like what local workers send.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import zmq

from .._wire._handshake_guard import HandshakeGuard
from .._wire._signed import MAX_FRAME_BYTES, OWN, Encoded
from .._wire._sockets import socket_events

if TYPE_CHECKING:
    from ._io_loop import IOLoop

_POLLIN = int(zmq.POLLIN)
_log = logging.getLogger("monarch_nb")


class AgentPeer(Protocol):
    """What the controller needs of a host agent (see :mod:`._hosts`)."""

    def on_message(self, frames: list[Any]) -> None: ...


def watch_guard(
    loop: IOLoop,
    router: zmq.Socket,
    mechanism: Literal["curve", "null"],
    closed: Callable[[], bool],
) -> HandshakeGuard:
    """Cap ``router``'s connections in their handshake, and what each brings
    before it is proven (before any bind). Any thread; ``loop``'s thread
    handles the guard's monitor until ``closed()``."""
    guard = HandshakeGuard(router, logger=_log, who="the controller", mechanism=mechanism)
    fd = int(guard.monitor.getsockopt(zmq.FD))

    def readable() -> None:  # edge-triggered: readable() reads until none is left
        if closed():
            return
        if guard.readable():  # a budget spent: the rest after other work
            loop.call_soon(readable)

    def watch() -> None:
        loop.add_fd(fd, readable)
        readable()

    if loop.in_loop_thread:
        watch()
    else:
        loop.call_soon(watch)
    return guard


def close_guard(loop: IOLoop, guard: HandshakeGuard) -> None:
    """Stop watching ``guard``'s monitor and close it (I/O thread)."""
    loop.remove_fd(int(guard.monitor.getsockopt(zmq.FD)))
    guard.close()


class AgentLinks:
    """The controller's socket for host agents' links, made on first use.

    ``lock`` is the controller's send lock: every use of the socket holds it
    (or runs on the I/O thread). ``drain(socket)`` takes and dispatches what
    the socket holds; ``closed()`` says the controller shut down.
    """

    def __init__(
        self,
        loop: IOLoop,
        lock: threading.Lock,
        drain: Callable[[zmq.Socket], None],
        closed: Callable[[], bool],
    ) -> None:
        self._loop = loop
        self._lock = lock
        self._drain = drain
        self._closed = closed
        self.agents: dict[bytes, AgentPeer] = {}  # identity -> a host agent
        self.router: zmq.Socket | None = None  # made by socket()
        self.guard: HandshakeGuard | None = None

    def add(self, identity: bytes, agent: AgentPeer) -> None:
        self.agents[identity] = agent

    def remove(self, identity: bytes) -> None:
        self.agents.pop(identity, None)

    def send(self, identity: bytes, message: Encoded) -> None:
        """Send an agent's own message (any thread)."""
        with self._lock:
            router = self.socket()
            message.send(router, identity, None, OWN)
            pending_input = socket_events(router) & _POLLIN
        if pending_input:
            self._loop.call_soon(self.readable)

    def socket(self) -> zmq.Socket:
        """The socket of the agents' links, made on first use (lock held, or the
        I/O thread)."""
        router = self.router
        if router is None:
            router = self._loop.context.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.setsockopt(zmq.SNDHWM, 0)
            router.setsockopt(zmq.RCVHWM, 0)
            # Frames from the network are capped before CURVE has judged the peer;
            # connections in their handshake, and what each brings meanwhile, too.
            router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
            self.guard = watch_guard(self._loop, router, "curve", self._closed)
            self.router = router
            fd = int(router.getsockopt(zmq.FD))

            def watch() -> None:  # edge-triggered: look once, for what came before
                self._loop.add_fd(fd, self.readable)
                self.readable()

            self._loop.call_soon(watch)
        return router

    def readable(self) -> None:
        """Take what the socket holds (I/O thread)."""
        if self.router is not None:
            self._drain(self.router)

    def bind_curve(self, host: str, server_public: str, server_secret: str) -> str:
        """Listen on ``host`` too, CURVE-encrypted with this server key pair (for
        agents on other hosts); returns the endpoint. I/O thread."""
        with self._lock:
            router = self.socket()
            # Options are copied into each endpoint when it is made: set, bind, unset.
            router.curve_server = True
            router.curve_publickey = server_public.encode()
            router.curve_secretkey = server_secret.encode()
            try:
                port = router.bind_to_random_port(f"tcp://{host}")
            finally:
                router.curve_server = False
        return f"tcp://{host}:{port}"

    def connect_curve(
        self, address: str, identity: bytes, server_public: str, public: str, secret: str
    ) -> None:
        """Connect to an agent listening at ``address`` as a CURVE client. I/O thread."""
        with self._lock:
            router = self.socket()
            router.setsockopt(zmq.CONNECT_ROUTING_ID, identity)
            router.curve_serverkey = server_public.encode()
            router.curve_publickey = public.encode()
            router.curve_secretkey = secret.encode()
            router.connect(address)

    def watch_handshakes(self, on_failure: Callable[[str], None]) -> Callable[[], None]:
        """Call ``on_failure(endpoint)`` (I/O thread) each time a CURVE handshake on
        one of the socket's connections fails: the peer refused our keys, or is
        not ours. Returns the function that stops watching. I/O thread.

        Only while a host mesh is being reached: the monitor (the handshake
        guard's: a socket has one) sees every connection of the socket, and
        strangers can make handshakes fail at will."""
        with self._lock:
            self.socket()
        assert self.guard is not None
        return self.guard.on_handshake_failed(on_failure)

    def disconnect(self, address: str) -> None:
        """Close the connection :meth:`connect_curve` made. I/O thread."""
        try:
            with self._lock:
                self.socket().disconnect(address)
        except zmq.ZMQError:
            pass  # never connected, or already gone

    def close(self) -> None:
        """Close the guard and the socket, if made (I/O thread, at shutdown)."""
        if self.guard is not None:
            close_guard(self._loop, self.guard)
        if self.router is not None:
            self._loop.remove_fd(int(self.router.getsockopt(zmq.FD)))
            self.router.close(0)
