"""Monarch's execution model over real workers: who runs while an actor waits,
and how a failed ``__init__`` reaches the fault hook.

Each case is one that hung or failed when Monarch's own tests were run against
monarch_nb: a sync endpoint that waits on an ``async def`` endpoint of another
actor in its own process, and a spawn whose ``__init__`` raises on every rank
of an unsupervised mesh, and a stream iterated inside an async endpoint.
"""

from __future__ import annotations

import asyncio
import threading
import time
import warnings

import pytest

import monarch_nb.actor
from monarch_nb import Actor, Future, MeshFailure, concurrent_endpoint, context, endpoint

pytestmark = pytest.mark.timeout(120)

T = 60  # seconds: a deadline for any one reply


class Counter(Actor):
    def __init__(self, v: int) -> None:
        self.v = v

    @endpoint
    async def value(self) -> int:
        await asyncio.sleep(0)  # a step after the first: the loop must keep running
        return self.v


class SyncCaller(Actor):
    @endpoint
    def value_of(self, counter: Counter) -> int:
        return counter.value.choose().get(timeout=T)

    @endpoint
    def values_of(self, counter: Counter) -> list[int]:
        return [value for _, value in counter.value.call().get(timeout=T)]

    @endpoint
    def sees_no_loop(self, counter: Counter) -> tuple[bool, bool, int]:
        try:
            asyncio.get_running_loop()
            loop_visible = True
        except RuntimeError:
            loop_visible = False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = counter.value.choose().get(timeout=T)
        return loop_visible, bool(caught), value


def test_a_sync_endpoint_waits_on_an_async_endpoint_of_its_own_process(procs2):
    # Both actors on both ranks: the call that choose() makes may land in the
    # caller's own process, whose main thread waits in the sync endpoint.
    caller = procs2.spawn("caller", SyncCaller)
    counter = procs2.spawn("counter", Counter, 5)
    assert caller.value_of.choose(counter).get(timeout=T) == 5
    assert caller.slice(procs=0).values_of.call_one(counter).get(timeout=T) == [5, 5]


def test_a_sync_endpoint_sees_no_loop_while_it_waits(procs2):
    caller = procs2.spawn("caller", SyncCaller)
    counter = procs2.spawn("counter", Counter, 7)
    assert caller.sees_no_loop.choose(counter).get(timeout=T) == (False, False, 7)


def test_an_async_client_awaits_a_sync_endpoint_waiting_on_its_process(procs2):
    caller = procs2.spawn("caller", SyncCaller)
    counter = procs2.spawn("counter", Counter, 3)

    async def client() -> int:
        return await asyncio.wait_for(caller.value_of.choose(counter), T)

    assert asyncio.run(client()) == 3


class Name(Actor):
    @endpoint
    async def rank(self) -> int:
        await asyncio.sleep(0)
        return monarch_nb.actor.current_rank().rank


class Streamer(Actor):
    @endpoint
    async def awaited(self, names: Name) -> list[int]:
        # Iterated with a plain for inside a coroutine, as Monarch's tests do:
        # each item is a future to await, the replies from this very process too.
        return sorted([await item for item in names.rank.stream()])


def test_a_stream_iterated_in_an_async_endpoint_yields_futures(procs2):
    names = procs2.spawn("names", Name)
    streamer = procs2.spawn("streamer", Streamer)
    names.initialized.get(timeout=T)
    assert streamer.awaited.call(names).get(timeout=T).item(procs=0) == [0, 1]


class FailsInInit(Actor):
    def __init__(self) -> None:
        raise ValueError("no start here")

    @endpoint
    def never(self) -> None:
        pass


def test_a_failed_init_reaches_the_fault_hook_once_per_rank(procs2):
    failures: list[MeshFailure] = []
    both = threading.Event()

    def hook(failure: MeshFailure) -> None:
        failures.append(failure)
        if len(failures) >= 2:
            both.set()

    monarch_nb.actor.unhandled_fault_hook = hook
    try:
        procs2.spawn("failing", FailsInInit)
        assert both.wait(T), f"the hook heard of {len(failures)} of 2 failed ranks"
    finally:
        monarch_nb.actor.unhandled_fault_hook = None
    assert sorted(f.ranks for f in failures) == [(0,), (1,)]
    for failure in failures:
        assert failure.actor == "failing"
        assert "ValueError: no start here" in str(failure)


# -- what Monarch refuses, refused the same way ----------------------------------------


class Mixed(Actor):
    @endpoint
    def plain(self) -> int:
        return 1

    @endpoint
    async def awaited(self) -> int:
        return 2


class SyncWithAsyncCleanup(Actor):
    @endpoint
    def plain(self) -> int:
        return 1

    async def __cleanup__(self, exc: Exception | None) -> None:
        pass


class AsyncWithSyncCleanup(Actor):
    @endpoint
    async def awaited(self) -> int:
        return 2

    def __cleanup__(self, exc: Exception | None) -> None:
        pass


class SpawnsMixed(Actor):
    @endpoint
    def try_spawn(self) -> str:
        try:
            context().actor_instance.proc_mesh.spawn("mixed_inside", Mixed)
        except ValueError as exc:
            return str(exc)
        return "spawned"


class Raises(Actor):
    @endpoint
    def boom(self, fail: bool) -> None:
        if fail:
            raise KeyError("boom")


def test_an_actor_mixing_sync_and_async_endpoints_is_refused_at_spawn(procs2):
    with pytest.raises(ValueError, match=r"Mixed mixes both async and sync.*plain.*awaited"):
        procs2.spawn("mixed", Mixed)
    with pytest.raises(ValueError, match=r"sync endpoints \(plain\) but an async __cleanup__"):
        procs2.spawn("mixed", SyncWithAsyncCleanup)
    with pytest.raises(ValueError, match=r"async endpoints \(awaited\) but a sync __cleanup__"):
        procs2.spawn("mixed", AsyncWithSyncCleanup)
    # From inside an actor, the same refusal, before anything is sent.
    spawner = procs2.slice(procs=0).spawn("spawner", SpawnsMixed)
    assert "mixes both async and sync" in spawner.try_spawn.call_one().get(timeout=T)
    # A failed broadcast's error names the actor mesh by its name, as Monarch's does.
    raisers = procs2.spawn("exception_actor", Raises)
    raisers.boom.broadcast(True)
    deadline = time.monotonic() + T
    while (error := raisers.boom.call(False).exception(timeout=T)) is None:
        assert time.monotonic() < deadline, "the failed broadcast was not reported"
        time.sleep(0.02)
    assert isinstance(error, MeshFailure)
    assert "so actor mesh 'exception_actor' is failed" in str(error)


def test_concurrent_endpoint_refuses_what_monarchs_refuses():
    with pytest.raises(ValueError, match=r"can only wrap async endpoints.*not an async def"):

        class SyncConcurrent(Actor):
            @concurrent_endpoint
            def ping(self) -> str:
                return "pong"

    with pytest.raises(ValueError, match="does not wrap @endpoint"):

        class Stacked(Actor):
            @concurrent_endpoint
            @endpoint
            async def ping(self) -> str:
                return "pong"

    class WithOptions(Actor):  # @endpoint's options, given to it directly
        @concurrent_endpoint(explicit_response_port=True, instrument=True)
        async def ping(self, port) -> None:
            port.send("pong")

    assert monarch_nb.actor.endpoint is endpoint


def test_a_future_is_not_constructed_by_users():
    with pytest.raises(TypeError, match=r"cannot be constructed directly.*Channel"):
        Future()
