"""An actor's async endpoints interleave at their awaits; sync ones stay serial.

Real worker processes. Every wait is on an event or a reply, with a generous
deadline: the tests run on a small, shared machine.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from polling import read_until

from monarch_nb import Actor, RemoteError, concurrent_endpoint, endpoint, this_host, this_proc

pytestmark = pytest.mark.timeout(120)

T = 60  # seconds: a deadline for any one reply


class Gate(Actor):
    """``wait`` awaits an event that only ``open``, another endpoint, sets."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.waiting = asyncio.Event()

    @endpoint
    async def wait(self) -> str:
        self.waiting.set()
        await self.opened.wait()
        return "opened"

    @endpoint
    async def until_waiting(self) -> None:
        await self.waiting.wait()

    @endpoint
    async def open(self) -> str:
        self.opened.set()
        return "open"

    @endpoint
    async def fail_when_open(self) -> None:
        await self.opened.wait()
        raise ValueError("failed after the gate opened")

    @endpoint
    async def sleep_forever(self) -> None:
        await asyncio.sleep(3600)

    @endpoint
    async def block(self) -> None:
        await asyncio.sleep(0)
        time.sleep(300)  # noqa: ASYNC251  (blocks the loop: only an interrupt ends it)


def test_an_async_endpoint_runs_while_another_awaits(procs2):
    gate = procs2.slice(procs=0).spawn("gate", Gate)
    waiting = gate.wait.call_one()
    assert gate.open.call_one().get(timeout=T) == "open"
    assert waiting.get(timeout=T) == "opened"


def test_async_endpoints_interleave_on_the_controllers_own_process():
    gate = this_proc().spawn("gate", Gate)
    try:
        waiting = gate.wait.call_one()
        gate.until_waiting.call_one().get(timeout=T)  # started before the next message
        failing = gate.fail_when_open.call_one()
        assert gate.open.call_one().get(timeout=T) == "open"
        assert waiting.get(timeout=T) == "opened"
        with pytest.raises(RemoteError, match="failed after the gate opened"):
            failing.get(timeout=T)
    finally:
        gate.stop()


class Generator(Actor):
    """The shape of Monarch's GRPO generator: ``generate`` waits on a condition
    that only its own ``update`` endpoint notifies, and awaits a call between."""

    def __init__(self, trajectories) -> None:
        self.trajectories = trajectories
        self.cond = asyncio.Condition()
        self.ready_to_generate = True
        self.version = 0

    @endpoint
    async def generate(self, state: int) -> int:
        async with self.cond:
            await self.cond.wait_for(lambda: self.ready_to_generate)
            made = (state, self.version)
        await self.trajectories.put.call_one(made)
        async with self.cond:
            self.ready_to_generate = False
            self.cond.notify_all()
        return made[1]

    @endpoint
    async def update(self, version: int) -> None:
        async with self.cond:
            self.version = version
            self.ready_to_generate = True
            self.cond.notify_all()


class Trajectories(Actor):
    def __init__(self) -> None:
        self.items: list[tuple[int, int]] = []

    @endpoint
    async def put(self, item: tuple[int, int]) -> None:
        self.items.append(tuple(item))

    @endpoint
    async def all(self) -> list[tuple[int, int]]:
        return self.items


class Learner(Actor):
    def __init__(self, generators) -> None:
        self.generators = generators

    @endpoint
    async def step(self, version: int) -> int:
        await self.generators.update.call(version)
        return version


def test_a_generator_waits_for_the_update_its_learner_sends(procs2):
    rank0, rank1 = procs2.slice(procs=0), procs2.slice(procs=1)
    trajectories = rank1.spawn("trajectories", Trajectories)
    generator = rank0.spawn("generator", Generator, trajectories)
    learner = rank1.spawn("learner", Learner, generator)
    assert generator.generate.call_one(0).get(timeout=T) == 0
    for step in range(1, 4):
        # generate waits (the last one made it not ready) until step's update
        generated = generator.generate.call_one(step)
        stepped = learner.step.call_one(step)
        assert stepped.get(timeout=T) == step
        assert generated.get(timeout=T) == step
    assert trajectories.all.call_one().get(timeout=T) == [(s, s) for s in range(4)]


class Recorder(Actor):
    """Async calls that log their start and hold until released."""

    def __init__(self) -> None:
        self.log: list[object] = []
        self.released = asyncio.Event()

    @endpoint
    async def hold(self, i: int) -> int:
        self.log.append(("start", i))
        await self.released.wait()
        self.log.append(("end", i))
        return i

    @endpoint
    async def release(self) -> None:
        self.released.set()

    @endpoint
    async def history(self) -> list[object]:
        return list(self.log)


class SyncRecorder(Actor):
    """Sync calls that log themselves and check that nothing else ran meanwhile
    (one actor's endpoints are all def or all async def)."""

    def __init__(self) -> None:
        self.log: list[object] = []
        self.in_sync = False

    @endpoint
    def record(self, i: int) -> int:
        assert not self.in_sync, "a sync endpoint ran while another had not ended"
        self.in_sync = True
        try:
            self.log.append(i)
            return i
        finally:
            self.in_sync = False

    @endpoint
    def history(self) -> list[object]:
        return list(self.log)


