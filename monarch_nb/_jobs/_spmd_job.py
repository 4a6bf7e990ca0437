"""``serve()`` and ``SPMDJob``, as Monarch's ``monarch.job.spmd``: reserve hosts
once, then run an unmodified torchrun command on them as often as you like.

::

    job = serve(["torchrun", "--nproc-per-node=4", "--standalone", "train.py"])
    job.run_spmd()      # edit train.py, then again: same hosts, fresh processes

Each ``run_spmd()`` starts ``--nproc-per-node`` ranks on every host of the
job, gives each torchrun's environment (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` ...) and runs the script as ``__main__``; the ranks stop when
it ends, so the next run reads the script afresh. Monarch's reaches hosts
through torchx; ours runs a local scheduler on this host, and takes other
hosts from any monarch_nb job (``serve(command, job=SlurmJob(...))``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._controller._proc_mesh import this_host
from .._model._errors import MeshUsageError
from .._services._spmd import SPMDActor
from ._job import _PICKLED_JOB_PATH, JobState, JobTrait
from ._slurm import SlurmJob
from ._torchrun_args import TorchrunCommand, parse_torchrun

# The mesh name a served job's hosts go by (``job.state().workers``), as Monarch's.
WORKERS = "workers"


def _command_of(appdef: Any) -> tuple[list[str], int]:
    """(command, replicas) of a command list or of a torchx ``AppDef``'s one role."""
    if isinstance(appdef, (list, tuple)):
        return [str(a) for a in appdef], 1
    roles = getattr(appdef, "roles", None)
    if roles is None:
        raise MeshUsageError(
            f"serve({type(appdef).__name__}): expected a torchrun command as a list "
            "(['torchrun', '--nproc-per-node=4', 'train.py']) or a torchx AppDef"
        )
    if len(roles) != 1:
        raise MeshUsageError(
            f"serve(AppDef): {len(roles)} roles; an SPMD job runs one (one program on every rank)"
        )
    role = roles[0]
    entrypoint, args = str(role.entrypoint), [str(a) for a in role.args]
    # An entrypoint that is a launcher script (a workspace's entrypoint.sh) runs its args.
    command = [entrypoint, *args] if _is_launcher(entrypoint) else args
    return command, int(getattr(role, "num_replicas", 1) or 1)


def _is_launcher(program: str) -> bool:
    name = os.path.basename(program)
    return name in ("torchrun", "torch.distributed.run") or name.startswith("python")


def _hosts_job(scheduler: str, scheduler_cfg: Mapping[str, Any], replicas: int) -> JobTrait | None:
    """The job that reserves the hosts, or None for this host alone."""
    if scheduler.startswith("local"):
        if replicas != 1:
            raise MeshUsageError(
                f"serve(scheduler={scheduler!r}): a local scheduler runs on this host "
                f"alone, and the command asks for {replicas} nodes; pass job= (any "
                "monarch_nb job, e.g. SSHJob or SlurmJob) for more hosts"
            )
        return None
    if scheduler == "slurm":
        unknown = set(scheduler_cfg) - {"partition", "account", "time"}
        if unknown:
            raise MeshUsageError(
                f"serve(scheduler='slurm'): scheduler_cfg keys {sorted(unknown)} are not "
                "understood (partition, account and time are); for other sbatch options "
                "pass job=SlurmJob(..., sbatch_args=[...])"
            )
        return SlurmJob(
            {WORKERS: replicas},
            partition=scheduler_cfg.get("partition"),
            account=scheduler_cfg.get("account"),
            time_limit=scheduler_cfg.get("time"),
        )
    raise MeshUsageError(
        f"serve(scheduler={scheduler!r}): monarch_nb starts hosts itself and does not "
        "drive torchx's schedulers; use scheduler='local_cwd' (this host), "
        "scheduler='slurm', or pass job= with any monarch_nb job (SSHJob, "
        "KubernetesJob, ProcessJob, ...)"
    )


