"""The event stream and status snapshots: typed events for everything that watches a mesh."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from process_checks import wait_for_exit
from stress_actors import Sink

from monarch_nb import RankState, RemoteError
from monarch_nb.events import (
    CallFinished,
    CallStarted,
    EventLog,
    Heartbeat,
    MeshFailed,
    RankFailed,
    RankStateChanged,
)

pytestmark = pytest.mark.timeout(60)


def test_a_call_reports_busy_then_idle_and_started_then_finished(procs4):
    sinks = procs4.slice(procs=[1, 2]).spawn("events_sink", Sink)
    sinks.initialized.get(timeout=60)  # the spawn's own events come before the log
    log = EventLog()
    with procs4.events.subscribe(log):
        sinks.take.call(5).get(timeout=10)
        finished = log.wait_for(CallFinished)
        log.wait_for(RankStateChanged, lambda e: e.rank == 2 and e.state is RankState.IDLE)
    started = log.wait_for(CallStarted)
    assert (started.label, started.ranks) == ("Sink.take", (1, 2))
    assert (finished.call_id, finished.error) == (started.call_id, None)
    states = [(e.rank, e.state) for e in log.of(RankStateChanged)]
    assert states.index((1, RankState.BUSY)) < states.index((1, RankState.IDLE))
    assert all(e.mesh == procs4.name for e in log.events)


def test_a_raise_is_reported_with_its_traceback_and_the_rank_shows_failed(procs4):
    log = EventLog()
    with procs4.events.subscribe(log, kinds=(RankFailed, CallFinished)):
        with pytest.raises(RemoteError):
            procs4.slice(procs=3).run("raise ValueError(f'bad {rank}')")
        failed = log.wait_for(RankFailed)
        finished = log.wait_for(CallFinished)
    assert (failed.rank, failed.cause) == (3, "ValueError: bad 3")
    assert "raise ValueError(f'bad {rank}')" in failed.traceback
    assert failed.label.startswith("cell <mesh-cell-")
    assert finished.error.startswith("CellError: cell <mesh-cell-")
    status = procs4.status()
    assert status.rank(3).state is RankState.FAILED
    assert status.rank(3).failure == "ValueError: bad 3"
    procs4.slice(procs=3).run("1")  # the next call clears it: the process was fine all along
    assert procs4.status().rank(3).state is RankState.IDLE


def test_a_killed_rank_is_dead_with_its_signal_within_a_second(procs2):
    log = EventLog()
    with procs2.events.subscribe(log):
        killed_at = time.monotonic()
        procs2.kill([1])
        failed = log.wait_for(RankFailed, timeout=5)
        dead = log.wait_for(RankStateChanged, lambda e: e.state is RankState.DEAD)
    assert time.monotonic() - killed_at < 1.0
    assert (failed.rank, failed.returncode, failed.cause) == (
        1,
        -signal.SIGKILL,
        "was killed by signal SIGKILL",
    )
    assert dead.rank == 1
    # One dead rank is not a failed mesh: rank 0 still takes calls (MeshFailed is
    # for a mesh that failed as a whole; see tests/test_recovery.py).
    assert not log.of(MeshFailed)
    assert procs2.slice(procs=0).run("rank").values() == [0]
    status = procs2.status()
    assert status.state == "failed"
    assert status.rank(1).state is RankState.DEAD
    assert status.rank(1).returncode == -signal.SIGKILL
    assert status.rank(0).state is RankState.IDLE


def test_heartbeats_and_status_flow_while_the_rank_is_busy_in_user_code(procs2):
    # The wire thread answers while the main thread spins in pure Python.
    log = EventLog()
    future = procs2.slice(procs=0).exec(
        "import time\ndeadline = time.monotonic() + 30\nwhile time.monotonic() < deadline: pass"
    )
    with procs2.events.subscribe(log, kinds=(Heartbeat,)):
        beat = log.wait_for(Heartbeat, lambda e: e.rank == 0 and e.work != "", timeout=10)
    assert beat.work.startswith("cell <mesh-cell-")
    assert beat.sample.rss_bytes > 1 << 20
    stacks = procs2.stacks(timeout=5)
    assert "while time.monotonic() < deadline" in stacks[0]
    status = procs2.status()
    busy = status.rank(0)
    assert busy.state is RankState.BUSY
    assert busy.work.startswith("cell <mesh-cell-")
    assert busy.heartbeat_age is not None
    assert busy.heartbeat_age < 5
    assert busy.cpu_percent is None or busy.cpu_percent > 20  # spinning
    assert status.rank(1).state is RankState.IDLE
    procs2.interrupt([0])
    with pytest.raises(RemoteError, match="KeyboardInterrupt"):
        future.get(timeout=10)


def test_an_observer_that_raises_is_logged_and_others_still_run(procs4, caplog):
    log = EventLog()

    def broken(_event):
        raise RuntimeError("observer bug")

    before = len(procs4.events)
    with procs4.events.subscribe(broken), procs4.events.subscribe(log):
        procs4.run("1")
        log.wait_for(CallFinished)
    assert "an event observer failed" in caplog.text
    assert len(procs4.events) == before  # both subscriptions closed


def test_ctrl_c_on_get_in_a_plain_script_interrupts_the_ranks(tmp_path):
    script = tmp_path / "ctrl_c.py"
    script.write_text(
        textwrap.dedent(
            """
            import signal
            import sys
            from monarch_nb import this_host

            # A user's terminal Ctrl-C, whatever the test runner's state was.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            signal.signal(signal.SIGINT, signal.default_int_handler)

            with this_host().spawn_procs(per_host={"procs": 2}) as procs:
                print("pids", *procs.pids, flush=True)
                future = procs.exec(
                    "import time\\n"
                    "try:\\n"
                    "    print('sleeping', flush=True)\\n"
                    "    time.sleep(60)\\n"
                    "except KeyboardInterrupt:\\n"
                    "    print('rank got it', flush=True)\\n"
                    "    raise\\n"
                )
                try:
                    print("controller waiting", flush=True)
                    future.get()
                except KeyboardInterrupt as exc:
                    print(f"controller: {exc}", flush=True)
                    usable = procs.run("'usable'").values()
                    print(f"after: {usable}", flush=True)
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, MONARCH_NB_INTERRUPT_GRACE="10"),
    )
    lines = _lines_of(proc)
    deadline = time.monotonic() + 40  # of the test's 60 s: the rest for py-spy below
    pids: set[int] = set()
    try:
        first = lines.get(timeout=40)
        assert first.startswith("pids"), first
        pids = {int(p) for p in first.split()[1:]}
        # Both ranks asleep (an earlier interrupt is ignored), and the controller in
        # get(): on a loaded machine the ranks can start before exec() has returned.
        # By content, not whole lines: the script's print() and the ranks' output
        # (printed by the controller's I/O thread) share stdout and can interleave
        # within a line ("controller waiting[1] sleeping"); the script prints each
        # line as one string, so a text itself is never split.
        waiting = ("[0] sleeping", "[1] sleeping", "controller waiting")
        seen = ""
        while not all(text in seen for text in waiting):
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                # Say what came and where everyone waits, rather than time out blind.
                stacks = _stacks(proc, pids)
                pytest.fail(f"no sleep on every rank in 40 s; output: {seen!r}\n{stacks}")
            assert line, f"the script ended before both ranks slept: {seen!r}"
            seen += line
    except BaseException:
        proc.kill()
        for pid in pids:
            _kill_quietly(pid)
        proc.wait()
        raise
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        # Say where everyone waits, then leave nothing behind for later tests.
        stacks = _stacks(proc, pids)
        proc.kill()
        for pid in pids:
            _kill_quietly(pid)
        proc.wait()
        so_far = "".join(iter(lines.get, ""))
        pytest.fail(f"the script did not end within 60 s of Ctrl-C; output: {so_far!r}\n{stacks}")
    out = "".join(iter(lines.get, ""))
    assert proc.returncode == 0, out
    assert out.count("rank got it") == 2
    assert "interrupted on rank(s) 0-1; the mesh is usable" in out
    assert "after: ['usable', 'usable']" in out
    assert not wait_for_exit(pids, 5.0)


