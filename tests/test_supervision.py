"""Faults: remote errors, dead ranks, fail-fast, __supervise__, timeouts, bad input."""

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
from process_checks import wait_for_exit

from monarch_nb import (
    Actor,
    CallTimeout,
    MeshFailure,
    RemoteError,
    SerializationError,
    SpawnError,
    SupervisionError,
    current_rank,
    endpoint,
    this_host,
)
from monarch_nb.events import Output


class Worker(Actor):
    @endpoint
    def divide(self, x: float) -> float:
        return 1 / x  # the line the traceback must show

    @endpoint
    def fail_on(self, rank: int) -> int:
        if current_rank().rank == rank:
            raise KeyError(f"only rank {rank}")
        return current_rank().rank

    @endpoint
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def unpicklable(self) -> object:
        return threading.Lock()

    @endpoint
    def echo(self, x: object) -> object:
        return x


class BrokenInit(Actor):
    def __init__(self, bad_rank: int):
        if current_rank().rank == bad_rank:
            raise RuntimeError(f"cannot start on rank {bad_rank}")


@pytest.fixture(scope="module")
def workers(procs4):
    return procs4.spawn("workers", Worker)


def test_same_error_on_many_ranks_is_reported_once_with_its_rank_set(workers):
    with pytest.raises(RemoteError) as info:
        workers.divide.call(0).get(timeout=10)
    error = info.value
    assert error.ranks == (0, 1, 2, 3)
    assert (error.actor, error.endpoint) == ("Worker", "divide")
    assert str(error) == "Worker.divide failed on ranks 0-3: ZeroDivisionError: division by zero"
    text = error.render()
    assert text.count("Traceback of where the remote call failed") == 1
    assert "return 1 / x  # the line the traceback must show" in text
    assert "test_supervision.py" in error.remote_traceback
    assert "monarch_nb/_worker.py" not in text
    assert error._render_traceback_() == text.splitlines()


def test_an_error_on_one_rank_names_that_rank_and_the_mesh_stays_usable(workers):
    with pytest.raises(
        RemoteError, match=r"Worker.fail_on failed on rank 2: KeyError: 'only rank 2'"
    ):
        workers.fail_on.call(2).get(timeout=10)
    assert workers.fail_on.call(-1).get(timeout=10).values() == [0, 1, 2, 3]


def test_call_timeout_names_the_ranks_that_did_not_reply(workers):
    fut = workers.slice(procs=[0, 1]).sleep.call(0.5)
    with pytest.raises(
        CallTimeout, match=r"got no reply from rank\(s\) 0-1 within 0.05 s \(0 of 2 replied\)"
    ):
        fut.get(timeout=0.05)
    assert len(fut.get(timeout=10)) == 2  # the call went on, and completes


def test_unpicklable_argument_is_named_and_the_mesh_stays_usable(workers):
    with pytest.raises(
        SerializationError, match=r"argument 0 of Worker.echo \(lock\) cannot be pickled"
    ):
        workers.echo.call(threading.Lock()).get(timeout=10)
    assert workers.echo.call(1).get(timeout=10).values() == [1] * 4


def test_unpicklable_return_value_names_rank_and_type(workers):
    with pytest.raises(
        SerializationError,
        match=r"Worker.unpicklable on rank\(s\) 0-3: the return value \(lock\) cannot be pickled",
    ) as info:
        workers.unpicklable.call().get(timeout=10)
    assert info.value.ranks == (0, 1, 2, 3)
    assert info.value.type_name == "lock"
    assert workers.echo.call(2).get(timeout=10).values() == [2] * 4


def test_spawn_fails_with_the_init_traceback_and_procs_stay_usable(procs4):
    broken = procs4.spawn("broken", BrokenInit, 1)
    with pytest.raises(SpawnError, match=r"rank 1: RuntimeError: cannot start on rank 1") as info:
        broken.initialized.get(timeout=10)
    assert 'raise RuntimeError(f"cannot start on rank {bad_rank}")' in info.value.render()
    assert procs4.spawn("fine", Worker).pid.call().get(timeout=10) is not None


