"""Monarch's tensor-engine idioms on real ranks (gloo on CPU): one 4-rank mesh shared."""

import pytest
import torch

import monarch_nb
from monarch_nb import MeshTensor, distribute
from monarch_nb.tensor import Shard, manual_seed
from monarch_nb.tensor._engine import engine_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def procs(procs4):
    return procs4


def rank_values(mesh):
    """A mesh tensor of shape (1,) holding each rank's index in ``mesh`` (a float)."""
    sizes = mesh.shape.sizes
    value = torch.arange(float(len(mesh.shape))).reshape(sizes)
    local = distribute(value, mesh, [Shard(i) for i in range(len(sizes))]).to_local()
    return local.reshape(1)


# -- to_local() / to_mesh() inside activate() ---------------------------------------------


def test_to_local_inside_activate_mixes_with_factories(procs):
    x = distribute(torch.arange(32.0), procs, [Shard(0)])
    with procs.activate():
        y = x.to_local() + torch.ones(8)
        z = y.to_mesh(procs.slice(procs=slice(0, 4))) * 2
    assert type(y._mt_meta) is torch.Tensor
    assert monarch_nb.inspect(y, procs=1).tolist() == [float(v) for v in range(9, 17)]
    assert monarch_nb.inspect(z, procs=3).tolist() == [2.0 * v for v in range(25, 33)]


def test_ranks_draw_different_values_until_seeded_alike(procs):
    with procs.activate():
        before = torch.rand(4)
    first = before.fetch().get(timeout=60).values()
    assert not all(torch.equal(first[0], v) for v in first[1:])
    manual_seed(3, procs)
    with procs.activate():
        after = torch.rand(4)
    values = after.fetch().get(timeout=60).values()
    assert all(torch.equal(values[0], v) for v in values[1:])
    assert isinstance(after, MeshTensor)


# -- reading values: fetch_shard, inspect, show ------------------------------------------


def test_fetch_shard_reads_one_rank_of_a_pytree(procs):
    v = rank_values(procs)
    with procs.activate():
        w = v * 10
    got = monarch_nb.fetch_shard({"v": v, "w": [w], "note": "kept"}, procs=2).get(timeout=60)
    assert got["v"].tolist() == [2.0]
    assert got["w"][0].tolist() == [20.0]
    assert got["note"] == "kept"
    assert monarch_nb.fetch_shard(w, {"procs": 3}).get(timeout=60).tolist() == [30.0]
    from monarch_nb.fetch import fetch_shard, inspect

    assert fetch_shard is monarch_nb.fetch_shard
    assert inspect(w).tolist() == [0.0]  # no coordinates: rank 0, as Monarch's inspect


def test_inspect_without_coordinates_on_a_2d_mesh_reads_coordinate_zero(procs):
    grid = procs.split(procs={"dp": 2, "tp": 2})
    v = rank_values(grid)
    assert monarch_nb.inspect(v).tolist() == [0.0]
    assert monarch_nb.inspect(v, dp=1, tp=0).tolist() == [2.0]
    with pytest.raises(monarch_nb.MeshUsageError, match=r"name a coordinate for \['tp'\]"):
        monarch_nb.inspect(v, dp=1)


def test_show_one_shard_or_every_rank_folded(procs, capsys):
    v = rank_values(procs)
    monarch_nb.show(v, procs=1)
    assert capsys.readouterr().out.strip() == "[1] tensor([1.])"
    monarch_nb.show(v * 0)
    assert capsys.readouterr().out.strip() == "[0-3] tensor([0.])"


# -- functions on ranks: @remote, call_on_shard_and_fetch, no_mesh, get_active_mesh ------


@monarch_nb.remote
def top_values(x, k):
    return x.topk(k).values


@monarch_nb.remote(propagate=lambda x: x)
def clip_(x):
    return x.clamp_(0.0, 1.5)


@monarch_nb.remote(propagate=lambda x: (x.sum(), x.abs()))
def sum_and_abs(x):
    return x.sum(), x.abs()


