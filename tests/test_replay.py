"""Replay: ``restart(replay=True)`` builds the state the notebook built again, from
the mesh's recorded history of pushes, cells and spawns.

Every test kills or restarts real processes; the autouse fixture checks that
none is left behind.
"""

from __future__ import annotations

import os
import signal

import pytest
from fault_actors import Keeper

from monarch_nb import ReplayError, this_host
from monarch_nb.events import EventLog, RankStateChanged


@pytest.fixture
def procs3():
    procs = this_host().spawn_procs(per_host={"procs": 3})
    yield procs
    procs.stop()


def _kill(procs, rank: int) -> None:
    log = EventLog()
    with procs.events.subscribe(log, kinds=(RankStateChanged,)):
        os.kill(procs.pids[rank], signal.SIGKILL)
        log.wait_for(RankStateChanged, lambda e: e.rank == rank and e.state == "dead", timeout=60)


def test_a_full_restart_with_replay_rebuilds_a_history_of_20_cells(procs3):
    procs3.push(base=100)
    procs3.run("total = base + rank")
    for step in range(20):
        procs3.run(f"total += {step}\nsteps = {step + 1}")
    before = procs3.run("(total, steps)").values()
    old_pids = procs3.pids
    _kill(procs3, 1)

    record = procs3.restart(replay=True)

    assert set(procs3.pids).isdisjoint(old_pids)  # every process is new
    assert procs3.run("(total, steps)").values() == before
    assert len(record.replayed) == 1 + 1 + 20 + 1  # the push, 21 cells, the read of total
    assert record.replayed[0] == "push base"


def test_cells_that_failed_or_were_marked_no_replay_are_not_run_again(procs3, tmp_path):
    marker = tmp_path / "ran"
    procs3.run("x = 1")
    with pytest.raises(Exception, match="boom"):
        procs3.run("raise ValueError('boom')")
    procs3.exec(f"open({str(marker)!r} + str(rank), 'w').close()", replay=False).get(timeout=60)
    for rank in range(3):
        os.remove(f"{marker}{rank}")
    history = str(procs3.history())
    assert "failed: CellError" in history
    assert "not replayed (--no-replay)" in history

    procs3.restart(replay=True)

    assert procs3.run("x").values() == [1, 1, 1]
    assert not any(os.path.exists(f"{marker}{rank}") for rank in range(3))


def test_a_replayed_step_that_fails_stops_the_replay_and_is_named(procs3, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("7")
    procs3.run("a = 1")
    procs3.run(f"b = int(open({str(data)!r}).read())")
    procs3.run("c = b + 1")
    data.unlink()  # the second cell cannot run again

    with pytest.raises(ReplayError) as caught:
        procs3.restart(replay=True)

    error = caught.value
    assert error.step == 2
    assert "replaying step 2" in str(error)
    assert "FileNotFoundError" in str(error)
    assert "1 step(s) before it were replayed and the 1 after it were not" in str(error)
    assert procs3.run("a").values() == [1, 1, 1]  # the mesh runs, with the state before it
    assert procs3.run("'c' in globals()").values() == [False, False, False]


def test_actors_are_spawned_again_and_old_handles_reach_them(procs3):
    keepers = procs3.spawn("keepers", Keeper, 5)
    assert keepers.get.call().get(timeout=60).values() == [(0, 5), (1, 5), (2, 5)]
    keepers.put.call(9).get(timeout=60)  # endpoint calls are not replayed

    procs3.restart(replay=True)

    assert keepers.get.call().get(timeout=60).values() == [(0, 5), (1, 5), (2, 5)]


def test_restarting_one_rank_with_replay_rebuilds_only_its_namespace(procs3):
    procs3.push(lr=0.5)
    procs3.run("w = rank * 10")
    procs3.slice(procs=[0, 1]).run("only_first_two = True")
    procs3.run("w += 1")
    procs3.run("w += 100 if rank != 1 else 0")  # the survivors' state moves on
    _kill(procs3, 1)

    record = procs3.restart(ranks=[1], replay=True)

    assert record.ranks == (1,)
    assert procs3.run("(lr, w)").values() == [(0.5, 101), (0.5, 11), (0.5, 121)]
    assert procs3.slice(procs=[1]).run("only_first_two").values() == [True]


def test_a_restart_without_replay_starts_the_history_over(procs3):
    procs3.run("x = 1")
    procs3.restart()
    assert "no steps recorded" in str(procs3.history())
    procs3.run("y = 2")
    procs3.restart(replay=True)
    assert procs3.run("'x' in globals(), y").values() == [(False, 2)] * 3


def test_mesh_restart_replay_in_a_notebook_with_torch_distributed():
    from kernel_utils import Kernel

    with Kernel() as k:
        k.ok("%load_ext monarch_nb")
        k.ok("%mesh start --procs 2 --dist gloo --no-dashboard")
        k.ok("%mesh push scale=3.0")
        k.ok("%%mesh\nx = torch.full((2,), float(rank) * scale)\ndist.all_reduce(x)")
        k.ok("%%mesh --no-replay\nprint('once only')")
        history = k.ok("%mesh history").text()
        assert "push scale" in history
        assert "not replayed (--no-replay)" in history

        reply = k.ok("%mesh restart --replay", timeout=120)

        assert "replayed 2 step(s)" in reply.text()  # the push and the all-reduce cell
        assert "once only" not in reply.text()
        assert k.ok("%%mesh\nx").text() == "[0-1] tensor([3., 3.])\n"
