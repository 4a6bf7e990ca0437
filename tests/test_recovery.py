"""Partial failure and restarts: a dead rank fails only the calls that include it,
the survivors keep their state, ``restart(ranks=...)`` and ``RestartPolicy``
bring it back, and collectives that included it fail instead of hanging.

Every test that kills a rank checks that every call it made returned or raised
and (with the autouse fixture) that no process is left behind.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from fault_actors import Keeper
from process_checks import wait_for_exit

from monarch_nb import MeshFailure, MeshUsageError, RestartPolicy, this_host
from monarch_nb.events import (
    EventLog,
    MeshFailed,
    RankFailed,
    RanksRestarted,
    RankStateChanged,
)

LIMIT_S = 10.0  # generous: this machine is shared and loaded


def _kill(procs, rank: int) -> int:
    """SIGKILL ``rank`` and wait until the controller saw it die; its old pid."""
    pid = procs.pids[rank]
    log = EventLog()
    with procs.events.subscribe(log, kinds=(RankStateChanged,)):
        os.kill(pid, signal.SIGKILL)
        log.wait_for(RankStateChanged, lambda e: e.rank == rank and e.state == "dead")
    return pid


def _settled(futures) -> None:
    """Every future returned or raised: none hangs."""
    for future in futures:
        assert future.done(), future
        future.exception(timeout=0)  # raises nothing, returns the error or None


@pytest.fixture
def procs4():
    procs = this_host().spawn_procs(per_host={"procs": 4}, echo_output=False)
    yield procs
    pids = set(procs.pids)
    procs.stop()
    assert not wait_for_exit(pids, 5)


def test_a_dead_rank_fails_only_the_calls_that_include_it(procs4):
    keepers = procs4.spawn("k", Keeper, 7)
    keepers.put.call(5).get(timeout=LIMIT_S)
    procs4.run("x = rank * 10")
    old = procs4.pids
    busy = keepers.slice(procs=1).sleep.call_one(60)
    os.kill(old[1], signal.SIGKILL)
    with pytest.raises(MeshFailure, match=r"rank 1 \(pid \d+\) .* SIGKILL while running") as info:
        busy.get(timeout=LIMIT_S)
    assert info.value.ranks == (1,)
    assert "restart(ranks=[1])" in str(info.value)

    # Calls that include the dead rank fail at once, naming it ...
    with pytest.raises(MeshFailure, match="rank 1"):
        keepers.get.call().get(timeout=LIMIT_S)
    with pytest.raises(MeshFailure, match="rank 1"):
        procs4.run("x")
    assert procs4.state == "failed"
    assert procs4.failure is info.value.__cause__  # the call's SupervisionError is from it
    # ... while a slice without it answers, with the survivors' state intact:
    # actors, cells, and the view healthy() gives.
    survivors = procs4.slice(procs=[0, 2, 3])
    assert survivors.state == "running"
    assert keepers.slice(procs=[0, 2, 3]).get.call().get(timeout=LIMIT_S).values() == [
        (0, 5),
        (2, 5),
        (3, 5),
    ]
    assert survivors.run("x").values() == [0, 20, 30]
    healthy = procs4.healthy()
    assert healthy.shape.ranks == (0, 2, 3)
    assert healthy.run("x + 1").values() == [1, 21, 31]
    status = procs4.status()
    assert status.rank(1).state == "dead"
    assert [status.rank(r).state for r in (0, 2, 3)] == ["idle"] * 3
    assert not wait_for_exit({old[1]}, 1)
    _settled([busy])


def test_the_magics_selection_runs_cells_on_the_survivors(procs4):
    from monarch_nb.magics._selection import select

    procs4.run("y = rank")
    _kill(procs4, 1)
    view = select(procs4, "0,2-3")
    assert view.run("y * 2").values() == [0, 4, 6]
    with pytest.raises(MeshFailure, match="rank 1"):
        select(procs4, "0-3").run("y")


def test_restart_of_one_rank_keeps_the_others_state_and_spawns_its_actors_again(procs4):
    keepers = procs4.spawn("k", Keeper, 7)
    keepers.put.call(5).get(timeout=LIMIT_S)
    procs4.push(pushed=42)
    old = procs4.pids
    log = EventLog()
    with procs4.events.subscribe(log, kinds=(RanksRestarted,)):
        _kill(procs4, 1)
        record = procs4.restart(ranks=[1])
        event = log.wait_for(RanksRestarted, timeout=LIMIT_S)
    assert record.ranks == (1,)
    assert not record.automatic
    assert record.respawned == ("k",)
    assert record.to_spawn_again == ()
    assert event.ranks == (1,)
    assert event.respawned == ("k",)
    new = procs4.pids
    assert new[1] != old[1]
    assert [new[r] for r in (0, 2, 3)] == [old[r] for r in (0, 2, 3)]
    assert procs4.state == "running"
    # Rank 0 still has what was pushed before; rank 1 starts empty, and its actor was
    # spawned again with its first arguments.
    assert procs4.run("globals().get('pushed')").values() == [42, None, 42, 42]
    assert keepers.get.call().get(timeout=LIMIT_S).values() == [(0, 5), (1, 7), (2, 5), (3, 5)]
    assert procs4.status().restarts == (record,)
    assert not wait_for_exit({old[1]}, 1)


def test_restart_of_a_live_rank_and_bad_requests(procs4):
    keepers = procs4.spawn("k", Keeper)
    keepers.slice(procs=2).stop()  # stopped actors are not spawned again
    old = procs4.pids
    record = procs4.restart(ranks=[2, 3])
    assert record.respawned == ("k",)
    assert procs4.pids[:2] == old[:2]
    assert not set(procs4.pids[2:]) & set(old)
    assert keepers.slice(procs=3).get.call_one().get(timeout=LIMIT_S) == (3, 0)
    with pytest.raises(MeshUsageError, match=r"restart\(ranks=\[7\]\): .* has ranks 0-3"):
        procs4.restart(ranks=[7])
    assert not wait_for_exit(set(old[2:]), 5)


def test_a_policy_of_two_restarts_fails_the_mesh_at_the_third_death():
    policy = RestartPolicy(max_restarts=2, window_s=600, ranks="failed")
    log = EventLog()
    pids_seen: set[int] = set()
    futures = []
    with this_host().spawn_procs(
        per_host={"procs": 3}, echo_output=False, restart=policy, name="policy"
    ) as procs:
        procs.events.subscribe(log, kinds=(RanksRestarted, MeshFailed, RankFailed))
        keepers = procs.spawn("k", Keeper, 1)
        keepers.slice(procs=0).put.call_one(9).get(timeout=LIMIT_S)
        for attempt in (1, 2):
            victim = procs.pids[1]
            pids_seen.update(procs.pids)
            futures.append(keepers.slice(procs=1).sleep.call_one(60))
            os.kill(victim, signal.SIGKILL)
            with pytest.raises(MeshFailure, match=r"its RestartPolicy restarts rank 1 \(restart"):
                futures[-1].get(timeout=LIMIT_S)
            log.wait_for(RanksRestarted, lambda e, n=attempt: len(log.of(RanksRestarted)) >= n)
            assert procs.pids[1] != victim
            assert procs.state == "running"
            assert keepers.get.call().get(timeout=LIMIT_S).values() == [(0, 9), (1, 1), (2, 1)]
        restarts = log.of(RanksRestarted)
        assert [(e.ranks, e.automatic, e.respawned) for e in restarts] == [((1,), True, ("k",))] * 2
        assert "was killed by signal SIGKILL" in restarts[0].cause
        assert [r.ranks for r in procs.status().restarts] == [(1,), (1,)]

        pids_seen.update(procs.pids)
        futures.append(keepers.sleep.call(60))
        os.kill(procs.pids[1], signal.SIGKILL)
        with pytest.raises(
            MeshFailure, match=r"allows 2 restart\(s\) within 600 s and 2 were made, so the mesh"
        ):
            futures[-1].get(timeout=LIMIT_S)
        failed = log.wait_for(MeshFailed, timeout=LIMIT_S)
        assert failed.error.ranks == (1,)
        assert procs.state == "failed"
        with pytest.raises(MeshFailure, match="the mesh is failed"):
            procs.healthy().run("1")  # the mesh as a whole failed: no survivors view
    _settled(futures)
    assert not wait_for_exit(pids_seen, 5)


def test_a_policy_for_all_ranks_replaces_every_process():
    policy = RestartPolicy(max_restarts=1, window_s=60, ranks="all")
    log = EventLog()
    with this_host().spawn_procs(
        per_host={"procs": 2}, echo_output=False, restart=policy, name="all"
    ) as procs:
        procs.events.subscribe(log, kinds=(RanksRestarted,))
        keepers = procs.spawn("k", Keeper)
        old = procs.pids
        os.kill(old[0], signal.SIGKILL)
        event = log.wait_for(RanksRestarted, timeout=LIMIT_S * 2)
        assert event.ranks == (0, 1)
        assert event.to_spawn_again == ("k",)
        assert not set(procs.pids) & set(old)
        with pytest.raises(MeshFailure, match="spawn it again"):
            keepers.get.call().get(timeout=LIMIT_S)
        assert procs.run("rank").values() == [0, 1]
    assert not wait_for_exit(set(old), 5)


def test_restart_policy_is_validated():
    with pytest.raises(MeshUsageError, match=r"max_restarts=-1\): give an int >= 0"):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(MeshUsageError, match=r"ranks='some'\): give \"failed\" or \"all\""):
        RestartPolicy(ranks="some")  # type: ignore[arg-type]
    with pytest.raises(MeshUsageError, match="restart= takes a RestartPolicy, got 3"):
        this_host().spawn_procs(per_host={"procs": 1}, restart=3)  # type: ignore[arg-type]


def _wait_in_collective(procs, ranks) -> None:
    """Until ``ranks``' stacks show them inside ``dist.all_reduce`` (asked of their
    wire threads, which answer while the main thread waits in C)."""
    deadline = time.monotonic() + 30
    while True:
        stacks = procs.stacks(timeout=5)
        if all("all_reduce" in stacks[r] for r in ranks):
            return
        assert time.monotonic() < deadline, stacks
        time.sleep(0.1)  # a poll of the ranks' own word: nothing to subscribe to


@pytest.mark.slow
def test_a_rank_killed_inside_a_gloo_all_reduce_frees_the_survivors(monkeypatch):
    pytest.importorskip("torch")
    from monarch_nb.magics import start_mesh

    timeout = 60.0  # what a survivor waiting on another survivor used to wait out
    monkeypatch.setenv("MONARCH_NB_COLLECTIVE_TIMEOUT", str(timeout))
    mesh = start_mesh(procs=4, dist="gloo", name="gloo-faults")
    procs = mesh.procs
    pids = set(procs.pids)
    try:
        mesh.run("kept = rank * 100")
        cell = mesh.run(
            "import time\n"
            "if rank == 1:\n"
            "    time.sleep(120)\n"
            "x = torch.ones(1)\n"
            "dist.all_reduce(x)\n"
            "x",
            block=False,
        )
        _wait_in_collective(procs, (0, 2, 3))
        killed_at = time.monotonic()
        os.kill(procs.pids[1], signal.SIGKILL)
        with pytest.raises(MeshFailure, match=r"rank 1 \(pid \d+\) .* SIGKILL while running"):
            cell.get(timeout=LIMIT_S)
        # The survivors leave the collective and answer, their namespaces intact:
        # gloo frees the dead rank's neighbours at once (their connections to it
        # close), and each of them then shuts its broken group's connections
        # (_worker/_collective_abort.py), which frees rank 3, waiting only on them.
        assert procs.healthy().run("kept", timeout=timeout + LIMIT_S).values() == [0, 200, 300]
        # Long before the collective timeout, even on a loaded machine.
        assert time.monotonic() - killed_at < 2 * LIMIT_S
        # restart(ranks=[1]) sets the process group up again across the mesh.
        record = mesh.restart("1")
        assert record.ranks == (1,)
        pids.update(procs.pids)
        assert mesh.run("x = torch.ones(1)\ndist.all_reduce(x)\nint(x)").values() == [4] * 4
        assert mesh.run("globals().get('kept')").values() == [0, None, 200, 300]
    finally:
        mesh.stop()
    assert not wait_for_exit(pids, 5)


@pytest.mark.slow
def test_a_collective_waiting_on_a_silent_rank_raises_within_the_timeout(monkeypatch):
    pytest.importorskip("torch")
    from monarch_nb import CellError
    from monarch_nb.magics import start_mesh

    monkeypatch.setenv("MONARCH_NB_COLLECTIVE_TIMEOUT", "3")
    mesh = start_mesh(procs=3, dist="gloo", name="gloo-timeout")
    pids = set(mesh.procs.pids)
    stopped = mesh.procs.pids[1]
    try:
        os.kill(stopped, signal.SIGSTOP)  # alive, but never joins: only the timeout helps
        started = time.monotonic()
        with pytest.raises(CellError, match=r"(?i)timed out"):
            mesh.run("x = torch.ones(1)\ndist.all_reduce(x)", ranks="0,2", timeout=60)
        assert 2.5 < time.monotonic() - started < 3 + LIMIT_S
    finally:
        os.kill(stopped, signal.SIGCONT)
        mesh.stop()
    assert not wait_for_exit(pids, 5)


def _oom_cgroup() -> tuple[str, str] | None:
    """A fresh memory cgroup capped at 64 MiB under ours: (its directory, the file
    a process writes its pid to, to move in); None if this host cannot make one."""
    import secrets

    with open("/proc/self/cgroup") as f:
        lines = f.read().splitlines()
    name = f"monarch-nb-oom-{secrets.token_hex(4)}"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            parent = f"/sys/fs/cgroup/memory{path.rstrip('/')}"
            limits = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
            break
    else:
        path = next((line[3:] for line in lines if line.startswith("0::")), None)
        if path is None:
            return None
        parent = f"/sys/fs/cgroup{path.rstrip('/')}"
        limits = ("memory.max", "memory.swap.max")
    directory = f"{parent}/{name}"
    try:
        os.mkdir(directory)
    except OSError:
        return None
    for limit, value in zip(limits, (str(64 << 20), str(64 << 20)), strict=True):
        if limit == "memory.swap.max":
            value = "0"
        try:
            with open(f"{directory}/{limit}", "w") as f:
                f.write(value)
        except OSError:
            if limit == limits[0]:
                os.rmdir(directory)
                return None
    return directory, f"{directory}/cgroup.procs"


def test_a_rank_killed_by_the_oom_killer_is_reported_as_out_of_memory(procs4):
    cgroup = _oom_cgroup()
    if cgroup is None:
        pytest.skip("needs a memory cgroup this test may create (root, cgroup v1 or v2)")
    directory, procs_file = cgroup
    try:
        eat = procs4.slice(procs=1).exec(
            f"import os\nopen({procs_file!r}, 'w').write(str(os.getpid()))\n"
            "hog = [bytearray(1 << 20) for _ in range(1024)]"
        )
        with pytest.raises(MeshFailure, match="OOM killer: out of memory") as info:
            eat.get(timeout=60)
        assert info.value.ranks == (1,)
        assert "rank 1" in str(info.value)
        assert "out of memory" in procs4.status().rank(1).failure
        assert procs4.slice(procs=[0, 2, 3]).run("rank").values() == [0, 2, 3]
    finally:
        wait_for_exit(set(procs4.pids), 5)
        os.rmdir(directory)
