"""SlurmJob: ``apply()`` to the first reply from its hosts, beside a bare ``srun hostname``.

Run (root, Linux): ``python benchmarks/bench_jobs.py [--runs N]``.

The two-node SLURM cluster of the multi-host tests (``tests/multihost/slurm.py``:
slurmctld plus one slurmd per network-namespace host). Each run: ``sbatch``
of the agents' script, ``state()`` waiting for RUNNING and attaching, a
1-rank-per-host mesh started and one ``run("1")`` answered by both; then
``kill()``. Baselines in the same run: ``srun -N2 hostname`` (allocation, launch and
exit of a trivial step), and the same step inside ``sbatch --wait`` (what a
batch submission pays before our agents start).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "multihost"))

from cluster import NetnsCluster  # noqa: E402
from slurm import SlurmCluster  # noqa: E402

from monarch_nb.job import SlurmJob  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with NetnsCluster(2) as hosts, SlurmCluster(hosts) as slurm:
        os.environ.update(slurm.env)
        os.environ["MONARCH_NB_BIND"] = hosts.controller_address
        bare, batch, job_times, parts = [], [], [], []
        for _ in range(args.runs):
            t = time.perf_counter()
            subprocess.run(["srun", "-N2", "hostname"], check=True, capture_output=True)
            bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run(
                ["sbatch", "--wait", "-N2", "-o", "/dev/null", "--wrap", "srun hostname"],
                check=True,
                capture_output=True,
            )
            batch.append(time.perf_counter() - t)
            with tempfile.TemporaryDirectory() as tmp:
                job = SlurmJob(meshes={"trainers": 2}, partition=slurm.partition)
                t = time.perf_counter()
                job.apply(cached_path=os.path.join(tmp, "job.json"))
                t_apply = time.perf_counter()
                state = job.state(cached_path=os.path.join(tmp, "job.json"), timeout=120)
                t_state = time.perf_counter()
                with state.trainers.spawn_procs(per_host={"procs": 1}) as procs:
                    assert procs.run("1").values() == [1, 1]
                    job_times.append(time.perf_counter() - t)
                parts.append((t_apply - t, t_state - t_apply, job_times[-1] - (t_state - t)))
                job.kill()
        b, j = statistics.median(bare), statistics.median(job_times)
        print(f"srun -N2 hostname                     median {b:6.2f} s  (baseline)")
        sb = statistics.median(batch)
        print(f"sbatch --wait -N2 --wrap 'srun hostname' median {sb:6.2f} s")
        print(f"SlurmJob apply -> first reply (2 nodes) median {j:6.2f} s  ({j / b:.1f}x)")
        a, w, r = (statistics.median(p[i] for p in parts) for i in range(3))
        print(
            f"  of which: sbatch {a:.2f} s, queue + agents up + attach {w:.2f} s, "
            f"spawn_procs + first reply {r:.2f} s"
        )


if __name__ == "__main__":
    main()
