"""HostMesh's Monarch surface: extent, slice, initialized, stop,
with_python_executable; spawn_procs(bootstrap=, proc_bind=); ProcMesh.initialized.
Real worker processes throughout."""

import os
import sys

import pytest
from process_checks import wait_for_exit

from monarch_nb import MeshFailure, MeshUsageError, ssh_hosts, this_host

LOCAL_SSH = (sys.executable, "-c", "import os,sys; os.execvp('sh', ['sh', '-c', sys.argv[2]])")


def _set_flag() -> None:
    os.environ["BOOTSTRAPPED"] = "yes"


async def _set_flag_async() -> None:
    os.environ["BOOTSTRAPPED"] = "async"


def _fail_on_rank_1() -> None:
    if os.environ["RANK"] == "1":
        raise RuntimeError("no CUDA for rank 1")


def test_this_host_extent_slice_and_initialized() -> None:
    host = this_host()
    assert dict(host.extent) == {"hosts": 1}
    assert len(host) == 1
    view = host.slice(hosts=0)
    assert view.hosts == host.hosts
    assert host.initialized.get(timeout=10) is True
    with pytest.raises(MeshUsageError, match="hosts"):
        host.slice(gpus=0)


def test_proc_mesh_initialized_is_done_once_spawned() -> None:
    with this_host().spawn_procs({"procs": 2}) as procs:
        assert procs.initialized.done()
        assert procs.initialized.get() is True


def test_stop_ends_the_processes_and_keeps_the_host() -> None:
    host = this_host()
    procs = host.spawn_procs({"procs": 2})
    assert host.stop().get(timeout=60) is None
    assert procs.state == "stopped"
    with host.spawn_procs({"procs": 1}) as again:
        assert again.run("1 + 1").item() == 2


def test_bootstrap_runs_before_anything_else() -> None:
    with this_host().spawn_procs({"procs": 2}, bootstrap=_set_flag) as procs:
        assert procs.run("import os; os.environ['BOOTSTRAPPED']").values() == ["yes", "yes"]
    with this_host().spawn_procs({"procs": 1}, bootstrap=_set_flag_async) as procs:
        assert procs.run("import os; os.environ['BOOTSTRAPPED']").item() == "async"


def test_bootstrap_error_names_the_rank_and_its_traceback() -> None:
    # As Monarch's: the spawn returns, and the failure surfaces at initialized
    # and at the mesh's first use; no process is left running.
    procs = this_host().spawn_procs({"procs": 2}, bootstrap=_fail_on_rank_1)
    assert procs.state == "failed"
    with pytest.raises(MeshFailure, match="rank 1") as info:
        procs.initialized.get(timeout=10)
    assert "no CUDA for rank 1" in str(info.value)
    assert "_fail_on_rank_1" in str(info.value)
    with pytest.raises(MeshFailure, match="no CUDA for rank 1"):
        procs.run("1 + 1")
    assert len(procs.pids) == 2
    assert not wait_for_exit(set(procs.pids), 10)
    procs.stop()


def test_bootstrap_must_be_callable() -> None:
    with pytest.raises(MeshUsageError, match="bootstrap takes a function"):
        this_host().spawn_procs({"procs": 1}, bootstrap="setup")  # type: ignore[arg-type]


def test_proc_bind_sets_each_process_affinity() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    binds = [{"cpus": str(cpus[0])}, {"physcpubind": str(cpus[-1])}]
    with this_host().spawn_procs({"procs": 2}, proc_bind=binds) as procs:
        got = procs.run("import os; sorted(os.sched_getaffinity(0))").values()
    assert got == [[cpus[0]], [cpus[-1]]]


@pytest.mark.parametrize(
    ("proc_bind", "match"),
    [
        ([{"cpus": "0"}], r"proc_bind length \(1\) must equal procs_per_host \(2\)"),
        ([{"cpus": "0"}, {"cpus": "3-1"}], r"proc_bind\[1\]\['cpus'\] = '3-1'"),
        ([{"cpus": "0"}, {"cores": "1"}], "has key 'cores'"),
        ([{"cpus": "0"}, {"membind": "0"}], "needs numactl"),
        ("0-3", "takes a list of dicts"),
    ],
)
def test_bad_proc_bind_is_refused_before_any_process_starts(proc_bind, match) -> None:
    with pytest.raises(MeshUsageError, match=match):
        this_host().spawn_procs({"procs": 2}, proc_bind=proc_bind)


def test_proc_bind_to_a_cpu_this_host_lacks_fails_the_spawn() -> None:
    with pytest.raises(MeshFailure, match="rank 0"):
        this_host().spawn_procs({"procs": 1}, proc_bind=[{"cpus": "100000"}])


def test_with_python_executable(tmp_path) -> None:
    # A wrapper interpreter that marks its processes: they really run it.
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexport VIA_WRAPPER=1\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    host = this_host().with_python_executable(str(wrapper))
    with host.spawn_procs({"procs": 1}) as procs:
        assert procs.run("import os; os.environ.get('VIA_WRAPPER')").item() == "1"
    with pytest.raises(MeshUsageError, match="no such executable"):
        this_host().with_python_executable(str(tmp_path / "missing"))


def test_multi_host_slice_is_a_view() -> None:
    with ssh_hosts(["h0", "h1"], ssh=LOCAL_SSH, bind="127.0.0.1") as hosts:
        assert dict(hosts.extent) == {"hosts": 2}
        assert hosts.initialized.get(timeout=10) is True
        second = hosts.slice(hosts=1)
        assert second.hosts == ["h1"]
        assert len(second) == 1
        for call in (second.spawn_procs, second.stop, second.shutdown):
            with pytest.raises(MeshUsageError, match="slice of a host mesh"):
                call()
        procs = hosts.spawn_procs({"procs": 1}, bootstrap=_set_flag)
        assert procs.run("import os; os.environ['BOOTSTRAPPED']").values() == ["yes", "yes"]
        hosts.stop().get(timeout=60)
        assert procs.state == "stopped"