def test_async_endpoints_start_in_message_order_and_interleave(procs2):
    recorder = procs2.slice(procs=0).spawn("recorder", Recorder)
    held = [recorder.hold.call_one(i) for i in range(8)]
    # A call sent after them finds every one started, none ended.
    assert recorder.history.call_one().get(timeout=T) == [("start", i) for i in range(8)]
    recorder.release.call_one().get(timeout=T)
    assert [h.get(timeout=T) for h in held] == list(range(8))
    log = recorder.history.call_one().get(timeout=T)
    assert sorted(e for e in log if e[0] == "end") == [("end", i) for i in range(8)]


def test_sync_endpoints_run_one_at_a_time_in_order(procs2):
    recorder = procs2.slice(procs=0).spawn("recorder", Recorder)
    syncs = procs2.slice(procs=0).spawn("sync_recorder", SyncRecorder)
    held = recorder.hold.call_one(-1)  # an async call in flight changes nothing for them
    calls = [syncs.record.call_one(i) for i in range(50)]
    assert [c.get(timeout=T) for c in calls] == list(range(50))
    assert syncs.history.call_one().get(timeout=T) == list(range(50))
    assert recorder.history.call_one().get(timeout=T) == [("start", -1)]
    recorder.release.call_one().get(timeout=T)
    assert held.get(timeout=T) == -1


def test_a_failing_call_fails_alone_while_another_completes(procs2):
    gate = procs2.slice(procs=0).spawn("gate", Gate)
    waiting = gate.wait.call_one()
    failing = gate.fail_when_open.call_one()
    gate.open.call_one().get(timeout=T)
    with pytest.raises(RemoteError, match="failed after the gate opened") as caught:
        failing.get(timeout=T)
    assert "fail_when_open" in caught.value.remote_traceback
    assert "in wait" not in caught.value.remote_traceback
    assert waiting.get(timeout=T) == "opened"
    assert gate.open.call_one().get(timeout=T) == "open"  # the actor lives on
    assert procs2.state == "running"


def test_interrupting_one_awaiting_call_leaves_the_other(procs2):
    gate = procs2.slice(procs=0).spawn("gate", Gate)
    waiting = gate.wait.call_one()
    gate.until_waiting.call_one().get(timeout=T)
    doomed = gate.fail_when_open.call_one()
    with pytest.raises(KeyboardInterrupt):
        doomed.interrupt(grace=T)
    assert gate.open.call_one().get(timeout=T) == "open"
    assert waiting.get(timeout=T) == "opened"
    assert procs2.state == "running"


def test_a_blocking_step_shows_in_the_stacks_and_its_interrupt_ends_it_alone(procs2):
    rank0 = procs2.slice(procs=0)
    gate = rank0.spawn("gate", Gate)
    waiting = gate.wait.call_one()
    blocked = gate.block.call_one()
    read_until(
        lambda: rank0.stacks(timeout=T).get(0, ""),
        lambda stack: "time.sleep(300)" in stack,
        T,
        "the blocking step in rank 0's stack",
    )
    with pytest.raises(KeyboardInterrupt):
        blocked.interrupt(grace=T)
    assert "KeyboardInterrupt" in str(blocked.exception(timeout=0))
    assert gate.open.call_one().get(timeout=T) == "open"
    assert waiting.get(timeout=T) == "opened"
    assert procs2.state == "running"


def test_the_stacks_say_where_each_async_call_awaits(procs2):
    rank0 = procs2.slice(procs=0)
    gate = rank0.spawn("gate", Gate)
    waiting = gate.wait.call_one()
    gate.until_waiting.call_one().get(timeout=T)
    stack = rank0.stacks(timeout=T)[0]
    assert "async endpoint calls awaiting (1):\n  Gate.wait awaits at " in stack
    assert "in wait: await self.opened.wait()" in stack
    why = str(rank0.diagnose(timeout=T))  # %mesh why
    assert "rank 0 waiting at an await in 1 async endpoint call(s): Gate.wait awaits at" in why
    assert "rank 0 has async endpoint calls waiting at an await" in why
    assert rank0.busy_ranks() == [0]
    gate.open.call_one().get(timeout=T)
    assert waiting.get(timeout=T) == "opened"
    assert "awaiting" not in rank0.stacks(timeout=T)[0]
    assert "rank 0 idle" in str(rank0.diagnose(timeout=T))


