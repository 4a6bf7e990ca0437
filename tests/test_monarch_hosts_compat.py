"""Monarch's host meshes and RDMAAction where they met Monarch's own tests:
``HostMesh.stream_logs``, ``with_python_executable`` inherited by a process's
own spawns, and RDMAAction copying bytes whatever the dtypes. Real worker
processes throughout."""

import os
import sys
import time

import pytest
import torch

from monarch_nb import this_host
from monarch_nb.actor import Actor, endpoint
from monarch_nb.rdma import RDMAAction, RDMABuffer


class WrapperMark(Actor):
    """Reads the mark the wrapper interpreter left, and spawns one level further."""

    @endpoint
    def mark(self) -> str:
        return os.environ.get("WRAPPER_PID", "")

    @endpoint
    def nested_mark(self) -> str:
        # this_host() inside an actor whose process the wrapper started: its new
        # processes must run the wrapper again, not fork or inherit its mark.
        inner = this_host().spawn_procs(per_host={"procs": 1})
        try:
            return inner.spawn("inner", WrapperMark).mark.call_one().get(timeout=60)
        finally:
            inner.stop()


def test_with_python_executable_is_run_again_by_a_nested_spawn(tmp_path) -> None:
    wrapper = tmp_path / "python"
    # $$ differs on every run of the wrapper: a fresh start leaves a fresh mark.
    wrapper.write_text(f'#!/bin/sh\nexport WRAPPER_PID=$$\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    host = this_host().with_python_executable(str(wrapper))
    assert host.stream_logs is False
    assert this_host().stream_logs is False
    with host.spawn_procs(per_host={"procs": 1}) as procs:
        actor = procs.spawn("outer", WrapperMark)
        outer = actor.mark.call_one().get(timeout=60)
        inner = actor.nested_mark.call_one().get(timeout=120)
    assert outer, "the wrapper did not run for the mesh's own process"
    assert inner, "the wrapper did not run for the nested spawn"
    assert inner != outer, "the nested process inherited the mark instead of running the wrapper"


class FloatOwner(Actor):
    def __init__(self) -> None:
        self.data = torch.arange(8, dtype=torch.float32)

    @endpoint
    def handle(self) -> RDMABuffer:
        return RDMABuffer(self.data)

    @endpoint
    def values(self) -> list[float]:
        return self.data.tolist()


def test_rdma_action_copies_bytes_whatever_the_dtypes() -> None:
    with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        owner = procs.spawn("owner", FloatOwner)
        buf = owner.handle.call_one().get(timeout=60)
        assert buf.size() == 32
        # A uint8 view of float32 data: Monarch's RDMAAction moves the bytes.
        src = torch.full((8,), 2.0, dtype=torch.float32).view(torch.uint8)
        RDMAAction().write_remote(buf, src[:16]).submit(timeout=30).get(timeout=60)
        assert owner.values.call_one().get(timeout=60) == [2.0, 2.0, 2.0, 2.0, 4.0, 5, 6, 7]
        out = torch.zeros(32, dtype=torch.uint8)
        RDMAAction().read_remote(out, buf).submit(timeout=30).get(timeout=60)
        assert out.view(torch.float32).tolist() == [2.0, 2.0, 2.0, 2.0, 4.0, 5, 6, 7]
        # Sizes still count, in bytes, at once (Monarch's ValueError).
        with pytest.raises(ValueError, match="at most 32 bytes"):
            RDMAAction().write_remote(buf, torch.zeros(64, dtype=torch.uint8))
        with pytest.raises(ValueError, match="at least 32 bytes"):
            RDMAAction().read_remote(torch.zeros(31, dtype=torch.uint8), buf)
        # Our own typed read_into keeps its dtype check.
        with pytest.raises(TypeError, match="dtype mismatch"):
            buf.read_into(out)
        buf.drop()


def test_copies_start_when_awaited_so_await_order_orders_them() -> None:
    import asyncio

    data = torch.zeros(1 << 20, dtype=torch.float32)
    buf = RDMABuffer(data)
    try:
        got = torch.ones(1 << 20, dtype=torch.float32)
        new = torch.full((1 << 20,), 2.0)

        async def reverse_order() -> None:
            # Monarch's idiom: issue both, then await the write first.
            read = buf.read_into(got, timeout=30)
            write = buf.write_from(new, timeout=30)
            assert not read.done()  # nothing started yet
            await write
            await read

        asyncio.run(reverse_order())
        assert bool((got == 2.0).all())  # the read saw the write
        # A future let go unwaited still copies (nothing asked for is lost); it
        # is ordered with nothing, so wait for its bytes to land.
        buf.write_from(torch.full((1 << 20,), 3.0))
        deadline = time.monotonic() + 30
        while not bool((data == 3.0).all()):
            assert time.monotonic() < deadline, "a write let go unwaited never ran"
            time.sleep(0.01)
    finally:
        buf.drop()
