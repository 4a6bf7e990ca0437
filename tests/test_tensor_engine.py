"""The tensor engine over real worker processes (gloo on CPU): one 4-rank mesh shared."""

import asyncio
import inspect as pyinspect

import pytest
import torch
from torch import nn

import monarch_nb
from monarch_nb import MeshTensor, MeshUsageError, distribute, module_to_mesh
from monarch_nb.tensor import MeshTensorError, Replicate, Shard, manual_seed, ref_counts
from monarch_nb.tensor._engine import engine_for

pytestmark = pytest.mark.timeout(120)


def _line_after(marker: str) -> int:
    """The line number of the test source line holding ``marker``."""
    lines, _ = pyinspect.getsourcelines(pyinspect.getmodule(_line_after))
    return 1 + next(i for i, line in enumerate(lines) if marker in line and "_line" not in line)


@pytest.fixture(scope="module")
def procs(procs4):
    return procs4


@pytest.fixture(scope="module")
def grid(procs):
    """The same 4 processes as a 2x2 mesh."""
    return procs.split(procs={"dp": 2, "tp": 2})


def rank_values(mesh):
    """A mesh tensor of shape (1,) holding each rank's global rank (a float)."""
    sizes = mesh.shape.sizes
    dims = len(sizes)
    value = torch.arange(float(len(mesh.shape))).reshape(sizes)
    local = distribute(value, mesh, [Shard(i) for i in range(dims)]).to_local()
    return local.reshape(1)


# -- 1. activate(): factories and ops run on the ranks; metadata known at once ------------


def test_factories_and_ops_are_mesh_tensors_known_without_a_round_trip(procs):
    controller = procs._group.controller
    with procs.activate():
        monarch_nb.inspect(torch.zeros(1), procs=0)  # the engine is started and idle
        sent = controller.stats.sent
        x = torch.rand(3, 4)
        y = (x * 2 + 1).to(torch.float64)
        z = y.sum(0)
        assert isinstance(x, MeshTensor)
        assert (tuple(z.shape), z.dtype, z.device) == ((4,), torch.float64, torch.device("cpu"))
        assert controller.stats.sent == sent  # nothing sent, nothing waited for
    local = outside = torch.ones(2)
    assert type(outside) is torch.Tensor  # outside the block torch is local again
    for rank in range(4):
        xv = monarch_nb.inspect(x, procs=rank)
        assert torch.allclose(monarch_nb.inspect(z, procs=rank), (xv * 2 + 1).double().sum(0))
    assert isinstance(z + 1, MeshTensor)  # mesh tensors stay on the mesh outside it
    assert torch.equal(local, torch.ones(2))


def test_mixing_a_local_tensor_with_a_mesh_tensor_says_to_distribute(procs):
    local = torch.ones(3)
    with procs.activate():
        x = torch.zeros(3)
        with pytest.raises(MeshUsageError, match=r"local tensor of shape \(3,\).*distribute"):
            x + local
    with pytest.raises(MeshUsageError, match=r"local tensor of shape \(3,\).*distribute"):
        local.mul(x)
    y = x + torch.tensor(2.0)  # a 0-dim local value travels as a scalar
    assert monarch_nb.inspect(y, procs=0).tolist() == [2.0, 2.0, 2.0]


def test_values_are_read_only_on_request(procs):
    with procs.activate():
        x = torch.ones(2)
    for read in (lambda: x.item(), lambda: bool(x), lambda: x.tolist()):
        with pytest.raises(MeshUsageError, match=r"monarch_nb.inspect"):
            read()
    assert monarch_nb.inspect(x).tolist() == [1.0, 1.0]  # rank 0's copy, as Monarch's


# -- 2. reading: inspect, show, fetch, await --------------------------------------------


def test_inspect_show_fetch_and_await(procs, capsys):
    v = rank_values(procs)
    with procs.activate():
        same = torch.tensor([1.0, 2.0])
        w = v * 10
    assert monarch_nb.inspect(w, procs=2).tolist() == [20.0]
    monarch_nb.show(same)
    assert capsys.readouterr().out.strip() == "[0-3] tensor([1., 2.])"
    monarch_nb.show(w)
    assert capsys.readouterr().out.splitlines()[:2] == ["[0] tensor([0.])", "[1] tensor([10.])"]
    values = w.fetch().get(timeout=30)
    assert [t.item() for t in values.values()] == [0.0, 10.0, 20.0, 30.0]

    async def read():
        return await w

    assert [t.item() for t in asyncio.run(read()).values()] == [0.0, 10.0, 20.0, 30.0]