def test_interrupting_the_ranks_cancels_calls_waiting_at_an_await(procs2):
    gates = procs2.spawn("gates", Gate)
    waiting = gates.wait.call()
    also = gates.sleep_forever.call()
    read_until(
        lambda: str(procs2.diagnose(timeout=T)),
        lambda why: why.count("2 async endpoint call(s)") == 1 and "ranks 0-1" in why,
        T,
        "both calls waiting on both ranks",
    )
    assert procs2.interrupt() == [0, 1]  # no call named: whatever runs or waits
    for future in (waiting, also):
        error = future.exception(timeout=T)
        assert isinstance(error, RemoteError)
        assert "KeyboardInterrupt" in str(error)
    read_until(procs2.busy_ranks, lambda busy: busy == [], T, "both ranks idle again")
    assert gates.open.call().get(timeout=T).values() == ["open", "open"]  # the actors live on


class Unwinds(Actor):
    """Calls that await forever, and say in a file how they and the actor end."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.started = asyncio.Event()

    def _write(self, line: str) -> None:
        with open(self.path, "a") as f:
            f.write(line + "\n")

    @endpoint
    async def hold(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # the handler may itself await
            self._write("hold cancelled")
            raise

    @concurrent_endpoint
    async def hold_concurrently(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self._write("hold_concurrently cancelled")
            raise

    @concurrent_endpoint(explicit_response_port=True)
    async def hold_port(self, port, tag: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self._write(f"hold_port {tag} cancelled")
            raise

    @endpoint
    async def until_started(self) -> None:
        await self.started.wait()

    async def __cleanup__(self, exc: Exception | None) -> None:
        self._write("cleanup")


def _file_lines(path: str, count: int) -> list[str]:
    def read() -> list[str]:
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return f.read().splitlines()

    return read_until(read, lambda lines: len(lines) >= count, T, f"{count} lines in {path}")


def test_stopping_an_actor_cancels_its_calls_before_its_cleanup(procs2, tmp_path):
    path = str(tmp_path / "ends")
    actor = procs2.slice(procs=0).spawn("unwinds", Unwinds, path)
    held = actor.hold.call_one()
    concurrent = actor.hold_concurrently.call_one()
    ported = actor.hold_port.call_one("called")
    actor.hold_port.broadcast("broadcast")  # nobody waits on it
    actor.until_started.call_one().get(timeout=T)
    actor.stop().get(timeout=T)
    lines = _file_lines(path, 5)
    assert sorted(lines[:4]) == [
        "hold cancelled",
        "hold_concurrently cancelled",
        "hold_port broadcast cancelled",
        "hold_port called cancelled",
    ]
    assert lines[4:] == ["cleanup"]
    for call in (held, concurrent, ported):  # their callers hear of it
        with pytest.raises(RemoteError, match="its actor was stopped"):
            call.get(timeout=T)
    assert procs2.state == "running"


def test_stopping_an_actor_of_the_controllers_process_cancels_then_cleans_up(tmp_path):
    path = str(tmp_path / "ends")
    actor = this_proc().spawn("unwinds", Unwinds, path)
    held = actor.hold.call_one()
    actor.until_started.call_one().get(timeout=T)
    actor.stop()
    assert _file_lines(path, 2) == ["hold cancelled", "cleanup"]
    with pytest.raises(RemoteError, match="CancelledError"):
        held.get(timeout=T)


def test_stopping_the_processes_cancels_calls_before_cleanup(tmp_path):
    path = str(tmp_path / "ends")
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        actor = procs.spawn("unwinds", Unwinds, path)
        actor.hold.call_one()
        actor.until_started.call_one().get(timeout=T)
    finally:
        procs.stop()  # waits for the processes to exit
    assert _file_lines(path, 2) == ["hold cancelled", "cleanup"]


def test_breakpoint_in_an_async_endpoint_while_another_call_awaits():
    from kernel_utils import Kernel
    from stdin_kernel import converse, scripted

    with Kernel(env={"MONARCH_NB_INTERRUPT_GRACE": "1"}) as kernel:
        kernel.ok("%load_ext monarch_nb")
        kernel.ok("%mesh start --procs 1 --name m")
        kernel.ok(
            "import asyncio\n"
            "from monarch_nb import Actor, endpoint, current_mesh\n"
            "class Paused(Actor):\n"
            "    def __init__(self):\n        self.opened = asyncio.Event()\n"
            "    @endpoint\n    async def wait(self):\n"
            "        await self.opened.wait()\n        return 'opened'\n"
            "    @endpoint\n    async def step(self, x):\n"
            "        await asyncio.sleep(0)\n"
            "        loss = x * 2\n"
            "        breakpoint()\n"
            "        self.opened.set()\n"
            "        return loss\n"
            "paused = current_mesh().spawn('paused', Paused)\n"
            "waiting = paused.wait.call_one()"
        )
        reply, convo = converse(
            kernel,
            "paused.step.call_one(5).get(timeout=60), waiting.get(timeout=60)",
            scripted("p loss", "c"),
        )
    assert reply.status == "ok", convo.text()
    assert convo.prompts == ["(Pdb rank 0) "] * 2
    text = convo.text()
    assert "-> self.opened.set()" in text
    assert "\n10\n" in text
    assert "(10, 'opened')" in text
