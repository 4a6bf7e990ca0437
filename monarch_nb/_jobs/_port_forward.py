"""``PortForwarder``: TCP ports of one process mesh reached through another, as
Monarch's ``monarch.job.PortForwarder``.

``forward(dst_procs, dst_port, src_procs, src_address)`` pairs the two meshes
point by point (they must have the same extent): each source process listens
on its ``"address:port"`` and every connection accepted there is relayed, over
two channels of the actors' own signed transport, to ``127.0.0.1:dst_port`` on
the destination process at the same point. So a service that listens only on
a worker host's loopback becomes reachable on the source host, and nothing new
listens anywhere but the address the caller named.

The forwarder is an actor (spawn it with ``this_proc().spawn(...)``, call
``forward`` once per forward); stopping it stops the relay actors of every
forward it started, which closes their listening sockets and connections.
Each accepted connection is a pair of one-way channels carrying
``(_DATA, bytes)``, ``(_EOF,)`` (a half close) and ``(_ABORT,)`` (a reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from typing import Any

from .._model._errors import RemoteError
from .._model._shape import Point
from .._runtime._actors import Actor, endpoint
from .._runtime._context import current_rank
from .._runtime._ports import Channel, Port, PortReceiver

# Destinations are dialled on loopback only: the forward exposes a port of the
# destination's own host, never a third machine chosen by whoever calls forward.
_LOOPBACK = "127.0.0.1"
_CHUNK = 64 * 1024
_CLOSE_WAIT_S = 1.0
_DATA, _EOF, _ABORT = "data", "eof", "abort"

PortSpec = int | Callable[[Point], int]
AddressSpec = str | int | Callable[[Point], str | int]


def check_port(what: str, port: object) -> int:
    """``port`` if it is a TCP port number, else a ValueError naming ``what``."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{what} must be an integer from 1 through 65535, got {port!r}")
    return port


def parse_address(address: object) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) as (host, port), or a ValueError.
    A bare port (``8888`` or ``"8888"``) is on loopback: reachable from this host only."""
    if isinstance(address, int) and not isinstance(address, bool):
        return _LOOPBACK, check_port("src_address's port", address)
    if not isinstance(address, str):
        raise ValueError(f"src_address must be 'address:port' or a port number, got {address!r}")
    if address.isdigit():
        return _LOOPBACK, check_port("src_address's port", int(address))
    host, colon, port_text = address.rpartition(":")
    if not colon or not host:
        raise ValueError(f"src_address must be 'address:port', got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"src_address's port must be an integer, got {address!r}") from None
    return host, check_port("src_address's port", port)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), _CLOSE_WAIT_S)
    except (OSError, asyncio.TimeoutError):
        writer.transport.abort()


async def _socket_to_channel(reader: asyncio.StreamReader, out: Port[Any]) -> None:
    while data := await reader.read(_CHUNK):
        out.send((_DATA, data))
    out.send((_EOF,))


async def _channel_to_socket(
    incoming: PortReceiver[Any], writer: asyncio.StreamWriter, peer_done: asyncio.Event
) -> None:
    while True:
        message = await incoming.recv()
        if message[0] == _DATA:
            writer.write(message[1])
            await writer.drain()  # the socket's pace: a slow reader slows this side
        elif message[0] == _EOF:
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()
            peer_done.set()
        else:  # the other side was reset: reset ours
            raise ConnectionAbortedError("the other end of the forward was reset")


async def _relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    out: Port[Any],
    incoming: PortReceiver[Any],
) -> None:
    """Copy both ways until both sides have half-closed, or either fails."""
    peer_done = asyncio.Event()
    sending = asyncio.ensure_future(_socket_to_channel(reader, out))
    receiving = asyncio.ensure_future(_channel_to_socket(incoming, writer, peer_done))

    async def both_closed() -> None:
        await sending
        await peer_done.wait()

    closed = asyncio.ensure_future(both_closed())
    clean = False
    try:
        done, _ = await asyncio.wait({receiving, closed}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
        clean = True
    except (OSError, RuntimeError, RemoteError):
        pass  # a reset, a closed channel: the other side learns it below
    finally:
        for task in (sending, receiving, closed):
            task.cancel()
        await asyncio.gather(sending, receiving, closed, return_exceptions=True)
        incoming.close()
        if not clean:
            with contextlib.suppress(Exception):
                out.send((_ABORT,))
            writer.transport.abort()
        await _close(writer)


class _Relays:
    """The connections an actor relays, cancelled together when it stops."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[None]] = set()

    def start(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        out: Port[Any],
        incoming: PortReceiver[Any],
    ) -> None:
        task = asyncio.ensure_future(_relay(reader, writer, out, incoming))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _ForwardDestination(Actor):
    """On a destination process: dials the local service for each connection."""

    def __init__(self) -> None:
        self._port: int | None = None
        self._relays = _Relays()

    @endpoint
    async def configure(self, dst_port: PortSpec) -> None:
        port = dst_port(current_rank()) if callable(dst_port) else dst_port
        self._port = check_port("dst_port", port)

    @endpoint
    async def open(self, to_source: Port[Any]) -> Port[Any]:
        if self._port is None:
            raise RuntimeError("this port forward's destination was never configured")
        reader, writer = await asyncio.open_connection(_LOOPBACK, self._port)
        to_here, incoming = Channel[Any].open()
        self._relays.start(reader, writer, to_source, incoming)
        return to_here

    async def __cleanup__(self, exc: Exception | None) -> None:
        await self._relays.close()