def rank_and_world(x):
    import torch.distributed as dist

    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "x": x * 2}


def test_remote_functions_run_on_every_rank_with_shapes_known_here(procs):
    v = rank_values(procs)
    controller = procs._group.controller
    monarch_nb.inspect(v)
    sent = controller.stats.sent
    with procs.activate():
        x = torch.arange(6.0) + v  # rank r: [r, r+1, ..., r+5]
        top = top_values(x, 2)  # shapes inferred on fake tensors
        total, magnitude = sum_and_abs(x - 3)  # shapes from propagate=
        clip_(x)  # in place, on the ranks
        assert controller.stats.sent == sent  # nothing sent or waited for yet
    assert isinstance(top, MeshTensor)
    assert tuple(top.shape) == (2,)
    assert (tuple(total.shape), tuple(magnitude.shape)) == ((), (6,))
    assert monarch_nb.inspect(top, procs=1).tolist() == [6.0, 5.0]
    assert monarch_nb.inspect(total, procs=2).item() == 27.0 - 18.0
    assert monarch_nb.inspect(magnitude, procs=0).tolist() == [3.0, 2.0, 1.0, 0.0, 1.0, 2.0]
    assert monarch_nb.inspect(x, procs=0).tolist() == [0.0, 1.0, 1.5, 1.5, 1.5, 1.5]


def test_call_on_shard_and_fetch_returns_any_value_from_one_rank(procs):
    v = rank_values(procs)
    got = monarch_nb.call_on_shard_and_fetch(rank_and_world, v, shard={"procs": 3})
    value = got.get(timeout=60)
    assert (value["rank"], value["world"], value["x"].tolist()) == (3, 4, [6.0])
    with procs.activate():
        first = monarch_nb.call_on_shard_and_fetch(monarch_nb.remote(rank_and_world), v)
    assert first.get(timeout=60)["rank"] == 0


def test_no_mesh_and_get_active_mesh(procs):
    with pytest.raises(ValueError, match=r"no mesh is active"):
        monarch_nb.get_active_mesh()
    half = procs.slice(procs=slice(0, 2))
    with procs.activate():
        assert monarch_nb.get_active_mesh() is procs
        with half.activate():
            assert monarch_nb.get_active_mesh() is half
            inner = torch.zeros(2)
        with monarch_nb.no_mesh.activate():
            local = torch.ones(2)
            with pytest.raises(ValueError, match=r"no mesh is active"):
                monarch_nb.get_active_mesh()
        outer = torch.zeros(3)
    assert type(local) is torch.Tensor
    assert inner.mesh is half
    assert outer.mesh is procs
    assert len(inner.fetch().get(timeout=60)) == 2


def test_remote_function_errors_say_what_to_do(procs):
    @monarch_nb.remote
    def first_rows(x):
        return x[: int(x.nonzero().shape[0])]  # Python needs a size only the ranks know

    with pytest.raises(monarch_nb.MeshUsageError, match=r"needs a mesh.*activate"):
        top_values(torch.ones(3), 1)
    with procs.activate():
        x = torch.ones(3)
        with pytest.raises(monarch_nb.MeshUsageError, match=r"first_rows.*propagate="):
            first_rows(x)
        broken = monarch_nb.remote(lambda t: t.reshape(7), propagate=lambda t: t)(x)
    with pytest.raises(monarch_nb.tensor.MeshTensorError, match=r"lambda.*reshape|shape '\[7\]'"):
        monarch_nb.inspect(broken)


