"""Monarch's ownership rules over real workers: what an actor starts goes when it goes.

An actor that spawns a process mesh, or an actor mesh on a mesh it was handed,
owns them: stopping the actor stops them too (their ``__cleanup__`` runs, the
owned processes exit), as Monarch's recursive stop does.
"""

from __future__ import annotations

import os
import time

import pytest

from monarch_nb import Actor, endpoint, this_host

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

    @endpoint
    def owned_pid(self) -> int:
        return self.on_own.pid.call_one().get(timeout=T)


def test_stopping_an_actor_stops_what_it_started(procs2):
    tally = procs2.slice(procs=0).spawn("tally", Tally)
    owner = procs2.slice(procs=0).spawn("owner", Owner, procs2, tally)
    owned_pid = owner.owned_pid.call_one().get(timeout=T)
    owner.stop().get(timeout=T)
    # The owner's stop waited for each: both cleaned up, the owned process gone.
    assert tally.marks_so_far.call_one().get(timeout=T) == ["on handed procs", "on owned procs"]
    deadline = time.monotonic() + T
    while os.path.exists(f"/proc/{owned_pid}"):
        assert time.monotonic() < deadline, "the owned process mesh outlived its owner"
        time.sleep(0.05)
