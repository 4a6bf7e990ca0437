"""Process meshes: start, environment, views, stop, restart."""

import logging
import os
import signal
import sys
import time

import psutil
import pytest
from process_checks import wait_for_exit

from monarch_nb import Actor, MeshFailure, MeshStopped, MeshUsageError, endpoint, this_host
from monarch_nb._controller._process_group import STOP_GRACE_S


class Probe(Actor):
    @endpoint
    def env(self, *names: str) -> dict:
        return {n: os.environ.get(n) for n in names}

    @endpoint
    def modules(self) -> list[str]:
        return sorted(m for m in ("torch", "numpy", "IPython", "cloudpickle") if m in sys.modules)

    @endpoint
    def all_reduce(self) -> list[float]:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            x = torch.full((2,), float(dist.get_rank()))
            dist.all_reduce(x)
            return x.tolist()
        finally:
            dist.destroy_process_group()


def test_workers_get_the_torch_distributed_environment(procs4):
    probes = procs4.spawn("probe", Probe)
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    envs = probes.env.call(*names).get(timeout=10).values()
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1


def test_workers_import_no_torch_until_user_code_does(procs4):
    probes = procs4.spawn("modules", Probe)
    assert probes.modules.call().get(timeout=10).values() == [[]] * 4


@pytest.mark.slow
def test_gloo_all_reduce_across_four_ranks(procs4):
    probes = procs4.spawn("dist", Probe)
    assert probes.all_reduce.call().get(timeout=60).values() == [[6.0, 6.0]] * 4


def test_extra_env_and_context_manager():
    with this_host().spawn_procs(per_host={"procs": 2}, env={"MY_FLAG": "on"}) as procs:
        pids = procs.pids
        probes = procs.spawn("p", Probe)
        assert probes.env.call("MY_FLAG").get(timeout=10).values() == [{"MY_FLAG": "on"}] * 2
        assert procs.state == "running"
    assert procs.state == "stopped"
    assert not wait_for_exit(set(pids), 1.0)
    with pytest.raises(MeshFailure, match="was stopped"):
        probes.env.call("X").get(timeout=10)
    # A spawn on it says so in Monarch's words too, and is a RuntimeError as Monarch's.
    with pytest.raises(MeshStopped, match="`ProcMesh` has already been stopped") as late:
        procs.spawn("late", Probe).initialized.get(timeout=10)
    assert isinstance(late.value, RuntimeError)


def test_slices_are_views_over_the_same_processes(procs4):
    view = procs4.slice(procs=slice(1, 3))
    assert len(view) == 2
    assert view.pids == procs4.pids[1:3]
    probes = view.spawn("view", Probe)
    assert [p.rank for p, _ in probes.env.call("RANK").get(timeout=10).items()] == [1, 2]
    assert procs4.point_of_rank(3) == {"procs": 3}
    assert procs4.rank_of_point({"procs": 2}) == 2


def test_gpus_on_a_host_without_any_are_cpu_ranks_as_in_monarch(monkeypatch, caplog):
    # Monarch's programs and tests name the dimension "gpus" on CPU machines too.
    from monarch_nb._controller import _process_group

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a host with no GPU visible
    _process_group._told_cpu_ranks.discard("this host")
    with (
        caplog.at_level(logging.WARNING, logger="monarch_nb"),
        this_host().spawn_procs(per_host={"gpus": 2}) as procs,
    ):
        assert procs.extent == {"gpus": 2}
        probes = procs.spawn("cpu", Probe)
        envs = probes.env.call("CUDA_VISIBLE_DEVICES").get(timeout=60).values()
    assert envs == [{"CUDA_VISIBLE_DEVICES": ""}] * 2  # no device handed out
    assert "this host has no GPU visible: per_host={'gpus': 2} starts 2 CPU ranks" in caplog.text


def test_bad_per_host_and_env_are_named():
    with pytest.raises(MeshUsageError, match=r"positive ints, got 'procs': 0"):
        this_host().spawn_procs(per_host={"procs": 0})
    with pytest.raises(MeshUsageError, match=r"env values must be strings; 'N' is not"):
        this_host().spawn_procs(per_host={"procs": 1}, env={"N": 1})


def test_restart_after_a_failure_gives_fresh_processes(procs2):
    probes = procs2.spawn("p", Probe)
    old = procs2.pids
    psutil.Process(old[1]).kill()
    with pytest.raises(MeshFailure, match="rank 1"):
        probes.env.call("RANK").get(timeout=10)
    assert procs2.state == "failed"
    procs2.restart()
    assert procs2.state == "running"
    assert not set(procs2.pids) & set(old)
    assert not wait_for_exit(set(old), 2.0)
    with pytest.raises(
        MeshFailure, match="spawned before its process mesh restarted; spawn it again"
    ):
        probes.env.call("RANK").get(timeout=10)
    fresh = procs2.spawn("p", Probe)
    assert fresh.env.call("RANK").get(timeout=10).values() == [{"RANK": "0"}, {"RANK": "1"}]


def test_status_is_a_plain_frozen_snapshot(procs4):
    import dataclasses

    from monarch_nb import MeshState, RankState

    status = procs4.status()
    assert status.state is MeshState.RUNNING
    assert status.state == "running"
    assert [r.rank for r in status.ranks] == [0, 1, 2, 3]
    assert {r.state for r in status.ranks} == {RankState.IDLE}
    assert [r.pid for r in status.ranks] == procs4.pids
    assert status.wire.sent >= 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.ranks[0].state = RankState.BUSY  # type: ignore[misc]
    assert procs4.slice(procs=slice(1, 3)).status().ranks[0].rank == 1


