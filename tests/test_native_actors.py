"""RDMABuffer handles travelling through real actor calls (native + runtime together)."""

import threading
import time

import pytest
import torch

from monarch_nb import Actor, RemoteError, endpoint
from monarch_nb.events import Output
from monarch_nb.native import RDMABuffer, RDMAOwnerGoneError, native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the C extension did not build")


class Owner(Actor):
    """Owns a tensor and hands out a handle to it (keeping the buffer alive)."""

    def __init__(self, numel: int):
        self.tensor = torch.arange(numel, dtype=torch.float32)
        self.buffer = RDMABuffer(self.tensor)

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buffer

    @endpoint
    def busy(self, seconds: float) -> int:
        print("busy", flush=True)
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:  # pure Python: holds the GIL throughout
            n += 1
        return n

    @endpoint
    def tensor_sum(self) -> float:
        return float(self.tensor.sum())


class Reader(Actor):
    @endpoint
    def read_sum(self, handle: RDMABuffer, transport: str) -> float:
        out = torch.empty(handle.shape, dtype=torch.float32)
        handle.read_into(out, transport=transport).get(timeout=60)
        return float(out.sum())

    @endpoint
    def write_ones(self, handle: RDMABuffer, transport: str) -> int:
        return handle.write_from(torch.ones(handle.shape), transport=transport).get(timeout=60)


@pytest.mark.parametrize("transport", ["local", "tcp"])
def test_handles_pass_through_endpoints_between_ranks(procs4, transport):
    owner = procs4.slice(procs=0).spawn(f"owner-{transport}", Owner, 1000)
    readers = procs4.slice(procs=slice(1, 4)).spawn(f"readers-{transport}", Reader)
    handle = owner.handle.call_one().get(timeout=10)
    assert handle.size == 4000
    assert readers.read_sum.call(handle, transport).get(timeout=30).values() == [499500.0] * 3
    readers.slice(procs=2).write_ones.call_one(handle, transport).get(timeout=30)
    assert owner.tensor_sum.call_one().get(timeout=10) == 1000.0
    # The controller can read it too.
    out = torch.empty(1000)
    handle.read_into(out, transport=transport).get(timeout=10)
    assert float(out.sum()) == 1000.0


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["local", "tcp"])
def test_256_mib_read_completes_while_the_owners_endpoint_is_busy(procs4, transport):
    numel = (256 << 20) // 4
    owner = procs4.slice(procs=0).spawn(f"big-{transport}", Owner, numel)
    handle = owner.handle.call_one().get(timeout=30)
    busy_now = threading.Event()
    with procs4.events.subscribe(
        lambda out: out.line == "busy" and busy_now.set(), kinds=(Output,)
    ):
        busy = owner.busy.call_one(20.0)
        assert busy_now.wait(10)
        out = torch.empty(numel)
        started = time.monotonic()
        handle.read_into(out, transport=transport).get(timeout=60)
        elapsed = time.monotonic() - started
        assert not busy.done(), "the read had to wait for the owner's Python"
    assert elapsed < 15
    assert torch.equal(out, torch.arange(numel, dtype=torch.float32))
    procs4.interrupt([0])  # end the busy loop: the mesh must stay healthy for other tests
    with pytest.raises(RemoteError, match="KeyboardInterrupt"):
        busy.get(timeout=30)


def test_a_dead_owner_fails_the_read_clearly(procs2):
    owner = procs2.slice(procs=0).spawn("doomed", Owner, 1000)
    handle = owner.handle.call_one().get(timeout=10)
    procs2.kill([0])
    with pytest.raises(RDMAOwnerGoneError):
        handle.read_into(torch.empty(1000), transport="tcp").get(timeout=30)


class InlineOwner(Actor):
    """Monarch's idiom: build the buffer inside the endpoint and return it."""

    def __init__(self) -> None:
        self.weights = torch.arange(16, dtype=torch.float32)

    @endpoint
    def weights_handle(self) -> RDMABuffer:
        return RDMABuffer(self.weights.view(torch.uint8).flatten())

    @endpoint
    def short_lived(self) -> RDMABuffer:
        return RDMABuffer(torch.zeros(4), lifetime="object")

    @endpoint
    def total(self) -> float:
        return float(self.weights.sum())


def test_a_buffer_returned_inline_stays_readable_until_dropped(procs4):
    import gc

    from monarch_nb.native import RDMAAction, RDMABufferDroppedError, is_rdma_available

    assert is_rdma_available()
    owner = procs4.slice(procs=1).spawn("inline_owner", InlineOwner)
    handle = owner.weights_handle.call_one().get(timeout=30)
    gc.collect()
    assert handle.size() == handle.size == 64  # Monarch's size() and our size, both
    larger = torch.zeros(100, dtype=torch.uint8)  # a larger destination is fine
    assert handle.read_into(larger, timeout=30).get(timeout=60) == 64
    assert larger[:64].view(torch.float32).tolist() == [float(i) for i in range(16)]
    # A smaller source writes the buffer's start.
    handle.write_from(torch.full((8,), 255, dtype=torch.uint8)).get(timeout=60)
    assert owner.total.call_one().get(timeout=30) != float(sum(range(16)))
    out = torch.zeros(64, dtype=torch.uint8)
    assert RDMAAction().read_remote(out, handle).submit(timeout=30).get(timeout=60) == 64
    assert handle.drop().get(timeout=10) is None
    with pytest.raises(RDMABufferDroppedError):
        handle.read_into(out).get(timeout=30)
    # lifetime="object": the owner's object goes away once the endpoint's reply is
    # sent and the rank lets go of it, and so does the registration (soon after the
    # reply, not before it: reads may succeed until then).
    gone = owner.short_lived.call_one().get(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        try:
            gone.read_into(torch.zeros(4)).get(timeout=30)
        except RDMABufferDroppedError:
            break
        assert time.monotonic() < deadline, "the registration outlived its object"
        time.sleep(0.05)  # the rank's collector has no event to wait for


def test_a_bad_lifetime_is_named():
    with pytest.raises(ValueError, match="lifetime='forever'"):
        RDMABuffer(bytearray(8), lifetime="forever")
