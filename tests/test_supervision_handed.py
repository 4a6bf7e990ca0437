"""Supervision follows whoever spawned an actor mesh, wherever its processes came from.

An actor handed a process mesh (a spawn argument) that spawns actors on it
owns them, as in Monarch's supervision tree: a failed ``broadcast()`` on them
reaches its ``__supervise__``, once per failed rank, and not the handed mesh's
controller (whose ``unhandled_fault_hook`` stays quiet). A process that dies
under an actor's own child mesh goes up the tree named by the actor that ran
there, as Monarch's events say it. Real workers throughout.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from fault_hooks import Faults, recording_faults
from polling import wait_until

from monarch_nb import Actor, MeshFailure, endpoint, this_host

pytestmark = pytest.mark.timeout(120)

T = 60  # seconds: a deadline for any one reply


class Child(Actor):
    @endpoint
    def fail(self) -> None:
        raise ValueError("child failed")

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Owner(Actor):
    """Spawns ``Child`` on a process mesh it was handed."""

    def __init__(self, procs, handle: bool) -> None:
        self.children = procs.spawn("kids", Child)
        self.handle = handle
        self.seen: list[dict] = []

    @endpoint
    def fail_children_by_broadcast(self) -> list[int]:
        pids = [pid for _, pid in self.children.pid.call().get(timeout=T)]
        self.children.fail.broadcast()
        return pids

    @endpoint
    def supervised(self) -> list[dict]:
        return self.seen

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(
            {
                "text": str(failure),
                "report": failure.report(),
                "actor": failure.actor,
                "ranks": failure.ranks,
                "point": str(failure.point),
            }
        )
        return self.handle


class Nest(Actor):
    """Starts a process mesh of its own, with an actor mesh on it."""

    def __init__(self) -> None:
        self.nested = this_host().spawn_procs(per_host={"a_dim": 1}).spawn("nested", Child)

    @endpoint
    def kill_nested(self) -> int:
        pid = self.nested.pid.call_one().get(timeout=T)
        os.kill(pid, signal.SIGKILL)
        return pid


@pytest.fixture(scope="module")
def meshes() -> Iterator[tuple]:
    top = this_host().spawn_procs(per_host={"procs": 2})
    handed = this_host().spawn_procs(per_host={"procs": 2})
    yield top, handed
    top.stop()
    handed.stop()


@pytest.fixture
def faults() -> Iterator[Faults]:
    with recording_faults() as hook:
        yield hook


def test_a_failed_broadcast_on_a_handed_mesh_reaches_the_spawners_supervise(meshes, faults):
    top, handed = meshes
    owner = top.slice(procs=0).spawn("owner", Owner, handed, True)
    owner.fail_children_by_broadcast.call_one().get(timeout=T)
    seen = wait_until(
        lambda: (s := owner.supervised.call_one().get(timeout=T)) and len(s) == 2 and s,
        T,
        "both ranks' failures at the owner's __supervise__",
    )
    assert sorted(r for s in seen for r in s["ranks"]) == [0, 1]
    for s in seen:
        (rank,) = s["ranks"]
        assert s["actor"] == "kids"
        assert f"broadcast of Child.fail failed on rank {rank}" in s["text"]
        assert f"MeshFailure(mesh_name=kids, crashed_ranks=[{rank}])" in s["text"]
        assert "ValueError: child failed" in s["report"]
        assert f"test_supervision_handed.Child kids{{'procs': {rank}/2}}" in s["report"]
    # Handled by its owner: the handed mesh's controller heard nothing, and
    # every process is still running.
    assert not faults.called.wait(1)
    assert top.state == "running"
    assert handed.state == "running"
    owner.stop().get(timeout=T)


def test_a_handed_meshs_failure_its_owner_does_not_handle_goes_up_the_tree(meshes, faults):
    top, handed = meshes
    owner = top.slice(procs=1).spawn("owner", Owner, handed, False)
    owner.fail_children_by_broadcast.call_one().get(timeout=T)
    report = faults.first_report(T)
    assert "Owner did not handle (its __supervise__ returned False)" in report
    assert "test_supervision_handed.Child kids{'procs': " in report
    assert "broadcast of Child.fail failed" in report


def test_a_killed_process_is_reported_up_the_tree_by_the_actor_that_ran_there(faults):
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        nest = procs.spawn("top", Nest)
        nest.initialized.get(timeout=T)
        nest.kill_nested.call_one().get(timeout=T)
        report = faults.first_report(T)
        assert "test_supervision_handed.Child nested{'a_dim': 0/1}" in report
        assert "the process this actor was running on failed: Killed(sig=9)" in report
        assert "was killed by signal SIGKILL" in report
    finally:
        procs.stop()