def test_slice_mesh_sends_one_stage_to_the_next_with_copies_along_missing_dims(procs):
    stages = procs.split(procs={"stage": 2, "dp": 2})
    v = rank_values(stages)  # rank r holds r
    second = stages.slice(stage=1)
    moved = monarch_nb.to_mesh(monarch_nb.slice_mesh(v, stage=0), second)  # in order
    assert [t.item() for t in moved.fetch().get(timeout=60).values()] == [0.0, 1.0]
    one = v.slice_mesh(stage=0, dp=1).to_mesh(second)  # one rank's value to both
    assert [t.item() for t in one.fetch().get(timeout=60).values()] == [1.0, 1.0]
    everywhere = v.slice_mesh(stage=1).to_mesh(stages)  # copies along "stage"
    assert [t.item() for t in everywhere.fetch().get(timeout=60).values()] == [2.0, 3.0] * 2
    with pytest.raises(monarch_nb.MeshUsageError, match=r"pairs points in order"):
        v.slice_mesh(dp=0).to_mesh(procs.slice(procs=slice(0, 3)))
    assert ref_counts_pinned(procs) == [0, 0, 0, 0]


def ref_counts_pinned(procs):
    """Buffers each rank still offers to readers (none once all have read)."""
    engine = engine_for(procs)
    with procs.activate():
        torch.zeros(1)  # the next batch releases buffers that every reader is done with
    return [s["pinned"] for s in engine.stats().values()]


# -- mesh tensors meet actors -------------------------------------------------------------


class Scaler(monarch_nb.Actor):
    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.rank = monarch_nb.current_rank().rank

    @monarch_nb.endpoint
    def describe(self, t):
        return (type(t).__name__, t.tolist())

    @monarch_nb.endpoint
    def scaled(self, t):
        return {"scaled": t * self.factor, "rank": self.rank, "ones": torch.ones(2)}


class Shifter(monarch_nb.Actor):
    """An async actor (one actor's endpoints are all def or all async def)."""

    @monarch_nb.endpoint
    async def shifted(self, t, by: float):
        return t + by


def test_mesh_tensors_arrive_at_endpoints_as_each_ranks_local_tensor(procs):
    scalers = procs.spawn("scalers", Scaler, 10.0)
    v = rank_values(procs)
    with procs.activate():
        w = v * 2 + 1  # not yet sent when the call is made: it goes first
    got = scalers.describe.call(w).get(timeout=60)
    assert [value for _, value in got] == [("Tensor", [2.0 * r + 1]) for r in range(4)]
    assert scalers.slice(procs=2).describe.call_one(w).get(timeout=60) == ("Tensor", [5.0])
    with procs.activate():
        bad = torch.ones(2)[torch.tensor([7])]
    with pytest.raises(monarch_nb.SerializationError, match=r"aten.index.*failed"):
        scalers.describe.call(bad).get(timeout=60)
    elsewhere = procs.slice(procs=slice(0, 2))
    with elsewhere.activate():
        half = torch.ones(1)
    with pytest.raises(monarch_nb.SerializationError, match=r"only on the processes that hold"):
        scalers.describe.call(half).get(timeout=60)


def test_an_endpoints_local_tensors_become_a_mesh_tensor_with_rref(procs):
    scalers = procs.spawn("scalers_rref", Scaler, 3.0)
    v = rank_values(procs)
    out = scalers.scaled.rref(v)
    assert isinstance(out["scaled"], MeshTensor)
    assert out["rank"] == 0  # plain values: rank 0's
    assert [t.item() for t in out["scaled"].fetch().get(timeout=60).values()] == [0, 3, 6, 9]
    with procs.activate():
        total = (out["scaled"] + out["ones"].sum()).reduce("procs")
    assert monarch_nb.inspect(total).tolist() == [18.0 + 8.0]
    shifters = procs.spawn("shifters_rref", Shifter)
    shifted = shifters.shifted.rref(total, by=1.0)  # async endpoints too
    assert monarch_nb.inspect(shifted, procs=3).tolist() == [27.0]


class SubMeshDriver(monarch_nb.Actor):
    """An actor that starts its own 2-rank mesh and drives it with mesh tensors."""

    @monarch_nb.endpoint
    def drive(self) -> list:
        procs = monarch_nb.this_host().spawn_procs(per_host={"procs": 2})
        try:
            with procs.activate():
                x = torch.ones(3) * (monarch_nb.current_rank().rank + 2)
                total = x.reduce("procs", "sum")
            return [monarch_nb.inspect(total).tolist(), monarch_nb.get_active_stream().name]
        finally:
            procs.stop()


