"""Spawning does not wait for ``__init__``; its outcome is ``initialized`` and the calls.

Real worker processes. A slow ``__init__`` waits on a gate file that the test
creates, so "spawn returned before ``__init__`` ended" holds by construction,
not by timing; one test also measures against a sleep, with generous bounds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from polling import wait_until

import monarch_nb.actor
from monarch_nb import (
    Actor,
    MeshFailure,
    RemoteError,
    SpawnError,
    current_rank,
    endpoint,
    this_host,
    this_proc,
)

pytestmark = pytest.mark.timeout(180)

T = 60  # seconds: a deadline for any one reply


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + 2 * T
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test never created {path}")
        time.sleep(0.01)


class Gated(Actor):
    """``__init__`` ends once ``gate`` exists; then raises on ``bad_rank`` if given."""

    def __init__(self, gate: str, bad_rank: int = -1) -> None:
        _wait_for(gate)
        if current_rank().rank == bad_rank:
            raise RuntimeError(f"cannot start on rank {bad_rank}")
        self.constructed = True

    @endpoint
    def value(self) -> bool:
        return self.constructed


class Sleepy(Actor):
    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)
        self.started = time.time()

    @endpoint
    def started_at(self) -> float:
        return self.started


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.n = start

    @endpoint
    def add(self, k: int) -> int:
        self.n += k
        return self.n


class Parent(Actor):
    """Spawns a gated child on a process mesh it was given."""

    @endpoint
    def spawn_and_call(self, procs, gate: str) -> tuple[bool, bool]:
        child = procs.spawn("child", Gated, gate)
        returned_first = not child.initialized.done()  # the gate is still closed
        reply = child.value.call_one()  # sent before __init__ ends: it queues
        Path(gate).touch()
        return returned_first, reply.get(timeout=T)

    @endpoint
    def spawn_failing(self, procs, gate: str) -> tuple[str, str]:
        child = procs.spawn("child", Gated, gate, 1)
        reply = child.value.call_one()
        Path(gate).touch()
        try:
            reply.get(timeout=T)
        except RemoteError as exc:
            at_call = str(exc)
        try:
            child.initialized.get(timeout=T)
        except SpawnError as exc:
            at_initialized = str(exc)
        return at_call, at_initialized


@pytest.fixture(scope="module")
def procs2() -> Iterator:
    procs = this_host().spawn_procs(per_host={"procs": 2})
    yield procs
    procs.stop()


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return tmp_path / "gate"


def test_spawn_returns_before_init_ends_and_a_call_queues_behind_it(procs2, gate):
    actors = procs2.spawn("gated", Gated, str(gate))
    assert not actors.initialized.done()  # __init__ waits on the gate we have not opened
    reply = actors.value.call()
    assert not reply.done()
    gate.touch()
    assert reply.get(timeout=T).values() == [True, True]
    assert actors.initialized.get(timeout=T) is None
    assert actors.slice(procs=1).initialized is actors.initialized


def test_spawn_does_not_block_for_a_sleeping_init(procs2):
    began = time.monotonic()
    actors = procs2.spawn("sleepy", Sleepy, 5.0)
    returned = time.monotonic() - began
    assert returned < 2.5, f"spawn blocked {returned:.1f} s on a 5 s __init__"
    started = actors.started_at.call().get(timeout=T)
    assert time.monotonic() - began >= 5.0  # the call waited for __init__ on the rank
    assert len(started.values()) == 2


def test_spawns_and_calls_sent_during_an_init_run_in_order_after_it(procs2, gate):
    slow = procs2.slice(procs=0).spawn("slow", Gated, str(gate))
    counters = procs2.slice(procs=0).spawn("counter", Counter, 10)  # queues behind slow's
    replies = [counters.add.call_one(k) for k in (1, 2, 3)]
    assert not counters.initialized.done()
    gate.touch()
    assert [r.get(timeout=T) for r in replies] == [11, 13, 16]
    assert slow.value.call_one().get(timeout=T) is True


def test_init_error_at_the_first_call_and_at_initialized(procs2, gate):
    actors = procs2.spawn("broken", Gated, str(gate), 1)
    first = actors.value.call()  # sent while __init__ runs: rank 1 answers its error
    gate.touch()
    with pytest.raises(
        RemoteError,
        match=r"rank 1: RuntimeError: cannot start on rank 1 \(raised by its __init__, so the "
        r"actor does not exist\)",
    ) as at_call:
        first.get(timeout=T)
    assert 'raise RuntimeError(f"cannot start on rank {bad_rank}")' in at_call.value.render()
    assert at_call.value.ranks == (1,)
    assert at_call.value.values is not None
    assert at_call.value.values.values() == [True]  # rank 0 was constructed

    with pytest.raises(SpawnError, match=r"rank 1: RuntimeError: cannot start on rank 1") as init:
        actors.initialized.get(timeout=T)
    assert init.value.ranks == (1,)
    assert "in __init__" in init.value.render()
    # Known now: a later call raises the same SpawnError without being sent.
    with pytest.raises(SpawnError, match=r"Gated 'broken' failed on rank 1: RuntimeError"):
        actors.value.call().get(timeout=T)
    # The process mesh is fine, and the failed spawn is in its history, not replayed.
    assert procs2.spawn("fine", Counter, 1).add.call(1).get(timeout=T).values() == [2, 2]
    history = str(procs2.history())
    assert "spawn broken (Gated)" in history
    assert "failed: SpawnError" in history


def test_an_unsupervised_init_error_reaches_the_unhandled_fault_hook(procs2):
    heard: list[MeshFailure] = []
    got = threading.Event()

    def hook(failure: MeshFailure) -> None:
        heard.append(failure)
        got.set()

    monarch_nb.actor.unhandled_fault_hook = hook
    try:
        procs2.spawn("unsupervised", Gated, os.devnull, 0)
        assert got.wait(T), "the hook never heard of the failed __init__"
    finally:
        monarch_nb.actor.unhandled_fault_hook = None
    (failure,) = heard
    assert failure.actor == "unsupervised"
    assert isinstance(failure.cause, SpawnError)
    assert "actor mesh 'unsupervised' could not start" in str(failure)
    assert "cannot start on rank 0" in str(failure)


def test_a_spawn_is_replayed_after_a_restart(gate):
    procs = this_host().spawn_procs(per_host={"procs": 2}, name="replayed")
    try:
        counters = procs.spawn("c", Counter, 5)
        assert counters.initialized.get(timeout=T) is None
        wait_until(
            lambda: (
                "spawn c (Counter) on ranks 0-1" in str(procs.history())
                and "running" not in str(procs.history())
            ),
            T,
            "the spawn step marked ok",
        )
        broken = procs.spawn("b", Gated, os.devnull, 0)
        with pytest.raises(SpawnError):
            broken.initialized.get(timeout=T)
        procs.restart(replay=True)
        # Built again in the new processes: the failed spawn is not sent again.
        assert counters.add.call(1).get(timeout=T).values() == [6, 6]
        with pytest.raises(MeshFailure, match="spawned before its process mesh restarted"):
            broken.value.call().get(timeout=T)
    finally:
        procs.stop()


def test_this_proc_spawn_returns_before_init_and_reports_its_error(gate):
    actors = this_proc().spawn("local_gated", Gated, str(gate))
    assert not actors.initialized.done()
    reply = actors.value.call_one()
    gate.touch()
    assert reply.get(timeout=T) is True
    assert actors.initialized.get(timeout=T) is None

    broken = this_proc().spawn("local_broken", Gated, str(gate), 0)
    with pytest.raises(RemoteError, match=r"cannot start on rank 0 \(raised by its __init__"):
        broken.value.call_one().get(timeout=T)
    with pytest.raises(SpawnError, match=r"rank 0: RuntimeError: cannot start on rank 0"):
        broken.initialized.get(timeout=T)


def test_an_actor_spawns_without_waiting_and_sees_init_errors(procs2, tmp_path):
    parent = procs2.slice(procs=0).spawn("parent", Parent)
    child_procs = procs2.slice(procs=1)
    returned_first, value = parent.spawn_and_call.call_one(child_procs, str(tmp_path / "a")).get(
        timeout=T
    )
    assert returned_first is True
    assert value is True
    at_call, at_initialized = parent.spawn_failing.call_one(child_procs, str(tmp_path / "b")).get(
        timeout=T
    )
    assert "rank 1: RuntimeError: cannot start on rank 1 (raised by its __init__" in at_call
    assert "Gated 'child' failed on rank 1: RuntimeError" in at_initialized