# -- 3. collectives by dimension name on a 2x2 mesh --------------------------------------


def test_collectives_along_named_dimensions(grid):
    v = rank_values(grid)  # rank (dp=i, tp=j) holds 2i + j
    with grid.activate():
        by_tp = v.reduce("tp", "sum")
        by_dp = v.reduce("dp")
        mean = v.reduce(("dp", "tp"), "avg")
        top = v.reduce("tp", "max")
        gathered = v.all_gather("dp")
        scattered = torch.cat([v, v * 10]).reduce_scatter("tp")
        from_tp1 = v.broadcast("tp", src=1)
        inplace = v.clone()
        assert inplace.reduce_("dp", "sum") is inplace
    assert tuple(gathered.shape) == (2, 1)
    assert tuple(scattered.shape) == (1,)

    def at(t):
        return [monarch_nb.inspect(t, dp=i, tp=j).tolist() for i in range(2) for j in range(2)]

    assert at(by_tp) == [[1.0], [1.0], [5.0], [5.0]]
    assert at(by_dp) == [[2.0], [4.0], [2.0], [4.0]]
    assert at(mean) == [[1.5]] * 4
    assert at(top) == [[1.0], [1.0], [3.0], [3.0]]
    assert at(gathered) == [[[0.0], [2.0]], [[1.0], [3.0]]] * 2
    assert at(v.reduce("dp", "stack")) == at(gathered)  # Monarch's spelling
    assert at(scattered) == [[1.0], [10.0], [5.0], [50.0]]
    assert at(from_tp1) == [[1.0], [1.0], [3.0], [3.0]]
    assert at(inplace) == at(by_dp)


def test_rename_and_bad_collectives(procs):
    workers = procs.rename(procs="workers")
    assert workers.shape.labels == ("workers",)
    v = rank_values(workers)
    assert monarch_nb.inspect(v.reduce("workers"), workers=3).tolist() == [6.0]
    with pytest.raises(MeshUsageError, match=r"dimensions \['workers'\]"):
        v.reduce("procs")
    with pytest.raises(MeshUsageError, match=r"unknown reduction 'mean'"):
        v.reduce("workers", "mean")
    with pytest.raises(MeshUsageError, match=r"divides by 4"):
        v.reduce_scatter("workers")
    w = v.detach().requires_grad_()
    with pytest.raises(MeshUsageError, match=r"not differentiable"):
        w.reduce("workers")
    with pytest.raises(MeshUsageError, match=r"sizes must multiply to 4"):
        procs.split(procs={"dp": 3, "tp": 2})


# -- 4. sharding and modules -------------------------------------------------------------


def test_distribute_and_full_tensor_round_trip(procs):
    x = torch.arange(24.0).reshape(8, 3)
    sharded = distribute(x, procs, [Shard(0)])
    replicated = distribute(x, procs, [Replicate()])
    assert tuple(sharded.shape) == (8, 3)
    assert torch.equal(monarch_nb.inspect(sharded, procs=1), x[2:4])
    assert torch.equal(monarch_nb.inspect(replicated, procs=3), x)
    assert torch.equal(sharded.full_tensor(), x)
    assert torch.equal((sharded * 2 + replicated).full_tensor(), 3 * x)  # DTensor ops on ranks
    assert torch.equal(sharded.to_local().sum(0).reduce("procs").fetch().get()[0], x.sum(0))
    with pytest.raises(MeshUsageError, match=r"full_tensor\(\) is for tensors sharded"):
        (sharded.to_local() + 1).full_tensor()
    with pytest.raises(MeshUsageError, match=r"one entry per mesh dimension"):
        distribute(x, procs, [Shard(0), Shard(1)])