def test_an_actor_drives_a_sub_mesh_with_the_tensor_engine(procs):
    driver = procs.slice(procs=1).spawn("driver", SubMeshDriver)
    assert driver.drive.call_one().get(timeout=240) == [[6.0, 6.0, 6.0], "main"]


# -- autograd helpers: grad_generator, grad_function --------------------------------------


def _train(model, xs, ys, steps, overlap):
    losses = []
    params = list(reversed(list(model.parameters())))
    for _ in range(steps):
        loss = ((model(xs) - ys) ** 2).mean()
        losses.append(loss.detach())
        if overlap:  # each gradient reduced as soon as backward has it
            grads = monarch_nb.grad_generator(loss, params)
        else:
            grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                g.reduce_("procs", "avg")
                p -= 0.1 * g
    # Each rank's loss is over its own shard and may rise while the mean falls.
    means = []
    for loss in losses:
        shards = list(loss.fetch().get(timeout=60).values())
        means.append(sum(t.item() for t in shards) / len(shards))
    return means


def _ddp_problem(procs):
    """A model factory (same weights each call, on ``procs``) and a sharded batch."""
    from torch import nn

    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        return monarch_nb.module_to_mesh(model, procs)

    torch.manual_seed(1)  # the same batch whichever tests ran before
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    xs = distribute(x, procs, [Shard(0)]).to_local()
    ys = distribute(y, procs, [Shard(0)]).to_local()
    return make, xs, ys


def test_grad_generator_ddp_loop_has_the_plain_loops_losses(procs):
    make, xs, ys = _ddp_problem(procs)
    plain = _train(make(), xs, ys, 5, overlap=False)
    overlapped = _train(make(), xs, ys, 5, overlap=True)
    assert overlapped == plain
    assert plain[-1] < plain[0]


def test_grad_generator_yields_before_backward_is_done_and_grad_function(procs):
    w = [torch.ones(2, requires_grad=True) for _ in range(3)]
    loss = (w[0] * 2).sum() + (w[1] * 3).sum() * (w[2] * 4).sum()
    events = []
    w[0].register_hook(lambda g: events.append("backward reached w0"))
    for g in monarch_nb.grad_generator(loss, [w[2], w[1], w[0]]):
        events.append(g.tolist())
    assert events[0] == [24.0, 24.0]  # yielded while backward had not reached w0 yet
    assert events[1:] == [[24.0, 24.0], "backward reached w0", [2.0, 2.0]]
    assert w[0].grad is None  # nothing accumulates, as torch.autograd.grad

    @monarch_nb.grad_function
    def summed(x):
        return x.reduce("procs", "sum"), lambda g: g.reduce("procs", "sum")

    v = rank_values(procs).requires_grad_()
    with procs.activate():
        out = (summed(v) * v).sum()  # rank r: S * v_r, S = v_0 + ... + v_3 = 6
        (grad,) = torch.autograd.grad(out, [v])  # S, plus v_r's gradient summed by backward
    assert [t.item() for t in grad.fetch().get(timeout=60).values()] == [12.0] * 4


# -- streams and borrows ------------------------------------------------------------------


def _train_with_comms(model, xs, ys, steps):
    """Monarch's overlapped DDP: each gradient reduced on a comms stream while backward
    goes on; the borrow is dropped only before the parameter is updated."""
    comms = monarch_nb.Stream("comms")
    losses = []
    params = list(reversed(list(model.parameters())))
    for _ in range(steps):
        loss = ((model(xs) - ys) ** 2).mean()
        losses.append(loss.detach())
        lent = []
        for g in monarch_nb.grad_generator(loss, params):
            g_comm, borrow = comms.borrow(g, mutable=True)
            with comms.activate():
                g_comm.reduce_("procs", "avg")
            lent.append((g, borrow))
        with torch.no_grad():
            for p, (g, borrow) in zip(params, lent, strict=True):
                borrow.drop()
                p -= 0.1 * g
    # Each rank's loss is over its own shard and may rise while the mean falls.
    means = []
    for loss in losses:
        shards = list(loss.fetch().get(timeout=60).values())
        means.append(sum(t.item() for t in shards) / len(shards))
    return means


