"""An agent's part in the cast tree: its tree link, and the relay to its children.

When the controller asks (:class:`TreeListen`), the agent binds a ROUTER on the
address other hosts reach it at, a CURVE server with the host mesh's agent key
pair; ZAP admits only that key, so only this host mesh's agents (which hold it)
can connect. What arrives there is a tree relay (``T`` + node, then the
controller's signed message): the agent passes the message to its own workers
named in the node and, unchanged, to each child agent, on a DEALER per child
(made when first needed, CURVE client with the same key pair). Anything else on
the tree link is dropped, counted.

The agent never signs what it relays, and never needs to: the workers check the
controller's signature, and their replay window takes each message once, so a
relay that reaches a rank twice runs there once.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from .._wire import _keys
from .._wire._handshake_guard import HandshakeGuard
from .._wire._signed import MAX_FRAME_BYTES, forward, receive
from .._wire._tree import TREE, TreeListening, parse_node
from .._wire._tree_fold import FOLD, parse_plan, parse_up

_log = logging.getLogger("monarch_nb.agent")


class TreeRelay:
    """This agent's tree link (bound on request) and its links to children."""

    def __init__(self, context: zmq.Context, poller: zmq.Poller, curve: dict[str, str]) -> None:
        self.context = context
        self.poller = poller
        self.curve = curve
        self.socket: zmq.Socket | None = None  # the tree link, once bound
        self.guard: HandshakeGuard | None = None
        self.children: dict[bytes, zmq.Socket] = {}  # endpoint -> a DEALER to that child
        self.child_of: dict[zmq.Socket, bytes] = {}  # and back: partial folds come on them
        self.folds: Any = None  # the agent's _folds.Folds (reduced calls)
        self.dropped = 0  # malformed relays, and messages that were not relays

    def owns(self, item: Any) -> bool:
        return item is not None and (
            item is self.socket
            or (self.guard is not None and item is self.guard.monitor)
            or item in self.child_of
        )

    def listen(self, address: str, who: str) -> TreeListening:
        """Bind the tree link on ``address`` (once); where it is."""
        if self.socket is None:
            try:
                self.socket = self._bind(address, who)
            except (zmq.ZMQError, OSError) as exc:
                return TreeListening("", f"{type(exc).__name__}: {exc}")
        return TreeListening(self.socket.getsockopt_string(zmq.LAST_ENDPOINT), "")

    def _bind(self, address: str, who: str) -> zmq.Socket:
        _keys.allow_only(self.context, self.curve["client_public"])
        sock = self._socket(zmq.ROUTER)
        # Strangers can connect: CURVE refuses them; those in their handshake are
        # capped and dropped after a few seconds, and frames are capped before that.
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        sock.setsockopt(zmq.HANDSHAKE_IVL, 10_000)
        self.guard = HandshakeGuard(sock, logger=_log, who=who)
        sock.curve_server = True
        sock.curve_publickey = self.curve["client_public"].encode()
        sock.curve_secretkey = self.curve["client_secret"].encode()
        host = f"[{address}]" if ":" in address else address
        sock.bind_to_random_port(f"tcp://{host}")
        self.poller.register(sock, zmq.POLLIN)
        self.poller.register(self.guard.monitor, zmq.POLLIN)
        return sock

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        return sock

    def readable(self, item: Any, down: zmq.Socket) -> None:
        """The tree link (or its guard's monitor) has something (the agent's loop)."""
        if self.guard is not None and item is self.guard.monitor:
            self.guard.readable()
            return
        if item in self.child_of:
            self._from_child(item)
            return
        assert self.socket is not None
        while True:
            frames = receive(self.socket)
            if frames is None:
                return
            # [the parent's routing id, T (or F) + node (plan), the controller's message...]
            if len(frames) < 3:
                self.dropped += 1
            elif frames[1].bytes.startswith(TREE):
                self.relay(frames[1].buffer[1:], frames[2:], down)
            elif frames[1].bytes.startswith(FOLD):
                self.fold(frames[1].buffer[1:], frames[2:], down, frames[0].bytes)
            else:
                self.dropped += 1

    def _from_child(self, sock: zmq.Socket) -> None:
        """A child's partial folds: [U + call id, the partial, its passed and lost ranks]."""
        while True:
            frames = receive(sock)
            if frames is None:
                return
            try:
                call_id = parse_up(frames[0].bytes)
            except ValueError:
                self.dropped += 1
                continue
            self.folds.from_child(self.child_of[sock], call_id, frames[1:])

    def fold(self, plan: Any, body: list[Any], down: zmq.Socket, parent: bytes | None) -> None:
        """A reduced cast: note what to fold (``_folds``), then relay it as any cast."""
        try:
            parsed = parse_plan(plan)
            self.folds.begin(parsed, parent)
        except ValueError as exc:
            self.dropped += 1
            _log.error("monarch_nb agent: dropped a reduced cast: %s", exc)
            return
        for endpoint, child_plan in parsed.children:
            child = self._child(endpoint)
            child.send(FOLD + parsed.head + child_plan, zmq.SNDMORE)
            forward(child, body)
        for _, identity in parsed.workers:
            forward(down, body, identity)

    def send_to_parent(self, parent: bytes, frames: list[bytes]) -> None:
        if self.socket is not None:
            self.socket.send_multipart([parent, *frames])

    def relay(self, node: Any, body: list[Any], down: zmq.Socket) -> None:
        """Pass ``body`` to the workers ``node`` names and on to its children."""
        try:
            workers, children = parse_node(node)
        except ValueError as exc:
            self.dropped += 1
            _log.error("monarch_nb agent: dropped a tree relay: %s", exc)
            return
        for endpoint, child_node in children:
            # Children first: they have a hop still to go.
            child = self._child(endpoint)
            child.send(TREE + child_node, zmq.SNDMORE)
            forward(child, body)
        for identity in workers:
            forward(down, body, identity)

    def _child(self, endpoint: bytes) -> zmq.Socket:
        sock = self.children.get(endpoint)
        if sock is None:
            sock = self._socket(zmq.DEALER)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
            sock.curve_serverkey = self.curve["client_public"].encode()
            sock.curve_publickey = self.curve["client_public"].encode()
            sock.curve_secretkey = self.curve["client_secret"].encode()
            sock.connect(endpoint.decode())
            self.children[endpoint] = sock
            self.child_of[sock] = endpoint
            self.poller.register(sock, zmq.POLLIN)
        return sock

    def close(self) -> None:
        for sock in self.children.values():
            self.poller.unregister(sock)
            sock.close(0)
        self.children.clear()
        self.child_of.clear()
        if self.guard is not None:
            self.poller.unregister(self.guard.monitor)
            self.guard.close()
            self.guard = None
        if self.socket is not None:
            self.poller.unregister(self.socket)
            self.socket.close(0)
            self.socket = None
