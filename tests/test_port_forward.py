"""PortForwarder: TCP ports of worker processes reached through other workers.

Real worker processes, real sockets: the services are asyncio servers in this
test process, the forwards run between two workers of one shared mesh.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psutil
import pytest

from monarch_nb import RemoteError, this_host
from monarch_nb.actor import this_proc
from monarch_nb.job import PortForwarder

LOOPBACK = "127.0.0.1"
WAIT_S = 60


@pytest.fixture(scope="module")
def procs() -> Iterator[Any]:
    mesh = this_host().spawn_procs(per_host={"procs": 2})
    yield mesh
    mesh.stop()


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def send_and_read_back(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(payload)
    writer.write_eof()  # a half close travels through the forward
    back = await asyncio.wait_for(reader.read(-1), WAIT_S)
    writer.close()
    return back


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 2 * WAIT_S))


def test_round_trip_half_close_and_stop_closes_the_port(procs: Any) -> None:
    async def body() -> None:
        server = await asyncio.start_server(echo, LOOPBACK, 0)
        service = server.sockets[0].getsockname()[1]
        (source,) = free_ports(1)
        forwarder = this_proc().spawn("forwarder", PortForwarder)
        # A bare port listens on loopback only.
        await forwarder.forward.call_one(
            procs.slice(procs=0), service, procs.slice(procs=1), source
        )
        listening = {
            c.laddr.ip
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == source
        }
        assert listening == {LOOPBACK}
        payload = bytes(range(256)) * 4096  # 1 MiB, several chunks each way
        assert await send_and_read_back(source, payload) == payload
        assert await send_and_read_back(source, b"again") == b"again"
        await forwarder.stop()
        await forwarder.stop()  # a second stop is harmless
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(LOOPBACK, source)
        assert bindable(source)
        server.close()

    run(body)


def test_each_rank_forwards_to_its_own_point(procs: Any) -> None:
    async def body() -> None:
        async def identify(rank: int, writer: asyncio.StreamWriter) -> None:
            writer.write(b"rank%d" % rank)
            await writer.drain()
            writer.close()

        servers = [
            await asyncio.start_server(lambda r, w, rank=rank: identify(rank, w), LOOPBACK, 0)
            for rank in range(2)
        ]
        services = [s.sockets[0].getsockname()[1] for s in servers]
        sources = free_ports(2)
        forwarder = this_proc().spawn("forwarder", PortForwarder)
        await forwarder.forward.call_one(
            procs,
            lambda point: services[point["procs"]],
            procs,
            lambda point: f"{LOOPBACK}:{sources[point['procs']]}",
        )

        async def read(port: int) -> bytes:
            reader, writer = await asyncio.open_connection(LOOPBACK, port)
            data = await asyncio.wait_for(reader.read(-1), WAIT_S)
            writer.close()
            return data

        got = await asyncio.gather(*(read(sources[r]) for r in (0, 1) for _ in range(3)))
        assert got == [b"rank0"] * 3 + [b"rank1"] * 3
        await forwarder.stop()
        for server in servers:
            server.close()

    run(body)


def test_a_slow_service_gets_every_byte(procs: Any) -> None:
    async def body() -> None:
        total: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def slow_sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            count = 0
            while data := await reader.read(16384):
                count += len(data)
                await asyncio.sleep(0.001)
            total.set_result(count)
            writer.close()

        server = await asyncio.start_server(slow_sink, LOOPBACK, 0)
        (source,) = free_ports(1)
        forwarder = this_proc().spawn("forwarder", PortForwarder)
        await forwarder.forward.call_one(
            procs.slice(procs=1),
            server.sockets[0].getsockname()[1],
            procs.slice(procs=0),
            f"{LOOPBACK}:{source}",
        )
        reader, writer = await asyncio.open_connection(LOOPBACK, source)
        size = 8 * 1024 * 1024
        writer.write(b"x" * size)
        writer.write_eof()
        await writer.drain()
        assert await asyncio.wait_for(total, WAIT_S) == size
        assert await asyncio.wait_for(reader.read(-1), WAIT_S) == b""  # closed after
        writer.close()
        await forwarder.stop()
        server.close()

    run(body)


def test_a_reset_reaches_the_service(procs: Any) -> None:
    async def body() -> None:
        connected, gone = asyncio.Event(), asyncio.Event()

        async def flood(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connected.set()
            try:
                while True:
                    writer.write(b"y" * 65536)
                    await writer.drain()
            except OSError:
                pass
            finally:
                writer.close()
                gone.set()

        server = await asyncio.start_server(flood, LOOPBACK, 0)
        (source,) = free_ports(1)
        forwarder = this_proc().spawn("forwarder", PortForwarder)
        await forwarder.forward.call_one(
            procs.slice(procs=0), server.sockets[0].getsockname()[1], procs.slice(procs=1), source
        )
        _reader, writer = await asyncio.open_connection(LOOPBACK, source)
        await asyncio.wait_for(connected.wait(), WAIT_S)
        writer.transport.abort()
        await asyncio.wait_for(gone.wait(), WAIT_S)
        await forwarder.stop()
        server.close()

    run(body)


def test_bad_forwards_fail_clearly_and_leave_nothing_listening(procs: Any) -> None:
    async def body() -> None:
        forwarder = this_proc().spawn("forwarder", PortForwarder)
        with pytest.raises(RemoteError, match="must have the same shape"):
            await forwarder.forward.call_one(procs, 1234, procs.slice(procs=0), 5678)
        with pytest.raises(RemoteError, match="dst_port must be an integer from 1"):
            await forwarder.forward.call_one(procs, 0, procs, 5678)
        with pytest.raises(RemoteError, match="address:port"):
            await forwarder.forward.call_one(procs, 1234, procs, "no port here")
        # Rank 1's source address is taken: rank 0's listener is closed again.
        service, *sources = free_ports(3)
        blocker = socket.socket()
        blocker.bind((LOOPBACK, sources[1]))
        blocker.listen()
        try:
            with pytest.raises(RemoteError, match=r"(?i)address already in use"):
                await forwarder.forward.call_one(
                    procs, service, procs, lambda point: sources[point["procs"]]
                )
        finally:
            blocker.close()
        assert all(bindable(port) for port in sources)
        # A destination whose port is bad on one rank: nothing listens either.
        with pytest.raises(RemoteError, match="dst_port"):
            await forwarder.forward.call_one(
                procs, lambda point: service if point["procs"] == 0 else 70000, procs, sources[0]
            )
        assert bindable(sources[0])
        await forwarder.stop()

    run(body)