def serve(
    appdef: Any,
    scheduler: str = "local_cwd",
    scheduler_cfg: Mapping[str, Any] | None = None,
    *,
    job: JobTrait | None = None,
) -> SPMDJob:
    """Reserve the hosts for a torchrun command; ``run_spmd()`` then runs it.

    ``appdef`` is a torchrun command as a list (``["torchrun",
    "--nproc-per-node=4", "--standalone", "train.py"]``; one node) or a torchx
    ``AppDef`` with one role (``num_replicas`` nodes). ``scheduler``:
    ``"local..."`` (this host) or ``"slurm"`` (``scheduler_cfg`` may give
    ``partition``, ``account``, ``time``); ``job=`` takes the hosts from any
    monarch_nb job instead (its only mesh, or the one named ``workers``).
    The command is checked here, before anything starts.
    """
    command, replicas = _command_of(appdef)
    parsed = parse_torchrun(command)
    if isinstance(appdef, (list, tuple)) and parsed.nnodes != 1:
        raise MeshUsageError(
            f"serve({command!r}): --nnodes={parsed.nnodes}; a command list runs on one "
            "node (--standalone or --nnodes=1): for more, pass a torchx AppDef with "
            "num_replicas, or job= with a multi-host monarch_nb job"
        )
    if job is None:
        job = _hosts_job(scheduler, scheduler_cfg or {}, max(replicas, parsed.nnodes))
    served = SPMDJob(command, scheduler=scheduler, hosts_job=job)
    served.apply()
    # Saved where job_load() looks by default, replacing the last served job's state
    # (as Monarch's serve()): a new session picks it up with job_load().run_spmd().
    served.dump(_PICKLED_JOB_PATH)
    return served


class SPMDJob(JobTrait):
    """A served torchrun command and the hosts reserved for it (see :func:`serve`).

    Written to Monarch's job contract, so ``job.dump(path)`` / ``job_load(path)``
    bring it back in a new session, where ``run_spmd()`` runs on the same hosts.
    """

    kind = "spmd"

    def __init__(
        self,
        command: Sequence[str],
        scheduler: str = "local_cwd",
        hosts_job: JobTrait | None = None,
    ) -> None:
        super().__init__()
        self.command = [str(a) for a in command]
        self.scheduler = scheduler
        self.hosts_job = hosts_job
        parse_torchrun(self.command)  # a bad command fails here, not at run_spmd()

    def can_run(self, other: JobTrait) -> bool:
        return (
            isinstance(other, SPMDJob)
            and other.command == self.command
            and other.scheduler == self.scheduler
        )

    def _create(self, client_script: str | None = None) -> None:
        if client_script is not None:
            raise MeshUsageError(
                "SPMDJob.apply(client_script=...): an SPMD job runs its torchrun "
                "command (run_spmd()), not a client script"
            )
        if self.hosts_job is not None:
            self.hosts_job.apply()

    def _state(self) -> JobState:
        if self.hosts_job is None:
            return JobState({WORKERS: this_host()})
        hosts = self.hosts_job.state()
        names = list(hosts)
        name = WORKERS if WORKERS in names else names[0] if len(names) == 1 else None
        if name is None:
            raise MeshUsageError(
                f"SPMDJob: job= has meshes {names}; name the one to run on 'workers'"
            )
        return JobState({WORKERS: hosts[name]})

    def _kill(self) -> None:
        if self.hosts_job is not None:
            self.hosts_job.kill()

    def run_spmd(self, timeout: float | None = None) -> None:
        """Run the command on every host of the job: ``--nproc-per-node`` fresh ranks
        a host with torchrun's environment, each running the script as ``__main__``.
        Returns when every rank's script has ended; a script that raises or exits
        with a non-zero status fails the run (a ``RemoteError`` naming the ranks).
        The ranks are stopped either way."""
        parsed: TorchrunCommand = parse_torchrun(self.command)
        hosts = self.state()[WORKERS]
        procs = hosts.spawn_procs(per_host={"gpus": parsed.nproc_per_node})
        try:
            actors = procs.spawn("_SPMDActor", SPMDActor)
            addr, port = parsed.master_addr, parsed.master_port
            if addr is None or port is None:  # what the command leaves open: rank 0's
                first = actors.slice(**dict.fromkeys(procs.shape.labels, 0))
                host, free = first.get_host_port.call_one(None).get(timeout=timeout)
                addr, port = addr or host, port or free
            actors.main.call(addr, port, parsed.script_args).get(timeout=timeout)
        finally:
            procs.stop().get()
