"""The worker process: interrupts aimed at one call, async endpoints, odd exceptions."""

from __future__ import annotations

import os
import signal
import time

import pytest
from process_checks import voluntary_switches
from worker_actors import (
    AsyncSleeper,
    LookupRaiser,
    Raiser,
    Sleeper,
    SlowSampler,
    Unpicklable,
    WireWatcher,
)

from monarch_nb import MeshFailure, RemoteError, this_host
from monarch_nb.events import EventLog, RankFailed, RankState

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
    sleepers = procs2.slice(procs=1).spawn("async", AsyncSleeper)
    slow = sleepers.slow.call_one()
    deadline = time.monotonic() + 10
    while "slow started" not in [o.line for o in procs2.output_tail(1)]:
        assert time.monotonic() < deadline, "the endpoint never started"
        time.sleep(0.02)
    with pytest.raises(KeyboardInterrupt):
        slow.interrupt(grace=5)
    assert sleepers.other.call_one().get(timeout=10) == ["slow unwound"]


def test_an_idle_rank_takes_calls_on_its_main_thread_without_waking_the_wire_thread(procs2):
    # The main thread waits on the socket itself while idle, so a call costs no
    # hand-off between threads: the wire thread sleeps through a run of calls,
    # waking only for its timers (heartbeats, the controller watch).
    watcher = procs2.slice(procs=0).spawn("wire_watcher", WireWatcher)
    pid, wire = watcher.wire_thread.call_one().get(timeout=30)
    before, started = voluntary_switches(pid, wire), time.monotonic()
    calls = 300
    for _ in range(calls):
        watcher.noop.call_one().get(timeout=30)
    woke = voluntary_switches(pid, wire) - before
    # Its timers wake it 5 times a second, each wake-up maybe a few switches (the
    # GIL, the drain lock); before, it woke for every call.
    allowed = calls // 4 + 20 * (time.monotonic() - started)
    assert woke < allowed, f"the wire thread woke {woke} times for {calls} calls"
    # Messages that come while the main thread is busy in user code still get
    # through: the wire thread takes the socket back (it answers a status query
    # with the running call's stack, and an interrupt stops that call, long before
    # the grace period would end in a kill).
    rank0 = procs2.slice(procs=0)
    sleeper = rank0.spawn("busy_sleeper", Sleeper)
    running = sleeper.sleep.call_one(60)
    deadline = time.monotonic() + 30
    while "time.sleep(seconds)" not in rank0.stacks(timeout=10).get(0, ""):
        assert time.monotonic() < deadline, "the rank never showed the running call's stack"
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        running.interrupt(grace=30)
    assert time.monotonic() - began < 15, "the interrupt reached the rank only by its kill"
    assert procs2.state == "running"


def test_an_idle_rank_answers_a_call_behind_a_burst_of_control_messages(monkeypatch):
    # The idle main thread drains at most a batch of messages before it runs the
    # first piece of work. A batch that held no work (here one interrupt of a call
    # long answered, then its replays, which the rank drops) must not leave the
    # rest, and the call after them, waiting for a notice the socket's
    # edge-triggered fd gave only once. Heartbeats and the idle recheck far apart:
    # each also makes the rank look again, which would hide the wait.
    monkeypatch.setenv("MONARCH_NB_IDLE_RECHECK_MS", str(600_000))
    from monarch_nb import config
    from monarch_nb._wire._messages import Interrupt

    with config.configured(heartbeat=600), this_host().spawn_procs(per_host={"procs": 1}) as procs:
        watcher = procs.spawn("burst_watcher", WireWatcher)
        watcher.noop.call_one().get(timeout=30)  # idle from here on
        group = procs._group
        burst = group.signer.encode(Interrupt(10**9))
        group.controller.send(group, [0] * 500, burst, even_if_failed=True)  # one seal
        assert watcher.noop.call_one().get(timeout=30) is None


# 100 fit one parse; 1000 are parsed a few hundred at a time (the link stops
# each read there): the rest waits in the link's own buffer.
@pytest.mark.parametrize("calls", [100, 1000])
def test_an_idle_rank_runs_every_call_of_a_burst_it_read_in_one_go(monkeypatch, calls):
    # An idle rank polls its socket, and on a Unix link polls without draining
    # first when nothing waits read (the fd is level-triggered). A burst read in
    # one go is parsed whole, but a drain hands on a batch of it: the rest waits
    # in the rank, where no poll of the socket announces it. The rank must look
    # there before it polls again. The rank is stopped while the burst is sent
    # (the calls held behind the first written too), so that it reads it at
    # once; the idle recheck is far off, which would otherwise hide the wait.
    monkeypatch.setenv("MONARCH_NB_IDLE_RECHECK_MS", str(600_000))
    from monarch_nb import config

    with config.configured(heartbeat=600), this_host().spawn_procs(per_host={"procs": 1}) as procs:
        watcher = procs.spawn("burst_reader", WireWatcher)
        watcher.noop.call_one().get(timeout=30)  # idle from here on
        (pid,) = procs.pids
        os.kill(pid, signal.SIGSTOP)
        try:
            futures = [watcher.echo.call_one(i) for i in range(calls)]
            procs._group.controller.caller_waits()  # the held ones written now, not at SIGCONT
        finally:
            os.kill(pid, signal.SIGCONT)
        assert [f.get(timeout=30) for f in futures] == list(range(calls))


