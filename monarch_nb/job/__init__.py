"""Jobs as in Monarch's ``monarch.job``: apply(), state() (one HostMesh per mesh), kill().

::

    from monarch_nb.job import ProcessJob, SSHJob, KubernetesJob, LocalJob, job_load

    job = SSHJob(hosts=["node1", "node2"], meshes={"trainers": 2})
    procs = job.state().trainers.spawn_procs(per_host={"gpus": 8})
"""

from __future__ import annotations

from .._jobs._admin import MeshAdminConfig
from .._jobs._exec_command import exec_command
from .._jobs._job import (
    DEFAULT_JOB_PATH,
    JobState,
    JobTrait,
    ProcessJob,
    SSHJob,
    job_load,
    job_loads,
)
from .._jobs._kubernetes import KubernetesJob
from .._jobs._local import LocalJob
from .._jobs._port_forward import PortForwarder
from .._jobs._shell import shell
from .._jobs._slurm import SlurmJob
from .._jobs._telemetry import TelemetryConfig

__all__ = [
    "DEFAULT_JOB_PATH",
    "JobState",
    "JobTrait",
    "KubernetesJob",
    "LocalJob",
    "MeshAdminConfig",
    "PortForwarder",
    "ProcessJob",
    "SSHJob",
    "SlurmJob",
    "TelemetryConfig",
    "exec_command",
    "job_load",
    "job_loads",
    "shell",
]
