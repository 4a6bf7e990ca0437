"""The worker process: interrupts aimed at one call, async endpoints, odd exceptions."""

from __future__ import annotations

import time

import pytest
from worker_actors import Raiser, Sleeper, Unpicklable

from monarch_nb import MeshFailure, RemoteError, this_host
from monarch_nb.events import EventLog, RankFailed

pytestmark = pytest.mark.timeout(60)


def test_interrupting_a_queued_call_leaves_the_running_one_alone(procs2):
    sleepers = procs2.slice(procs=0).spawn("queued", Sleeper)
    first = sleepers.sleep.call_one(1.5)
    second = sleepers.sleep.call_one(30)  # queued behind the first on rank 0
    with pytest.raises(KeyboardInterrupt, match="interrupted on rank"):
        second.interrupt(grace=5)
    assert first.get(timeout=10) == "slept"  # not the one we interrupted
    assert procs2.state == "running"  # and nobody was killed
    error = second.exception(timeout=0)
    assert isinstance(error, RemoteError)
    assert "interrupted before it started" in str(error)


def test_an_interrupted_async_endpoint_does_not_resume_inside_a_later_call(procs2):
    sleepers = procs2.slice(procs=1).spawn("async", Sleeper)
    slow = sleepers.slow.call_one()
    deadline = time.monotonic() + 10
    while "slow started" not in [o.line for o in procs2.output_tail(1)]:
        assert time.monotonic() < deadline, "the endpoint never started"
        time.sleep(0.02)
    with pytest.raises(KeyboardInterrupt):
        slow.interrupt(grace=5)
    assert sleepers.other.call_one().get(timeout=10) == ["slow unwound"]


def test_an_exception_whose_str_raises_is_reported_not_fatal(procs2):
    raisers = procs2.spawn("raisers", Raiser)
    with pytest.raises(RemoteError, match="str\\(\\) of the exception failed"):
        raisers.boom.call().get(timeout=10)
    assert procs2.state == "running"


def test_a_broadcast_whose_arguments_cannot_be_unpickled_fails_its_actor_mesh(procs2):
    sleepers = procs2.spawn("bcast", Sleeper)
    sleepers.take.broadcast(Unpicklable())

    def next_call_error() -> BaseException | None:
        return sleepers.take.call(1).exception(timeout=10)

    deadline = time.monotonic() + 10
    while (error := next_call_error()) is None:
        assert time.monotonic() < deadline, "the failed broadcast was not reported"
        time.sleep(0.02)
    assert isinstance(error, MeshFailure)
    assert "broadcast of Sleeper.take failed" in str(error)


def test_stacks_and_interrupts_reach_the_survivors_of_a_failed_mesh(procs2):
    sleepers = procs2.spawn("survivors", Sleeper)
    # Separate calls: a call that included the dead rank would have its share on
    # rank 0 stopped when rank 1 dies (see tests/test_recovery.py).
    survivor = sleepers.slice(procs=0).sleep.call_one(30)
    running = sleepers.slice(procs=1).sleep.call_one(30)
    procs2.kill([1])
    with pytest.raises(MeshFailure):
        running.get(timeout=10)
    stacks = procs2.stacks(timeout=5)
    assert "time.sleep(seconds)" in stacks[0]
    assert stacks[1].startswith("<no stack: the process was killed by signal SIGKILL")
    assert not survivor.done()
    procs2.interrupt([0])
    with pytest.raises(RemoteError, match="KeyboardInterrupt"):
        survivor.get(timeout=10)


SEGFAULT = """
import ctypes

def crash():
    ctypes.string_at(0)  # reads address 0: SIGSEGV

crash()
"""


def test_a_segfault_reports_the_python_stack_of_every_thread():
    procs = this_host().spawn_procs(per_host={"procs": 2}, echo_output=False)
    try:
        log = EventLog()
        with procs.events.subscribe(log, kinds=(RankFailed,)):
            cell = procs.slice(procs=1).exec(SEGFAULT)
            with pytest.raises(
                MeshFailure, match=r"rank 1 .* was killed by signal SIGSEGV"
            ) as info:
                cell.get(timeout=60)
            failed = log.wait_for(RankFailed, timeout=30)
        message = str(info.value)
        assert "its Python stacks when it crashed (faulthandler)" in message
        assert "Fatal Python error: Segmentation fault" in message
        assert 'File "<mesh-cell-' in message
        assert "line 5 in crash" in message
        assert message.count("hread 0x") >= 2  # every thread: main, wire, ...
        assert failed.rank == 1
        assert "line 5 in crash" in failed.traceback  # what the dashboard's panel shows
    finally:
        procs.stop()
