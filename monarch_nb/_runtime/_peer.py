"""The routing layer: how a process reaches actors in other processes directly.

Every process that hosts actors or calls them through a reference has one
:class:`PeerNode`:

- an *inbox*, a ROUTER bound to an ``ipc://`` socket in the tree's private
  run directory (:mod:`._rundir`, mode 0700: only our uid can connect at
  all). Calls, spawns, port messages and interrupts from other processes
  arrive here; replies to them leave through it, to the sender that asked;
- one *outbox* per peer process it calls, a DEALER connected to that peer's
  inbox, created on first use. Replies come back on it, so a caller needs no
  address of its own to call. A socket monitor on each outbox notices at once
  when the peer's process is gone (its socket closes, or refuses to connect),
  which fails the calls waiting on it with :class:`MeshFailure`.

Between hosts (meshes started through host agents) a rank's inbox also
listens on TCP, on the interface its host reaches the controller through,
CURVE-encrypted with the tree's server key pair; a connection that cannot
complete the handshake (no server key) is never read. Frames are capped
(``ZMQ_MAXMSGSIZE``), and a :class:`~._handshake_guard.HandshakeGuard` caps
the connections still in their handshake (5 s at most) and what each may
bring before it (64 KiB), so a keyless flood takes neither a rank's fds nor
its memory.

Every message is signed with the *tree key*: one key shared by the processes
of one controller's tree (the controller, its workers, and the meshes those
start), handed down on each worker's bootstrap pipe, never on a command line.
Each sender has its own replay window on each receiver; nothing is unpickled
before the signature and sequence number pass (:mod:`._wire`).

One thread per node (``monarch_nb-peer``) receives on every socket; any
thread may send, under the node's lock (as the worker's wire thread does),
so a reply leaves from the thread that computed it with no hand-off.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import os
import secrets
import threading
import traceback
from collections.abc import Callable
from typing import Any

import zmq

from .._model._errors import MeshFailure, RemoteFailure, for_call
from .._wire._eventfd import clear_eventfd
from .._wire._handshake_guard import HandshakeGuard
from .._wire._messages import Failure, Interrupt, Message, PortSend, UnknownMessage, Value
from .._wire._rundir import socket_path
from .._wire._signed import (
    MAX_FRAME_BYTES,
    Encoded,
    ReplayWindow,
    Signer,
    WireStats,
    decode_payload,
    new_key,
    receive,
    sender_tag,
)
from .._wire._sockets import socket_events
from ._pending import PendingCall

_POLLIN = int(zmq.POLLIN)
# Monitor events that mean "that process is not there": it closed its socket
# (exit, kill) or refuses connections (gone before we connected).
_GONE_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CLOSED
# A sender's replay windows we keep: bounded, since senders come and go.
_MAX_SENDERS = 4096

_log = logging.getLogger("monarch_nb")

_tree_key: bytes | None = None
# The tree's CURVE key pairs (z85): "server_public", "server_secret", "client_public",
# "client_secret". Every inbox other hosts reach is a server of the first pair
# and accepts only clients of the second (ZAP).
_tree_curve: dict[str, str] | None = None
_node: PeerNode | None = None
_node_lock = threading.Lock()


def tree_key() -> bytes:
    """The key this process signs actor-to-actor messages with (made on first use)."""
    global _tree_key
    with _node_lock:
        if _tree_key is None:
            _tree_key = new_key()
        return _tree_key


def tree_id(key: bytes | None = None) -> str:
    """A public name of the tree whose key is ``key`` (this process's by default):
    references carry it, so that one used in another tree (a second client
    process it was pickled into) is refused by name at once, where its signed
    messages would go unanswered. A hash: it tells nothing of the key."""
    global _last_tree_id
    if key is None:
        key = _tree_key or tree_key()  # read without the lock: every send asks
    last_key, last_id = _last_tree_id
    if key is last_key:
        return last_id
    name = hashlib.sha256(b"monarch_nb tree id:" + key).hexdigest()[:16]
    _last_tree_id = (key, name)
    return name


_last_tree_id: tuple[bytes, str] = (b"", "")


def set_tree_key(key: bytes) -> None:
    """Adopt the tree key of the process that started this one (worker bootstrap)."""
    global _tree_key
    with _node_lock:
        _tree_key = key


def tree_curve() -> dict[str, str]:
    """The tree's CURVE key pairs for inboxes other hosts reach (made on first use)."""
    global _tree_curve
    with _node_lock:
        if _tree_curve is None:
            server_public, server_secret = zmq.curve_keypair()
            client_public, client_secret = zmq.curve_keypair()
            _tree_curve = {
                "server_public": server_public.decode(),
                "server_secret": server_secret.decode(),
                "client_public": client_public.decode(),
                "client_secret": client_secret.decode(),
            }
        return dict(_tree_curve)


def set_tree_curve(keys: dict[str, str]) -> None:
    """Adopt the tree's CURVE keys (a worker's bootstrap)."""
    global _tree_curve
    with _node_lock:
        _tree_curve = dict(keys)


def local_node() -> PeerNode:
    """This process's node, started on first use (a worker starts its own at boot)."""
    global _node
    with _node_lock:
        node = _node
    if node is not None:
        return node
    # Named like a one-rank process group's inbox (prefix + "0"), so this
    # process can host actors of its own (this_proc()) at the same address.
    started = PeerNode(socket_path(f"c{secrets.token_hex(8)}-0-0"), tree_key())
    with _node_lock:
        if _node is None:
            _node = started
            return started
    started.close()
    return _node


def install_node(node: PeerNode) -> None:
    """Make ``node`` this process's node (a worker's, bound where its refs point)."""
    global _node
    with _node_lock:
        _node = node


def node_or_none() -> PeerNode | None:
    return _node


@functools.cache
def tunnels() -> dict[str, str]:
    """What this process dials for a ``tcp://127.0.0.1:PORT`` address that ssh
    carries to the controller through a Unix socket (``MONARCH_NB_TUNNELS``,
    set by a host agent started with ``ssh_hosts(reverse=True)``)."""
    text = os.environ.get("MONARCH_NB_TUNNELS", "")
    return dict(json.loads(text)) if text else {}


class _Outbox:
    """A DEALER to one peer's inbox, and the calls waiting on replies from it."""

    __slots__ = ("address", "gone", "label", "monitor", "socket")

    def __init__(self, address: str, socket: zmq.Socket, monitor: zmq.Socket) -> None:
        self.address = address
        self.socket = socket
        self.monitor = monitor
        self.gone = ""  # why the peer is unreachable, once we know


# Work from a peer: (message, frames, the route its replies take).
WorkHandler = Callable[[Message, list[Any], "PeerRoute"], None]


class PeerNode:
    """This process's inbox and outboxes; see the module docstring."""

    def __init__(self, address: str | None, key: bytes, *, tcp_host: str | None = None) -> None:
        """An inbox at ``address`` (``ipc://``), and one other hosts reach on
        ``tcp_host`` if given; with no ``address``, the TCP inbox is the only one."""
        if address is None and tcp_host is None:
            raise ValueError("a peer node needs an ipc:// address, a TCP host, or both")
        self.identity = secrets.token_bytes(16)
        self.tree = tree_id(key)  # whose references this node may use (ProcsRef.tree)
        self.stats = WireStats()
        # Both ways go over trusted links (our private Unix sockets, or CURVE):
        # requests leave through outboxes, replies through the inbox they came in on.
        tag = sender_tag(self.identity)
        self.signer = Signer(key, self.stats, sender=tag, upstream=False, trusted_link=True)
        self.reply_signer = Signer(key, self.stats, sender=tag, upstream=True, trusted_link=True)
        self.lock = threading.Lock()
        self._zmq: zmq.Context = zmq.Context.instance()
        self._windows: dict[bytes, ReplayWindow] = {}
        self._outboxes: dict[str, _Outbox] = {}
        self._by_fd: dict[int, tuple[str, Any]] = {}
        # call id -> (the call, {address: rank}) for calls this process made.
        self._calls: dict[int, tuple[PendingCall, dict[str, int]]] = {}
        self._call_ids = itertools.count(1)
        self.ports: dict[int, Callable[[Any, bool], None]] = {}
        self._port_ids = itertools.count(1)
        self.on_work: WorkHandler | None = None  # set by a worker: calls and spawns
        self.on_interrupt: Callable[[bytes, int], None] | None = None
        # In a worker: its process group and rank (this_proc() is that rank).
        self.home: tuple[Any, int] | None = None
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._poller = zmq.Poller()
        self._poller.register(self._wake_fd, zmq.POLLIN)
        self._new_fds: list[tuple[int, str, Any]] = []
        self.tcp_addresses: list[str] = []  # where other hosts reach this inbox
        self._tcp_hosts: set[str] = set()
        self.tcp_inbox: zmq.Socket | None = None
        self._guard: HandshakeGuard | None = None  # the TCP inbox's
        if tcp_host is not None:
            self._listen_tcp(tcp_host)
        if address is not None:
            inbox = self._zmq.socket(zmq.ROUTER)
            inbox.setsockopt(zmq.LINGER, 1000)
            inbox.setsockopt(zmq.SNDHWM, 0)
            inbox.setsockopt(zmq.RCVHWM, 0)
            inbox.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished caller raises
            inbox.bind(address)
            self._new_fds.append((int(inbox.getsockopt(zmq.FD)), "inbox", inbox))
        else:
            assert self.tcp_inbox is not None
            inbox, address = self.tcp_inbox, self.tcp_address
        self.inbox = inbox
        self.address = address  # where this process's own references point
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="monarch_nb-peer", daemon=True)
        self._thread.start()

    def _listen_tcp(self, host: str) -> None:
        """Take messages from other hosts too, on ``host``: a CURVE inbox (one socket,
        an endpoint per host address asked for). Lock held, or not yet shared."""
        if host in self._tcp_hosts:
            return
        sock = self.tcp_inbox
        if sock is None:
            from .._wire._keys import allow_only  # here: zmq.auth loads asyncio, workers start lean

            curve = tree_curve()
            allow_only(self._zmq, curve["client_public"])
            sock = self._zmq.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
            # Anyone on the network can connect: those in their handshake, and
            # what each brings meanwhile, are capped (HANDSHAKE_IVL too).
            guard = HandshakeGuard(sock, logger=_log, who=f"the actor inbox of pid {os.getpid()}")
            self._guard = guard
            self._new_fds.append((int(guard.monitor.getsockopt(zmq.FD)), "guard", guard))
            sock.curve_server = True
            sock.curve_publickey = curve["server_public"].encode()
            sock.curve_secretkey = curve["server_secret"].encode()
            self.tcp_inbox = sock
            self._new_fds.append((int(sock.getsockopt(zmq.FD)), "inbox", sock))
        port = sock.bind_to_random_port(f"tcp://{host}")
        self._tcp_hosts.add(host)
        self.tcp_addresses.append(f"tcp://{host}:{port}")

    def tcp_port(self, host: str) -> int:
        """The port this inbox listens on at ``host``, listening there first if it
        did not (an ssh tunnel to it needs the number before anything connects)."""
        self.listen_tcp(host)
        with self.lock:
            for address in self.tcp_addresses:
                if address.startswith(f"tcp://{host}:"):
                    return int(address.rpartition(":")[2])
        raise RuntimeError(f"the peer inbox does not listen on {host}")  # not reached

    @property
    def tcp_address(self) -> str:
        """Where other hosts reach this inbox ("" if it does not listen for them)."""
        return self.tcp_addresses[0] if self.tcp_addresses else ""

    def listen_tcp(self, host: str) -> None:
        """Listen on ``host`` too, for other hosts (a controller whose host meshes
        reach it at different addresses listens on each)."""
        with self.lock:
            self._listen_tcp(host)
        self._wake_always()

    # -- sending (any thread) -----------------------------------------------------------

    def next_call_id(self) -> int:
        return next(self._call_ids)

    def encode(self, message: Message, payload: Any = None, *, by_value: bool = True) -> Encoded:
        return self.signer.encode(message, payload, by_value=by_value)

    def send(
        self,
        addresses: list[str],
        encoded: Encoded,
        call: PendingCall | None = None,
        ranks: list[int] | None = None,
    ) -> None:
        """Send one encoded message to the inboxes at ``addresses``; track ``call``,
        whose rank at ``addresses[i]`` is ``ranks[i]``, until every one replied."""
        gone: list[tuple[int, str]] = []
        with self.lock:
            boxes = [self._outbox(a) for a in addresses]
            if call is not None:
                assert ranks is not None
                call.tracker = self
                self._calls[call.call_id] = (call, dict(zip(addresses, ranks, strict=True)))
                gone = [(r, b.gone) for r, b in zip(ranks, boxes, strict=True) if b.gone]
            frames = encoded.seal()
            pending = bool(self._new_fds)  # a new outbox for the thread to watch
            for box in boxes:
                if not box.gone:
                    encoded.send(box.socket, None, frames)
                    # A send may consume the edge of a reply that just arrived
                    # (ZMQ_FD is edge-triggered): then the thread must look.
                    pending = pending or bool(socket_events(box.socket) & _POLLIN)
            self.stats.sent += len(boxes)
        if pending:
            self._wake()
        for rank, why in gone:
            self._fail_rank(call, rank, why)
        if call is None:  # a broadcast: nobody waits to hear that a target is gone
            dead = [a for a, b in zip(addresses, boxes, strict=True) if b.gone]
            if dead:
                raise MeshFailure(
                    f"{len(dead)} of the {len(addresses)} ranks this message was sent to "
                    f"cannot be reached ({boxes[addresses.index(dead[0])].gone}); "
                    "was their mesh stopped?"
                )

    def reply(self, identity: bytes, encoded: Encoded, inbox: zmq.Socket | None = None) -> None:
        """Send a reply back to the sender ``identity`` of a message ``inbox`` took."""
        inbox = inbox if inbox is not None else self.inbox
        with self.lock:
            try:
                encoded.send(inbox, identity)
            except zmq.ZMQError:
                return  # the caller is gone (ROUTER_MANDATORY): nobody waits for this
            self.stats.sent += 1
            pending = socket_events(inbox) & _POLLIN
        if pending:
            self._wake()

    def send_to_port(self, address: str, port_id: int, value: Any, is_error: bool) -> None:
        """Deliver ``value`` (or an exception) to port ``port_id`` of the node at ``address``."""
        if address == self.address:
            self._deliver_port(port_id, value, is_error)
            return
        self.send([address], self.encode(PortSend(port_id, is_error), value))

    def interrupt(self, addresses: list[str], call_id: int) -> None:
        self.send(addresses, self.encode(Interrupt(call_id)))

    # -- ports --------------------------------------------------------------------------

    def open_port(self, deliver: Callable[[Any, bool], None]) -> int:
        port_id = next(self._port_ids)
        self.ports[port_id] = deliver
        return port_id

    def close_port(self, port_id: int) -> None:
        self.ports.pop(port_id, None)

    def _deliver_port(self, port_id: int, value: Any, is_error: bool) -> None:
        deliver = self.ports.get(port_id)
        if deliver is not None:
            deliver(value, is_error)

    # -- call bookkeeping (CallTracker) -------------------------------------------------

    def rank_answered(self, call: PendingCall, rank: int) -> None:
        call.mark_answered(rank)

    def call_finished(self, call: PendingCall, error: BaseException | None) -> None:
        call.closed = True
        self._calls.pop(call.call_id, None)

    def last_answered(self, call: PendingCall, rank: int) -> None:
        call.all_answered()
        self.call_finished(call, None)

    # -- the node's thread ----------------------------------------------------------------

    def _wake(self) -> None:
        if threading.current_thread() is not self._thread:
            os.eventfd_write(self._wake_fd, 1)

    def _wake_always(self) -> None:
        os.eventfd_write(self._wake_fd, 1)

    def _outbox(self, address: str) -> _Outbox:
        """The outbox to ``address``, connected on first use (lock held)."""
        box = self._outboxes.get(address)
        if box is not None:
            return box
        sock = self._zmq.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.identity)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        if address.startswith("tcp://"):  # another host's inbox: CURVE, as its server
            curve = tree_curve()
            sock.curve_serverkey = curve["server_public"].encode()
            sock.curve_publickey = curve["client_public"].encode()
            sock.curve_secretkey = curve["client_secret"].encode()
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        monitor = sock.get_monitor_socket(_GONE_EVENTS)
        # Behind a reverse tunnel, the controller's loopback address is a Unix
        # socket here (still CURVE: the far end is its TCP inbox).
        sock.connect(tunnels().get(address, address))
        box = _Outbox(address, sock, monitor)
        self._outboxes[address] = box
        self._new_fds.append((sock.getsockopt(zmq.FD), "outbox", box))
        self._new_fds.append((monitor.getsockopt(zmq.FD), "monitor", box))
        return box

    def _run(self) -> None:
        try:
            while not self._closing:
                with self.lock:  # sockets made by other threads since: watch them too
                    for fd, kind, box in self._new_fds:
                        self._poller.register(fd, zmq.POLLIN)
                        self._by_fd[fd] = (kind, box)
                    self._new_fds.clear()
                    sources = list(self._by_fd.values())
                # Edge-triggered FDs: drain every socket on each wake-up.
                for kind, box in sources:
                    if kind == "inbox":
                        self._drain_inbox(box)
                    elif kind == "outbox":
                        self._drain_outbox(box)
                    elif kind == "guard":
                        if box.readable():  # a budget of events spent: look again soon
                            self._wake_always()
                    else:
                        self._drain_monitor(box)
                self._poller.poll(1000)
                clear_eventfd(self._wake_fd)
        except Exception:
            if not self._closing:
                traceback.print_exc()

    def _take(self, sock: zmq.Socket) -> list[Any] | None:
        with self.lock:
            if self._closing:
                return None
            return receive(sock, self.stats)

    def _drain_inbox(self, inbox: zmq.Socket) -> None:
        while (frames := self._take(inbox)) is not None:
            sender, body = bytes(frames[0].buffer), frames[1:]
            message = self._verify(sender, body, self.reply_signer, sender_tag(sender))
            if message is None:
                continue
            match message:
                case PortSend(port_id, is_error):
                    self._deliver_port(port_id, decode_payload(body), is_error)
                case Interrupt(call_id):
                    if self.on_interrupt is not None:
                        self.on_interrupt(sender, call_id)
                case _:
                    if self.on_work is not None:
                        self.on_work(message, body, PeerRoute(self, sender, inbox))

    def _verify(
        self, sender: bytes, body: list[Any], signer: Signer, tag: bytes | None
    ) -> Message | None:
        known = self._windows.get(sender)
        window = known if known is not None else ReplayWindow()
        fresh = known is None
        try:
            message = signer.verify(body, window, sender=tag)
        except UnknownMessage:
            return None  # signed by our tree, but a kind we do not know: counted
        if message is not None and fresh:
            if len(self._windows) >= _MAX_SENDERS:
                self._windows.pop(next(iter(self._windows)))
            self._windows[sender] = window
        return message

    def _drain_outbox(self, box: _Outbox) -> None:
        while (frames := self._take(box.socket)) is not None:
            # A reply: from whichever process serves that address (not us).
            message = self._verify(b"out:" + box.address.encode(), frames, self.signer, None)
            match message:
                case Value(call_id):
                    entry = self._calls.get(call_id)
                    if entry is None:
                        continue
                    call, ranks = entry
                    try:
                        value = decode_payload(frames)
                    except Exception as exc:
                        failure = RemoteFailure(
                            ranks[box.address],
                            type(exc).__name__,
                            f"its reply could not be unpickled here: {exc}",
                            "",
                        )
                        call.add_failure(failure, serialization=True)
                        continue
                    call.add_value(ranks[box.address], value)
                case Failure(call_id, failure, serialization):
                    entry = self._calls.get(call_id)
                    if entry is not None:
                        entry[0].add_failure(failure, serialization=serialization)

    def _drain_monitor(self, box: _Outbox) -> None:
        while (frames := self._take(box.monitor)) is not None:
            event = int.from_bytes(bytes(frames[0].buffer)[:2], "little")
            if box.gone or not event & _GONE_EVENTS:
                continue
            box.gone = (
                "its process exited"
                if event == zmq.EVENT_DISCONNECTED
                else "nothing answers at its address (stopped, restarted or never started)"
            )
            waiting = [
                (call, ranks[box.address])
                for call, ranks in list(self._calls.values())
                if box.address in ranks
            ]
            for call, rank in waiting:
                self._fail_rank(call, rank, box.gone)

    def _fail_rank(self, call: PendingCall | None, rank: int, why: str) -> None:
        if call is None or rank in call.answered:
            return
        mesh = getattr(call.group, "name", "")  # the ProcsRef a reference sent through
        where = f"rank {rank} of mesh {mesh!r}" if mesh else f"rank {rank}"
        error = MeshFailure(f"{call.label}: {where} cannot be reached: {why}", ranks=[rank])
        call.fail(for_call(call, error))

    def forget(self, address: str) -> None:
        """Drop the outbox to ``address`` (a peer known to be gone), so a later call
        connects afresh (a restarted mesh reuses no address, but stay tidy)."""
        with self.lock:
            box = self._outboxes.pop(address, None)
            if box is None:
                return
            for sock in (box.socket, box.monitor):
                fd = int(sock.getsockopt(zmq.FD))
                self._by_fd.pop(fd, None)
                try:
                    self._poller.unregister(fd)
                except KeyError:
                    pass
                sock.close(0)

    def close(self) -> None:
        self._closing = True
        os.eventfd_write(self._wake_fd, 1)
        self._thread.join(timeout=2)
        with self.lock:
            for box in self._outboxes.values():
                box.socket.close(0)
                box.monitor.close(0)
            self._outboxes.clear()
            if self._guard is not None:
                self._guard.close()
            self.inbox.close(0)
            if self.tcp_inbox is not None and self.tcp_inbox is not self.inbox:
                self.tcp_inbox.close(0)


class PeerRoute:
    """Where the replies to one message from a peer go: back to its sender."""

    __slots__ = ("inbox", "node", "sender")

    def __init__(self, node: PeerNode, sender: bytes, inbox: zmq.Socket | None = None) -> None:
        self.node = node
        self.sender = sender
        self.inbox = inbox  # the socket it came in on (local or from another host)

    @property
    def signer(self) -> Signer:
        return self.node.reply_signer

    def send(self, message: Message, payload: Any = None) -> None:
        encoded = self.node.reply_signer.encode(message, payload, by_value=False)
        self.node.reply(self.sender, encoded, self.inbox)

    def send_encoded(self, encoded: Encoded) -> None:
        self.node.reply(self.sender, encoded, self.inbox)

    def send_small(self, meta: tuple[Any, ...], payload_bytes: bytes) -> bool:
        """Not in one step here (a peer's reply goes out on the node's thread): False."""
        return False
