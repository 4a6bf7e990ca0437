"""RDMABuffer over CUDA memory (needs a CUDA device; skipped without one).

Owners are spawned processes holding a CUDA tensor, as a rank would. This
process uses CUDA, so ``local`` maps the owner's memory by CUDA IPC; ``tcp``
goes through the owner's page-locked staging, as a reader on another host
does. A reader that never touched CUDA is a subprocess of its own.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import pickle
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from monarch_nb.native import RDMABuffer, RDMABufferDroppedError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.timeout(120),
]

CTX = mp.get_context("spawn")
N = 3 << 20  # float32 elements: 12 MiB, more than one staging chunk
TRANSPORTS = ["local", "tcp"]


def _owner_main(conn: Any) -> None:
    t = torch.arange(N, dtype=torch.float32, device="cuda")
    buf = RDMABuffer(t)
    conn.send(buf)
    while True:
        cmd, *args = conn.recv()
        if cmd == "slice":
            lo, hi = args
            conn.send(t[lo:hi].cpu().tolist())
        elif cmd == "fill_late":
            # Queue a long kernel, then the fill behind it, and answer at once: a
            # read that starts now must still see the fill.
            torch.cuda._sleep(200_000_000)
            t.fill_(args[0])
            conn.send(True)
        elif cmd == "reset":
            t.copy_(torch.arange(N, dtype=torch.float32, device="cuda"))
            torch.cuda.synchronize()
            conn.send(True)
        elif cmd == "drop":
            buf.drop()
            conn.send(True)
        elif cmd == "renew":
            # Drop, free, and register new memory (torch's allocator hands out the
            # same block again): readers must see the new bytes, not a stale mapping.
            buf.drop()
            del t
            t = torch.full((N,), args[0], dtype=torch.float32, device="cuda")
            buf = RDMABuffer(t)
            conn.send(buf)
        elif cmd == "exit":
            return


class Owner:
    def __init__(self) -> None:
        self.conn, child = CTX.Pipe()
        self.proc = CTX.Process(target=_owner_main, args=(child,), daemon=True)
        self.proc.start()
        self.buf: RDMABuffer = self.conn.recv()

    def ask(self, *cmd: Any) -> Any:
        self.conn.send(cmd)
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(("exit",))
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


@pytest.fixture
def owner() -> Iterator[Owner]:
    torch.cuda.init()  # this reader uses CUDA: "auto" maps by IPC
    o = Owner()
    yield o
    o.close()
    assert not o.proc.is_alive()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_read_into_host_and_device_memory(owner: Owner, transport: str) -> None:
    expected = torch.arange(N, dtype=torch.float32)
    host = torch.empty(N)
    assert owner.buf.read_into(host, transport=transport).get(timeout=60) == 4 * N
    assert torch.equal(host, expected)
    device = torch.empty(N, device="cuda")
    owner.buf.read_into(device, transport=transport).get(timeout=60)
    assert torch.equal(device.cpu(), expected)
    part = torch.empty(100)
    owner.buf.read_into(part, offset=4 * 1000, transport=transport).get(timeout=60)
    assert torch.equal(part, expected[1000:1100])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_writes_from_host_and_device_memory_land(owner: Owner, transport: str) -> None:
    owner.buf.write_from(torch.full((10,), -1.0), offset=40, transport=transport).get(timeout=60)
    source = torch.full((10,), -2.0, device="cuda")
    owner.buf.write_from(source, offset=80, transport=transport).get(timeout=60)
    assert owner.ask("slice", 8, 32) == [8.0, 9.0] + [-1.0] * 10 + [-2.0] * 10 + [30.0, 31.0]
    owner.ask("reset")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_read_sees_work_queued_before_it(owner: Owner, transport: str) -> None:
    owner.ask("fill_late", 7.0)
    out = torch.empty(N)
    owner.buf.read_into(out, transport=transport).get(timeout=60)
    assert bool((out == 7.0).all())
    owner.ask("reset")


def test_sealed_copies_of_cuda_memory_across_the_network(
    owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MONARCH_NB_RDMA_ENCRYPT", "1")  # this reader seals its copies
    remote = RDMABuffer._from_handle(dataclasses.replace(owner.buf._handle, unix=None))
    out = torch.empty(N, device="cuda")
    remote.read_into(out, transport="tcp").get(timeout=60)
    assert torch.equal(out.cpu(), torch.arange(N, dtype=torch.float32))
    remote.write_from(torch.full((10,), -3.0, device="cuda"), offset=40, transport="tcp").get(
        timeout=60
    )
    assert owner.ask("slice", 9, 21) == [9.0] + [-3.0] * 10 + [20.0]
    owner.ask("reset")


def test_a_reader_without_cuda_goes_by_staging(owner: Owner) -> None:
    code = (
        "import pickle, sys, torch\n"
        "buf = pickle.loads(sys.stdin.buffer.read())\n"
        "out = torch.empty(buf.size // 4)\n"
        "buf.read_into(out).get(timeout=60)\n"
        "print(int(out[-1].item()), torch.cuda.is_initialized())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(owner.buf),
        capture_output=True,
        timeout=90,
        check=True,
    )
    assert done.stdout.split() == [str(N - 1).encode(), b"False"]


def test_new_memory_in_a_reused_block_reads_its_own_bytes(owner: Owner) -> None:
    out = torch.empty(N)
    for value in (3.0, 4.0, 5.0):
        owner.buf.read_into(out).get(timeout=60)  # keeps the old mapping for next time
        owner.buf = owner.ask("renew", value)
        owner.buf.read_into(out).get(timeout=60)
        assert bool((out == value).all())
        small = torch.empty(10, device="cuda")
        owner.buf.read_into(small, offset=400).get(timeout=60)
        assert small.tolist() == [value] * 10


def test_a_dropped_buffer_refuses_both_transports(owner: Owner) -> None:
    owner.ask("drop")
    for transport in TRANSPORTS:
        with pytest.raises(RDMABufferDroppedError):
            owner.buf.read_into(torch.empty(N), transport=transport).get(timeout=60)


def test_own_cuda_buffer_and_host_buffer_into_device() -> None:
    t = torch.arange(1000, dtype=torch.int64, device="cuda")
    with RDMABuffer(t) as buf:
        assert "cuda:0" in buf._handle.describe()
        out = torch.zeros(1000, dtype=torch.int64)
        buf.read_into(out).get(timeout=60)
        assert torch.equal(out, t.cpu())
    host = torch.arange(1000, dtype=torch.int64)
    with RDMABuffer(host) as buf:
        for transport in TRANSPORTS:
            device = torch.zeros(1000, dtype=torch.int64, device="cuda")
            buf.read_into(device, transport=transport).get(timeout=60)
            assert torch.equal(device.cpu(), host)
