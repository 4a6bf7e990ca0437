"""``SlurmJob``: agents in an ``sbatch`` allocation; ``apply()`` submits and returns.

One batch job per named mesh. Its script (``job.script(name)``, shown before
submission) runs one listening agent per node with ``srun``; the agents read
the job's key file (0600) at the same path, so it must be on storage the
nodes share (a home directory, as on most clusters; ``key_dir=`` picks
another). ``state()`` waits while the queue holds the job, printing a
progress line, then attaches to each node's agent at its ``NodeAddr``.
"""

from __future__ import annotations

import random
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .._controller._proc_mesh import HostMesh
from .._model._errors import MeshFailure, MeshUsageError
from ._job import JobTrait, _attach_when_listening, _idle_timeout_export, _meshes
from ._launchers import host_prelude

_ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"}
_WHY_ENDED = {"TIMEOUT": "reached its time limit", "PREEMPTED": "was preempted"}
# What sbatch --parsable prints first: a job id, digits only. An id goes on the
# command lines of scancel, squeue and sacct, so one read back from the saved
# state must be this and nothing else: "--user=me" would cancel all your jobs.
_JOB_ID = re.compile(r"[0-9]{1,12}")


class SlurmJob(JobTrait):
    """Agents on SLURM nodes, one ``sbatch`` per mesh: ``meshes={"trainers": 2}``."""

    kind = "slurm"

    def __init__(
        self,
        meshes: Mapping[str, int],
        *,
        partition: str | None = None,
        gpus_per_node: int | None = None,
        time_limit: str | None = None,
        account: str | None = None,
        sbatch_args: Sequence[str] = (),
        python: str | None = None,
        env_setup: str | None = None,
        port: int | None = None,
    ) -> None:
        super().__init__()
        self.meshes = _meshes(meshes, "SlurmJob")
        self.partition, self.gpus_per_node = partition, gpus_per_node
        self.time_limit, self.account = time_limit, account
        self.sbatch_args = list(sbatch_args)
        self.python = python or sys.executable
        self.env_setup = env_setup
        # One port for every agent of the job; the node picks none, so it is saved.
        self.port = port or random.randrange(20000, 40000)

    def spec(self) -> dict[str, Any]:
        return {
            "meshes": self.meshes,
            "partition": self.partition,
            "gpus_per_node": self.gpus_per_node,
            "time_limit": self.time_limit,
            "account": self.account,
            "sbatch_args": self.sbatch_args,
            "python": self.python,
            "env_setup": self.env_setup,
            "port": self.port,
        }

    def script(self, mesh: str | None = None, key_file: str = "KEY_FILE") -> str:
        """The batch script for ``mesh`` (default: the first), as ``sbatch`` gets it."""
        name = mesh or next(iter(self.meshes))
        lines = ["#!/bin/sh", f"#SBATCH --job-name=monarch_nb-{name}"]
        lines.append(f"#SBATCH --nodes={self.meshes[name]}")
        lines.append("#SBATCH --ntasks-per-node=1")
        for flag, value in (
            ("--partition", self.partition),
            ("--gpus-per-node", self.gpus_per_node),
            ("--time", self.time_limit),
            ("--account", self.account),
        ):
            if value is not None:
                lines.append(f"#SBATCH {flag}={value}")
        lines += [f"#SBATCH {arg}" for arg in self.sbatch_args]
        agent = host_prelude(self.python, self.env_setup) + (
            _idle_timeout_export() + 'exec "$p" -m monarch_nb.agent '
            f"--listen tcp://0.0.0.0:{self.port} --key-file {shlex.quote(key_file)} "
            "--host-index $SLURM_NODEID"
        )
        lines.append(f"srun --ntasks-per-node=1 sh -c {shlex.quote(agent)}")
        return "\n".join(lines) + "\n"

    def _create(self, key_file: str) -> dict[str, Any]:
        ids: dict[str, str] = {}
        for mesh in self.meshes:
            done = subprocess.run(
                ["sbatch", "--parsable", "--output=/dev/null"],
                input=self.script(mesh, key_file).encode(),
                capture_output=True,
                timeout=60,
            )
            printed = done.stdout.decode(errors="replace").strip().split(";")[0]
            if done.returncode != 0 or not _JOB_ID.fullmatch(printed):
                self._running = {"ids": ids}
                self._kill()  # the meshes submitted before this one
                why = done.stderr.decode(errors="replace").strip() or f"it printed {printed!r}"
                raise MeshUsageError(f"SlurmJob: sbatch for mesh {mesh!r} failed: {why}")
            ids[mesh] = printed
        return {"ids": ids, "meshes": {}}

    def _running_problem(self, running: Any, path: str) -> str:
        problem = super()._running_problem(running, path)
        if problem:
            return problem
        ids = running.get("ids")
        if not isinstance(ids, dict) or set(ids) != set(self.meshes):
            return "'ids' is not a job id per mesh of the spec"
        if not all(isinstance(i, str) and _JOB_ID.fullmatch(i) for i in ids.values()):
            return f"a SLURM job id in {ids!r} is not digits"
        return ""

    def _ids(self) -> dict[str, str]:
        """The job id of each mesh, each checked (``MeshUsageError`` for one that is
        not a job id: never passed on to a SLURM command)."""
        ids = (self._running or {}).get("ids", {})
        if not isinstance(ids, dict):
            raise MeshUsageError(f"SlurmJob: saved 'ids' {ids!r} is not a job id per mesh")
        return {mesh: _job_id(i, "saved") for mesh, i in ids.items()}

    def _alive(self) -> bool:
        ids = self._ids()
        return bool(ids) and all(
            _squeue(i)[0] in ("PENDING", "RUNNING", "CONFIGURING") for i in ids.values()
        )

    def _kill(self) -> None:
        ids = list(self._ids().values())
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=60, check=False)

    def _connect(self, timeout: float | None) -> dict[str, HostMesh]:
        assert self._running is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        started = time.monotonic()
        meshes: dict[str, list[str]] = self._running.setdefault("meshes", {})
        for mesh, job_id in self._ids().items():
            if mesh not in meshes:
                nodes = self._wait_running(mesh, job_id, started, deadline)
                meshes[mesh] = [f"tcp://{_node_address(n)}:{self.port}" for n in nodes]
        if self._path:
            self.dump(self._path)
        left = None if deadline is None else max(1.0, deadline - time.monotonic())
        key_file = self._running["key_file"]
        return {m: _attach_when_listening(a, key_file, left) for m, a in meshes.items()}

    def _wait_running(
        self, mesh: str, job_id: str, started: float, deadline: float | None
    ) -> list[str]:
        shown = ""
        while True:
            state, reason, nodelist = _squeue(job_id)
            if state == "RUNNING":
                return _hostnames(nodelist)
            if state in _ENDED or state == "":
                why = _WHY_ENDED.get(state, f"ended ({state or 'gone from the queue'})")
                raise MeshFailure(f"SLURM job {job_id} (mesh {mesh!r}) {why}")
            waited = time.monotonic() - started
            why = f" {reason}" if reason and reason != "None" else ""
            line = f"queued: mesh {mesh!r}, {self.meshes[mesh]} nodes, {state.lower()}{why}, "
            line += f"{waited:.0f} s"
            if line.rsplit(",", 1)[0] != shown.rsplit(",", 1)[0] or int(waited) % 10 == 0:
                print(line, file=sys.stderr, flush=True)
                shown = line
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"SLURM job {job_id} (mesh {mesh!r}) still {state.lower()} ({reason}); "
                    "state(timeout=None) waits as long as the queue does"
                )
            # A job that starts at once is seen at once; a long wait polls slowly.
            time.sleep(min(2.0, 0.05 + waited / 20))


