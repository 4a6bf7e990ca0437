"""Ports and channels: the one-way primitive beneath replies.

``Channel.open()`` gives a :class:`Port` (the sending end, a small value that
travels in messages to any actor or to the controller) and a
:class:`PortReceiver` (the receiving end, which stays in the process that
opened it). ``port.send(value)`` from any process of the tree delivers
``value`` to the receiver's process through the peer layer; the receiver's
``recv()`` is a future (``.get()`` or ``await``), values in the order each
sender sent them.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import deque
from typing import Any, Generic, TypeVar

from .._model._errors import MeshUsageError
from .._model._future import Future
from .._model._public import publish
from ._peer import local_node, node_or_none

T = TypeVar("T")


class Port(Generic[T]):
    """The sending end of a channel: ``port.send(value)``, ``port.exception(exc)``."""

    __slots__ = ("_address", "_host", "_port_id", "_tcp")

    def __init__(
        self, address: str, port_id: int, host: str = "", tcp: tuple[str, ...] = ()
    ) -> None:
        self._address = address  # the owner's inbox (a socket on the owner's host)
        self._port_id = port_id
        self._host = host or socket.gethostname()
        self._tcp = tuple(tcp)  # where other hosts reach the owner, if it listens for them

    def _target(self) -> str:
        if self._host == socket.gethostname() or not self._tcp:
            return self._address
        return _nearest(self._tcp)

    def send(self, value: T) -> None:
        """Deliver ``value`` to the receiver (without waiting)."""
        local_node().send_to_port(self._target(), self._port_id, value, False)

    def exception(self, exc: BaseException) -> None:
        """Make the receiver's next ``recv()`` raise ``exc``."""
        local_node().send_to_port(self._target(), self._port_id, exc, True)

    def __repr__(self) -> str:
        return f"<Port {self._port_id} at {self._address}>"

    def __reduce__(self):
        tcp = self._tcp
        node = node_or_none()
        if node is not None and node.address == self._address:
            tcp = tuple(node.tcp_addresses)  # sent by its owner: it may listen for more by now
        return (Port, (self._address, self._port_id, self._host, tcp))


def _nearest(addresses: tuple[str, ...]) -> str:
    """The owner's TCP address most likely reachable from here: the one sharing the
    longest prefix with this host's own address on the mesh's network."""
    if os.environ.get("MONARCH_NB_REVERSE_TUNNEL"):
        # This host reaches the controller only through ssh -R, on loopback.
        tunnelled = [a for a in addresses if a.startswith("tcp://127.")]
        if tunnelled:
            return tunnelled[0]
    mine = os.environ.get("MONARCH_NB_RDMA_HOST", "").split(".")

    def shared(address: str) -> int:
        theirs = address.removeprefix("tcp://").rsplit(":", 1)[0].split(".")
        same = 0
        while same < min(len(mine), len(theirs)) and mine[same] == theirs[same]:
            same += 1
        return same

    return max(addresses, key=shared)


class PortReceiver(Generic[T]):
    """The receiving end of a channel: ``recv()`` is a future of the next value."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: deque[tuple[Any, bool]] = deque()
        self._waiting: deque[Future[T]] = deque()
        self._node = local_node()
        self._port_id = self._node.open_port(self._deliver)
        self._closed = False

    @property
    def port(self) -> Port[T]:
        return Port(self._node.address, self._port_id, "", tuple(self._node.tcp_addresses))

    def _deliver(self, value: Any, is_error: bool) -> None:
        with self._lock:
            waiter = self._waiting.popleft() if self._waiting else None
            if waiter is None:
                self._values.append((value, is_error))
                return
        _complete(waiter, value, is_error)

    def recv(self) -> Future[T]:
        """A future of the next value sent to the port (``.get(timeout=)`` or ``await``)."""
        future: Future[T] = Future._new()
        with self._lock:
            if self._closed:
                future.set_exception(MeshUsageError("recv() on a closed PortReceiver"))
                return future
            if not self._values:
                self._waiting.append(future)
                return future
            value, is_error = self._values.popleft()
        _complete(future, value, is_error)
        return future

    def close(self) -> None:
        """Stop receiving: later values are dropped, waiting ``recv()`` calls fail."""
        self._node.close_port(self._port_id)
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, deque()
        for future in waiting:
            future.set_exception(MeshUsageError("the PortReceiver was closed"))

    def __reduce__(self):
        raise MeshUsageError(
            "a PortReceiver stays in the process that opened the channel; send its Port instead"
        )


def _complete(future: Future[Any], value: Any, is_error: bool) -> None:
    if is_error:
        future.set_exception(value if isinstance(value, BaseException) else RuntimeError(value))
    else:
        future.set_result(value)


class Channel(Generic[T]):
    """``port, receiver = Channel.open()``: a one-way channel to this process."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[T], PortReceiver[T]]:
        """A new channel; ``once`` is accepted for Monarch's API (a port may send any
        number of values here)."""
        receiver: PortReceiver[T] = PortReceiver()
        return receiver.port, receiver


publish(globals())
