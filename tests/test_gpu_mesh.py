"""A mesh on GPUs (needs a CUDA device; skipped without one): ``per_host={"gpus": n}``,
NCCL across the ranks, and a rank's CUDA weights handed out as an RDMABuffer."""

from __future__ import annotations

import pytest
import torch

from monarch_nb import Actor, endpoint, this_host
from monarch_nb.native import RDMABuffer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.timeout(300),
]


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True)


class Trainer(Actor):
    """DDP over NCCL on the rank's one visible GPU."""

    def __init__(self) -> None:
        import os

        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        from monarch_nb._services._dist import init_process_group

        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        torch.cuda.set_device(0)
        init_process_group("nccl")
        self.backend = dist.get_backend()
        self.rank = dist.get_rank()
        self.model = DistributedDataParallel(make_model().cuda())
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)

    @endpoint
    def describe(self) -> dict:
        return {
            "visible": self.visible,
            "backend": self.backend,
            "gpu": torch.cuda.get_device_name(),
        }

    @endpoint
    def step(self, step: int) -> float:
        x, y = (t.cuda() for t in batch(self.rank, step))
        self.opt.zero_grad()
        torch.nn.functional.mse_loss(self.model(x), y).backward()
        norm = torch.sqrt(sum((p.grad**2).sum() for p in self.model.parameters()))
        self.opt.step()
        return float(norm)

    @endpoint
    def weights(self) -> RDMABuffer:
        # Built inline and returned, as Monarch programs do: the rank keeps it registered.
        first = self.model.module[0].weight.data
        return RDMABuffer(first.view(torch.uint8).flatten())


def reference_norms(world: int, steps: int) -> list[float]:
    """The same training on the CPU in this process: DDP averages the ranks' gradients."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    norms = []
    for step in range(steps):
        opt.zero_grad()
        for rank in range(world):
            x, y = batch(rank, step)
            (torch.nn.functional.mse_loss(model(x), y) / world).backward()
        norms.append(float(torch.sqrt(sum((p.grad**2).sum() for p in model.parameters()))))
        opt.step()
    return norms


def test_ddp_over_nccl_and_rdma_of_cuda_weights() -> None:
    gpus = torch.cuda.device_count()
    with this_host().spawn_procs(per_host={"gpus": gpus}) as procs:
        trainers = procs.spawn("trainers", Trainer)
        described = trainers.describe.call().get(timeout=120).values()
        assert [d["visible"] for d in described] == [str(i) for i in range(gpus)]
        assert {d["backend"] for d in described} == {"nccl"}
        norms = [trainers.step.call(step).get(timeout=120).values() for step in range(3)]
        for got, want in zip(norms, reference_norms(gpus, 3), strict=True):
            assert got == pytest.approx([want] * gpus, rel=1e-4)
        torch.cuda.init()  # the controller uses CUDA too: the read maps the rank's memory
        buf = trainers.slice(gpus=0).weights.call_one().get(timeout=60)
        host = torch.empty(32 * 16 * 4, dtype=torch.uint8)
        buf.read_into(host).get(timeout=60)
        device = torch.empty_like(host, device="cuda")
        buf.read_into(device, transport="tcp").get(timeout=60)
        assert torch.equal(device.cpu(), host)
        trained = host.view(torch.float32).reshape(32, 16)
        assert not torch.equal(trained, make_model()[0].weight.data)  # three steps moved it
