"""Remote functions as meshes of functions: the endpoint adverbs on the active mesh,
``send()`` into a port, and ``send()``'s ``selection=`` for actor endpoints."""

from __future__ import annotations

import os

import pytest
import torch

import monarch_nb
from monarch_nb import Actor, MeshUsageError, RemoteError, ValueMesh, endpoint, remote
from monarch_nb.actor import Channel, send
from monarch_nb.tensor import MeshTensorError

pytestmark = pytest.mark.timeout(120)

# Set by `remember` on the ranks (this module is imported there by reference).
_kept: dict[str, object] = {}


@pytest.fixture(scope="module")
def procs(procs4):
    return procs4


@remote
def rank_of() -> int:
    return int(os.environ["RANK"])


@remote
def scaled(x: torch.Tensor, by: float) -> torch.Tensor:
    return x * by


@remote
def squared(x: float) -> float:
    return x * x


@remote
def boom(why: str) -> None:
    raise ValueError(f"boom: {why}")


@remote
def remember(value: object) -> None:
    _kept["value"] = value


@remote
def recall() -> object:
    return _kept.get("value")


class Counter(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def bump(self, by: int) -> int:
        self.n += by
        return monarch_nb.current_rank().rank

    @endpoint
    def count(self) -> int:
        return self.n


def received(receiver, n: int) -> list:
    return [receiver.recv().get(timeout=60) for _ in range(n)]


# -- the adverbs, inside activate() -----------------------------------------------------


def test_call_gives_each_ranks_value_as_a_value_mesh_of_the_active_mesh(procs):
    with procs.activate():
        got = rank_of.call().get(timeout=60)
    assert isinstance(got, ValueMesh)
    assert got.extent == procs.extent
    assert got.values() == [0, 1, 2, 3]
    grid = procs.split(procs={"dp": 2, "tp": 2})
    with grid.activate():
        assert rank_of.call().get(timeout=60).item(dp=1, tp=0) == 2


def test_call_runs_on_each_ranks_own_tensors_after_the_ops_before_it(procs):
    with procs.activate():
        x = torch.ones(3)
        x.add_(1)  # issued before the call: the call sees it
        got = scaled.call(x, 3.0).get(timeout=60)
    assert [t.tolist() for t in got.values()] == [[6.0, 6.0, 6.0]] * 4


def test_call_one_on_a_one_point_mesh_and_its_error_on_more(procs):
    with procs.slice(procs=2).activate():
        assert rank_of.call_one().get(timeout=60) == 2
    with (
        procs.activate(),
        pytest.raises(MeshUsageError, match=r"activate one point: with procs.slice\(procs=0\)"),
    ):
        rank_of.call_one().get(timeout=60)


def test_stream_yields_each_ranks_point_and_value(procs):
    with procs.slice(procs=slice(1, 3)).activate():
        items = list(rank_of.stream())
    assert sorted((point["procs"], value) for point, value in items) == [(0, 1), (1, 2)]


def test_choose_and_map_spread_over_the_ranks(procs):
    with procs.activate():
        chosen = {rank_of.choose().get(timeout=60) for _ in range(8)}
        mapped = squared.map(range(5)).get(timeout=60)
    assert chosen == {0, 1, 2, 3}
    assert mapped == [0, 1, 4, 9, 16]


def test_broadcast_runs_everywhere_without_waiting(procs):
    with procs.activate():
        assert remember.broadcast("kept") is None
        assert recall.call().get(timeout=60).values() == ["kept"] * 4


def test_a_failed_broadcast_is_raised_by_the_next_call_and_the_mesh_stays_usable(procs):
    with procs.slice(procs=1).activate():
        boom.broadcast("late")
        with pytest.raises(RemoteError, match=r"rank 1: RuntimeError: boom issued at .*: late"):
            recall.call().get(timeout=60)
        assert rank_of.call_one().get(timeout=60) == 1


def test_an_error_in_the_function_names_it_and_the_ranks(procs):
    with (
        procs.activate(),
        pytest.raises(RemoteError, match=r"remote function boom failed on ranks 0-3: ValueError"),
    ):
        boom.call("now").get(timeout=60)


def test_a_function_defined_here_travels_by_value(procs):
    offset = 10

    @remote
    def shifted() -> int:
        return int(os.environ["RANK"]) + offset

    with procs.activate():
        assert shifted.call().get(timeout=60).values() == [10, 11, 12, 13]
    # A module's own travels by reference: `remember` and `recall` share its globals.
    assert rank_of._target() == f"{__name__}:rank_of"
    assert shifted._target() is shifted.fn


def test_a_failed_input_tensor_fails_the_call_with_its_root_cause(procs):
    with procs.activate():
        bad = monarch_nb.remote(lambda t: t.reshape(7), propagate=lambda t: t)(torch.ones(3))
        with pytest.raises(
            RemoteError,
            match=r"on ranks 0-3: RuntimeError: .* issued at .*shape '\[7\]' is invalid",
        ):
            scaled.call(bad, 2.0).get(timeout=60)


# -- outside activate() ------------------------------------------------------------------


def test_adverbs_outside_activate_say_to_activate_a_mesh(procs):
    hint = r"none is active; call it inside `with procs.activate\(\):`"
    with pytest.raises(MeshUsageError, match=hint):
        rank_of.call()
    with pytest.raises(MeshUsageError, match=hint):
        rank_of.broadcast()
    port, _ = Channel.open()
    with pytest.raises(MeshUsageError, match=hint):
        send(rank_of, (), {}, port=port)
    with monarch_nb.no_mesh.activate(), pytest.raises(MeshUsageError, match=hint):
        rank_of.call_one()


def test_tensors_of_another_mesh_are_refused(procs):
    with procs.slice(procs=0).activate():
        x = torch.ones(2)
    with (
        procs.activate(),
        pytest.raises(MeshUsageError, match=r"activate the tensors' mesh"),
    ):
        scaled.call(x, 2.0)


# -- send() ------------------------------------------------------------------------------


def test_send_delivers_each_ranks_result_to_the_port(procs):
    port, receiver = Channel.open()
    with procs.activate():
        send(rank_of, args=(), kwargs={}, port=port)
    assert sorted(received(receiver, 4)) == [0, 1, 2, 3]
    with procs.activate():
        send(rank_of, (), {}, port=port, selection="choose")
    assert received(receiver, 1)[0] in {0, 1, 2, 3}


def test_send_delivers_a_ranks_error_to_the_port(procs):
    port, receiver = Channel.open()
    with procs.slice(procs=3).activate():
        send(boom, ("sent",), {}, port=port)
    with pytest.raises(RemoteError, match=r"remote function boom failed on rank 3"):
        receiver.recv().get(timeout=60)


def test_send_to_an_endpoint_with_a_selection(procs):
    counters = procs.spawn("send_counters", Counter)
    try:
        port, receiver = Channel.open()
        send(counters.bump, (1,), {}, port=port, selection="all")
        assert sorted(received(receiver, 4)) == [0, 1, 2, 3]
        send(counters.bump, (10,), {}, port=port, selection="choose")
        chosen = received(receiver, 1)[0]
        send(counters.bump, (100,), {}, selection="choose")  # no port: one actor, not waited
        send(counters.bump, (1000,), {})  # no port, "all": a broadcast
        counts = counters.count.call().get(timeout=60).values()
        assert sum(counts) == 4 * 1 + 10 + 100 + 4 * 1000
        assert counts[chosen] >= 1011
        with pytest.raises(MeshUsageError, match=r'selection=\'some\'\): use "all" or "choose"'):
            send(counters.bump, (1,), {}, port=port, selection="some")  # type: ignore[arg-type]
    finally:
        counters.stop().get(timeout=60)


def test_monarch_names_for_remote_and_send():
    import monarch_nb.actor

    assert monarch_nb.actor.send is send
    assert isinstance(rank_of, monarch_nb.tensor.Remote)
    assert issubclass(MeshTensorError, RemoteError)