def test_a_heartbeat_never_says_a_rank_runs_a_call_whose_reply_it_sent():
    # A heartbeat read what the main thread ran, then its resources (file reads,
    # during which the main thread ran on, finished the call and sent the reply),
    # then went out after the reply: the controller saw the rank busy in a call it
    # had answered, until the next heartbeat (a `%mesh start` status showed a
    # rank busy in its finished dist setup). Slow resource reads make it likely.
    from monarch_nb import config

    with config.configured(heartbeat=0.02), this_host().spawn_procs(per_host={"procs": 1}) as procs:
        sampler = procs.spawn("slow_sampler", SlowSampler)
        sampler.slow_samples.call_one(0.05).get(timeout=30)
        for _ in range(8):
            sampler.work.call_one(0.03).get(timeout=30)
            replied = time.monotonic()
            deadline = replied + 30
            while True:  # the first heartbeat the controller took after the reply
                rank = procs.status().ranks[0]
                age = rank.heartbeat_age
                if age is not None and age < time.monotonic() - replied:
                    break
                assert time.monotonic() < deadline, "no heartbeat after the reply"
                time.sleep(0.005)
            assert rank.state is RankState.IDLE, (rank.state, rank.work)


def test_an_exception_whose_str_raises_is_reported_not_fatal(procs2):
    raisers = procs2.spawn("raisers", Raiser)
    with pytest.raises(RemoteError, match="str\\(\\) of the exception failed"):
        raisers.boom.call().get(timeout=10)
    assert procs2.state == "running"


def test_an_endpoint_whose_lookup_raises_fails_its_call_not_the_rank(procs2):
    # Finding the endpoint on the actor runs the actor's own code (a property,
    # __getattribute__): what it raises is the call's error, and the rank, with
    # its other endpoints, stays.
    actors = procs2.spawn("lookup_raiser", LookupRaiser)
    with pytest.raises(RemoteError, match="looking up guarded failed") as failed:
        actors.guarded.call().get(timeout=30)
    assert "LookupRaiser.guarded" in str(failed.value)
    assert actors.fine.call().get(timeout=30).values() == [2, 2]
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


def test_a_status_asked_as_a_call_arrives_describes_the_call(procs2):
    # The idle main thread receives for itself. Stopped while a call and then a
    # status query queue up, it takes both in one batch when it resumes: the
    # answer must describe the call (its stack in user code), not the drain
    # that took it.
    import os
    import signal
    import threading

    from monarch_nb._controller._client import Controller

    sleepers = procs2.slice(procs=0).spawn("asked_while_queued", Sleeper)
    assert sleepers.take.call_one(1).get(timeout=30) == 1
    rank0 = procs2.pids[0]
    os.kill(rank0, signal.SIGSTOP)
    try:
        call = sleepers.sleep.call_one(30)
        stats = Controller.get().stats
        sent_before = stats.sent
        answers = []
        asker = threading.Thread(
            target=lambda: answers.append(procs2.slice(procs=0).stacks(timeout=30))
        )
        asker.start()
        deadline = time.monotonic() + 30
        while stats.sent == sent_before and time.monotonic() < deadline:
            time.sleep(0.005)  # until the query is on its way (not a timing assumption)
        assert stats.sent > sent_before, "stacks() sent no query"
    finally:
        os.kill(rank0, signal.SIGCONT)
    asker.join(60)
    assert answers, "no status came back"
    assert "time.sleep(seconds)" in answers[0][0], answers[0][0]
    procs2.interrupt([0])
    with pytest.raises(RemoteError, match="KeyboardInterrupt"):
        call.get(timeout=30)


def test_a_message_whose_handling_raises_does_not_lose_the_ones_taken_with_it(procs2):
    # A rank drains the messages waiting as one batch. One whose handling raises
    # (a bug in a control handler: the drain's callers say it and go on) must not
    # take the rest of the batch with it: here a call, queued behind it.
    import os
    import signal

    from monarch_nb._wire._messages import CommToRank

    procs2.slice(procs=0).run(
        "from monarch_nb._worker import _comms\n"
        "from monarch_nb._wire._messages import CommToRank\n"
        "def _broken(message):\n"
        "    raise RuntimeError('a broken control handler')\n"
        "_comms._worker.wire.control_handlers[CommToRank] = _broken\n",
        timeout=30,
    )
    sleepers = procs2.slice(procs=0).spawn("behind_a_broken_one", Sleeper)
    assert sleepers.take.call_one(1).get(timeout=30) == 1
    group = procs2._group
    rank0 = procs2.pids[0]
    os.kill(rank0, signal.SIGSTOP)  # both arrive before it looks: one batch
    try:
        broken = group.signer.encode(CommToRank("nobody", "comm_msg", {}, ()))
        group.controller.send(group, [0], broken)
        call = sleepers.take.call_one(2)
    finally:
        os.kill(rank0, signal.SIGCONT)
    assert call.get(timeout=30) == 2
    # ...and at once: not after the idle rank's 1 s recheck (a lost wake-up).
    missed = procs2.slice(procs=0).run(
        "from monarch_nb._worker import _comms\n_comms._worker.signer.stats.missed_wakeups",
        timeout=30,
    )
    assert missed.values() == [0]


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