def test_sigkill_during_a_call_fails_it_within_a_second_then_fails_fast(procs2):
    workers = procs2.spawn("w", Worker)
    pid1 = workers.pid.call().get(timeout=10)[1]
    fut = workers.sleep.call(30)
    time.sleep(0.1)
    killed_at = time.monotonic()
    os.kill(pid1, signal.SIGKILL)
    with pytest.raises(
        MeshFailure,
        match=r"rank 1 \(pid \d+\) of process mesh 'procs' was killed by signal SIGKILL "
        r"while running Worker\.sleep",
    ) as info:
        fut.get(timeout=10)
    assert time.monotonic() - killed_at < 1.0
    assert info.value.ranks == (1,)
    # Which mesh, which rank, and (the call's SupervisionError) which actor mesh.
    assert (info.value.mesh, info.value.actor) == (procs2.name, "w")
    # Fail fast: later calls that include rank 1 raise at once, with the cause,
    # until restart() ...
    started = time.monotonic()
    with pytest.raises(MeshFailure, match="SIGKILL"):
        workers.pid.call().get(timeout=10)
    with pytest.raises(MeshFailure, match="SIGKILL"):
        procs2.spawn("again", Worker)
    assert time.monotonic() - started < 0.5
    # The call's error is Monarch's SupervisionError, raised from the mesh's failure.
    assert isinstance(info.value, SupervisionError)
    assert procs2.failure is info.value.__cause__
    # ... while rank 0 keeps its actor, and its share of the failed call was
    # stopped, so it answers at once.
    assert workers.slice(procs=0).pid.call_one().get(timeout=10) == procs2.pids[0]


def test_broadcast_failure_reaches_supervision(procs2, caplog):
    workers = procs2.spawn("bw", Worker)
    with caplog.at_level(logging.ERROR, logger="monarch_nb"):
        workers.divide.broadcast(0)
        deadline = time.monotonic() + 10
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "broadcast of Worker.divide failed on rank" in caplog.records[0].getMessage()
    with pytest.raises(
        MeshFailure, match=r"broadcast of Worker.divide failed.*spawn it again"
    ) as info:
        workers.pid.call().get(timeout=10)
    assert isinstance(info.value.cause, RemoteError)
    assert (info.value.mesh, info.value.actor) == (procs2.name, "bw")  # and which actor
    # Only that actor mesh is failed; the processes serve other actors.
    assert len(procs2.spawn("ok", Worker).pid.call().get(timeout=10)) == 2


class Parent(Actor):
    """Owns a child mesh; decides whether it handles the child's failure."""

    def __init__(self, handle: bool):
        self.handle = handle
        self.seen: list[str] = []
        self.children = None

    @endpoint
    def start_children(self) -> list[int]:
        self.children = this_host().spawn_procs(per_host={"procs": 2}, name="child")
        return self.children.pids

    @endpoint
    def supervised(self) -> list[str]:
        return self.seen

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(str(failure))
        return self.handle


def _wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_supervise_handles_a_child_mesh_failure(procs2):
    parent = procs2.slice(procs=0).spawn("parent", Parent, True)
    child_pids = parent.start_children.call_one().get(timeout=30)
    os.kill(child_pids[1], signal.SIGKILL)
    seen = _wait_for(lambda: parent.supervised.call_one().get(timeout=10))
    assert "rank 1" in seen[0]
    assert "SIGKILL" in seen[0]
    assert procs2.state == "running"
    assert not wait_for_exit({child_pids[0]}, 0.1) or True  # still alive: owned by parent
    procs2.stop()  # the parent's worker exits; its children follow it
    assert not wait_for_exit(set(child_pids), 5.0)


