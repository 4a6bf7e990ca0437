"""The tensor engine driven from inside actors, and ``rref`` with ``propagate=``.

Monarch's ``grpo_actor_te.py`` pattern: an actor activates the process mesh it
runs on (``context().actor_instance.proc_mesh``) in ``__init__`` and in an async
endpoint, and awaits ``fetch_shard`` there. Also a mesh the actor was handed
as an argument, remote functions with adverbs inside the actor, and an
endpoint's ``propagate=`` building an ``rref`` result without asking a rank.
"""

import pytest
import torch

import monarch_nb
from monarch_nb import Actor, MeshTensor, endpoint, fetch_shard, inspect, remote
from monarch_nb.actor import context
from monarch_nb.tensor import MeshTensorError

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def procs():
    procs = monarch_nb.this_host().spawn_procs(per_host={"procs": 2})
    yield procs
    procs.stop().get(timeout=60)


@remote
def doubled(t):
    return t * 2


class _Driving(Actor):
    """Activates the mesh it runs on, as Monarch's GRPOTrainer does."""

    def __init__(self) -> None:
        self.procs = context().actor_instance.proc_mesh
        with self.procs.activate():
            self.w = torch.ones(3)


class SelfDriver(_Driving):
    @endpoint
    async def step(self) -> list:
        with self.procs.activate():
            self.w = self.w + 1
            value = await fetch_shard(doubled(self.w))  # awaited inside activate()
        return value.tolist()


class SyncSelfDriver(_Driving):
    """The same from a sync endpoint (an actor's endpoints are all def or all async def)."""

    @endpoint
    def sync_step(self) -> list:
        with self.procs.activate():
            self.w = self.w * 3
            # A remote function's adverb, from inside the actor.
            calls = doubled.call(self.w).get(timeout=60)
            return [inspect(self.w).tolist(), [t.tolist() for t in calls.values()]]


def test_an_actor_activates_the_mesh_it_runs_on(procs):
    driver = procs.slice(procs=0).spawn("self_driver", SelfDriver)
    assert driver.step.call_one().get(timeout=120) == [4.0, 4.0, 4.0]
    assert driver.step.call_one().get(timeout=120) == [6.0, 6.0, 6.0]
    # The whole mesh the actor runs in (both ranks), though it was spawned on one.
    sync_driver = procs.slice(procs=0).spawn("sync_self_driver", SyncSelfDriver)
    assert sync_driver.sync_step.call_one().get(timeout=120) == [[3.0] * 3, [[6.0] * 3] * 2]


class Reducer(Actor):
    """Drives a mesh it was handed (a reference): a collective across its ranks."""

    def __init__(self, procs) -> None:
        self.procs = procs

    @endpoint
    def total(self) -> list:
        with self.procs.activate():
            x = torch.arange(4.0) + 1
            return inspect(x.reduce("procs", "sum"), procs=1).tolist()


def test_an_actor_drives_a_mesh_it_was_handed(procs):
    other = monarch_nb.this_host().spawn_procs(per_host={"procs": 1})
    try:
        reducer = other.spawn("reducer", Reducer, procs)
        assert reducer.total.call_one().get(timeout=120) == [2.0, 4.0, 6.0, 8.0]
    finally:
        other.stop().get(timeout=60)


class Scaler(Actor):
    def __init__(self) -> None:
        self.calls = 0

    @endpoint(propagate=lambda t: {"out": t.float() * 0, "n": 0})
    def scaled(self, t: torch.Tensor) -> dict:
        self.calls += 1
        return {"out": t.float() * 10, "n": self.calls}

    @endpoint(propagate=lambda t: t)
    def broken(self, t: torch.Tensor) -> torch.Tensor:
        raise ValueError("broken on purpose")

    @endpoint(propagate=lambda t: t)
    def two_tensors(self, t: torch.Tensor) -> tuple:
        return t, t

    @endpoint
    def unpropagated(self, t: torch.Tensor) -> torch.Tensor:
        raise ValueError("fails at the call")

    @endpoint
    def count(self) -> int:
        return self.calls


def test_rref_with_propagate_builds_the_result_without_a_rank(procs):
    scalers = procs.spawn("scalers_prop", Scaler)
    with procs.activate():
        x = torch.arange(3)
    out = scalers.scaled.rref(x)
    assert isinstance(out["out"], MeshTensor)
    assert out["out"].dtype == torch.float32
    assert tuple(out["out"].shape) == (3,)
    assert out["n"] == 0  # a plain value from the propagate function, not from a rank
    assert inspect(out["out"], procs=1).tolist() == [0.0, 10.0, 20.0]
    assert scalers.count.call().get(timeout=60).values() == [1, 1]


def test_an_error_with_propagate_surfaces_where_the_value_is_used(procs):
    scalers = procs.spawn("scalers_err", Scaler)
    with procs.activate():
        x = torch.ones(2)
    bad = scalers.broken.rref(x)  # no round trip: nothing raises yet
    with procs.activate():
        later = bad + 1
    with pytest.raises(MeshTensorError, match="broken on purpose"):
        inspect(later)
    mismatch = scalers.two_tensors.rref(x)
    with pytest.raises(MeshTensorError, match="make its propagate= match"):
        inspect(mismatch)
    with pytest.raises(MeshTensorError, match="fails at the call"):
        scalers.unpropagated.rref(x)  # without propagate=: the first rank is asked


def test_a_propagate_function_that_fails_names_the_endpoint(procs):
    class Bad(Actor):
        @endpoint(propagate=lambda t: t.reshape(7))
        def f(self, t):
            return t

    actors = procs.spawn("bad_prop", Bad)
    with procs.activate():
        x = torch.ones(2)
    with pytest.raises(monarch_nb.MeshUsageError, match=r"Bad\.f\.rref\(\).*propagate"):
        actors.f.rref(x)
