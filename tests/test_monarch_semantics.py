"""Monarch's semantics that its own programs and tests rely on, over real workers.

Each case is one that failed when Monarch's examples and tests were run against
monarch_nb: a response port on ``this_proc()``, a stop that waits for
``__cleanup__``, a child mesh respawned by ``__supervise__``, a failed broadcast
going up the supervision tree, ``self.logger``, and a graceful process stop.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import threading

import pytest
from polling import wait_until

import monarch_nb.actor
from monarch_nb import (
    Actor,
    MeshFailure,
    RemoteError,
    endpoint,
    this_host,
    this_proc,
)

pytestmark = pytest.mark.timeout(120)

T = 60  # seconds: a deadline for any one reply


class Answerer(Actor):
    @endpoint(explicit_response_port=True)
    def plus_one(self, port, x: int) -> None:
        port.send(x + 1)

    @endpoint(explicit_response_port=True)
    def refuse(self, port, x: int) -> None:
        port.exception(ValueError(f"no {x}"))

    @endpoint(explicit_response_port=True)
    def raises(self, port, x: int) -> None:
        raise KeyError(x)


class LaterAnswerer(Actor):
    """Async (one actor's endpoints are all def or all async def)."""

    @endpoint(explicit_response_port=True)
    async def later(self, port, x: int) -> None:
        await asyncio.sleep(0)
        port.send(x * 2)


def test_an_explicit_response_port_on_this_proc_answers_the_call():
    answerer = this_proc().spawn("answerer", Answerer)
    later = this_proc().spawn("later_answerer", LaterAnswerer)
    try:
        assert answerer.plus_one.call_one(1).get(timeout=T) == 2
        assert later.later.call_one(4).get(timeout=T) == 8
        with pytest.raises(RemoteError, match="ValueError: no 3"):
            answerer.refuse.call_one(3).get(timeout=T)
        # Raised before answering: the caller gets the error through the port.
        with pytest.raises(RemoteError, match="KeyError: 5"):
            answerer.raises.call_one(5).get(timeout=T)
    finally:
        answerer.stop().get(timeout=T)
        later.stop().get(timeout=T)


class FileKeeper(Actor):
    """Writes to a file it closes only in ``__cleanup__`` (slowly)."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "w")  # noqa: SIM115  # closed in __cleanup__

    @endpoint
    def write(self, text: str) -> None:
        self.file.write(text)

    def __cleanup__(self, exc: BaseException | None) -> None:
        import time

        time.sleep(0.3)  # a stop that does not wait would read the file first
        self.file.close()


def test_actor_mesh_stop_is_done_once_cleanup_ran(procs2, tmp_path):
    paths = [tmp_path / "rank0", tmp_path / "rank1"]
    keepers = [
        procs2.slice(procs=rank).spawn(f"keeper{rank}", FileKeeper, str(path))
        for rank, path in enumerate(paths)
    ]
    for keeper in keepers:
        keeper.write.call_one("kept").get(timeout=T)
    for keeper in keepers:
        assert keeper.stop().get(timeout=T) is None
    assert [path.read_text() for path in paths] == ["kept", "kept"]


def test_this_proc_actor_stop_is_done_once_cleanup_ran(tmp_path):
    path = tmp_path / "local"
    keeper = this_proc().spawn("keeper", FileKeeper, str(path))
    keeper.write.call_one("kept").get(timeout=T)
    keeper.stop().get(timeout=T)
    assert path.read_text() == "kept"


class Child(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def fail(self) -> None:
        raise ValueError("child failed")


class Supervisor(Actor):
    """Monarch's fault-handling pattern: respawn the child mesh in ``__supervise__``."""

    def __init__(self, new_procs: bool) -> None:
        self.new_procs = new_procs
        self.seen: list[str] = []
        self.procs = this_host().spawn_procs(per_host={"procs": 1}, name="kids")
        self.child = self.procs.spawn("child", Child)

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(str(failure))
        if self.new_procs:  # the old one lost its process
            self.procs.stop()
            self.procs = this_host().spawn_procs(per_host={"procs": 1}, name="kids")
        self.child = self.procs.spawn("child", Child)
        return True

    @endpoint
    def kill_child(self) -> int:
        pid = self.child.pid.call_one().get(timeout=T)
        os.kill(pid, signal.SIGKILL)
        return pid

    @endpoint
    def fail_child_by_broadcast(self) -> None:
        self.child.fail.broadcast()

    @endpoint
    def supervised(self) -> list[str]:
        return self.seen

    @endpoint
    def child_pid(self) -> int:
        return self.child.pid.call_one().get(timeout=T)

    @endpoint
    def stop_children(self) -> None:
        self.procs.stop()


def test_a_child_mesh_respawned_in_supervise_answers_the_next_call(procs2):
    supervisor = procs2.slice(procs=0).spawn("supervisor", Supervisor, True)
    killed = supervisor.kill_child.call_one().get(timeout=T)
    seen = wait_until(lambda: supervisor.supervised.call_one().get(timeout=T), T, "supervise")
    assert "SIGKILL" in seen[0]
    # The owner's calls wait for its __supervise__: this one reaches the new child.
    assert supervisor.child_pid.call_one().get(timeout=T) not in (killed, 0)
    assert procs2.state == "running"
    supervisor.stop_children.call_one().get(timeout=T)


def test_a_failed_broadcast_on_a_child_mesh_reaches_the_owners_supervise(procs2):
    supervisor = procs2.slice(procs=1).spawn("supervisor", Supervisor, False)
    supervisor.fail_child_by_broadcast.call_one().get(timeout=T)
    seen = wait_until(lambda: supervisor.supervised.call_one().get(timeout=T), T, "supervise")
    assert "broadcast of Child.fail failed" in seen[0]
    assert "ValueError: child failed" in seen[0]
    # Respawned on the same processes, the child answers.
    assert supervisor.child_pid.call_one().get(timeout=T) > 0
    assert procs2.state == "running"
    supervisor.stop_children.call_one().get(timeout=T)


def test_a_failed_broadcast_of_an_unsupervised_mesh_calls_the_fault_hook(procs2):
    failures: list[MeshFailure] = []
    called = threading.Event()

    def hook(failure: MeshFailure) -> None:
        failures.append(failure)
        called.set()

    children = procs2.spawn("children", Child)
    monarch_nb.actor.unhandled_fault_hook = hook
    try:
        children.fail.broadcast()
        assert called.wait(T)
    finally:
        monarch_nb.actor.unhandled_fault_hook = None
    assert failures[0].actor == "children"
    assert "ValueError: child failed" in failures[0].report()
    with pytest.raises(MeshFailure, match=r"broadcast of Child\.fail failed"):
        children.pid.call().get(timeout=T)


class Logs(Actor):
    @endpoint
    def logger_facts(self) -> tuple[str, int, bool]:
        self.logger.info("hello from the logger")
        return self.logger.name, self.logger.level, self.logger is self.logger


def test_actors_have_a_logger_named_by_their_class(procs2):
    logs = procs2.slice(procs=0).spawn("logs", Logs)
    assert logs.logger_facts.call_one().get(timeout=T) == ("Logs", logging.DEBUG, True)
    assert isinstance(Logs().logger, logging.Logger)


class _WritesOnDel:
    """A module global's object: its ``__del__`` runs when the interpreter finalizes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __del__(self, _open=open) -> None:  # builtins may be gone by then: keep open
        with _open(self.path, "a") as f:
            f.write("del\n")


_held: _WritesOnDel | None = None


def _write_at_exit(path: str) -> None:
    with open(path, "a") as f:
        f.write("atexit\n")


class Finalized(Actor):
    @endpoint
    def arm(self, directory: str) -> None:
        global _held
        path = os.path.join(directory, str(os.getpid()))
        _held = _WritesOnDel(path)
        atexit.register(_write_at_exit, path)


def test_proc_mesh_stop_lets_the_workers_finalize(tmp_path):
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        procs.spawn("finalized", Finalized).arm.call(str(tmp_path)).get(timeout=T)
        pids = procs.pids
    finally:
        procs.stop().get(timeout=T)
    for pid in pids:
        assert (tmp_path / str(pid)).read_text() == "atexit\ndel\n"
