"""Actors and endpoints over real worker processes."""

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from monarch_nb import (
    Actor,
    EndpointError,
    MeshUsageError,
    RemoteError,
    SpawnError,
    SupervisionError,
    ValueMesh,
    context,
    current_rank,
    endpoint,
)


class Counter(Actor):
    def __init__(self, start: int = 0):
        self.value = start
        self.log: list[int] = []

    @endpoint
    def add(self, n: int) -> int:
        self.value += n
        self.log.append(n)
        return self.value

    @endpoint
    def history(self) -> list[int]:
        return self.log

    @endpoint
    def whoami(self) -> tuple:
        ctx = context()
        return current_rank().rank, dict(current_rank()), ctx.actor_name, ctx.actor is self

    @endpoint
    def slow_double(self, x: int, delay: float = 0.0) -> int:
        time.sleep(delay)
        return 2 * x

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def helper(self) -> None:
        """Not an endpoint."""


class AsyncDoubler(Actor):
    """An async actor (one actor's endpoints are all def or all async def)."""

    @endpoint
    async def slow_double(self, x: int, delay: float = 0.0) -> int:
        await asyncio.sleep(delay)
        return 2 * x


@pytest.fixture(scope="module")
def counters(procs4):
    return procs4.spawn("counters", Counter, 10)


def test_call_gathers_a_value_mesh(counters):
    result = counters.whoami.call().get(timeout=10)
    assert isinstance(result, ValueMesh)
    assert [v[0] for v in result.values()] == [0, 1, 2, 3]
    assert result[2][1] == {"procs": 2}
    assert all(v[2] == "counters" and v[3] for v in result.values())


def test_call_one_needs_exactly_one_point(counters):
    assert counters.slice(procs=2).whoami.call_one().get(timeout=10)[0] == 2
    with pytest.raises(MeshUsageError, match=r"exactly one point.*has 4.*slice\(procs=0\)"):
        counters.whoami.call_one().get(timeout=10)


def test_sync_and_async_endpoints(procs4, counters):
    assert counters.slow_double.call(21).get(timeout=10).values() == [42] * 4
    doublers = procs4.spawn("async_doublers", AsyncDoubler)
    assert doublers.slow_double.call(21).get(timeout=10).values() == [42] * 4
    assert doublers.slice(procs=1).slow_double.call_one(x=5, delay=0.01).get(timeout=10) == 10


def test_await_and_get_from_inside_a_running_loop(counters):
    async def cell():
        awaited = await counters.slow_double.call(1)
        blocked = counters.slow_double.call(2).get(timeout=10)  # as in a Jupyter cell
        return awaited.values(), blocked.values()

    assert asyncio.run(cell()) == ([2] * 4, [4] * 4)


def test_calls_to_one_actor_run_in_the_order_sent(procs4):
    ordered = procs4.slice(procs=0).spawn("ordered", Counter)
    futures = [ordered.add.call_one(i) for i in range(200)]
    assert [f.get(timeout=10) for f in futures][-1] == sum(range(200))
    assert ordered.history.call_one().get(timeout=10) == list(range(200))


def test_several_actors_share_a_process(procs4):
    a = procs4.spawn("a", Counter, 0)
    b = procs4.spawn("b", Counter, 100)
    assert a.pid.call().get(timeout=10) == b.pid.call().get(timeout=10)
    a.add.call(1).get(timeout=10)
    assert b.add.call(1).get(timeout=10).values() == [101] * 4


def test_broadcast_is_fire_and_forget(procs4):
    c = procs4.spawn("bcast", Counter, 0)
    c.add.broadcast(5)
    c.add.broadcast(6)
    assert c.history.call().get(timeout=10).values() == [[5, 6]] * 4


def test_choose_spreads_calls_over_ranks(procs4):
    c = procs4.spawn("choose", Counter, 0)
    ranks = {c.whoami.choose().get(timeout=10)[0] for _ in range(8)}
    assert ranks == {0, 1, 2, 3}
    # With rank 0 busy, choose() must pick another rank.
    busy = c.slice(procs=0).slow_double.call_one(1, delay=1.0)
    picked = [c.whoami.choose() for _ in range(3)]
    assert 0 not in {f.get(timeout=10)[0] for f in picked}
    busy.get(timeout=10)


def test_stream_yields_replies_as_they_arrive(procs4):
    c = procs4.spawn("stream", Counter, 0)
    # Rank r sleeps (3 - r) * 0.15 s, so replies arrive in reverse rank order.
    delays = {0: 0.45, 1: 0.3, 2: 0.15, 3: 0.0}
    streams = [c.slice(procs=r).slow_double.call_one(r, delay=delays[r]) for r in range(4)]
    [s.get(timeout=10) for s in streams]
    order = [point.rank for point, _ in c.slow_double.stream(1, delay=0.0)]
    assert sorted(order) == [0, 1, 2, 3]

    class Sleeper(Actor):
        @endpoint
        def nap(self) -> int:
            import time

            time.sleep(0.15 * (3 - current_rank().rank))
            return current_rank().rank

    sleepers = procs4.spawn("sleepers", Sleeper)
    assert [v for _, v in sleepers.nap.stream()] == [3, 2, 1, 0]

    async def consume():
        return [v async for _, v in sleepers.nap.stream()]

    assert asyncio.run(consume()) == [3, 2, 1, 0]