def test_a_comms_stream_ddp_loop_has_the_plain_loops_losses(procs):
    make, xs, ys = _ddp_problem(procs)
    before = [s["overlapped"] for s in engine_for(procs).stats().values()]
    assert _train_with_comms(make(), xs, ys, 5) == _train(make(), xs, ys, 5, overlap=False)
    after = [s["overlapped"] for s in engine_for(procs).stats().values()]
    assert [a - b for a, b in zip(after, before, strict=True)] == [5 * 4] * 4  # 4 grads a step


def test_streams_and_borrows_keep_their_rules(procs):
    comms = monarch_nb.Stream("comms")
    assert monarch_nb.get_active_stream().name == "main"
    v = rank_values(procs)
    with procs.activate():
        t = v * 1
        with comms.activate():
            assert monarch_nb.get_active_stream() is comms
            with pytest.raises(monarch_nb.MeshUsageError, match=r"stream 'main'.*comms.borrow"):
                t + 1
        shared, borrow = comms.borrow(t)
        with comms.activate():
            total = shared.reduce("procs")  # reads on both streams are fine
            with pytest.raises(monarch_nb.MeshUsageError, match=r"borrowed immutably"):
                shared.add_(1)
        doubled = t * 2
        with pytest.raises(monarch_nb.MeshUsageError, match=r"borrowed immutably"):
            t.mul_(2)
        borrow.drop()
        t.add_(100)  # writable again; the ranks finished the reduction first
        lent, borrow = comms.borrow(t, mutable=True)
        with pytest.raises(monarch_nb.MeshUsageError, match=r"lent mutably"):
            t + 1
        with comms.activate():
            lent.reduce_("procs", "max")
        with borrow:
            pass
        with comms.activate(), pytest.raises(monarch_nb.MeshUsageError, match=r"after its"):
            lent + 1
    assert monarch_nb.inspect(total).tolist() == [6.0]
    assert monarch_nb.inspect(doubled, procs=3).tolist() == [6.0]
    assert [v.item() for v in t.fetch().get(timeout=60).values()] == [103.0] * 4


# -- shape propagation on fake tensors ------------------------------------------------------


