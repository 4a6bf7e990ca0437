"""Tests of monarch_nb.native: real owner processes (spawn), both transports.

Owners are spawned Python processes that register memory and pass the pickled
RDMABuffer back over a pipe; the test process reads and writes through the
handle. One owner serves most tests (module fixture); tests that kill or drop
in ways that end an owner get their own. Every test checks it left no process
behind.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing as mp
import pickle
import random
import re
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psutil
import pytest
import torch

import monarch_nb.native as native
from monarch_nb.native import (
    RDMAAccessError,
    RDMABatch,
    RDMABuffer,
    RDMABufferDroppedError,
    RDMAError,
    RDMAOwnerGoneError,
    RDMAUnavailableError,
)
from monarch_nb.native import _memory as C
from monarch_nb.native._transport import REPLY_FORMAT, read_hello, sign_request

pytestmark = pytest.mark.timeout(60)

CTX = mp.get_context("spawn")
TRANSPORTS = ["local", "tcp"]
BIG = 256 << 20

# -- memory both sides can rebuild -------------------------------------------


def make(kind: str, dtype: str | None, shape: tuple[int, ...], salt: int = 0) -> Any:
    """Deterministic contents, so the test can predict the owner's bytes."""
    n = int(np.prod(shape))
    if kind == "tensor":
        values = (torch.arange(n, dtype=torch.float64) + salt).remainder(251)
        return values.to(getattr(torch, dtype)).reshape(shape)
    if kind == "arange64":
        return torch.arange(n, dtype=torch.int64)
    if kind == "numpy":
        return ((np.arange(n) + salt) % 251).astype(dtype).reshape(shape)
    pattern = bytes((i + salt) % 256 for i in range(256))
    data = bytearray((pattern * (n // 256 + 1))[:n])
    return memoryview(data) if kind == "memoryview" else data


def raw(obj: Any) -> bytes:
    if isinstance(obj, torch.Tensor):
        return obj.reshape(-1).view(torch.uint8).numpy().tobytes()
    if isinstance(obj, np.ndarray):
        return obj.tobytes()
    return bytes(obj)


# -- the owner process --------------------------------------------------------


def _owner_main(conn: Any, busy_flag: Any) -> None:
    objects: dict[str, Any] = {}
    buffers: dict[str, RDMABuffer] = {}
    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "register":
                name, kind, dtype, shape = args
                objects[name] = make(kind, dtype, shape)
                buffers[name] = RDMABuffer(objects[name])
                reply: Any = buffers[name]
            elif cmd == "register_slice":
                # A region in the middle of a larger allocation: the rest are canaries.
                (name,) = args
                objects[name] = make("bytearray", None, (3 * 4096,))
                buffers[name] = RDMABuffer(memoryview(objects[name])[4096:8192])
                reply = buffers[name]
            elif cmd == "bytes":
                reply = raw(objects[args[0]])
            elif cmd == "drop":
                buffers.pop(args[0]).drop()
                reply = True
            elif cmd == "busy":
                conn.send("busy")
                while not busy_flag.value:  # pure Python: holds the GIL throughout
                    pass
                reply = "done"
            elif cmd == "stats":
                reply = native.statistics()
            elif cmd == "exit":
                return
            else:
                reply = ValueError(f"unknown command {cmd!r}")
        except Exception as exc:
            reply = exc
        conn.send(reply)


class Owner:
    """A spawned process that registers memory on request."""

    def __init__(self) -> None:
        self.busy_flag = CTX.RawValue("i", 0)
        self.conn, child = CTX.Pipe()
        self.proc = CTX.Process(target=_owner_main, args=(child, self.busy_flag), daemon=True)
        self.proc.start()
        child.close()

    def send(self, *cmd: Any) -> None:
        self.conn.send(cmd)

    def reply(self, timeout: float = 30) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"owner pid {self.proc.pid} did not answer within {timeout} s")
        value = self.conn.recv()
        if isinstance(value, BaseException):
            raise value
        return value

    def call(self, *cmd: Any, timeout: float = 30) -> Any:
        self.send(*cmd)
        return self.reply(timeout)

    def register(self, name: str, kind: str, dtype: str | None, shape: tuple[int, ...]) -> Any:
        return self.call("register", name, kind, dtype, shape)

    def close(self) -> None:
        try:
            if self.proc.is_alive():
                self.busy_flag.value = 1
                self.conn.send(("exit",))
                self.proc.join(5)
        except OSError:
            pass
        finally:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
            self.conn.close()


@pytest.fixture(scope="module")
def owner() -> Iterator[Owner]:
    o = Owner()
    try:
        yield o
    finally:
        o.close()


@pytest.fixture
def own_owner() -> Iterator[Owner]:
    o = Owner()
    try:
        yield o
    finally:
        o.close()


@pytest.fixture(autouse=True)
def no_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + 30  # processes exit late on a loaded machine
    while True:
        left = [p for p in me.children(recursive=True) if p.pid not in before and p.is_running()]
        left = [p for p in left if p.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"test left processes behind: {[p.pid for p in left]}"


# -- raw protocol helpers -----------------------------------------------------


_nonces = itertools.count(1)


def pack(challenge: bytes, op: int, region: int, token: bytes, offset: int, length: int) -> bytes:
    """A request signed for the connection whose hello carried ``challenge``."""
    return sign_request(challenge, token, op, region, next(_nonces), offset, length)


def connect_raw(server: tuple[str, int], timeout: float = 10) -> tuple[socket.socket, bytes]:
    """A plain connection to a buffer server and the challenge of its hello."""
    s = socket.create_connection(server, timeout=timeout)
    return s, read_hello(s)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def read_reply(sock: socket.socket) -> tuple[int, int] | None:
    header = recv_exact(sock, C.REPLY_SIZE)
    if len(header) < C.REPLY_SIZE:
        return None
    magic, status, value = struct.unpack(REPLY_FORMAT, header)
    assert magic == C.REPLY_MAGIC
    return status, value


# -- copies -------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("float32", (1000,)), ("bfloat16", (64, 33)), ("int64", (7, 3, 5)), ("uint8", (4096,))],
)
def test_tensor_read_and_write(owner: Owner, transport: str, dtype: str, shape: tuple) -> None:
    name = f"t-{dtype}-{transport}"
    buf = owner.register(name, "tensor", dtype, shape)
    expected = make("tensor", dtype, shape)
    assert (buf.size, buf.dtype, buf.shape) == (len(raw(expected)), dtype, shape)

    dst = torch.empty(shape, dtype=getattr(torch, dtype))
    assert buf.read_into(dst, transport=transport).get(timeout=10) == buf.size
    assert torch.equal(dst, expected)

    src = make("tensor", dtype, shape, salt=7)
    buf.write_from(src, transport=transport).get(timeout=10)
    assert owner.call("bytes", name) == raw(src)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", ["numpy", "bytearray", "memoryview"])
def test_numpy_and_python_buffers(owner: Owner, transport: str, kind: str) -> None:
    dtype = "float64" if kind == "numpy" else None
    shape = (3, 50) if kind == "numpy" else (1500,)
    name = f"{kind}-{transport}"
    buf = owner.register(name, kind, dtype, shape)

    dst = np.empty(shape, dtype=dtype) if kind == "numpy" else bytearray(buf.size)
    buf.read_into(dst, transport=transport).get(timeout=10)
    assert raw(dst) == raw(make(kind, dtype, shape))

    src = make(kind, dtype, shape, salt=3)
    buf.write_from(src, transport=transport).get(timeout=10)
    assert owner.call("bytes", name) == raw(src)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_offsets_and_sizes(owner: Owner, transport: str) -> None:
    buf = owner.register(f"part-{transport}", "bytearray", None, (10_000,))
    expected = bytearray(raw(make("bytearray", None, (10_000,))))

    part = bytearray(100)
    assert buf.read_into(part, offset=1234, transport=transport).get(timeout=10) == 100
    assert part == expected[1234:1334]

    head = bytearray(64)
    buf.read_into(head, offset=9_990, size=10, transport=transport).get(timeout=10)
    assert head[:10] == expected[9_990:]
    assert head[10:] == bytes(54)

    buf.write_from(b"\xff" * 16, offset=5000, transport=transport).get(timeout=10)
    expected[5000:5016] = b"\xff" * 16
    assert owner.call("bytes", f"part-{transport}") == expected

    # A typed destination for untyped bytes is fine, and a typed source too.
    floats = torch.empty(25, dtype=torch.float32)
    buf.read_into(floats, offset=0, size=100, transport=transport).get(timeout=10)
    assert raw(floats) == expected[:100]


def test_mismatches_fail_before_any_byte_moves(owner: Owner) -> None:
    buf = owner.register("mismatch", "tensor", "float32", (10, 20))  # 800 bytes
    with pytest.raises(ValueError, match=r"size mismatch: the buffer has 800 bytes .* 400 bytes"):
        buf.read_into(torch.empty(100))
    with pytest.raises(ValueError, match=r"size mismatch: the buffer has 800 bytes .* 1600 bytes"):
        buf.write_from(torch.empty(400))
    with pytest.raises(TypeError, match=r"dtype mismatch: the buffer holds float32 .* bfloat16"):
        buf.read_into(torch.empty((10, 20), dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"dtype mismatch: the buffer holds float32 .* int32"):
        buf.write_from(np.zeros(200, dtype=np.int32))
    with pytest.raises(ValueError, match=r"cannot read 400 bytes at offset 600: .* only 800"):
        buf.read_into(bytearray(400), offset=600)
    with pytest.raises(ValueError, match=r"fewer than the 500 bytes requested"):
        buf.read_into(bytearray(400), offset=0, size=500)
    with pytest.raises(ValueError, match=r"not contiguous .* call \.contiguous\(\)"):
        buf.read_into(torch.empty(20, 10).t())
    with pytest.raises(ValueError, match=r"read-only .* pass a bytearray"):
        buf.read_into(bytes(800))
    with pytest.raises(TypeError, match=r"must be a contiguous CPU torch.Tensor.*'list'"):
        buf.read_into([0.0] * 200)
    with pytest.raises(ValueError, match=r"unknown RDMA transport 'carrier-pigeon'"):
        buf.read_into(torch.empty((10, 20)), transport="carrier-pigeon")
    assert owner.call("bytes", "mismatch") == raw(make("tensor", "float32", (10, 20)))


def test_transport_selection(owner: Owner, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = owner.register("select", "bytearray", None, (64,))
    monkeypatch.setenv("MONARCH_NB_RDMA_TRANSPORT", "rdma-over-smoke")
    with pytest.raises(ValueError, match=r"unknown RDMA transport .* MONARCH_NB_RDMA_TRANSPORT"):
        buf.read_into(bytearray(64))
    for value in ("tcp", "local", "auto"):
        monkeypatch.setenv("MONARCH_NB_RDMA_TRANSPORT", value)
        dst = bytearray(64)
        buf.read_into(dst).get(timeout=10)
        assert dst == raw(make("bytearray", None, (64,)))
    elsewhere = RDMABuffer._from_handle(dataclasses.replace(buf._handle, host_key="other-host"))
    with pytest.raises(ValueError, match=r"transport 'local' needs the owner on this host"):
        elsewhere.read_into(bytearray(64), transport="local")
    # auto picks TCP for an owner on another host; here that still reaches the owner.
    elsewhere.read_into(bytearray(64), transport="auto").get(timeout=10)


def test_handle_pickles_small_and_without_data(owner: Owner) -> None:
    buf = owner.register("pickled", "tensor", "float32", (1 << 16,))
    blob = pickle.dumps(buf)
    assert len(blob) < 600
    again = pickle.loads(blob)
    assert (again.size, again.dtype, again.owner_pid) == (1 << 18, "float32", owner.proc.pid)
    assert not again.is_owner
    assert "token" not in repr(again._handle)
    assert repr(again).startswith("<RDMABuffer 262144 bytes float32[65536] owned by pid")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_batch_is_one_future(owner: Owner, transport: str) -> None:
    a = owner.register(f"batch-a-{transport}", "tensor", "float32", (256,))
    b = owner.register(f"batch-b-{transport}", "numpy", "int16", (512,))
    ra, rb = torch.empty(256), np.empty(512, dtype=np.int16)
    new_b = make("numpy", "int16", (512,), salt=11)
    batch = RDMABatch(transport=transport).read_into(a, ra).read_into(b, rb)
    assert len(batch) == 2
    assert batch.submit().get(timeout=10) == 1024 + 1024
    assert torch.equal(ra, make("tensor", "float32", (256,)))
    assert np.array_equal(rb, make("numpy", "int16", (512,)))

    total = RDMABatch(transport=transport).write_from(b, new_b).read_into(a, ra).submit()
    assert total.get(timeout=10) == 2048
    assert owner.call("bytes", f"batch-b-{transport}") == raw(new_b)
    with pytest.raises(TypeError, match="dtype mismatch"):
        RDMABatch().read_into(a, np.empty(256, dtype=np.int32))


async def _await(fut: Any) -> Any:
    return await fut


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_256mib_read_while_owner_holds_the_gil(owner: Owner, transport: str) -> None:
    import asyncio

    buf = owner.register(f"big-{transport}", "arange64", "int64", (BIG // 8,))
    dst = torch.empty(BIG // 8, dtype=torch.int64)
    owner.busy_flag.value = 0
    assert owner.call("busy") == "busy"
    try:
        fut = buf.read_into(dst, transport=transport)
        assert asyncio.run(asyncio.wait_for(_await(fut), 30)) == BIG
        assert not owner.conn.poll(0), "the owner left its busy loop: the read needed it"
    finally:
        owner.busy_flag.value = 1
    assert owner.reply() == "done"
    assert torch.equal(dst, torch.arange(BIG // 8, dtype=torch.int64))
    owner.call("drop", f"big-{transport}")


# -- drop, death, access ------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_read_after_drop_fails(owner: Owner, transport: str) -> None:
    name = f"dropped-{transport}"
    buf = owner.register(name, "bytearray", None, (4096,))
    buf.read_into(bytearray(4096), transport=transport).get(timeout=10)
    owner.call("drop", name)
    with pytest.raises(RDMABufferDroppedError, match=r"buffer has been dropped"):
        buf.read_into(bytearray(4096), transport=transport).get(timeout=10)
    with pytest.raises(RDMABufferDroppedError, match=r"buffer has been dropped"):
        buf.write_from(bytearray(4096), transport=transport).get(timeout=10)


def test_drop_from_a_handle_revokes_for_everyone(owner: Owner) -> None:
    buf = owner.register("remote-drop", "bytearray", None, (128,))
    other = pickle.loads(pickle.dumps(buf))
    other.drop()
    assert other.dropped
    with pytest.raises(RDMABufferDroppedError, match="was dropped; ask its owner"):
        other.read_into(bytearray(128))
    for transport in TRANSPORTS:
        with pytest.raises(RDMABufferDroppedError):
            buf.read_into(bytearray(128), transport=transport).get(timeout=10)


def test_drop_breaks_a_stalled_tcp_stream(owner: Owner) -> None:
    buf = owner.register("stalled", "bytearray", None, (64 << 20,))
    h = buf._handle
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.settimeout(10)
        s.connect(h.server)
        s.sendall(pack(read_hello(s), C.OP_READ, h.region, h.token, 0, h.size))
        assert read_reply(s) == (C.ST_OK, h.size)
        received = len(recv_exact(s, 1 << 16))
        # The server is now blocked in send() on our full window; drop must wake it.
        assert owner.call("drop", "stalled", timeout=10) is True
        while chunk := s.recv(1 << 20):
            received += len(chunk)
    assert received < h.size
    with pytest.raises(RDMABufferDroppedError):
        buf.read_into(bytearray(h.size), transport="tcp").get(timeout=10)


def test_drop_waits_for_a_local_lease_to_end(owner: Owner) -> None:
    buf = owner.register("leased", "bytearray", None, (1 << 20,))
    h = buf._handle
    s, challenge = connect_raw(h.server)
    with s:
        s.sendall(pack(challenge, C.OP_LEASE_WRITE, h.region, h.token, 0, 4096))
        assert read_reply(s) == (C.ST_OK, h.address)
        owner.send("drop", "leased")
        assert s.recv(1) == b"", "the owner must tell the lease holder to stop"
        assert not owner.conn.poll(0.2), "drop returned while a reader could still copy"
        s.sendall(pack(challenge, C.OP_RELEASE, h.region, h.token, 0, 0))
        assert owner.reply(timeout=10) is True
    with pytest.raises(RDMABufferDroppedError):
        buf.read_into(bytearray(h.size), transport="local").get(timeout=10)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_drop_during_read_fails_cleanly(owner: Owner, transport: str) -> None:
    name = f"racing-{transport}"
    buf = owner.register(name, "arange64", "int64", ((64 << 20) // 8,))
    dst = torch.zeros((64 << 20) // 8, dtype=torch.int64)
    # A batch starts at submit (read_into's future starts when waited on).
    fut = RDMABatch(transport=transport).read_into(buf, dst).submit()
    owner.call("drop", name)
    exc = fut.exception(timeout=30)
    if exc is None:  # the copy won the race: then every byte must be right
        assert torch.equal(dst, torch.arange((64 << 20) // 8, dtype=torch.int64))
    else:
        assert isinstance(exc, RDMABufferDroppedError)
        assert re.search("dropped while the read was in flight|has been dropped", str(exc))
    with pytest.raises(RDMABufferDroppedError):
        buf.read_into(dst, transport=transport).get(timeout=10)


def test_owner_killed_before_and_during_reads(own_owner: Owner) -> None:
    buf = own_owner.register("doomed", "arange64", "int64", (BIG // 8,))
    dst = torch.empty(BIG // 8, dtype=torch.int64)
    buf.read_into(dst[:1024], size=8192, transport="tcp").get(timeout=10)  # connection pooled
    fut = RDMABatch(transport="tcp").read_into(buf, dst).submit()  # starts now
    own_owner.proc.kill()
    own_owner.proc.join(10)
    exc = fut.exception(timeout=30)
    if exc is not None:  # else the copy finished before the kill
        assert isinstance(exc, RDMAOwnerGoneError)
        assert "exited" in str(exc)
    for transport in TRANSPORTS:
        with pytest.raises(RDMAOwnerGoneError, match=r"owning process has exited|exited"):
            buf.read_into(dst, transport=transport).get(timeout=10)


def test_local_read_when_owner_dies_mid_copy(own_owner: Owner) -> None:
    buf = own_owner.register("doomed-local", "arange64", "int64", (BIG // 8,))
    dst = torch.empty(BIG // 8, dtype=torch.int64)
    fut = RDMABatch(transport="local").read_into(buf, dst).submit()  # starts now
    own_owner.proc.kill()
    own_owner.proc.join(10)
    exc = fut.exception(timeout=30)
    if exc is not None:  # else the copy finished before the kill
        assert isinstance(exc, RDMAOwnerGoneError)
        assert "exited" in str(exc)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_wrong_token_or_region_is_refused(owner: Owner, transport: str) -> None:
    buf = owner.register(f"guarded-{transport}", "bytearray", None, (256,))
    forged = RDMABuffer._from_handle(dataclasses.replace(buf._handle, token=bytes(16)))
    # A wrong token reads as a dropped buffer: the reply tells a prober nothing
    # about which buffers are live.
    with pytest.raises(RDMABufferDroppedError, match="token is not its owner's"):
        forged.read_into(bytearray(256), transport=transport).get(timeout=10)
    with pytest.raises(RDMABufferDroppedError, match="token is not its owner's"):
        forged.write_from(bytearray(256), transport=transport).get(timeout=10)
    unknown = RDMABuffer._from_handle(dataclasses.replace(buf._handle, region=1 << 60))
    with pytest.raises(RDMAAccessError, match="never registered buffer"):
        unknown.read_into(bytearray(256), transport=transport).get(timeout=10)
    # A forged size cannot reach past the registered region either.
    grown = RDMABuffer._from_handle(dataclasses.replace(buf._handle, size=1 << 20))
    with pytest.raises(RDMAAccessError, match="outside the registered region"):
        grown.read_into(bytearray(512), offset=0, size=512, transport=transport).get(timeout=10)
    assert owner.call("bytes", f"guarded-{transport}") == raw(make("bytearray", None, (256,)))


def test_fuzzed_requests_never_crash_or_escape_the_region(owner: Owner) -> None:
    buf = owner.call("register_slice", "fuzz")
    h = buf._handle
    size = h.size
    original = owner.call("bytes", "fuzz")
    baseline = owner.call("stats").server_connections
    rng = random.Random(20240611)
    ops = [C.OP_READ, C.OP_WRITE, C.OP_LEASE_READ, C.OP_LEASE_WRITE, C.OP_RELEASE, C.OP_QUERY]
    edge = [0, 1, size - 1, size, size + 1, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]

    def exchange(request: bytes | tuple, then_close: bool = True, cut: int | None = None) -> bytes:
        """Send raw bytes, or ``pack``'s arguments signed for this connection (the first
        ``cut`` bytes of them); return what came back after the hello."""
        out = bytearray()
        s, challenge = connect_raw(h.server, timeout=5)
        with s:
            try:
                s.sendall(
                    request if isinstance(request, bytes) else pack(challenge, *request)[:cut]
                )
                if then_close:
                    s.shutdown(socket.SHUT_WR)
                while chunk := s.recv(1 << 16):
                    out += chunk
                    if not then_close and len(out) >= C.REPLY_SIZE:
                        break
            except OSError:
                pass  # the server closed on garbage it had not read yet
        return bytes(out)

    for _ in range(120):  # random bytes, truncated and oversized
        length = rng.choice([0, 1, 17, 47, 48, 49, 96, 1000, 70_000])
        reply = exchange(rng.randbytes(length))
        assert len(reply) in (0, C.REPLY_SIZE), reply[:64]

    for _ in range(120):  # well-formed headers, wrong tokens, random fields
        op = rng.choice([*ops, C.OP_DROP, 0, 99, 0xFFFF])
        region = rng.choice([h.region, 0, rng.getrandbits(64)])
        token = rng.randbytes(16)
        offset, length = rng.choice(edge), rng.choice(edge)
        reply = exchange((op, region, token, offset, length))
        status = struct.unpack(REPLY_FORMAT, reply[: C.REPLY_SIZE])[1]
        assert status != C.ST_OK, (op, region)

    for _ in range(160):  # the right token with random ranges: only in-range is served
        op = rng.choice([C.OP_READ, C.OP_WRITE, C.OP_QUERY])
        offset = rng.choice([*edge, rng.randrange(size)])
        length = rng.choice([*edge, rng.randrange(size)])
        inside = offset <= size and length <= size - offset
        s, challenge = connect_raw(h.server, timeout=5)
        with s:
            s.sendall(pack(challenge, op, h.region, h.token, offset, length))
            status, value = read_reply(s) or (None, None)
            assert status == (C.ST_OK if inside else C.ST_OUT_OF_RANGE), (op, offset, length)
            if status != C.ST_OK or op == C.OP_QUERY:
                continue
            assert value == length
            if op == C.OP_READ:
                got = recv_exact(s, length)
                assert got == original[4096 + offset : 4096 + offset + length]
            else:
                s.sendall(original[4096 + offset : 4096 + offset + length])
                assert read_reply(s) == (C.ST_OK, length)

    for cut in range(1, C.REQUEST_SIZE):  # a valid header cut short
        assert exchange((C.OP_READ, h.region, h.token, 0, size), cut=cut) == b""

    # Leases taken and abandoned without RELEASE do not pin the region forever.
    for op in (C.OP_LEASE_READ, C.OP_LEASE_WRITE):
        assert exchange((op, h.region, h.token, 0, size), then_close=False)

    assert owner.call("bytes", "fuzz") == original, "bytes outside the region changed"
    dst = bytearray(size)
    buf.read_into(dst).get(timeout=10)
    assert dst == original[4096:8192]
    deadline = time.monotonic() + 10
    while owner.call("stats").server_connections > baseline + 2:
        assert time.monotonic() < deadline, "server connections were not cleaned up"
        time.sleep(0.05)
    owner.call("drop", "fuzz")  # returns: no abandoned lease still holds the region


# -- this process as owner ----------------------------------------------------


def test_in_process_owner_and_read_only_memory() -> None:
    data = bytearray(b"abc" * 100)
    with RDMABuffer(data) as buf:
        assert buf.is_owner
        for transport in TRANSPORTS:
            dst = bytearray(300)
            buf.read_into(dst, transport=transport).get(timeout=10)
            assert dst == data
        stats = native.statistics()
        assert stats.registered_buffers >= 1
        assert stats.server_address is not None
    assert buf.dropped
    with pytest.raises(RDMABufferDroppedError, match="was dropped"):
        buf.read_into(bytearray(300))

    frozen = RDMABuffer(b"read only bytes")
    try:
        with pytest.raises(RDMAAccessError, match="read-only"):
            frozen.write_from(b"x" * frozen.size)
        dst = bytearray(frozen.size)
        frozen.read_into(dst).get(timeout=10)
        assert dst == b"read only bytes"
    finally:
        frozen.drop()


def test_meta_tensor_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match=r"device 'meta'.* create it on the CPU"):
        RDMABuffer(torch.empty(4, device="meta"))
    meta = torch.empty(16, dtype=torch.uint8, device="meta")
    with (
        RDMABuffer(bytearray(16)) as buf,
        pytest.raises(ValueError, match=r"the destination is a tensor on device 'meta'"),
    ):
        buf.read_into(meta)


def test_missing_extension_gives_a_clear_error() -> None:
    code = (
        "import sys\n"
        "sys.modules['monarch_nb.native._memory'] = None\n"
        "import monarch_nb.native as n\n"
        "assert not n.native_available()\n"
        "try:\n"
        "    n.RDMABuffer(bytearray(8))\n"
        "except n.RDMAUnavailableError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert "native data plane is unavailable" in out.stdout
    assert "ModuleNotFoundError" in out.stdout
    assert "build_ext --inplace" in out.stdout


def test_public_names() -> None:
    public = sorted(n for n in dir(native) if not n.startswith("_"))
    assert native.__all__ == sorted(native.__all__)
    assert set(native.__all__) == set(public)
    assert issubclass(RDMAUnavailableError, RDMAError)
    assert RDMABuffer.__module__ == "monarch_nb.native"


def test_an_explicit_offset_of_zero_is_a_partial_copy() -> None:
    with RDMABuffer(bytearray(16)) as buf:
        buf.write_from(bytearray(b"\x07" * 8), offset=0).get(timeout=10)
        out = bytearray(16)
        buf.read_into(out).get(timeout=10)
    assert out == bytearray(b"\x07" * 8 + b"\x00" * 8)
