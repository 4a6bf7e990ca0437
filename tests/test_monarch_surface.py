"""Monarch's import paths (monarch_nb.actor, monarch_nb.rdma) and a program written for Monarch."""

import subprocess
import sys
import textwrap

import pytest

import monarch_nb
import monarch_nb.actor
import monarch_nb.rdma


def test_monarch_actor_names_resolve_to_ours():
    actor = monarch_nb.actor
    assert actor.__all__ == sorted(actor.__all__)
    for name in actor.__all__:
        assert getattr(actor, name) is not None, name
    assert set(actor.__all__) <= set(dir(actor))
    for name in set(actor.__all__) - {"ActorError", "unhandled_fault_hook"}:
        assert getattr(actor, name) is getattr(monarch_nb, name), name
    assert actor.ActorError is monarch_nb.RemoteError
    with pytest.raises(AttributeError, match=r"'monarch_nb\.actor' has no attribute 'as_endpoint'"):
        _ = actor.as_endpoint
    from monarch_nb.actor import Actor, endpoint, this_host  # the lines a program starts with

    assert (Actor, endpoint, this_host) == (
        monarch_nb.Actor,
        monarch_nb.endpoint,
        monarch_nb.this_host,
    )


class Named(monarch_nb.actor.Actor):
    @monarch_nb.actor.endpoint
    def names(self) -> tuple[str, str]:
        return monarch_nb.actor.current_actor_name(), str(monarch_nb.actor.current_rank())


def test_actor_names_and_points_print_as_monarchs(procs2):
    from monarch_nb.actor import ValueMesh, current_actor_name

    assert ValueMesh[int] is ValueMesh  # a type hint, the class itself
    assert current_actor_name() == "client"  # on the controller, no actor runs
    grid = procs2.split(procs=("hosts", "gpus"), gpus=2)
    named = grid.spawn("named", Named)
    replies = named.names.call().get(timeout=60)
    assert replies.item(hosts=0, gpus=0)[1] == "{'hosts': 0/1, 'gpus': 0/2}"
    assert replies.item(hosts=0, gpus=1)[1] == "{'hosts': 0/1, 'gpus': 1/2}"
    # Each rank's actor has a name of its own.
    first, second = (name for name, _ in replies.values())
    assert first != second
    assert first.endswith("/named[0]")
    # A point of a slice prints its place in the slice (an index drops its dimension).
    assert named.slice(gpus=1).names.call_one().get(timeout=60)[1] == "{'hosts': 0/1}"


def test_unhandled_fault_hook_is_assignable_and_checked():
    from monarch_nb._controller._supervision import default_unhandled_fault_hook
    from monarch_nb.actor import unhandled_fault_hook

    assert unhandled_fault_hook is default_unhandled_fault_hook
    with pytest.raises(TypeError, match="must be a function of one MeshFailure, got 3"):
        monarch_nb.actor.unhandled_fault_hook = 3
    monarch_nb.actor.unhandled_fault_hook = print
    try:
        assert monarch_nb.actor.unhandled_fault_hook is print
    finally:
        monarch_nb.actor.unhandled_fault_hook = None
    assert monarch_nb.actor.unhandled_fault_hook is default_unhandled_fault_hook


def test_monarch_rdma_names():
    rdma = monarch_nb.rdma
    assert rdma.__all__ == sorted(rdma.__all__)
    for name in rdma.__all__:
        assert getattr(rdma, name) is not None, name
    assert rdma.RDMABuffer is monarch_nb.native.RDMABuffer
    assert issubclass(rdma.RDMAAction, rdma.RDMABatch)
    assert rdma.get_rdma_backend() == ("tcp" if rdma.native_available() else "none")
    assert rdma.is_ibverbs_available() is False
    assert rdma.is_rdma_available() is rdma.native_available()


def test_rdma_action_copies_as_monarchs_does():
    if not monarch_nb.rdma.native_available():
        pytest.fail("the native data plane is not built: python setup.py build_ext --inplace")
    from monarch_nb.rdma import RDMAAction, RDMABuffer

    remote_a, remote_b = bytearray(b"a" * 64), bytearray(64)
    buf_a, buf_b = RDMABuffer(remote_a), RDMABuffer(remote_b)
    try:
        local = bytearray(64)
        action = RDMAAction().read_remote(local, buf_a).write_remote(buf_b, bytearray(b"b" * 64))
        assert action.submit().get(timeout=30) == 128
        assert (bytes(local), bytes(remote_b)) == (b"a" * 64, b"b" * 64)
        # Submitted again, the same copies run again: fresh bytes, not stale ones.
        remote_a[:] = b"c" * 64
        local[:] = bytes(64)
        assert action.submit().get(timeout=30) == 128
        assert bytes(local) == b"c" * 64
    finally:
        buf_a.drop()
        buf_b.drop()


