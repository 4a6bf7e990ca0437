"""Calls in flight: every future completes exactly once, whoever races to complete it."""

from __future__ import annotations

import threading
import time

import pytest

from monarch_nb import CallCancelled, MeshFailure, Shape
from monarch_nb._controller._calls import PendingCall

pytestmark = pytest.mark.timeout(120)

CALLS = 10_000


def _race(calls: list[PendingCall], *racers) -> None:
    start = threading.Barrier(len(racers))

    def run(racer):
        start.wait()
        racer()

    threads = [threading.Thread(target=run, args=(r,)) for r in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_completion_failure_and_cancellation_race_and_each_future_completes_once():
    shape = Shape.from_sizes({"procs": 2})
    calls = [PendingCall(i, shape, actor="Racer", endpoint="go") for i in range(CALLS)]
    completions = [0] * CALLS
    for i, call in enumerate(calls):

        def count(_fut, i=i):
            completions[i] += 1

        call.future.add_done_callback(count)

    def replies():  # the I/O thread's part
        for call in calls:
            call.add_value(0, "a")
            call.add_value(1, "b")

    def failures():  # stop() on a caller's thread
        for call in reversed(calls):
            call.fail(MeshFailure("stopped", ranks=(0, 1)))

    def cancels():  # a caller giving up
        for call in calls[::3]:
            call.future.cancel()

    _race(calls, replies, failures, cancels)
    assert completions == [1] * CALLS
    outcomes = {"value": 0, "failure": 0, "cancelled": 0}
    for call in calls:
        error = call.future.exception(timeout=0)
        if error is None:
            assert call.future.get(timeout=0).values() == ["a", "b"]
            outcomes["value"] += 1
        elif isinstance(error, CallCancelled):
            outcomes["cancelled"] += 1
        else:
            assert isinstance(error, MeshFailure)
            outcomes["failure"] += 1
    assert sum(outcomes.values()) == CALLS


def test_stopping_a_mesh_under_a_flood_of_calls_completes_every_future_once():
    from stress_actors import Sink

    from monarch_nb import this_host

    with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        sinks = procs.spawn("sink", Sink)
        futures = []
        counts: list[int] = []
        lock = threading.Lock()

        def count(_fut, index):
            with lock:
                counts[index] += 1

        sent = threading.Event()

        def flood():
            for i in range(CALLS):
                fut = sinks.take.call(i)
                counts.append(0)
                fut.add_done_callback(lambda f, i=i: count(f, i))
                futures.append(fut)
                if i == CALLS // 2:
                    sent.set()

        flooder = threading.Thread(target=flood)
        flooder.start()
        assert sent.wait(60)
        procs.stop()  # races the replies still arriving and the calls still being sent
        flooder.join()
    for fut in futures:
        fut.exception(timeout=60)
    assert counts == [1] * CALLS
    assert _in_flight(procs) == 0  # every call's load on its ranks was taken back
    values = [f for f in futures if f.exception(timeout=0) is None]
    failed = [f for f in futures if isinstance(f.exception(timeout=0), MeshFailure)]
    assert len(values) + len(failed) == CALLS
    # How many calls returned before the stop depends on the machine's load (on a
    # busy one, none may have): only that each one that did carries both replies.
    for fut in values[:50]:
        assert len(fut.get(timeout=0)) == 2


def _in_flight(procs) -> int:
    group = procs._group  # the controller's per-rank load counters of this mesh
    return sum(n for (gid, _), n in group.controller.outstanding.items() if gid == group.id)


def test_calls_racing_a_restart_each_complete_and_leave_no_load_behind():
    from monarch_nb import this_host

    with this_host().spawn_procs(per_host={"procs": 2}, echo_output=False) as procs:
        futures = []
        stop = threading.Event()

        def caller():
            while not stop.is_set():
                futures.append(procs.exec("1"))

        thread = threading.Thread(target=caller)
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while not any(f.done() and f.exception(timeout=0) is None for f in list(futures)):
                assert time.monotonic() < deadline, "no call returned before the restarts"
                time.sleep(0.01)
            for _ in range(3):
                procs.restart()
        finally:
            stop.set()
            thread.join()
        outcomes = {"value": 0, "refused": 0}
        for fut in futures:
            error = fut.exception(timeout=30)  # none may hang
            if error is None:
                outcomes["value"] += 1
            else:
                assert isinstance(error, MeshFailure), error
                outcomes["refused"] += 1
        assert outcomes["value"] > 0
        assert _in_flight(procs) == 0
        assert procs.run("'after'").values() == ["after", "after"]


def test_a_reply_completing_a_call_and_one_to_a_cancelled_call_each_leave_no_load(tmp_path):
    """The last reply of a call ends its rank's load and the call in one step;
    a reply to a call already cancelled only records that the rank answered.
    Either way nothing stays in flight, and the timeline says how each ended."""
    from stress_actors import Gate

    from monarch_nb import this_host

    gate_file = str(tmp_path / "open")
    with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        gates = procs.spawn("gate", Gate)
        held = gates.wait.call(gate_file)
        assert held.cancel()
        queued = gates.slice(procs=0).wait.call_one(gate_file)  # behind the cancelled one
        both = gates.wait.call(gate_file)
        with open(gate_file, "w"):
            pass
        assert queued.get(timeout=60) == "open"
        assert both.get(timeout=60).values() == ["open", "open"]
        group = procs._group
        deadline = time.monotonic() + 60
        while _in_flight(procs) or any(c.group is group for c in group.controller._calls.values()):
            assert time.monotonic() < deadline, "a call's load was never taken back"
            time.sleep(0.01)
        spans = group.timeline.timeline([0, 1], since=0).spans
        outcomes = sorted((s.call_id, s.rank, s.outcome) for s in spans if s.label == "Gate.wait")
        held_id = min(call_id for call_id, _, _ in outcomes)
        assert [(rank, outcome) for _, rank, outcome in outcomes] == [
            (0, "cancelled"),
            (1, "cancelled"),
            (0, "ok"),  # the one-rank call
            (0, "ok"),
            (1, "ok"),
        ]
        assert outcomes[0][0] == held_id