class _ForwardSource(Actor):
    """On a source process: listens, and relays each connection to its destination."""

    def __init__(self) -> None:
        self._destination: Any = None
        self._server: asyncio.AbstractServer | None = None
        self._relays = _Relays()

    @endpoint
    async def listen(self, destination: Any, src_address: AddressSpec) -> None:
        point = current_rank()
        self._destination = destination.slice(**dict(point))
        address = src_address(point) if callable(src_address) else src_address
        host, port = parse_address(address)
        # reuse_port: the ranks of one host may share an address (the kernel spreads
        # connections among them), as Monarch's do.
        self._server = await asyncio.start_server(self._accept, host, port, reuse_port=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            to_here, incoming = Channel[Any].open()
            to_destination = await self._destination.open.call_one(to_here)
        except BaseException:
            writer.transport.abort()  # the destination refused: so does this connection
            raise
        self._relays.start(reader, writer, to_destination, incoming)

    async def __cleanup__(self, exc: Exception | None) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._relays.close()
        if server is not None:
            await server.wait_closed()


class PortForwarder(Actor):
    """Owns TCP port forwards between process meshes; stop it to close them all.

    ::

        forwarder = this_proc().spawn("forwarder", PortForwarder)
        await forwarder.forward.call_one(workers, 8888, this_proc(), "127.0.0.1:8888")
        ...
        await forwarder.stop()
    """

    def __init__(self) -> None:
        self._forwards: list[tuple[Any, Any]] = []

    @endpoint
    async def forward(
        self,
        dst_proc_mesh: Any,
        dst_port: PortSpec,
        src_proc_mesh: Any,
        src_address: AddressSpec,
    ) -> None:
        """Forward ``src_address`` on each process of ``src_proc_mesh`` to
        ``127.0.0.1:dst_port`` on the process at the same point of ``dst_proc_mesh``.

        Both meshes must have the same extent. ``dst_port`` and ``src_address``
        (``"address:port"``, or a bare port, which listens on ``127.0.0.1``: only
        this host's users reach it) may be functions of the point. If any process
        fails to set up, every actor the call started is stopped before the error
        is raised.
        """
        if dst_proc_mesh.extent != src_proc_mesh.extent:
            raise ValueError(
                "destination and source process meshes must have the same shape: "
                f"{dst_proc_mesh.extent} != {src_proc_mesh.extent}"
            )
        if not callable(dst_port):
            check_port("dst_port", dst_port)
        if not callable(src_address):
            parse_address(src_address)
        suffix = uuid.uuid4().hex[:12]
        source = destination = None
        try:
            destination = dst_proc_mesh.spawn(f"forward_dst_{suffix}", _ForwardDestination)
            source = src_proc_mesh.spawn(f"forward_src_{suffix}", _ForwardSource)
            await destination.configure.call(dst_port)
            await source.listen.call(destination, src_address)
        except Exception as error:
            failures = await _stop_all([a for a in (source, destination) if a is not None])
            add_note = getattr(error, "add_note", None)  # Python 3.11+
            if failures and add_note is not None:
                add_note(
                    "stopping the forward's actors also failed: "
                    + "; ".join(f"{type(f).__name__}: {f}" for f in failures)
                )
            raise
        self._forwards.append((source, destination))

    async def __cleanup__(self, exc: Exception | None) -> None:
        forwards, self._forwards = self._forwards, []
        failures = await _stop_all([actor for pair in forwards for actor in pair])
        if failures and exc is None:
            raise failures[0]


async def _stop_all(actors: list[Any]) -> list[BaseException]:
    """Stop ``actors`` (sources first, so nothing new is accepted), returning failures."""
    results = await asyncio.gather(*(actor.stop() for actor in actors), return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException)]
