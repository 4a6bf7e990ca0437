"""SlurmJob on the two-node test cluster: sbatch returns at once, state() waits in the queue."""

from __future__ import annotations

import time

import pytest
from slurm import SlurmCluster

from monarch_nb.job import SlurmJob, job_load

pytestmark = pytest.mark.timeout(300)


def test_apply_returns_while_queued_and_state_attaches_once_running(
    slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch, tmp_path, capsys
) -> None:
    assert slurm_cluster.hosts is not None
    for name, value in slurm_cluster.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MONARCH_NB_BIND", slurm_cluster.hosts.controller_address)
    # A job holding both nodes: ours must wait behind it.
    holder = slurm_cluster.run(
        ["sbatch", "--parsable", "--exclusive", "-N2", "-o", "/dev/null", "--wrap", "sleep 600"],
        check=True,
    ).stdout.strip()
    job = SlurmJob(
        meshes={"trainers": 2},
        partition=slurm_cluster.partition,
        env_setup="export MNB_FROM_ENV_SETUP=loaded",
    )
    assert "#SBATCH --nodes=2" in job.script()
    assert "-m monarch_nb.agent --listen tcp://0.0.0.0:" in job.script()
    assert "export MNB_FROM_ENV_SETUP=loaded ||" in job.script()  # shown before sbatch
    path = str(tmp_path / "job.json")
    try:
        started = time.monotonic()
        job.apply(cached_path=path)
        assert time.monotonic() - started < 30  # sbatch returned; nothing waited
        with pytest.raises(TimeoutError, match=r"still pending .*state\(timeout=None\)"):
            job.state(cached_path=path, timeout=3)
        assert "queued: mesh 'trainers', 2 nodes, pending" in capsys.readouterr().err
        assert job_load(path).active
        slurm_cluster.run(["scancel", holder], check=True)
        state = job.state(cached_path=path, timeout=120)
        with state.trainers.spawn_procs(per_host={"procs": 1}) as procs:
            found = procs.run(
                "import os, socket\n(socket.gethostname(), os.environ['MNB_FROM_ENV_SETUP'])"
            )
            assert sorted(found.values()) == [("host0", "loaded"), ("host1", "loaded")]
    finally:
        slurm_cluster.run(["scancel", holder])
        job.kill()
    deadline = time.monotonic() + 60
    while slurm_cluster.run(["squeue", "-h"]).stdout and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm_cluster.run(["squeue", "-h"]).stdout == ""
