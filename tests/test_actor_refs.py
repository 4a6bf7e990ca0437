"""Actors that talk to actors: references travel, calls go process to process."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import time
from dataclasses import dataclass

import pytest

from monarch_nb import (
    Actor,
    CallTimeout,
    EndpointError,
    MeshFailure,
    RemoteError,
    SpawnError,
    ValueMesh,
    context,
    current_rank,
    current_size,
    endpoint,
    this_host,
)
from monarch_nb._model._shape import Shape
from monarch_nb._runtime import _refs
from monarch_nb._runtime._peer_mesh import rebuild_actors


class Leaf(Actor):
    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    def who(self, x: int) -> tuple[int, int, int]:
        return current_rank().rank, os.getpid(), x

    @endpoint
    def record(self, x: int) -> None:
        self.seen.append(x)

    @endpoint
    def history(self) -> list[int]:
        return self.seen

    @endpoint
    def boom(self) -> None:
        raise ValueError("leaf exploded")

    @endpoint
    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slept"

    @endpoint
    def where(self) -> tuple[dict, dict]:
        return dict(context().message_rank), current_size()


@dataclass
class Holder:
    """A reference inside a dataclass inside a container must travel too."""

    meshes: list


class Relay(Actor):
    """Holds a reference to another mesh and calls it with every adverb."""

    def __init__(self, target) -> None:
        self.target = target

    @endpoint
    def call_all(self, x: int) -> list:
        return sorted(self.target.who.call(x).get(timeout=60).values())

    @endpoint
    def call_one(self, rank: int, x: int):
        return self.target.slice(procs=rank).who.call_one(x).get(timeout=60)

    @endpoint
    def choose(self, x: int):
        return self.target.who.choose(x).get(timeout=60)

    @endpoint
    def stream(self, x: int) -> list:
        return sorted(value for _, value in self.target.who.stream(x))

    @endpoint
    def map(self, n: int) -> list:
        return self.target.who.map(range(n)).get(timeout=60)

    @endpoint
    def broadcast_in_order(self, n: int) -> None:
        one = self.target.slice(procs=0)
        for i in range(n):
            one.record.broadcast(i)

    @endpoint
    def history(self) -> list[int]:
        return self.target.slice(procs=0).history.call_one().get(timeout=60)

    @endpoint
    def boom(self) -> None:
        self.target.slice(procs=0).boom.call_one().get(timeout=60)

    @endpoint
    def sleep_on(self, rank: int, seconds: float, timeout: float | None = None) -> str:
        return self.target.slice(procs=rank).sleep.call_one(seconds).get(timeout=timeout)

    @endpoint
    def where(self) -> list:
        return sorted(map(str, self.target.slice(procs=slice(1, 3)).where.call().get().values()))

    @endpoint
    def give_back(self):
        return self.target

    @endpoint
    def bound_endpoint(self):
        return self.target.who


class AsyncRelay(Actor):
    """Relay's awaiting adverbs (one actor's endpoints are all def or all async def)."""

    def __init__(self, target) -> None:
        self.target = target

    @endpoint
    async def call_one_async(self, rank: int, x: int):
        return await self.target.slice(procs=rank).who.call_one(x)

    @endpoint
    async def stream_async(self, x: int) -> list:
        return sorted([value async for _, value in self.target.who.stream(x)])


class Hop(Actor):
    """The second hop: gets a reference from an actor that got it from the controller."""

    @endpoint
    def via(self, holder: Holder, x: int):
        (mesh,) = holder.meshes
        return sorted(mesh.who.call(x).get(timeout=60).values())

    @endpoint
    def call_endpoint(self, ep, x: int):
        return sorted(ep.call(x).get(timeout=60).values())


class Spawner(Actor):
    """Spawns actors on a process mesh it was given, and calls them."""

    @endpoint
    def spawn_leaves(self, procs) -> list:
        leaves = procs.spawn("spawned_leaves", Leaf)
        return sorted(v for v in leaves.who.call(7).get(timeout=60).values())

    @endpoint
    def spawn_failing(self, procs) -> str:
        try:
            procs.spawn("bad", BadInit).initialized.get(timeout=60)
        except SpawnError as exc:
            return str(exc)
        return "no error"


class BadInit(Actor):
    def __init__(self) -> None:
        raise RuntimeError("cannot start")


@pytest.fixture(scope="module")
def leaves(procs4):
    return procs4.spawn("leaves", Leaf)


@pytest.fixture(scope="module")
def relays(procs4, leaves):
    return procs4.spawn("relays", Relay, leaves)


def test_an_actor_calls_a_mesh_it_was_given_with_every_adverb(procs4, relays, leaves):
    pids = procs4.pids
    one = relays.slice(procs=1)
    assert one.call_all.call_one(5).get(timeout=60) == [(r, pids[r], 5) for r in range(4)]
    assert one.call_one.call_one(2, 6).get(timeout=60) == (2, pids[2], 6)
    awaiting = procs4.slice(procs=1).spawn("async_relay", AsyncRelay, leaves)
    assert awaiting.call_one_async.call_one(3, 7).get(timeout=60) == (3, pids[3], 7)
    assert one.choose.call_one(8).get(timeout=60)[2] == 8
    assert one.stream.call_one(9).get(timeout=60) == [(r, pids[r], 9) for r in range(4)]
    assert awaiting.stream_async.call_one(10).get(timeout=60) == [
        (r, pids[r], 10) for r in range(4)
    ]
    mapped = one.map.call_one(12).get(timeout=60)
    assert [x for _, _, x in mapped] == list(range(12))  # in input order
    assert {(r, pid) for r, pid, _ in mapped} <= {(r, pids[r]) for r in range(4)}


def test_actors_of_one_process_call_each_other_without_deadlock(relays):
    # Every relay calls every leaf, its own process's included, all at once.
    values = relays.call_all.call(1).get(timeout=60)
    assert len({tuple(v) for v in values.values()}) == 1


def test_messages_from_one_sender_arrive_in_order(relays):
    one = relays.slice(procs=2)
    one.broadcast_in_order.call_one(200).get(timeout=60)
    seen = one.history.call_one().get(timeout=60)
    assert seen[-200:] == list(range(200))


def test_a_reference_passes_through_two_hops_inside_a_dataclass(procs4, leaves):
    hops = procs4.spawn("hops", Hop)
    relay = procs4.slice(procs=3).spawn("hop_relay", Relay, Holder([leaves]))
    # controller -> relay (holds a Holder) -> returns it -> hop calls the mesh in it
    holder = relay.give_back.call_one().get(timeout=60)
    assert isinstance(holder, Holder)
    got = hops.slice(procs=0).via.call_one(holder, 11).get(timeout=60)
    assert [v[2] for v in got] == [11] * 4


def test_a_bound_endpoint_is_a_value(procs4, relays):
    hops = procs4.slice(procs=1).spawn("hops2", Hop)
    leaves_who = relays.slice(procs=0).bound_endpoint.call_one().get(timeout=60)
    got = hops.call_endpoint.call_one(leaves_who, 12).get(timeout=60)
    assert [v[2] for v in got] == [12] * 4


def test_a_reference_returned_to_the_controller_is_the_controllers_own_mesh(leaves, relays):
    back = relays.slice(procs=0).give_back.call_one().get(timeout=60)
    assert type(back) is type(leaves)
    assert back.who.call(1).get(timeout=60) == leaves.who.call(1).get(timeout=60)


def test_an_actor_spawns_on_a_process_mesh_it_was_given(procs4):
    spawner = procs4.slice(procs=0).spawn("spawner", Spawner)
    got = spawner.spawn_leaves.call_one(procs4.slice(procs=slice(2, 4))).get(timeout=60)
    assert [(v[0], v[2]) for v in got] == [(2, 7), (3, 7)]
    message = spawner.spawn_failing.call_one(procs4.slice(procs=1)).get(timeout=60)
    assert "cannot start" in message


def test_a_remote_error_from_a_nested_call_names_both_actors(relays):
    with pytest.raises(RemoteError) as info:
        relays.slice(procs=1).boom.call_one().get(timeout=60)
    text = str(info.value)
    assert "Relay.boom" in text
    assert "Leaf.boom" in text
    assert "leaf exploded" in text
    # The chain: the relay's own lines, then the leaf's, without our waiting frames.
    rendered = info.value.render()
    assert "self.target.slice(procs=0).boom.call_one()" in rendered
    assert 'raise ValueError("leaf exploded")' in rendered
    assert rendered.index("Relay.boom") < rendered.index("Leaf.boom was called from here")
    assert "_pending.py" not in rendered


def test_message_rank_is_relative_to_the_slice_called(relays):
    got = relays.slice(procs=0).where.call_one().get(timeout=60)
    assert got == sorted(map(str, [({"procs": 0}, {"procs": 2}), ({"procs": 1}, {"procs": 2})]))


def test_a_timeout_in_an_actor_names_the_silent_rank(relays):
    with pytest.raises(RemoteError, match=r"CallTimeout.*rank\(s\) 3"):
        relays.slice(procs=0).sleep_on.call_one(3, 5.0, 0.2).get(timeout=60)
    assert issubclass(CallTimeout, TimeoutError)


def test_calling_a_missing_endpoint_through_a_reference_lists_the_endpoints(leaves):
    ref = pickle.loads(pickle.dumps(leaves))  # the controller's own mesh again
    with pytest.raises(EndpointError, match="its endpoints are"):
        ref.nope  # noqa: B018


def test_a_reference_is_small_however_large_the_mesh():
    shape = Shape(["hosts", "gpus"], [128, 8], range(1024))
    procs = _refs.ProcsRef(
        "abcdef012345", 1, "big", "host", "ipc:///tmp/x/abc-1-", _refs.ViewRef.of(shape)
    )
    ref = _refs.ActorRef(procs, 7, "trainers", "Trainer", ("step", "load"), _refs.ViewRef.of(shape))
    sliced = _refs.ViewRef.of(shape.slice(gpus=0))
    size = len(pickle.dumps((rebuild_actors, (ref, sliced))))
    assert size < 1024, size
    assert sliced.shape() == shape.slice(gpus=0)


def test_a_rank_killed_mid_call_fails_the_calling_actor_within_a_second(procs2):
    leaves = procs2.spawn("victims", Leaf)
    relay_procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        relay = relay_procs.spawn("relay", Relay, leaves)
        pending = relay.sleep_on.call_one(1, 60.0)
        deadline = time.monotonic() + 30
        while "Leaf.sleep" not in (procs2.status().ranks[1].work or ""):
            assert time.monotonic() < deadline, "the call never reached rank 1"
            time.sleep(0.02)
        killed_at = time.monotonic()
        os.kill(procs2.pids[1], signal.SIGKILL)
        with pytest.raises(
            RemoteError, match=r"MeshFailure.*rank 1 of mesh .* cannot be reached"
        ) as info:
            pending.get(timeout=30)
        assert time.monotonic() - killed_at < 10  # promised: about a second; room for load
        assert "Leaf.sleep" in str(info.value)
        # The caller's own mesh is fine.
        assert relay.call_one.call_one(0, 3).get(timeout=60)[2] == 3
    finally:
        relay_procs.stop()


def test_a_reference_to_a_stopped_mesh_fails_at_call_time_naming_it(procs4):
    doomed = this_host().spawn_procs(per_host={"procs": 1}, name="doomed")
    leaves = doomed.spawn("doomed_leaves", Leaf)
    relay = procs4.slice(procs=0).spawn("relay_to_doomed", Relay, leaves)
    assert relay.call_one.call_one(0, 1).get(timeout=60)[2] == 1
    doomed.stop()
    with pytest.raises(RemoteError, match="rank 0 of mesh 'doomed' cannot be reached") as info:
        relay.call_one.call_one(0, 2).get(timeout=60)
    assert "Leaf.who" in str(info.value)


class AsyncSelf(Actor):
    """An async actor whose loop keeps running between messages."""

    def __init__(self) -> None:
        self.ticks = 0
        self.task = None

    @endpoint
    async def start_ticking(self) -> None:
        async def tick() -> None:
            while True:
                self.ticks += 1
                await asyncio.sleep(0.01)

        self.task = asyncio.get_running_loop().create_task(tick())

    @endpoint
    async def ticks_now(self) -> int:
        return self.ticks


def test_an_actors_event_loop_runs_between_messages(procs2):
    actor = procs2.slice(procs=0).spawn("ticker", AsyncSelf)
    actor.start_ticking.call_one().get(timeout=30)
    first = actor.ticks_now.call_one().get(timeout=30)
    deadline = time.monotonic() + 30
    while actor.ticks_now.call_one().get(timeout=30) < first + 5:
        assert time.monotonic() < deadline, "tasks of the actor's loop did not advance"
        time.sleep(0.05)


def test_value_mesh_of_nested_calls_keeps_points(relays):
    values = relays.slice(procs=slice(0, 2)).call_all.call(2).get(timeout=60)
    assert isinstance(values, ValueMesh)
    assert len(values) == 2


def test_an_unpicklable_argument_in_an_actor_is_named(procs4, leaves):
    class Holds(Actor):
        def __init__(self, target) -> None:
            self.target = target

        @endpoint
        def send_lock(self) -> str:
            import threading

            try:
                self.target.slice(procs=0).record.call_one(threading.Lock()).get(timeout=60)
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            return "sent"

    holder = procs4.slice(procs=0).spawn("holds", Holds, leaves)
    assert "argument 0" in holder.send_lock.call_one().get(timeout=60)


def test_the_inbox_directory_is_private(procs4, leaves):
    ref = leaves.__reduce__()[1][0]
    directory = os.path.dirname(ref.procs.address(0).removeprefix("ipc://"))
    assert os.stat(directory).st_mode & 0o777 == 0o700
    assert isinstance(MeshFailure("x"), Exception)


class Local(Actor):
    def __init__(self, base: int) -> None:
        self.base = base

    @endpoint
    def add(self, x: int) -> tuple[int, int]:
        return os.getpid(), self.base + x


class AsyncLocal(Actor):
    def __init__(self, base: int) -> None:
        self.base = base

    @endpoint
    async def add_async(self, x: int) -> int:
        await asyncio.sleep(0)
        return self.base + x


class UsesThisProc(Actor):
    @endpoint
    def spawn_beside(self) -> tuple[int, int]:
        from monarch_nb import this_proc

        local = this_proc().spawn("beside", Local, 100)
        pid, value = local.add.call_one(1).get(timeout=60)
        return pid - os.getpid(), value


def test_this_proc_runs_actors_in_the_controllers_process_reachable_by_others(procs4):
    from monarch_nb import this_proc

    local = this_proc().spawn("local", Local, 10)
    assert local.add.call_one(5).get(timeout=60) == (os.getpid(), 15)
    awaiting = this_proc().spawn("local_async", AsyncLocal, 10)
    assert awaiting.add_async.call_one(6).get(timeout=60) == 16
    # Actors hold a reference to it (and to one of its endpoints) and call it.
    callers = procs4.spawn("calls_local", CallsLocal, local)
    assert callers.add_one.call().get(timeout=60).values() == [(os.getpid(), 11)] * 4
    hop = procs4.slice(procs=1).spawn("hops_local", Hop)
    assert hop.call_endpoint.call_one(local.add, 1).get(timeout=60) == [(os.getpid(), 11)]


class CallsLocal(Actor):
    def __init__(self, local) -> None:
        self.local = local

    @endpoint
    def add_one(self) -> tuple[int, int]:
        return self.local.add.call_one(1).get(timeout=60)


def test_this_proc_in_an_actor_is_its_own_process(procs4):
    user = procs4.slice(procs=2).spawn("uses_this_proc", UsesThisProc)
    assert user.spawn_beside.call_one().get(timeout=60) == (0, 101)


class HostUser(Actor):
    @endpoint
    def start_and_call(self, host) -> list:
        with host.spawn_procs(per_host={"procs": 2}, name="owned") as procs:
            leaves = procs.spawn("owned_leaves", Leaf)
            return sorted(v[2] for v in leaves.who.call(4).get(timeout=60).values())


def test_a_host_mesh_is_a_value_an_actor_spawns_processes_on(procs4):
    user = procs4.slice(procs=0).spawn("host_user", HostUser)
    assert user.start_and_call.call_one(this_host()).get(timeout=120) == [4, 4]


def test_interrupting_a_call_reaches_the_actor_it_waits_on(procs4, relays, leaves):
    pending = relays.slice(procs=0).sleep_on.call_one(3, 60.0)
    deadline = time.monotonic() + 30
    while "Leaf.sleep" not in (procs4.status().ranks[3].work or ""):
        assert time.monotonic() < deadline, "the call never reached rank 3"
        time.sleep(0.02)
    with pytest.raises((KeyboardInterrupt, RemoteError)):
        pending.interrupt(grace=20)
    # The leaf stopped sleeping: it answers now, not in a minute.
    assert leaves.slice(procs=3).who.call_one(1).get(timeout=30)[2] == 1


def test_stream_items_are_pairs_and_monarchs_futures(relays, leaves):
    import asyncio as aio

    items = list(leaves.who.stream(6))
    assert sorted(v[2] for _, v in items) == [6] * 4  # ours: (point, value)
    assert sorted(item.get()[2] for item in items) == [6] * 4  # Monarch's: futures

    async def awaited():
        return [(await item)[2] for item in leaves.who.stream(7)]

    assert aio.run(awaited()) == [7] * 4