def _job_id(value: Any, where: str) -> str:
    """``value`` if it is a SLURM job id (digits), else ``MeshUsageError``."""
    if isinstance(value, str) and _JOB_ID.fullmatch(value):
        return value
    raise MeshUsageError(
        f"SlurmJob: {where} job id {value!r} is not a SLURM job id (digits, e.g. '4242'); "
        "nothing was passed to scancel/squeue. If the job state file was edited, remove it "
        "and cancel the job yourself (scancel ID)"
    )


def _squeue(job_id: str) -> tuple[str, str, str]:
    """(state, reason, nodelist) of a job; ("", "", "") once SLURM forgot it."""
    job_id = _job_id(job_id, "queried")
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"], capture_output=True, timeout=60
    )
    text = out.stdout.decode().strip()
    if out.returncode != 0 or not text:
        sacct = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
            capture_output=True,
            timeout=60,
        )
        states = sacct.stdout.decode().split()
        return (states[0] if states else "", "", "")
    fields = [*text.splitlines()[0].split("|"), "", ""]
    return fields[0], fields[1], fields[2]


def _hostnames(nodelist: str) -> list[str]:
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, timeout=60, check=True
    )
    return out.stdout.decode().split()


def _node_address(node: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "node", node, "-o"], capture_output=True, timeout=60, check=True
    )
    for field in out.stdout.decode().split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return node