def _lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """``proc``'s output lines as they come ("" once it ends), read on a thread so
    a test can wait for them with a deadline."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _stacks(proc: subprocess.Popen[str], pids: set[int]) -> str:
    """Every process's Python stacks by py-spy (where it is installed)."""
    from monarch_nb._services import _py_spy

    py_spy = _py_spy.find()
    if py_spy is None:
        return "(py-spy is not installed: no stacks)"
    dumps = []
    for pid in (proc.pid, *sorted(pids)):
        run = subprocess.run(
            [py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        )
        dumps.append(run.stdout + run.stderr)
    return "\n".join(dumps)


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def test_events_nobody_takes_are_not_built():
    from monarch_nb._controller._events import EventStream, Output

    stream = EventStream("m")
    assert not stream.wants(Output)
    assert not stream.observed
    assert not stream
    with stream.subscribe(print, kinds=(Output,)):
        assert stream.wants(Output)
        assert stream.observed
        assert stream
        assert not stream.wants(RankStateChanged)
        assert not stream.calls_observed  # a call and its reply build no event
        with stream.subscribe(print):
            assert stream.wants(RankStateChanged)
            assert stream.calls_observed
        assert not stream.wants(RankStateChanged)
        assert stream.observed
        for kind in (CallStarted, CallFinished, RankStateChanged):
            with stream.subscribe(print, kinds=(kind,)):
                assert stream.calls_observed, kind
        assert not stream.calls_observed
    assert not stream.wants(Output)
    assert not stream.observed
    assert not stream


def test_a_call_whose_events_nobody_takes_does_not_wake_the_io_thread(procs4, monkeypatch):
    # procs4 prints its ranks' output: an observer of Output only. A call queues
    # no event anyone takes, so nothing should be handed to the I/O thread for
    # it: a hand-off of an empty event queue cost every call a thread switch.
    from monarch_nb._controller._client import Controller

    assert not procs4.events.wants(CallStarted)
    sink = procs4.slice(procs=0).spawn("wake_sink", Sink)
    sink.take.call_one(0).get(timeout=30)
    handed = _record_hand_offs(Controller.get().loop, monkeypatch)
    for i in range(100):
        assert sink.take.call_one(i).get(timeout=30) == i
    assert not [h for h in handed if h.startswith("EventStream.")]
    # With an observer of calls starting, their events are queued and handed on.
    log = EventLog()
    with procs4.events.subscribe(log, kinds=(CallStarted,)):
        sink.take.call_one(1).get(timeout=30)
        log.wait_for(CallStarted)
    assert "EventStream._run_batched_drain" in handed


def _record_hand_offs(loop, monkeypatch) -> list[str]:
    """The callbacks handed to the I/O thread from now on, by name (and when)."""
    handed: list[str] = []
    for name in ("call_soon", "call_soon_batched"):
        real = getattr(loop, name)

        def recording(callback, real=real):
            handed.append(getattr(callback, "__qualname__", repr(callback)))
            real(callback)

        monkeypatch.setattr(loop, name, recording)
    return handed


def test_the_events_of_a_run_of_calls_reach_observers_in_batches_and_in_order(procs4, monkeypatch):
    # A dashboard observes every call's events (started, finished, busy, idle).
    # Handed to the I/O thread one by one they woke it twice per call; batched,
    # it wakes once per batch window however many calls ran, and every event
    # still arrives, in order.
    from monarch_nb._controller._client import Controller
    from monarch_nb._controller._io_loop import BATCH_S

    sink = procs4.slice(procs=0).spawn("batch_sink", Sink)
    sink.take.call_one(0).get(timeout=30)
    log = EventLog()
    with procs4.events.subscribe(log, kinds=(CallStarted, CallFinished, RankStateChanged)):
        handed = _record_hand_offs(Controller.get().loop, monkeypatch)
        calls = 200
        started = time.monotonic()
        ids = [sink.take.call_one(i) for i in range(calls)]  # pipelined, then one by one
        for i, future in enumerate(ids):
            assert future.get(timeout=30) == i
        for i in range(calls):
            assert sink.take.call_one(i).get(timeout=30) == i
        log.wait_for(
            CallFinished,
            lambda _: sum(e.label == "Sink.take" for e in log.of(CallFinished)) >= 2 * calls,
            timeout=30,
        )
        elapsed = time.monotonic() - started
    batches = handed.count("EventStream._run_batched_drain")
    assert batches >= 1
    # At most one batch per window (the first may begin at once), never one per event.
    assert batches <= elapsed / BATCH_S + 2, (batches, elapsed)
    assert "EventStream._run_drain" not in handed
    ours = [e for e in log.events if getattr(e, "label", None) == "Sink.take"]
    finished = [e.call_id for e in ours if isinstance(e, CallFinished)]
    begun = [e.call_id for e in ours if isinstance(e, CallStarted)]
    assert len(finished) == len(begun) == 2 * calls
    assert finished == sorted(finished)
    assert begun == sorted(begun)
    # Each call's start is seen before its end.
    order = {
        (type(e), e.call_id): n for n, e in enumerate(ours) if not isinstance(e, RankStateChanged)
    }
    assert all(order[(CallStarted, c)] < order[(CallFinished, c)] for c in finished)
