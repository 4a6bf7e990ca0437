"""Faults: ranks killed or stopped mid-call, mid-cell, mid-collective, mid-read;
the controller killed; a rank out of memory. Each fault is detected fast, loses
no call that returned, leaves no process behind, and ``restart()`` recovers."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from chaos_actors import Collective, Probe
from chaos_support import wait_until
from process_checks import wait_for_exit

from monarch_nb import CallTimeout, MeshFailure, RemoteError, this_host

# A SIGKILLed rank must fail the call waiting on it within a second (README);
# twice that here, since this suite shares 2 cores with other tests.
DETECTION_LIMIT_S = 2.0


def kill_and_time(procs, rank: int, future, sig: int = signal.SIGKILL) -> tuple[float, Exception]:
    """Send ``sig`` to ``rank``; seconds until ``future`` raised, and what it raised."""
    pid = procs.pids[rank]
    t0 = time.monotonic()
    os.kill(pid, sig)
    with pytest.raises(MeshFailure) as info:
        future.get(timeout=10)
    return time.monotonic() - t0, info.value


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_of_a_random_rank_mid_call_is_detected_fast_and_restart_recovers(procs3, seed):
    rank = random.Random(seed).randrange(3)
    probe = procs3.spawn("probe", Probe)
    old_pids = set(probe.pid.call().get(timeout=10).values())
    busy = probe.sleep.call(30)
    wait_until(lambda: procs3.busy_ranks() == [0, 1, 2], 5, "every rank busy")

    elapsed, error = kill_and_time(procs3, rank, busy)

    assert elapsed < DETECTION_LIMIT_S
    assert error.ranks == (rank,)
    assert f"rank {rank} (pid " in str(error)
    assert "SIGKILL" in str(error)
    assert "Probe.sleep" in str(error)
    assert procs3.state == "failed"
    with pytest.raises(MeshFailure, match=r"call restart\(\)"):
        probe.rank.call().get(timeout=5)

    procs3.restart()
    assert not wait_for_exit(old_pids, 5), "processes of the failed generation survived"
    probe = procs3.spawn("probe", Probe)
    assert probe.rank.call().get(timeout=10).values() == [0, 1, 2]


def test_no_call_that_returned_is_lost_when_a_rank_dies_mid_stream(procs3):
    probe = procs3.spawn("probe", Probe)
    victim = 1
    per_rank = {r: probe.slice(procs=r) for r in range(3)}
    futures = [(r, i, per_rank[r].echo.call_one(i)) for i in range(200) for r in range(3)]
    last = per_rank[victim].sleep.call_one(30)  # keeps the victim busy until it dies
    wait_until(lambda: all(f.done() for _, _, f in futures), 10, "every echo to return")
    kill_and_time(procs3, victim, last)

    for rank, i, future in futures:
        assert future.done(), (rank, i)  # nothing left hanging
        assert future.get(timeout=0) == i  # every echo returned before the kill, intact
    # A stream cut by the kill: each future either has its value or a MeshFailure.
    procs3.restart()
    probe = procs3.spawn("probe", Probe)
    cut = [probe.slice(procs=r).echo.call_one(i) for i in range(100) for r in range(3)]
    os.kill(procs3.pids[victim], signal.SIGKILL)
    returned = failed = 0
    for n, future in enumerate(cut):
        try:
            assert future.get(timeout=10) == n // 3
            returned += 1
        except MeshFailure:
            failed += 1
    assert returned + failed == len(cut)


def test_sigstop_of_a_rank_times_out_naming_it_and_sigcont_loses_nothing(procs3):
    probe = procs3.spawn("probe", Probe)
    pid = procs3.pids[2]
    os.kill(pid, signal.SIGSTOP)
    try:
        call = probe.rank.call()
        with pytest.raises(CallTimeout, match=r"got no reply from rank\(s\) 2 within"):
            call.get(timeout=0.5)
        assert call.waiting_ranks() == [2]
        assert procs3.state == "running"  # stopped is not dead: no false failure
    finally:
        os.kill(pid, signal.SIGCONT)
    assert call.get(timeout=10).values() == [0, 1, 2]
    assert probe.rank.call().get(timeout=10).values() == [0, 1, 2]


def test_a_timeout_names_the_stopped_rank_not_the_ones_waiting_for_it(procs3):
    # As in an all-reduce: ranks 0 and 1 are busy (here sleeping), rank 2 is
    # stopped. All three owe a reply; only rank 2 is silent, and the error says so.
    probe = procs3.spawn("probe", Probe)
    pid = procs3.pids[2]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: 2 in procs3._group.silent_ranks([2]),
            30,
            "rank 2's heartbeats to stop",
        )
        call = probe.sleep.call(5)
        with pytest.raises(CallTimeout) as caught:
            call.get(timeout=0.5)
        assert caught.value.ranks == (0, 1, 2)
        assert caught.value.silent == (2,)
        message = str(caught.value)
        assert "no heartbeat from rank 2 for" in message
        assert "rank(s) 0-1 are alive, most likely waiting for the silent one(s)" in message
    finally:
        os.kill(pid, signal.SIGCONT)
    assert call.get(timeout=60).values() == [0, 1, 2]


def test_a_stopped_rank_can_be_killed_and_the_mesh_restarted(procs3):
    probe = procs3.spawn("probe", Probe)
    pid = procs3.pids[0]
    os.kill(pid, signal.SIGSTOP)
    call = probe.rank.call()
    with pytest.raises(CallTimeout):
        call.get(timeout=0.3)
    procs3.kill([0])  # what a user does about a rank stuck for good
    with pytest.raises(MeshFailure, match="SIGKILL"):
        call.get(timeout=5)
    procs3.restart()
    assert not wait_for_exit({pid}, 5)
    assert procs3.spawn("probe", Probe).rank.call().get(timeout=10).values() == [0, 1, 2]


def test_sigkill_during_a_cell_fails_it_and_names_the_rank(procs3):
    cell = procs3.exec("import time\ntime.sleep(30)\nrank")
    wait_until(lambda: len(procs3.busy_ranks()) == 3, 5, "the cell to start")
    elapsed, error = kill_and_time(procs3, 0, cell)
    assert elapsed < DETECTION_LIMIT_S
    assert error.ranks == (0,)
    assert "cell" in str(error)
    procs3.restart()
    assert procs3.run("rank").values() == [0, 1, 2]


def test_rdma_read_from_an_owner_killed_mid_session_fails_clearly(procs3):
    from monarch_nb.native import RDMABuffer
    from monarch_nb.native._errors import RDMAError

    probe = procs3.spawn("probe", Probe)
    handle = probe.slice(procs=1).rdma_region.call_one(1 << 20).get(timeout=10)
    assert isinstance(handle, RDMABuffer)
    first = bytearray(1 << 20)
    handle.read_into(first).get(timeout=10)
    os.kill(procs3.pids[1], signal.SIGKILL)
    wait_until(lambda: procs3.state == "failed", 5, "the owner's death to be seen")
    with pytest.raises(RDMAError, match="owner"):
        handle.read_into(bytearray(1 << 20)).get(timeout=10)
    procs3.restart()


@pytest.mark.slow
def test_sigkill_of_a_rank_blocked_in_a_gloo_all_reduce():
    pytest.importorskip("torch")
    with this_host().spawn_procs(per_host={"procs": 2}, name="gloo", echo_output=False) as procs:
        ring = procs.spawn("ring", Collective)  # init_process_group("gloo") on each rank
        assert ring.all_reduce.call(1.0).get(timeout=60).values() == [2.0, 2.0]
        pids = set(procs.pids)
        blocked = ring.slice(procs=0).all_reduce.call_one(1.0)  # waits in C for rank 1
        wait_until(lambda: procs.busy_ranks() == [0], 5, "rank 0 to enter all_reduce")
        t0 = time.monotonic()
        os.kill(procs.pids[1], signal.SIGKILL)
        # Two true stories race here: the mesh fails for rank 1's death, or rank
        # 0's gloo sees the connection reset first and raises. Either way the
        # mesh must name rank 1 as dead within the limit.
        with pytest.raises((MeshFailure, RemoteError)):
            blocked.get(timeout=10)
        wait_until(lambda: procs.failure is not None, DETECTION_LIMIT_S, "the mesh to fail")
        assert time.monotonic() - t0 < DETECTION_LIMIT_S
        assert procs.failure.ranks == (1,)
        procs.restart()  # rank 0 may be stuck inside gloo: restart must kill it
        assert not wait_for_exit(pids, 5)
        assert procs.spawn("probe", Probe).rank.call().get(timeout=10).values() == [0, 1]


_CONTROLLER = textwrap.dedent(
    """
    import json, sys
    from chaos_actors import Probe
    from monarch_nb import this_host

    procs = this_host().spawn_procs(per_host={"procs": 3})
    probe = procs.spawn("probe", Probe)
    print(json.dumps(procs.pids), flush=True)
    probe.sleep.call(60).get()
    """
)


def test_controller_sigkill_leaves_no_orphans():
    controller = subprocess.Popen(
        [sys.executable, "-c", _CONTROLLER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert controller.stdout is not None
        pids = set(json.loads(controller.stdout.readline()))
        assert len(pids) == 3
        t0 = time.monotonic()
        controller.kill()
        controller.wait(10)
        left = wait_for_exit(pids, 5)
        elapsed = time.monotonic() - t0
    finally:
        controller.kill()
        controller.wait(10)
        controller.stdout.close()
    assert not left, f"orphans of a SIGKILLed controller: {sorted(left)}"
    assert elapsed < 3.0


def test_a_rank_out_of_memory_raises_memoryerror_and_the_mesh_survives(procs3):
    probe = procs3.spawn("probe", Probe)
    with pytest.raises(RemoteError, match=r"Probe.allocate_under_limit failed on rank 1") as info:
        probe.slice(procs=1).allocate_under_limit.call_one(64 << 20, 1 << 30).get(timeout=20)
    assert "MemoryError" in str(info.value)
    assert probe.rank.call().get(timeout=10).values() == [0, 1, 2]