def test_calling_something_that_is_not_an_endpoint(counters):
    with pytest.raises(
        EndpointError, match=r"Counter has no endpoint 'nope'; its endpoints are: add, history"
    ):
        _ = counters.nope
    with pytest.raises(
        EndpointError,
        match=r"Counter.helper is a method but not an endpoint: decorate it with @endpoint",
    ):
        _ = counters.helper
    with pytest.raises(MeshUsageError, match=r"call it with an adverb"):
        counters.add(1)


def test_slices_of_an_actor_mesh_share_actors(counters):
    before = counters.slice(procs=3).add.call_one(0).get(timeout=10)
    counters.slice(procs=[1, 3]).add.call(1).get(timeout=10)
    assert counters.slice(procs=3).add.call_one(0).get(timeout=10) == before + 1


def test_classes_from_main_travel_by_value(tmp_path):
    # A script's (or notebook's) classes are not importable on the workers.
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            from monarch_nb import Actor, endpoint, this_host

            SCALE = 3

            def triple(x):
                return x * SCALE

            class Local(Actor):
                @endpoint
                def apply(self, fn, x):
                    return fn(x), type(self).__module__

            with this_host().spawn_procs(per_host={"procs": 2}) as procs:
                local = procs.spawn("local", Local)
                print(local.apply.call(triple, 5).get(timeout=30).values())
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[(15, '__main__'), (15, '__main__')]"


def test_futures_resolve_on_another_thread_while_main_waits(counters):
    results = []
    thread = threading.Thread(target=lambda: results.append(counters.add.call(0).get(timeout=10)))
    thread.start()
    thread.join(10)
    assert len(results[0]) == 4


def test_source_of_notebook_cells_reaches_remote_tracebacks(procs4):
    # A class defined in a notebook cell: its code's file exists only in linecache.
    import linecache

    filename = "/tmp/ipykernel_0/cell-test-source.py"
    source = (
        "from monarch_nb import Actor, endpoint\n"
        "class FromCell(Actor):\n"
        "    @endpoint\n"
        "    def boom(self):\n"
        "        raise ValueError('raised in a cell')  # shown remotely\n"
    )
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    actors = procs4.slice(procs=0).spawn("cell", namespace["FromCell"])
    with pytest.raises(RemoteError) as info:
        actors.boom.call_one().get(timeout=10)
    assert "raise ValueError('raised in a cell')  # shown remotely" in info.value.render()


def test_a_rank_stops_being_busy_as_soon_as_it_replies(procs4):
    c = procs4.spawn("busy_ranks", Counter, 0)
    c.initialized.get(timeout=60)  # spawning does not wait: its __init__ keeps ranks busy
    fut = c.slice(procs=[0, 1]).slow_double.call(1, delay=0.0)
    slow = c.slice(procs=2).slow_double.call_one(1, delay=1.0)
    assert fut.get(timeout=10).values() == [2, 2]
    assert fut.waiting_ranks() == []
    assert procs4.busy_ranks() == [2]
    assert slow.waiting_ranks() == [2]
    slow.get(timeout=10)
    assert procs4.busy_ranks() == []


def test_an_actor_mesh_reads_its_shape_and_stop_returns_a_future(procs4):
    counters = procs4.split(procs=("dp", "tp"), tp=2).spawn("grid", Counter, 0)
    assert counters.sizes == {"dp": 2, "tp": 2}
    assert counters.size("tp") == 2
    assert counters.extent.nelements == 4
    row = counters.slice(dp=1)
    assert row.add.call(1).get(timeout=10).values() == [1, 1]
    flat = counters.flatten("rank")
    assert flat.add.call(1).get(timeout=10).item(rank=3) == 2
    stopped = counters.stop()
    assert stopped.get(timeout=5) is None
    with pytest.raises(SupervisionError, match="was stopped"):
        counters.add.call(1).get(timeout=10)


class MadeByNew(Actor):
    """A class that constructs in __new__ too: spawn must call both, as cls(...) does."""

    def __new__(cls, x: int):
        instance = super().__new__(cls)
        instance.from_new = x
        return instance

    def __init__(self, x: int):
        self.from_init = x * 2
        self.current_during_init = context().actor is self  # the actor owns what it starts

    @endpoint
    def made(self) -> tuple[int, int, bool]:
        return self.from_new, self.from_init, self.current_during_init


class NoInit(Actor):
    @endpoint
    def ok(self) -> bool:
        return True


def test_spawn_constructs_as_calling_the_class_does(procs4):
    made = procs4.slice(procs=0).spawn("made", MadeByNew, 3)
    assert made.made.call_one().get(timeout=10) == (3, 6, True)
    wrong = procs4.slice(procs=0).spawn("noinit", NoInit, 1)  # returns: __init__ runs later
    with pytest.raises(SpawnError, match="NoInit\\(\\) takes no arguments"):
        wrong.initialized.get(timeout=10)
    assert procs4.slice(procs=0).spawn("noinit", NoInit).ok.call_one().get(timeout=10)
