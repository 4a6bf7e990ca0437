"""More of Monarch's surface: spawn_procs(bootstrap_command=), default_bootstrap_cmd,
proc_mesh(gpus=, env=), labels as Monarch's, MeshAdminConfig, LocalJob's batch
mode, Simulator's refusal. Real worker processes and a real client script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import monarch_nb
from monarch_nb import MeshUsageError, this_host
from monarch_nb.actor import BootstrapCommand, default_bootstrap_cmd, proc_mesh
from monarch_nb.job import LocalJob, MeshAdminConfig

ENV_OF = "import os; (os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('NB_CMD'))"


def test_bootstrap_command_gives_each_point_its_environment() -> None:
    base = default_bootstrap_cmd()
    assert base.program == sys.executable
    assert base.args == ["-m", "monarch_nb.worker"]
    assert base.with_env({"A": "1"}).env == {"A": "1"}
    assert base.env == {}  # with_env made a copy

    def per_point(point) -> BootstrapCommand:
        return base.with_env({"CUDA_VISIBLE_DEVICES": str(point["gpus"]), "NB_CMD": "x"})

    with this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=per_point) as procs:
        assert procs.run(ENV_OF).values() == [("0", "x"), ("1", "x")]
    one = base.with_env({"NB_CMD": "same"})
    with this_host().spawn_procs(per_host={"procs": 2}, bootstrap_command=one) as procs:
        assert [v[1] for v in procs.run(ENV_OF).values()] == ["same", "same"]


def test_a_bootstrap_command_we_cannot_honour_is_refused() -> None:
    odd = BootstrapCommand(sys.executable, None, ["-m", "something.else"], {})
    with pytest.raises(MeshUsageError, match=r"has args \['-m', 'something.else'\]"):
        this_host().spawn_procs(per_host={"procs": 1}, bootstrap_command=odd)
    with pytest.raises(MeshUsageError, match="give a BootstrapCommand"):
        this_host().spawn_procs(per_host={"procs": 1}, bootstrap_command=lambda p: "python")


def test_the_old_proc_mesh_and_labels_as_monarchs() -> None:
    procs = proc_mesh(gpus=2, env={"NB_OLD": "yes"})
    try:
        assert procs.extent.labels == ["gpus"]
        assert procs.extent.sizes == [2]
        assert procs._labels == ["gpus"]
        assert procs.run("import os; os.environ['NB_OLD']").values() == ["yes", "yes"]
    finally:
        procs.stop()
    assert this_host()._labels == ("hosts",)
    with pytest.raises(MeshUsageError, match="for several hosts start a host mesh"):
        proc_mesh(gpus=1, hosts=2)


def test_mesh_admin_config_is_accepted_and_says_nothing_runs(monkeypatch) -> None:
    from monarch_nb._jobs import _unserved

    monkeypatch.setattr(_unserved, "_said", set())  # said once per process: say it here
    job = LocalJob()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert job.enable_admin(MeshAdminConfig(admin_addr="[::]:1729")) is job
    assert job.admin_config == MeshAdminConfig(admin_addr="[::]:1729")
    assert job.state().admin_url is None
    assert [str(w.message) for w in caught if "mesh admin" in str(w.message)]
    assert LocalJob().enable_admin(admin_addr="x").admin_config.admin_addr == "x"


def test_a_client_script_finds_the_job_that_launched_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            from monarch_nb.job import LocalJob
            state = LocalJob().state()
            print("launched", getattr(state, "launched_hosts", None) is not None)
            print("default", getattr(state, "hosts", None) is not None)
            """
        )
    )
    job = LocalJob(("launched_hosts",))
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the job's logs go under the working directory
    try:
        job.apply(client_script=str(script))
    finally:
        os.chdir(cwd)
    assert job.process.wait(timeout=60) == 0, (Path(job.log_dir) / "stderr.log").read_text()
    out = (Path(job.log_dir) / "stdout.log").read_text()
    assert "launched True" in out
    assert "default False" in out
    # Run on its own, the same script describes its own job.
    alone = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    assert "launched False" in alone.stdout
    assert "default True" in alone.stdout


def test_simulator_says_what_to_do_instead() -> None:
    with pytest.raises(NotImplementedError, match=r"spawn_procs\(per_host=\{'gpus': 8\}\)"):
        monarch_nb.Simulator(hosts=2, gpus=8, trace_mode="stream_only")


def test_a_host_handle_stops_only_its_own_process_meshes() -> None:
    from monarch_nb.job import ProcessJob

    job = ProcessJob({"hosts": 1})
    try:
        first, second = job.state(cached_path=None).hosts, job.state(cached_path=None).hosts
        mine = first.spawn_procs(per_host={"procs": 1}, name="mine")
        theirs = second.spawn_procs(per_host={"procs": 1}, name="theirs")
        assert first.stop().get(timeout=60) is None
        assert mine.state == "stopped"
        assert theirs.run("1 + 1").item() == 2
        second.stop()
        assert theirs.state == "stopped"
    finally:
        job.kill()


def test_a_host_mesh_used_after_its_shutdown_says_so() -> None:
    from monarch_nb.job import ProcessJob

    job = ProcessJob({"hosts": 1})
    try:
        with job.state(cached_path=None).hosts as hosts:
            assert hosts.spawn_procs(per_host={"procs": 1}).run("2 + 2").item() == 4
        with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
            hosts.spawn_procs(per_host={"procs": 1})
        with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
            hosts.shutdown().get()  # a second shutdown raises at its result, as Monarch's
    finally:
        job.kill()