def test_an_actor_class_written_against_monarch_nb_actor_loads_no_controller_code():
    # A worker imports the module that defines an actor class: that must stay light.
    code = (
        "import sys\n"
        "from monarch_nb.actor import Actor, endpoint, current_rank, current_size, context\n"
        "print(sorted(m for m in sys.modules if m.startswith('monarch_nb._controller')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# A program in the style of Monarch's getting-started guide, with `monarch`
# renamed to `monarch_nb` (and `gpus` to `procs`): nothing else changed.
MONARCH_PROGRAM = """
import asyncio

import monarch_nb.actor
from monarch_nb.actor import (
    Actor, ActorError, Extent, MeshFailure, ValueMesh, current_rank, current_size,
    endpoint, shutdown_context, this_host,
)


class Counter(Actor):
    def __init__(self, initial_value: int):
        self.value = initial_value

    @endpoint
    def incr(self) -> None:
        self.value += 1

    @endpoint
    def get_value(self) -> int:
        return self.value

    @endpoint
    def where(self):
        return current_rank().rank, current_size()

    @endpoint
    def fail(self) -> None:
        raise ValueError("deliberately")


faults = []
monarch_nb.actor.unhandled_fault_hook = faults.append

procs = this_host().spawn_procs(per_host={"procs": 4})
assert isinstance(procs.extent, Extent) and procs.extent == {"procs": 4}
counters = procs.spawn("counters", Counter, 0)

counters.slice(procs=0).incr.call_one().get()
values = counters.get_value.call().get()
assert isinstance(values, ValueMesh)
assert values.item(procs=0) == 1 and values.item(procs=1) == 0
assert [v for _, v in values.items()] == [1, 0, 0, 0]
assert counters.where.call().get().item(procs=2) == (2, {"procs": 4})
try:
    counters.slice(procs=1).fail.call_one().get()
except ActorError as error:
    print("caught:", str(error).splitlines()[0])

grid = procs.split(procs=("dp", "tp"), tp=2)
print(grid.to_table())


async def main():
    await counters.incr.call()
    values = await counters.get_value.call()
    last = await counters.slice(procs=3).get_value.call_one().as_asyncio()
    return values.flatten("rank").item(rank=0), last


print("async:", asyncio.run(main()))
print("result:", counters.slice(procs=0).get_value.call_one().result(timeout=30))
counters.stop().get()

other = this_host().spawn_procs(per_host={"procs": 1})
shutdown_context().get()
print("states:", procs.state, other.state, "faults:", faults)
"""


def test_a_monarch_program_runs_after_renaming_its_imports(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(MONARCH_PROGRAM))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "caught: Counter.fail failed on rank 1: ValueError: deliberately" in lines
    assert "dp\\tp | 0 | 1" in lines
    assert "async: (2, 1)" in lines
    assert "result: 2" in lines
    assert "states: stopped stopped faults: []" in lines  # stopped on purpose: no fault


BY_VALUE_PROGRAM = """
import monarch_nb.actor
from monarch_nb.actor import Actor, ActorError, endpoint, this_host


class Ranked(Actor):  # defined in __main__: travels by value, as a notebook's class
    @endpoint
    def where(self) -> int:
        return monarch_nb.actor.current_rank().rank

    @endpoint
    def load(self) -> None:
        try:
            {}["batch-7"]
        except KeyError as e:
            raise ValueError("could not load the batch") from e


procs = this_host().spawn_procs(per_host={"procs": 2})
ranked = procs.spawn("ranked", Ranked)
print("ranks:", sorted(ranked.where.call().get(timeout=60).values()))
try:
    ranked.slice(procs=1).load.call_one().get(timeout=60)
except ActorError as e:
    print("error:", str(e))
procs.stop()
"""


def test_a_class_pickled_by_value_may_name_monarch_nb_actor_and_errors_keep_their_cause(
    tmp_path,
):
    script = tmp_path / "program.py"
    script.write_text(BY_VALUE_PROGRAM)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ranks: [0, 1]" in out.stdout
    error = out.stdout[out.stdout.index("error: ") :]
    assert error.startswith(
        "error: Ranked.load failed on rank 1: ValueError: could not load the batch\n"
    )
    # The chain, as Python prints it (and Monarch's ActorError says it).
    assert "KeyError: 'batch-7'" in error
    assert "The above exception was the direct cause of the following exception" in error


class Scorer(monarch_nb.actor.Actor):
    """An actor whose endpoints are named like mesh methods (GRPO's scorer has stop)."""

    @monarch_nb.actor.endpoint
    async def stop(self) -> str:
        return f"scorer {monarch_nb.actor.current_rank().rank} stopped"

    @monarch_nb.actor.endpoint
    async def stop_of(self, other: monarch_nb.actor.ActorMesh) -> list[str]:
        # Through a reference; awaited, so this process's own scorer answers meanwhile.
        return sorted((await other.stop.call()).values())


def test_an_endpoint_named_like_a_mesh_method_is_what_the_mesh_calls(procs2):
    scorers = procs2.spawn("scorers", Scorer)
    assert isinstance(scorers, monarch_nb.actor.ActorMesh)
    assert scorers.slice(procs=1).stop.call_one().get(timeout=60) == "scorer 1 stopped"
    assert sorted(scorers.stop.call().get(timeout=60).values()) == [
        "scorer 0 stopped",
        "scorer 1 stopped",
    ]
    helper = procs2.spawn("helper", Scorer)
    assert helper.slice(procs=0).stop_of.call_one(scorers).get(timeout=60) == [
        "scorer 0 stopped",
        "scorer 1 stopped",
    ]
    # The mesh's own stop, through its class: the actors are gone after it, and a
    # call to them raises SupervisionError, as Monarch's.
    monarch_nb.actor.ActorMesh.stop(scorers).get(timeout=60)
    with pytest.raises(monarch_nb.SupervisionError, match="stopped"):
        scorers.stop.call().get(timeout=60)
