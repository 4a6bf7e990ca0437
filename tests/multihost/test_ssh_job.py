"""SSHJob across network-namespace hosts with real sshd: detached agents, re-attach, kill."""

from __future__ import annotations

import time

import pytest

from monarch_nb.job import SSHJob, job_load

pytestmark = pytest.mark.timeout(240)


def test_ssh_job_meshes_reattach_and_kill(cluster2, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MONARCH_NB_BIND", cluster2.controller_address)
    path = str(tmp_path / "job.json")

    def spec() -> SSHJob:
        return SSHJob(
            hosts=cluster2.hosts, meshes={"a": 1, "b": 1}, ssh_options=cluster2.ssh_options
        )

    job = again = spec()
    try:
        state = job.state(cached_path=path, timeout=180)  # generous: a loaded machine
        for i, name in enumerate(("a", "b")):
            with state[name].spawn_procs(per_host={"procs": 1}) as procs:
                (found,) = procs.run("import socket; socket.gethostname()").values()
                assert found == cluster2.hostnames[i]
        pids = dict(job._running["pids"])
        for i, host in enumerate(cluster2.hosts):
            assert pids[host] in cluster2.pids(i)  # the agent runs on its host
        for name in ("a", "b"):
            state[name].shutdown()  # the kernel goes away; the agents stay
        again = spec()  # a restarted kernel, same spec
        state = again.state(cached_path=path, timeout=180)  # generous: a loaded machine
        assert again._running["pids"] == pids
        with state.b.spawn_procs(per_host={"procs": 2}) as procs:
            assert procs.run("rank").values() == [0, 1]
        assert job_load(path).can_run(spec())
    finally:
        again.kill()  # the same agents whichever object holds them
    job._state = None  # its meshes were shut down above
    deadline = time.monotonic() + 30
    left = [p for i in (0, 1) for p in cluster2.pids(i) if p in pids.values()]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for i in (0, 1) for p in cluster2.pids(i) if p in pids.values()]
    assert left == []


def test_ssh_job_runs_env_setup_and_a_venv_on_each_host(
    cluster2, monkeypatch, tmp_path, host_venv, env_script
) -> None:
    monkeypatch.setenv("MONARCH_NB_BIND", cluster2.controller_address)
    job = SSHJob(
        hosts=cluster2.hosts,
        python=str(host_venv),
        env_setup=f". {env_script}",
        ssh_options=cluster2.ssh_options,
    )
    try:
        state = job.state(cached_path=str(tmp_path / "job.json"), timeout=180)
        with state.hosts.spawn_procs(per_host={"procs": 1}) as procs:
            seen = procs.run("import os, sys\n(os.environ['MNB_FROM_ENV_SETUP'], sys.prefix)")
        assert list(seen.values()) == [("loaded", str(host_venv))] * 2
    finally:
        job.kill()