def _ddp_step(model, x, y, procs=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    if procs is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.grad.reduce_("procs", "avg")
    opt.step()
    return loss


def test_module_to_mesh_ddp_step_matches_a_local_step(procs):
    torch.manual_seed(0)
    local = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    remote = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    remote.load_state_dict(local.state_dict())
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    assert module_to_mesh(remote, procs) is remote
    assert all(
        isinstance(p, MeshTensor) and isinstance(p, nn.Parameter) for p in remote.parameters()
    )
    # Each rank trains on its quarter of the batch; the averaged gradients are the
    # gradients of the whole batch.
    xs = distribute(x, procs, [Shard(0)]).to_local()
    ys = distribute(y, procs, [Shard(0)]).to_local()
    _ddp_step(remote, xs, ys, procs)
    _ddp_step(local, x, y)
    for (name, p), q in zip(remote.named_parameters(), local.parameters(), strict=True):
        for rank in range(4):
            assert torch.allclose(monarch_nb.inspect(p, procs=rank), q.detach(), atol=1e-6), name


def test_module_to_mesh_with_placements_trains_with_dtensor_semantics(procs):
    torch.manual_seed(1)
    local, remote = nn.Linear(3, 1), nn.Linear(3, 1)
    remote.load_state_dict(local.state_dict())
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    module_to_mesh(remote, procs, [Replicate()])  # DTensor parameters on the ranks
    xs, ys = distribute(x, procs, [Shard(0)]), distribute(y, procs, [Shard(0)])
    _ddp_step(remote, xs, ys)  # no explicit reduce: DTensor turns partial grads whole
    _ddp_step(local, x, y)
    assert torch.allclose(remote.weight.full_tensor(), local.weight.detach(), atol=1e-6)
    assert torch.allclose(monarch_nb.inspect(remote.bias, procs=3), local.bias.detach())


def test_modules_and_optimizers_made_inside_activate_live_on_the_ranks(procs):
    manual_seed(7, procs)  # ranks start with different seeds
    with procs.activate():
        model = nn.Linear(3, 2)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        x = torch.randn(5, 3)
        loss = model(x).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert isinstance(model.weight, MeshTensor)
    assert model.weight.grad is None
    weights = model.weight.fetch().get(timeout=30).values()
    assert all(torch.equal(w, weights[0]) for w in weights)
    torch.manual_seed(7)
    twin = nn.Linear(3, 2)
    assert not torch.equal(weights[0], twin.weight.detach())  # it took a step


# -- 5. pipelining between slices: bytes over the data plane -----------------------------


def test_to_mesh_moves_bytes_rank_to_rank_not_through_the_controller(procs):
    stages = procs.split(procs={"stage": 2, "dp": 2})
    first, second = stages.slice(stage=0), stages.slice(stage=1)
    with first.activate():
        x = torch.rand(1 << 20)  # 4 MiB per rank
        checksum = x.sum()
    stats = procs._group.controller.stats
    before = stats.bytes_in_band + stats.bytes_out_of_band
    y = x.to_mesh(second)
    with second.activate():
        moved = y.sum()
    assert monarch_nb.inspect(moved, dp=1).item() == monarch_nb.inspect(checksum, dp=1).item()
    assert stats.bytes_in_band + stats.bytes_out_of_band - before < 64 * 1024
    assert torch.equal(monarch_nb.inspect(y, dp=0), monarch_nb.inspect(x, dp=0))
    with pytest.raises(MeshUsageError, match=r"mixes tensors on different meshes.*to_mesh"):
        x + y
    with pytest.raises(MeshUsageError, match=r"has 2 and .* has 4"):
        x.to_mesh(procs)
    with pytest.raises(MeshUsageError, match=r"to_mesh\(\) is not differentiable"):
        x.detach().requires_grad_().to_mesh(second)


# -- 6. errors on ranks: deferred, named, and the mesh stays up --------------------------


def test_a_failed_op_is_reported_where_a_dependent_value_is_read(procs):
    with procs.activate():
        a = -torch.eye(3)
        picked = a[torch.tensor([5])]  # fails on the ranks: index out of range
        dependent = picked @ a + 1
        line = _line_after("fails on the ranks")
        with pytest.raises(RuntimeError, match=r"same reduction dim"):  # checked here, at once
            a @ torch.ones(4, 2)
    for t in (dependent, picked):
        with pytest.raises(MeshTensorError, match=r"aten.index.*failed on rank\(s\) 0-3") as info:
            monarch_nb.inspect(t, procs=2)
        assert info.value.source.endswith(f"test_tensor_engine.py:{line}")
        assert info.value.ranks == (0, 1, 2, 3)
        assert f"test_tensor_engine.py:{line}" in str(info.value)
        assert "out of bounds" in str(info.value)
    assert monarch_nb.inspect(a * 2, procs=0)[0, 0].item() == -2.0  # later ops work
    assert procs.state == "running"


def test_a_failed_check_without_outputs_is_reported_at_the_next_read(procs):
    with procs.activate():
        torch.linalg.cholesky(-torch.eye(2))  # its error check fails; it has no output
        line = _line_after("its error check fails")
        fine = torch.ones(1)
    with pytest.raises(MeshTensorError, match=r"linalg_check_errors.*failed on rank\(s\) 0-3"):
        fine.fetch().get(timeout=30)
    assert [t.item() for t in fine.fetch().get(timeout=30).values()] == [1.0] * 4
    assert line > 0


def test_a_failure_on_some_ranks_reaches_collectives_without_a_hang(procs):
    v = rank_values(procs)
    with procs.activate():
        picked = torch.ones(2)[v.long()]  # out of range on ranks 2 and 3 only
        huge = torch.empty(1 << 45)  # no rank can allocate it
        total = picked.reduce("procs")  # the failure flag rides with the data
        gathered = picked.all_gather("procs")  # the flag is a collective of its own
    with pytest.raises(MeshTensorError, match=r"index.*failed on rank\(s\) 2-3"):
        monarch_nb.inspect(picked, procs=0)
    for t in (total, gathered):
        with pytest.raises(MeshTensorError, match=r"index.*rank\(s\) [23]:") as info:
            t.fetch().get(timeout=30)  # every rank holds the root cause, none hangs
        assert info.value.op == "aten.index.Tensor"
    with pytest.raises(MeshTensorError, match=r"empty.*failed on rank\(s\) 0-3"):
        monarch_nb.show(huge)
    assert monarch_nb.inspect(v.reduce("procs"), procs=1).tolist() == [6.0]


def test_consecutive_in_place_reductions_share_one_collective(procs):
    # A loop of p.grad.reduce_(...) is fused on the ranks into one flat all-reduce
    # (as DDP buckets gradients): the values are those of separate reductions,
    # and a failure on some ranks still reaches every fused tensor, without a hang.
    v = rank_values(procs)  # rank r holds r
    fused_before = engine_for(procs).stats()[0]["fused"]
    with procs.activate():
        a = torch.ones(2, 3) * v
        b = torch.ones(5) * (v + 1)
        c = torch.ones(1) * 7 + v * 0
        for t in (a, b, c):
            t.reduce_("procs", "avg")
    assert monarch_nb.inspect(a, procs=3).tolist() == [[1.5] * 3] * 2
    assert monarch_nb.inspect(b, procs=0).tolist() == [2.5] * 5
    assert monarch_nb.inspect(c, procs=1).tolist() == [7.0]
    assert engine_for(procs).stats()[0]["fused"] == fused_before + 2  # three as one
    with procs.activate():
        good = torch.ones(3) * v
        bad = torch.ones(2)[v.long()]  # fails on ranks 2 and 3 only
        for t in (good, bad):
            t.reduce_("procs", "sum")
    for t in (good, bad):
        with pytest.raises(MeshTensorError, match=r"index.*rank\(s\) [23]"):
            t.fetch().get(timeout=30)
    assert monarch_nb.inspect(v.reduce("procs"), procs=2).tolist() == [6.0]


# -- 7. memory on the ranks stays bounded ------------------------------------------------


def test_dropped_tensors_are_freed_on_the_ranks_over_10000_steps(procs):
    from monarch_nb.tensor._engine import FLUSH_EVERY

    two = procs.slice(procs=slice(0, 2))
    with two.activate():
        x = torch.zeros(4)
        for _ in range(10_000):
            x = x * 0.5 + 1.0
    assert torch.allclose(monarch_nb.inspect(x, procs=1), torch.full((4,), 2.0))
    counts = ref_counts(procs).values()
    assert max(counts) < FLUSH_EVERY + 64, counts
    del x
    assert max(ref_counts(procs).values()) < FLUSH_EVERY + 64
