"""monarch_nb.job: agents that outlive the kernel, saved state, re-attach, kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from process_checks import wait_for_exit

from monarch_nb import MeshUsageError
from monarch_nb.job import JobState, KubernetesJob, LocalJob, ProcessJob, SSHJob, job_load

pytestmark = pytest.mark.timeout(180)


def test_local_job_is_this_host_under_each_name():
    state = LocalJob(hosts=("a", "b")).state()
    with state.a.spawn_procs(per_host={"procs": 1}) as procs:
        assert procs.run("rank").values() == [0]
    with pytest.raises(AttributeError, match="no mesh 'c'; its meshes: a, b"):
        state.c  # noqa: B018


def test_process_job_saves_state_without_secrets_and_a_restarted_kernel_reattaches(tmp_path):
    path = str(tmp_path / "state" / "job.json")
    job = ProcessJob(meshes={"trainers": 2, "loaders": 1})
    try:
        state = job.state(cached_path=path)
        assert isinstance(state, JobState)
        with state.trainers.spawn_procs(per_host={"procs": 1}) as procs:
            assert procs.run("rank + 10").values() == [10, 11]
        record = _read_json(path)
        key_file = record["running"]["key_file"]
        assert os.stat(key_file).st_mode & 0o777 == 0o600
        keys = _read_json(key_file)
        with open(path) as f:
            text = f.read()
        for secret in _strings(keys):
            assert secret not in text
        pids = [agent["pid"] for agent in record["running"]["agents"]]
        for hosts in state._hosts.values():
            hosts.shutdown()  # as a dying kernel would leave them
        # A new kernel: same spec, same saved path -> the same agents.
        code = textwrap.dedent(f"""
            from monarch_nb.job import ProcessJob, job_load
            job = ProcessJob(meshes={{"trainers": 2, "loaders": 1}})
            state = job.state(cached_path={path!r})
            with state.loaders.spawn_procs(per_host={{"procs": 2}}) as procs:
                pids = [agent["pid"] for agent in job._running["agents"]]
                print(sorted(procs.run("rank").values()), pids == {pids!r})
            for name in ("trainers", "loaders"):
                state[name].shutdown()
        """)
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        assert out.stdout.strip() == "[0, 1] True", out.stderr
        assert all(_alive(pid) for pid in pids)
        loaded = job_load(path)
        assert loaded.active
        assert loaded.can_run(job)
        assert not loaded.can_run(ProcessJob(meshes={"trainers": 3}))
    finally:
        job.kill()
    assert not os.path.exists(path)
    assert not wait_for_exit(set(pids), 10)


def test_a_saved_job_with_another_spec_is_replaced(tmp_path):
    path = str(tmp_path / "job.json")
    first = ProcessJob(meshes={"hosts": 1})
    first.apply(cached_path=path)
    old = [agent["pid"] for agent in first._running["agents"]]
    second = ProcessJob(meshes={"hosts": 2})
    try:
        state = second.state(cached_path=path)
        assert not wait_for_exit(set(old), 10)  # the saved job's agents were stopped
        new = [agent["pid"] for agent in second._running["agents"]]
        assert set(new).isdisjoint(old)
        with state.hosts.spawn_procs(per_host={"procs": 1}) as procs:
            assert procs.run("rank").values() == [0, 1]
    finally:
        second.kill()
    assert not wait_for_exit(set(new), 10)


def test_bad_specs_are_named():
    with pytest.raises(MeshUsageError, match="positive host count, got 0"):
        ProcessJob(meshes={"trainers": 0})
    with pytest.raises(MeshUsageError, match="must be a Python name"):
        ProcessJob(meshes={"my mesh": 1})
    with pytest.raises(MeshUsageError, match="count 3 hosts, hosts= names 2"):
        SSHJob(hosts=["a", "b"], meshes={"x": 3})


def test_ssh_job_starts_detached_agents_through_ssh(tmp_path):
    # A stand-in for ssh that runs the remote command here, as ssh would.
    fake = tmp_path / "ssh"
    home = tmp_path / "home"
    home.mkdir()
    fake.write_text(f'#!/bin/sh\nshift 3\ncd {home} && exec sh -c "$1"\n')
    fake.chmod(0o755)
    setup = tmp_path / "env.sh"
    setup.write_text("export MNB_FROM_ENV_SETUP=loaded\n")
    # Monarch's form: meshes added by name; env_setup runs before the agent.
    job = SSHJob(ssh=[str(fake), "-T", "-o"], env_setup=f". {setup}")
    job.add_mesh("hosts", ["127.0.0.1"])
    path = str(tmp_path / "job.json")
    try:
        state = job.state(cached_path=path)
        with state.hosts.spawn_procs(per_host={"procs": 2}) as procs:
            assert procs.run("rank").values() == [0, 1]
            seen = procs.run("import os\nos.environ['MNB_FROM_ENV_SETUP']").values()
            assert seen == ["loaded", "loaded"]
        assert job_load(path).env_setup == f". {setup}"  # saved with the spec
        pid = job._running["pids"]["127.0.0.1"]
        assert _alive(pid)
        (remote_key,) = (home / ".monarch_nb").iterdir()
        assert remote_key.stat().st_mode & 0o777 == 0o600
    finally:
        job.kill()
    assert not wait_for_exit({pid}, 10)
    assert not remote_key.exists()


def test_kubernetes_manifest_runs_listening_agents_with_the_key_from_a_secret():
    job = KubernetesJob(meshes={"trainers": 2}, image="img:1", namespace="ml", gpus_per_node=8)
    service, statefulset = job.manifest()
    assert service["kind"] == "Service"
    assert service["spec"]["clusterIP"] == "None"
    spec = statefulset["spec"]
    assert spec["replicas"] == 2
    assert spec["serviceName"] == "monarch-nb-trainers"
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    command = container["command"][-1]
    assert "-m monarch_nb.agent --listen tcp://0.0.0.0:7000" in command
    assert "--key-file /etc/monarch-nb/agent.key" in command
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert pod["volumes"][0]["secret"]["secretName"] == "monarch-nb-key"
    assert job.addresses() == {
        "trainers": [f"tcp://monarch-nb-trainers-{i}.monarch-nb-trainers.ml:7000" for i in (0, 1)]
    }
    json.dumps(job.manifest())  # what kubectl apply -f - receives


def test_kubernetes_job_attaches_the_way_its_pods_listen(tmp_path):
    # The pods' command, run here with the job's own key file and addresses
    # rewritten to loopback: state() attaches through the same path.
    job = KubernetesJob(meshes={"trainers": 1}, image="img", port=_free_port())
    key_file = str(tmp_path / "agent.key")
    from monarch_nb._wire._keys import write_key_file

    write_key_file(key_file)
    command = job.manifest()[1]["spec"]["template"]["spec"]["containers"][0]["command"]
    shell = (
        command[-1].replace("0.0.0.0", "127.0.0.1").replace("/etc/monarch-nb/agent.key", key_file)
    )
    shell = shell.replace(" python ", f" {sys.executable} ")
    pod = subprocess.Popen(
        ["sh", "-c", shell], env={**os.environ, "HOSTNAME": "monarch-nb-trainers-0"}
    )
    try:
        job._running = {
            "key_file": key_file,
            "meshes": {"trainers": [f"tcp://127.0.0.1:{job.port}"]},
        }
        state = JobState(job._connect(60))
        with state.trainers.spawn_procs(per_host={"procs": 1}) as procs:
            assert procs.run("rank + 1").values() == [1]
        state.trainers.shutdown()
    finally:
        pod.terminate()
        pod.wait(10)


def _read_json(path: str):
    with open(path) as f:
        return json.load(f)


def _strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, str) and len(value) >= 20:
        yield value


def _alive(pid: int) -> bool:
    from monarch_nb._wire._pids import pid_alive

    return pid_alive(pid)


def _free_port() -> int:
    from monarch_nb._jobs._job import _free_port as free

    return free()


def test_ssh_job_names_an_env_setup_that_fails(tmp_path):
    fake = tmp_path / "ssh"
    fake.write_text(f'#!/bin/sh\nshift 3\ncd {tmp_path} && exec sh -c "$1"\n')
    fake.chmod(0o755)
    job = SSHJob(hosts=["127.0.0.1"], ssh=[str(fake), "-T", "-o"], env_setup="false")
    failed = r"on '127.0.0.1' failed \(97\).*env_setup failed: false"
    with pytest.raises(MeshUsageError, match=failed):
        job.apply(cached_path=str(tmp_path / "job.json"))
    assert not (tmp_path / ".monarch_nb").exists()  # the key was never written there


# -- agents nobody re-attaches: agent_idle_timeout ----------------------------------


def test_process_job_agents_nobody_reattaches_end_by_themselves(tmp_path):
    from monarch_nb import config

    path = str(tmp_path / "job.json")
    job = ProcessJob(meshes={"hosts": 2})
    with config.configured(agent_idle_timeout=0.5):  # the agents inherit the variable
        job.apply(cached_path=path)
    pids = {agent["pid"] for agent in job._running["agents"]}
    key_file = job._running["key_file"]
    again = ProcessJob(meshes={"hosts": 2})
    try:
        assert wait_for_exit(pids, 30) == set()  # nobody attached: each exits by itself
        assert not os.path.exists(key_file)  # the job's key file went with them
        # A later state() finds them gone and starts the job afresh.
        state = again.state(cached_path=path)
        assert {agent["pid"] for agent in again._running["agents"]}.isdisjoint(pids)
        with state.hosts.spawn_procs(per_host={"procs": 1}) as procs:
            assert procs.run("rank").values() == [0, 1]
    finally:
        again.kill()
        job._path = None  # the file is again's now, removed by its kill()
        job.kill()


def test_remote_agents_get_the_idle_timeout_on_their_command_line():
    from monarch_nb import config
    from monarch_nb.job import SlurmJob

    with config.configured(agent_idle_timeout=7.5):
        ssh = SSHJob(hosts=["node1"])._remote_start("node1", 0, ".monarch_nb/agent-job-0.key")
        slurm = SlurmJob(meshes={"trainers": 2}).script()
    for command in (ssh, slurm):
        assert "export MONARCH_NB_AGENT_IDLE_TIMEOUT=7.5; " in command
    assert slurm.index("MONARCH_NB_AGENT_IDLE_TIMEOUT") < slurm.index("-m monarch_nb.agent")


# -- SLURM job ids from the state file reach scancel only as job ids -----------------


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """scancel, squeue, sacct and sbatch stand-ins that log their arguments."""
    bin_dir, log = tmp_path / "bin", tmp_path / "slurm.log"
    bin_dir.mkdir()
    for name in ("scancel", "squeue", "sacct", "sbatch"):
        tool = bin_dir / name
        tool.write_text(
            f'#!/bin/sh\necho {name} "$@" >> {log}\n[ {name} != sbatch ] || echo "$SBATCH_PRINTS"\n'
        )
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    log.touch()
    return log


def _saved_slurm_job(tmp_path, job_id: object):
    from monarch_nb._jobs import _state_file
    from monarch_nb.job import SlurmJob

    job = SlurmJob(meshes={"trainers": 2}, port=24242)
    path = str(tmp_path / "state" / "job.json")
    running = {"key_file": str(tmp_path / "state" / "job-0123456789ab.key"), "meshes": {}}
    running["ids"] = {"trainers": job_id}
    _state_file.write(path, {"kind": "slurm", "spec": job.spec(), "running": running})
    return job, path


@pytest.mark.parametrize("job_id", ["--user=me", "-u", "123 456", "12;rm", 4242, "", "4242_1"])
def test_a_saved_slurm_job_id_that_is_not_digits_never_reaches_scancel(
    tmp_path, fake_slurm, job_id
):
    job, path = _saved_slurm_job(tmp_path, job_id)
    with pytest.raises(MeshUsageError, match=r"not a running state monarch_nb wrote.*not digits"):
        job.state(cached_path=path)
    with pytest.raises(MeshUsageError, match=r"saved job id .* is not a SLURM job id \(digits"):
        job_load(path).kill()  # job_load trusts the file's spec, never its ids
    assert fake_slurm.read_text() == ""  # no scancel, squeue or sacct ran


def test_a_saved_slurm_job_id_of_digits_is_cancelled(tmp_path, fake_slurm):
    _, path = _saved_slurm_job(tmp_path, "4242")
    job_load(path).kill()
    assert fake_slurm.read_text().splitlines() == ["scancel 4242"]
    assert not os.path.exists(path)


def test_an_sbatch_that_prints_no_job_id_fails_the_apply(tmp_path, fake_slurm, monkeypatch):
    from monarch_nb.job import SlurmJob

    monkeypatch.setenv("SBATCH_PRINTS", "--user=me")
    job = SlurmJob(meshes={"trainers": 1})
    with pytest.raises(
        MeshUsageError, match="sbatch for mesh 'trainers' failed: it printed '--user=me'"
    ):
        job.apply(cached_path=str(tmp_path / "job.json"))
    assert fake_slurm.read_text().splitlines() == ["sbatch --parsable --output=/dev/null"]