def test_a_worker_that_cannot_start_is_reported_with_its_stderr():
    # A broken sitecustomize makes python itself fail before our code runs.
    with pytest.raises(
        MeshFailure,
        match=r"(?s)exited with code 1; so the mesh failed to start; "
        r"last lines of its stderr:.*encodings",
    ):
        this_host().spawn_procs(per_host={"procs": 2}, env={"PYTHONHOME": "/nonexistent"})


def test_each_gpu_rank_gets_one_of_the_controllers_visible_devices(monkeypatch):
    # No GPU is needed to check the mapping: these workers never touch CUDA.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    with this_host().spawn_procs(per_host={"gpus": 2}) as procs:
        probes = procs.spawn("gpu", Probe)
        envs = probes.env.call("CUDA_VISIBLE_DEVICES").get(timeout=10).values()
    assert envs == [{"CUDA_VISIBLE_DEVICES": "5"}, {"CUDA_VISIBLE_DEVICES": "7"}]
    with pytest.raises(MeshUsageError, match=r"needs 3 GPUs but this host has 2 visible"):
        this_host().spawn_procs(per_host={"gpus": 3})


def test_stopping_a_failed_mesh_is_prompt(procs2):
    survivor = procs2.pids[1]
    procs2.kill([0])
    deadline = time.monotonic() + 10
    while procs2.state != "failed" and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    procs2.stop()  # the surviving rank is asked to exit, not waited out and killed
    assert time.monotonic() - started < STOP_GRACE_S - 1  # not the grace's kill
    assert not wait_for_exit({survivor}, 30)


def test_no_hello_is_lost_while_slow_launches_are_under_way(monkeypatch):
    # Forking a controller that holds a lot of memory is slow; the first worker
    # then says hello while later ones are still being launched. Its hello must
    # find its identity known (it once was dropped, and the start hung).
    import subprocess

    from monarch_nb._controller import _process_group
    from monarch_nb._controller._client import Controller

    real_popen = subprocess.Popen
    launched: list[int] = []

    class SlowLaunches(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            if launched:
                time.sleep(0.5)  # the previous worker is up and says hello meanwhile
            super().__init__(*args, **kwargs)
            launched.append(self.pid)

    monkeypatch.setattr(subprocess, "Popen", SlowLaunches)
    monkeypatch.setattr(_process_group, "START_TIMEOUT_S", 15.0)
    # Each rank a fresh interpreter, launched by Popen: not forked by the zygote.
    monkeypatch.setenv("MONARCH_NB_ZYGOTE", "0")
    dropped = Controller.get().stats.dropped_unknown_peer
    with this_host().spawn_procs(per_host={"procs": 3}) as procs:
        assert procs.state == "running"
    assert len(launched) == 3
    assert Controller.get().stats.dropped_unknown_peer == dropped


def test_a_process_mesh_reads_its_shape_as_monarchs_do(procs4):
    grid = procs4.split(procs=("dp", "tp"), tp=2)
    assert grid.sizes == {"dp": 2, "tp": 2}
    assert grid.extent["tp"] == 2
    assert grid.size("dp") == 2
    assert grid.size() == 4
    assert grid.slice(tp=1).pids == [procs4.pids[1], procs4.pids[3]]
    flat = grid.slice(tp=1).flatten("rank")
    assert flat.sizes == {"rank": 2}
    assert flat.pids == [procs4.pids[1], procs4.pids[3]]
    assert grid.rename(dp="data").sizes == {"data": 2, "tp": 2}
    assert grid.to_table().splitlines()[2] == "    0 | 0 | 1"


def test_stop_and_shutdown_return_futures_once_stopped():
    import asyncio

    procs = this_host().spawn_procs(per_host={"procs": 1})
    pids = procs.pids
    stopped = procs.stop()
    assert stopped.done()  # a plain procs.stop() has stopped the mesh already
    assert stopped.get(timeout=1) is None
    assert not wait_for_exit(set(pids), 1.0)
    assert procs.stop().get() is None  # again: nothing left to do

    async def main() -> list[int]:
        async with this_host().spawn_procs(per_host={"procs": 2}) as mesh:
            pids = mesh.pids
        assert mesh.state == "stopped"
        await mesh.stop()  # Monarch's spelling, on a stopped mesh
        await this_host().shutdown()
        return pids

    assert not wait_for_exit(set(asyncio.run(main())), 1.0)
    # shutdown_context() stops every mesh of the process: tests/test_monarch_surface.py


# "stop, I/O thread busy": the stop reaps the ranks and forgets their exit
# notices while the I/O thread, busy, has not handled them yet (a busy host).
@pytest.mark.parametrize("how", ["stop", "stop, I/O thread busy", "SIGKILL"])
def test_a_ranks_subprocesses_do_not_outlive_it(how):
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        children = procs.run(
            "import subprocess\nchild = subprocess.Popen(['sleep', '600'])\nchild.pid"
        ).values()
        assert all(psutil.pid_exists(pid) for pid in children)
        if how == "SIGKILL":
            os.kill(procs.pids[1], signal.SIGKILL)  # rank 1 dies; its child goes with it
            children_gone = [children[1]]
        else:
            if how == "stop, I/O thread busy":
                procs._group.controller.loop.call_soon(lambda: time.sleep(1.0))
            procs.stop()
            children_gone = children
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in children_gone):
            assert time.monotonic() < deadline, f"left running: {children_gone}"
            time.sleep(0.05)  # polling the process table: there is no event for it
    finally:
        procs.stop()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