def test_unhandled_child_failure_fails_the_parent_mesh(procs2):
    parent = procs2.slice(procs=1).spawn("parent", Parent, False)
    child_pids = parent.start_children.call_one().get(timeout=30)
    os.kill(child_pids[0], signal.SIGKILL)
    _wait_for(lambda: procs2.state == "failed")
    assert "rank 1 of 'procs' reported an unhandled failure: Parent did not handle" in str(
        procs2.failure
    )
    assert "SIGKILL" in str(procs2.failure)
    procs2.stop()
    assert not wait_for_exit(set(child_pids), 5.0)


def test_workers_exit_when_the_controller_is_killed(tmp_path):
    script = tmp_path / "controller.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from monarch_nb import this_host
            procs = this_host().spawn_procs(per_host={"procs": 3})
            print(*procs.pids, flush=True)
            time.sleep(60)
            """
        )
    )
    controller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = {int(p) for p in controller.stdout.readline().split()}
        assert len(pids) == 3
        assert all(psutil.pid_exists(p) for p in pids)
        controller.kill()
        controller.wait()
        killed = time.monotonic()
        assert not wait_for_exit(pids, 5.0)
        assert time.monotonic() - killed < 5.0
    finally:
        controller.kill()
        controller.wait()
        controller.stdout.close()


class Busy(Actor):
    @endpoint
    def spin(self, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        print("spinning", flush=True)
        try:
            while time.monotonic() < deadline:
                pass
        except KeyboardInterrupt:
            return "interrupted"
        return "finished"


def test_interrupt_reaches_busy_user_code_and_the_mesh_stays_usable(procs2):
    busy = procs2.spawn("busy", Busy)
    spinning: set[int] = set()
    with procs2.events.subscribe(
        lambda out: out.line == "spinning" and spinning.add(out.rank), kinds=(Output,)
    ):
        fut = busy.spin.call(30)
        _wait_for(lambda: spinning == {0, 1})
    assert procs2.busy_ranks() == [0, 1]
    procs2.interrupt()
    assert fut.get(timeout=10).values() == ["interrupted"] * 2
    # An interrupt between calls is ignored: nothing is lost, nothing breaks.
    procs2.interrupt(ranks=[0, 1])
    assert busy.spin.call(0).get(timeout=10).values() == ["finished"] * 2


class InitParent(Actor):
    """Starts its child mesh in __init__, as Monarch programs often do."""

    def __init__(self):
        self.seen: list[str] = []
        self.children = this_host().spawn_procs(per_host={"procs": 2}, name="child")

    @endpoint
    def child_pids(self) -> list[int]:
        return self.children.pids

    @endpoint
    def supervised(self) -> list[str]:
        return self.seen

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(f"{current_rank().rank}: {failure}")
        return True


def test_a_mesh_started_in_init_is_supervised_by_its_actor(procs2):
    parent = procs2.slice(procs=1).spawn("parent", InitParent)
    child_pids = parent.child_pids.call_one().get(timeout=30)
    os.kill(child_pids[0], signal.SIGKILL)
    seen = _wait_for(lambda: parent.supervised.call_one().get(timeout=10))
    assert seen[0].startswith("1: ")  # ran as the actor, on its rank
    assert "SIGKILL" in seen[0]
    assert procs2.state == "running"  # handled: nothing propagates
    procs2.stop()
    assert not wait_for_exit(set(child_pids), 5.0)


class AsyncParent(Actor):
    def __init__(self, handle: bool):
        self.handle = handle
        self.awaited: list[str] = []
        self.children = None

    @endpoint
    def start_children(self) -> list[int]:
        self.children = this_host().spawn_procs(per_host={"procs": 1}, name="child")
        return self.children.pids

    @endpoint
    def awaited_failures(self) -> list[str]:
        return self.awaited

    async def __supervise__(self, failure: MeshFailure) -> bool:
        import asyncio

        await asyncio.sleep(0)
        self.awaited.append(str(failure))
        return self.handle


def test_an_async_supervise_is_awaited_and_its_answer_counts(procs2):
    handler = procs2.slice(procs=0).spawn("handler", AsyncParent, True)
    refuser = procs2.slice(procs=1).spawn("refuser", AsyncParent, False)
    handled_pids = handler.start_children.call_one().get(timeout=30)
    refused_pids = refuser.start_children.call_one().get(timeout=30)
    os.kill(handled_pids[0], signal.SIGKILL)
    seen = _wait_for(lambda: handler.awaited_failures.call_one().get(timeout=10))
    assert "SIGKILL" in seen[0]
    assert procs2.state == "running"
    # A coroutine is not "handled": the awaited False propagates.
    os.kill(refused_pids[0], signal.SIGKILL)
    _wait_for(lambda: procs2.state == "failed")
    assert "AsyncParent did not handle (its __supervise__ returned False)" in str(procs2.failure)
    procs2.stop()
    assert not wait_for_exit(set(handled_pids + refused_pids), 5.0)


def test_an_assigned_unhandled_fault_hook_sees_the_controllers_mesh_failures(procs2):
    import monarch_nb.actor

    failures: list[MeshFailure] = []
    called = threading.Event()
    caller: list[str] = []

    def hook(failure: MeshFailure) -> None:
        caller.append(threading.current_thread().name)
        failures.append(failure)
        called.set()

    monarch_nb.actor.unhandled_fault_hook = hook
    try:
        assert monarch_nb.actor.unhandled_fault_hook is hook
        os.kill(procs2.pids[1], signal.SIGKILL)
        assert called.wait(30)
    finally:
        monarch_nb.actor.unhandled_fault_hook = None  # back to the default
    assert isinstance(failures[0], MeshFailure)
    assert failures[0].ranks == (1,)
    assert "SIGKILL" in failures[0].report()
    assert caller == ["monarch_nb-faults"]  # never the I/O thread
    assert procs2.state == "failed"  # the hook returned: the mesh stays failed all the same
    from monarch_nb._controller._supervision import default_unhandled_fault_hook

    assert monarch_nb.actor.unhandled_fault_hook is default_unhandled_fault_hook


def test_a_fault_hook_that_raises_interrupts_the_main_thread(tmp_path):
    # As in Monarch: sys.exit() in the hook makes the fault unhandled.
    script = tmp_path / "program.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, sys, time
            import monarch_nb.actor
            from monarch_nb.actor import this_host

            def hook(failure):
                sys.exit(1)

            monarch_nb.actor.unhandled_fault_hook = hook
            procs = this_host().spawn_procs(per_host={"procs": 2})
            os.kill(procs.pids[0], signal.SIGKILL)
            try:
                time.sleep(600)  # woken by the interrupt, not at the end of the sleep
            except KeyboardInterrupt:
                print("interrupted", flush=True)
            procs.stop()
            """
        )
    )
    # Started with SIGINT at its default, as from a terminal: a job that a
    # non-interactive shell put in the background inherits it ignored, and then
    # Python cannot raise KeyboardInterrupt at all.
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert out.stdout.strip() == "interrupted", out.stderr[-2000:]
    assert "unhandled_fault_hook 'hook' raised SystemExit" in out.stderr
    assert "SIGKILL" in out.stderr


class Pauser(Actor):
    @endpoint
    def pause(self) -> int:
        breakpoint()  # what a Monarch program does
        return 1


def test_breakpoint_without_a_debugger_says_what_to_call(monkeypatch):
    from monarch_nb._controller import _process_group

    monkeypatch.delenv("PYTHONBREAKPOINT", raising=False)
    monkeypatch.setattr(_process_group, "WORKER_IMPORTS", [])  # as in a plain script
    with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        pausers = procs.spawn("pauser", Pauser)
        with pytest.raises(RemoteError, match=r"call monarch_nb\.debug\.install\(\)") as info:
            pausers.pause.call().get(timeout=30)
        assert info.value.ranks == (0, 1)
        assert "BdbQuit" not in str(info.value)
