"""The SLURM test cluster: srun, sbatch, salloc and scancel across two namespace hosts."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from slurm import SlurmCluster, remove_stale_slurm_clusters, slurm_unavailable_reason
from system import pid_alive, run_then_sigkill_itself

from monarch_nb import MeshFailure, RankState, slurm_hosts


def test_srun_runs_this_interpreter_on_both_hosts(slurm_cluster: SlurmCluster) -> None:
    # What a SLURM launcher does: one task per node, this interpreter, the
    # caller's environment exported (srun's default --export=ALL).
    probe = (
        "import monarch_nb, os, socket;"
        "print(socket.gethostname(), os.environ['SLURM_NODEID'], os.environ['MARK'])"
    )
    done = subprocess.run(
        ["srun", "-p", slurm_cluster.partition, "-N2", "--ntasks-per-node=1",
         sys.executable, "-c", probe],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env={**os.environ, **slurm_cluster.env, "MARK": "exported"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["host0 0 exported", "host1 1 exported"]


def test_slurm_mesh_ranks_run_on_their_nodes(
    slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert slurm_cluster.hosts is not None
    for name, value in slurm_cluster.env.items():
        monkeypatch.setenv(name, value)  # what srun needs to find the cluster
    hosts = slurm_hosts(
        2,
        partition=slurm_cluster.partition,
        bind=slurm_cluster.hosts.controller_address,
        env_setup="export MNB_FROM_ENV_SETUP=node-$SLURM_NODEID",  # runs on each node
    )
    try:
        with hosts.spawn_procs({"procs": 1}) as procs:
            found = procs.run(
                "import os, socket\nenv = os.environ\n"
                "(socket.gethostname(), env['SLURM_NODEID'], env['MNB_FROM_ENV_SETUP'])"
            )
            assert list(found.values()) == [("host0", "0", "node-0"), ("host1", "1", "node-1")]
    finally:
        hosts.shutdown()
    # The job ended with the mesh: no agent or worker is left on the nodes
    # (they carry srun's environment, SLURM_CONF included: pids() finds them).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = [p for p in slurm_cluster.pids() if "monarch_nb" in _cmdline(p)]
        if not left and not slurm_cluster.run(["squeue", "-h"]).stdout:
            break
        time.sleep(0.1)
    assert left == []
    assert slurm_cluster.run(["squeue", "-h"]).stdout == ""


def test_scancel_of_the_mesh_job_fails_every_rank_at_once(
    slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert slurm_cluster.hosts is not None
    for name, value in slurm_cluster.env.items():
        monkeypatch.setenv(name, value)
    hosts = slurm_hosts(
        2, partition=slurm_cluster.partition, bind=slurm_cluster.hosts.controller_address
    )
    try:
        procs = hosts.spawn_procs({"procs": 1})
        call = procs.exec("import time; time.sleep(60)")
        slurm_cluster.run(["scancel", "-n", "monarch_nb"], check=True)
        started = time.monotonic()
        # scancel signals every process of the job: a rank's SIGTERM or its
        # agent's end (srun exits) is seen first, whichever wins.
        with pytest.raises(MeshFailure, match=r"SIGTERM|lost its agent: srun ended"):
            call.get(timeout=30)
        deadline = started + 10
        while time.monotonic() < deadline:
            states = {r.rank: r.state for r in procs.status().ranks}
            if states == {0: RankState.DEAD, 1: RankState.DEAD}:
                break
            time.sleep(0.1)
        assert states == {0: RankState.DEAD, 1: RankState.DEAD}
        procs.stop()
    finally:
        hosts.shutdown()


def test_sbatch_and_salloc(slurm_cluster: SlurmCluster) -> None:
    assert slurm_cluster.hosts is not None
    out = os.path.join(slurm_cluster.workdir, "batch.out")
    batch = slurm_cluster.run(
        ["sbatch", "--wait", "-N2", "-o", out, "--wrap", "srun hostname"], check=True
    )
    assert batch.stdout.startswith("Submitted batch job")
    with open(out) as f:
        assert sorted(f.read().split()) == ["host0", "host1"]
    alloc = slurm_cluster.run(["salloc", "-N1", "-w", "host1", "srun", "hostname"], check=True)
    assert alloc.stdout.strip() == "host1"


def test_scancel_kills_a_jobs_tasks(slurm_cluster: SlurmCluster) -> None:
    job = subprocess.Popen(
        ["srun", "-N2", "-J", "sleeper", "sleep", "300"],
        env={**os.environ, **slurm_cluster.env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _cancel_and_check(slurm_cluster, job)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def _cancel_and_check(slurm_cluster: SlurmCluster, job: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while len(sleepers := _sleepers(slurm_cluster)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(sleepers) == 2
    slurm_cluster.run(["scancel", "-n", "sleeper"], check=True)
    assert job.wait(timeout=60) != 0
    deadline = time.monotonic() + 30
    while any(pid_alive(p) for p in sleepers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in sleepers if pid_alive(p)]


@pytest.mark.timeout(300)
def test_a_killed_hosts_slurmd_restarts(slurm_cluster: SlurmCluster) -> None:
    # A host crash (kill_host) takes its slurmd; started again, the node rejoins
    # (ReturnToService=2) and srun -N2 reaches both hosts again. How soon it
    # rejoins depends on the machine's load: the deadlines only catch a hang.
    assert slurm_cluster.hosts is not None
    slurm_cluster.hosts.kill_host(1)
    slurm_cluster.restart_slurmd(1, timeout=120)
    slurm_cluster.wait_for_nodes_idle(timeout=120)
    done = slurm_cluster.run(["srun", "-N2", "hostname"], timeout=120, check=True)
    assert sorted(done.stdout.split()) == ["host0", "host1"]


def test_single_node_cluster_on_this_machine_leaves_nothing() -> None:
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(f"no SLURM cluster: {reason}")
    with SlurmCluster() as slurm:
        done = slurm.run(["srun", "-N1", "-n1", "hostname"], check=True)
        assert done.stdout.strip() == slurm.nodes[0]
        pids = slurm.pids()
        assert len(pids) >= 3  # munged, slurmctld, slurmd
    assert not [p for p in pids if pid_alive(p)]
    assert not os.path.exists(slurm.workdir)


def _sleepers(slurm: SlurmCluster) -> list[int]:
    found = []
    for pid in slurm.pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            # srun runs the task by its full path: /usr/bin/sleep.
            if os.path.basename(argv[0]) == b"sleep" and argv[1:2] == [b"300"]:
                found.append(pid)
        except FileNotFoundError:
            pass
    return found


def test_a_killed_runs_slurm_cluster_is_removed_by_the_next() -> None:
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(f"no SLURM cluster: {reason}")
    # A test process SIGKILLed mid-run leaves munged, slurmctld and slurmd
    # running in the root namespace; the next SlurmCluster kills them.
    workdir, *pids = run_then_sigkill_itself(
        "import slurm; s = slurm.SlurmCluster(); print(s.workdir, *s.pids())"
    )
    assert len(pids) >= 3
    assert {int(p) for p in pids} <= set(remove_stale_slurm_clusters())
    assert not [p for p in pids if pid_alive(int(p))]
    assert not os.path.exists(workdir)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""
