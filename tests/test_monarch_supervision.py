"""Monarch's ownership rules over real workers: what an actor starts goes when it
goes, and a failure's report says which actor failed, where, and through whom.

An actor that spawns a process mesh, or an actor mesh on a mesh it was handed,
owns them: stopping the actor stops them too (their ``__cleanup__`` runs, the
owned processes exit), as Monarch's recursive stop does.
"""

from __future__ import annotations

import os
import time

import pytest

import monarch_nb.actor
from monarch_nb import Actor, MeshFailure, endpoint, this_host

pytestmark = pytest.mark.timeout(180)

T = 60  # seconds: a deadline for any one reply


class Tally(Actor):
    def __init__(self) -> None:
        self.marks: list[str] = []

    @endpoint
    def mark(self, what: str) -> None:
        self.marks.append(what)

    @endpoint
    def marks_so_far(self) -> list[str]:
        return sorted(self.marks)


class Marker(Actor):
    """Marks the tally when it is cleaned up."""

    def __init__(self, tally: Tally, what: str) -> None:
        self.tally = tally
        self.what = what

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def __cleanup__(self, exc: Exception | None) -> None:
        self.tally.mark.call_one(self.what).get(timeout=T)


class Owner(Actor):
    """Starts a process mesh of its own and an actor mesh on one it was handed."""

    def __init__(self, procs, tally: Tally) -> None:
        self.own_procs = this_host().spawn_procs(per_host={"procs": 1}, name="owned")
        self.on_own = self.own_procs.spawn("on_own", Marker, tally, "on owned procs")
        self.on_handed = procs.slice(procs=1).spawn("on_handed", Marker, tally, "on handed procs")
        # In the owner's own process: its stop cannot be waited for there.
        self.beside = procs.slice(procs=0).spawn("beside", Marker, tally, "beside the owner")

    @endpoint
    def owned_pid(self) -> int:
        return self.on_own.pid.call_one().get(timeout=T)


def test_stopping_an_actor_stops_what_it_started(procs2):
    tally = procs2.slice(procs=0).spawn("tally", Tally)
    owner = procs2.slice(procs=0).spawn("owner", Owner, procs2, tally)
    owned_pid = owner.owned_pid.call_one().get(timeout=T)
    started = time.monotonic()
    owner.stop().get(timeout=T)
    assert time.monotonic() - started < T / 2  # not a wait that timed out
    # All cleaned up (the one on the owned procs before the owner's stop was
    # done; the others were sent their stop), and the owned process is gone.
    assert "on owned procs" in tally.marks_so_far.call_one().get(timeout=T)
    _wait_until(
        lambda: len(tally.marks_so_far.call_one().get(timeout=T)) == 3,
        "an actor mesh on the handed procs was not stopped",
    )
    deadline = time.monotonic() + T
    while os.path.exists(f"/proc/{owned_pid}"):
        assert time.monotonic() < deadline, "the owned process mesh outlived its owner"
        time.sleep(0.05)


class Runs(Actor):
    @endpoint
    def run(self, fail: bool) -> int:
        if fail:
            raise ValueError("run failed")
        return 1


class Nest(Actor):
    """Owns a one-process mesh with a ``Runs`` actor named "nested"; handles nothing."""

    def __init__(self) -> None:
        self.nest = this_host().spawn_procs(per_host={"a_dim": 1}).spawn("nested", Runs)

    @endpoint
    def fail_nested(self) -> None:
        self.nest.run.broadcast(True)


def test_a_failure_report_names_the_actor_its_point_and_the_chain(procs2):
    failures: list[MeshFailure] = []
    monarch_nb.actor.unhandled_fault_hook = failures.append
    try:
        runs = procs2.spawn("runs", Runs)
        runs.slice(procs=1).run.broadcast(True)
        _wait_until(lambda: failures, "the broadcast's failure never reached the hook")
        report = failures[0].report()
        assert report.startswith(
            "The actor test_monarch_supervision.Runs runs{'procs': 1/2} and all its "
            "descendants have failed: broadcast of Runs.run failed on rank 1"
        )
        assert "ValueError: run failed" in report  # and the remote traceback
        # One level down: a child mesh of an actor fails, and its owner does not
        # handle it. The client's report names the descendant that failed first.
        nest = procs2.slice(procs=0).spawn("nest", Nest)
        nest.fail_nested.call_one().get(timeout=T)
        _wait_until(lambda: len(failures) > 1, "the nested failure never reached the hook")
    finally:
        monarch_nb.actor.unhandled_fault_hook = None
    report = failures[1].report()
    assert "Nest did not handle" in report
    assert (
        "The actor test_monarch_supervision.Runs nested{'a_dim': 0/1} and all its "
        "descendants have failed" in report
    )


def _wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + T
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