def test_shapes_come_from_fake_tensors_on_the_ranks_device(procs):
    with procs.activate():
        x = torch.ones(2, 3)
        with pytest.raises(monarch_nb.MeshUsageError, match=r"on meta.*keep their tensors on cpu"):
            x.to("meta")  # a device the ranks do not use: refused here, not on the ranks
        assert not isinstance(x.nonzero().shape[0], int)  # a symbol: see the tests below
        with pytest.raises(RuntimeError, match=r"same reduction dim"):
            x @ x  # checked here, at once
        y = (x @ x.T).softmax(-1).to(torch.float64)
    assert (tuple(y.shape), y.dtype) == ((2, 2), torch.float64)
    assert monarch_nb.inspect(y).tolist() == [[0.5, 0.5], [0.5, 0.5]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_ops_on_a_cpu_mesh_are_refused_on_the_controller(procs):
    with procs.activate():
        x = torch.ones(2)
        with pytest.raises(monarch_nb.MeshUsageError, match=r"on cuda.*keep their tensors on cpu"):
            x.to("cuda")


# -- sizes that depend on values: unbacked symbols, as Monarch -------------------------------


@monarch_nb.remote
def positives(x):
    return x[x > 0]  # no propagate=: its size becomes a symbol on fake tensors


def test_value_dependent_ops_give_each_rank_its_own_size(procs):
    v = rank_values(procs)
    with procs.activate():
        x = torch.arange(6.0) - v  # rank r: [-r, ..., 5 - r]
        positive = x[x > 0]  # 5 - r values on rank r
        negative = x[x < 0]  # the same op on the same shapes: a new symbol, r values
        where = torch.nonzero(x)
        kinds = torch.unique(x.clamp(-1, 1))
        total = positive.sum()
        doubled = torch.zeros(positive.shape[0] * 2)  # a size each rank works out
        scaled = (positive * 2).reshape(1, -1)
        inferred = positives(x)  # a @remote function, shapes inferred
    size = positive.shape[0]
    assert isinstance(size, torch.SymInt)
    assert str(size).startswith("u")
    assert repr(positive).startswith(f"MeshTensor(shape=({size},)")
    assert str(doubled.shape[0]) == f"2*{size}"
    assert where.shape[1] == 1
    assert total.shape == ()
    assert len({str(size), str(negative.shape[0]), str(inferred.shape[0])}) == 3  # one each
    for r in range(4):
        expected = [float(i) for i in range(1, 6 - r)]
        assert monarch_nb.inspect(positive, procs=r).tolist() == expected
        assert monarch_nb.inspect(inferred, procs=r).tolist() == expected
        assert monarch_nb.inspect(total, procs=r).item() == sum(expected)
        assert tuple(monarch_nb.inspect(doubled, procs=r).shape) == (2 * len(expected),)
        assert tuple(monarch_nb.inspect(scaled, procs=r).shape) == (1, len(expected))
        assert monarch_nb.inspect(where, procs=r).shape == (5, 1)
        assert monarch_nb.inspect(negative, procs=r).tolist() == [
            float(-i) for i in range(r, 0, -1)
        ]
    assert monarch_nb.inspect(kinds, procs=0).tolist() == [0.0, 1.0]
    assert monarch_nb.inspect(kinds, procs=2).tolist() == [-1.0, 0.0, 1.0]


def test_a_loop_over_value_dependent_sizes_keeps_each_steps_own_symbols(procs):
    v = rank_values(procs)
    steps = []
    with procs.activate():
        x = torch.arange(6.0) - v
        for threshold in range(3):  # the same ops each step; shapes cached by symbol position
            kept = x[x > threshold]
            steps.append((kept, kept * 2 + kept, (kept * kept).sum()))
    for threshold, (kept, tripled, squares) in enumerate(steps):
        assert str(tripled.shape[0]) == str(kept.shape[0])
        for r in range(4):
            expected = [float(i - r) for i in range(6) if i - r > threshold]
            assert monarch_nb.inspect(tripled, procs=r).tolist() == [3 * e for e in expected]
            assert monarch_nb.inspect(squares, procs=r).item() == sum(e * e for e in expected)
    assert len({str(kept.shape[0]) for kept, _, _ in steps}) == 3


def test_gradients_flow_through_masks_and_collectives_refuse_value_dependent_shapes(procs):
    v = rank_values(procs)
    with procs.activate():
        w = torch.ones(6, requires_grad=True)
        x = torch.arange(6.0) - v
        (w * x)[x > 0].sum().backward()  # the backward expands to a size only the ranks know
        grad = w.grad
        positive = x[x > 0]
        for collective in (lambda: positive.reduce("procs"), lambda: positive.all_gather("procs")):
            with pytest.raises(
                monarch_nb.MeshUsageError, match=r"needs the same shape on every rank.*\(u\d+,\)"
            ):
                collective()
        with pytest.raises(monarch_nb.MeshUsageError, match=r"to_mesh\(\) needs the same shape"):
            positive.slice_mesh(procs=0).to_mesh(procs.slice(procs=1))
        with pytest.raises(RuntimeError, match=r"data-dependent"):
            int(positive.shape[0])  # Python code needs the value: torch says so
    for r in range(4):
        values = [float(i - r) for i in range(6)]
        assert monarch_nb.inspect(grad, procs=r).tolist() == [max(x, 0.0) for x in values]
