"""A keyless process of our own uid on the controller's socket, as an attacker
would connect: with libzmq to an ``ipc://``/``tcp://`` address, or over the
Unix link to a ``unixlink://`` one (the default for local workers)."""

from __future__ import annotations

import os
from typing import Any

import zmq

from monarch_nb._wire._unix_link import SCHEME, LinkDealer


class Rogue:
    """A DEALER-like socket: ``connect``, ``send``/``send_multipart``, ``close``."""

    def __init__(self, identity: bytes | None = None, context: zmq.Context | None = None) -> None:
        self.identity = identity
        self._context = context or zmq.Context.instance()
        self._socket: Any = None

    def connect(self, address: str) -> None:
        self._address = address
        if address.startswith(SCHEME):
            # The link's first message is the name (zmq sends a routing id in its
            # handshake): a random one when none is claimed, as zmq picks one.
            self._socket = LinkDealer(address, self.identity or os.urandom(16))
            return
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        if self.identity is not None:
            sock.setsockopt(zmq.ROUTING_ID, self.identity)
        sock.connect(address)
        self._socket = sock

    @property
    def socket(self) -> Any:
        """The connected socket (a zmq socket or a ``LinkDealer``), for the wire's
        own sends (``Encoded.send``)."""
        return self._socket

    def send(self, data: Any, flags: int = 0, copy: bool = True, track: bool = False) -> None:
        if isinstance(self._socket, LinkDealer) and not self._socket._parts:
            self._reconnect_if_hung_up()
        self._socket.send(data, flags, copy=copy)

    def send_multipart(self, frames: list[Any], copy: bool = True) -> None:
        for i, frame in enumerate(frames):
            self.send(frame, zmq.SNDMORE if i < len(frames) - 1 else 0, copy=copy)

    def _reconnect_if_hung_up(self) -> None:
        """As a zmq DEALER does: the controller hangs up on a name that is live
        (a rank that just died may not have been noticed yet), so try again."""
        link = self._socket
        link.take(1 << 20, 1 << 20)  # reads to the end of the stream, if it ended
        if link._conn.eof:
            link.close(0)
            self._socket = LinkDealer(self._address, self.identity or os.urandom(16))

    def close(self, linger: int | None = 0) -> None:
        if self._socket is not None:
            self._socket.close(linger)
