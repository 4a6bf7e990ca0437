"""A caller waiting in get() receives its replies itself; the I/O thread keeps the rest."""

from __future__ import annotations

import os
import threading

import pytest
from process_checks import voluntary_switches
from worker_actors import Raiser, Sleeper, WireWatcher

from monarch_nb import RemoteError
from monarch_nb._controller._client import Controller
from monarch_nb.events import EventLog, RankFailed

pytestmark = pytest.mark.timeout(120)


def test_a_run_of_calls_is_received_by_the_caller_not_the_io_thread(procs2):
    watcher = procs2.slice(procs=0).spawn("io_watcher", WireWatcher)
    watcher.noop.call_one().get(timeout=30)
    controller = Controller.get()
    io_thread = controller.loop._thread.native_id
    assert io_thread is not None
    before = controller.stats.replies_to_callers
    switches_before = voluntary_switches(os.getpid(), io_thread)
    calls = 300
    for _ in range(calls):
        assert watcher.noop.call_one().get(timeout=30) is None
    by_caller = controller.stats.replies_to_callers - before
    woke = voluntary_switches(os.getpid(), io_thread) - switches_before
    # The I/O thread polls the workers' socket again at its timer (50 times a
    # second) and may then take a reply that came while the caller was not yet
    # waiting (a loaded machine preempts it between send and get); most replies
    # reach the caller directly. Before, every one went through the I/O thread.
    assert by_caller >= calls * 2 // 3, (
        f"callers took {by_caller} of {calls} replies (the I/O thread woke {woke} times)"
    )


def test_callers_on_several_threads_each_get_their_own_replies(procs2):
    sleepers = procs2.spawn("many_callers", Sleeper)
    errors: list[BaseException] = []

    def caller(index: int) -> None:
        try:
            for i in range(100):
                value = (index, i)
                assert sleepers.slice(procs=index % 2).take.call_one(value).get(timeout=60) == value
                assert sleepers.take.call(value).get(timeout=60).values() == [value, value]
        except BaseException as exc:  # reported below, with the thread's index
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=100)
    assert not any(t.is_alive() for t in threads), "a caller never got its reply"
    assert errors == []


def test_what_is_not_a_reply_still_reaches_the_io_thread_while_a_caller_receives(procs2):
    # The main thread waits (and receives) through a 5 s call; meanwhile another
    # call's failure and the ranks' heartbeats must be handled as usual, not when
    # it stops receiving.
    sleepers = procs2.slice(procs=0).spawn("long_wait", Sleeper)
    raisers = procs2.slice(procs=1).spawn("raise_meanwhile", Raiser)
    log = EventLog()
    seen: dict[str, object] = {}

    def watch() -> None:
        seen["event"] = log.wait_for(RankFailed, timeout=60)
        seen["slow_done_then"] = slow.done()

    with procs2.events.subscribe(log):
        slow = sleepers.sleep.call_one(5)
        failing = raisers.boom.call()
        watcher = threading.Thread(target=watch)
        watcher.start()
        assert slow.get(timeout=60) == "slept"
        watcher.join(timeout=60)
        with pytest.raises(RemoteError):
            failing.get(timeout=60)
    assert seen["slow_done_then"] is False, "the failure was handled only after the wait"
    ages = [rank.heartbeat_age for rank in procs2.status().ranks]
    assert all(age is not None and age < 5 for age in ages), ages


def test_a_timeout_while_receiving_names_the_silent_ranks_and_leaves_the_call_running(procs2):
    sleepers = procs2.slice(procs=0).spawn("timed_out", Sleeper)
    slow = sleepers.sleep.call_one(3)
    with pytest.raises(TimeoutError, match=r"got no reply from rank\(s\) 0 within 0.5 s"):
        slow.get(timeout=0.5)
    assert slow.get(timeout=60) == "slept"  # received by a later wait


def test_ctrl_c_while_a_caller_receives_interrupts_the_call_and_puts_the_handler_back(procs2):
    # The receiving main thread holds Ctrl-C until it is between batches (raised
    # mid-batch it would lose replies), then raises it through the handler that
    # was installed: get() interrupts the call, as without the receive path.
    import signal
    import time

    sleepers = procs2.slice(procs=0).spawn("interrupted_wait", Sleeper)
    assert sleepers.take.call_one(1).get(timeout=30) == 1
    old_mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    ctrl_c = threading.Timer(0.5, signal.pthread_kill, (threading.get_ident(), signal.SIGINT))
    try:
        slow = sleepers.sleep.call_one(60)
        ctrl_c.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt, match=r"Sleeper.sleep interrupted on rank\(s\) 0"):
            slow.get(timeout=90)
        assert time.monotonic() - started < 45, "Ctrl-C did not stop the wait"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert Controller.get().stats.replies_to_callers > 0
        assert sleepers.take.call_one(2).get(timeout=30) == 2  # the rank answers again
    finally:
        ctrl_c.cancel()
        signal.signal(signal.SIGINT, old_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
