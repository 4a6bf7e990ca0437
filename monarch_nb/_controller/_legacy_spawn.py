"""``proc_mesh(gpus=, env=)``: Monarch's older way to start processes, which its
launch article still shows; today's is ``this_host().spawn_procs(per_host=...)``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._model._errors import MeshUsageError


def proc_mesh(
    *,
    gpus: int | None = None,
    hosts: int = 1,
    env: Mapping[str, str] | None = None,
    setup: Callable[[], Any] | None = None,
) -> Any:
    """``gpus`` processes on this host, dimension ``gpus`` (one GPU each where the
    host has them), with ``env`` added to their environment; ``setup`` runs first
    in each (``spawn_procs(bootstrap=)``). The same as
    ``this_host().spawn_procs(per_host={"gpus": gpus}, env=env, bootstrap=setup)``.
    """
    from ._proc_mesh import this_host

    if hosts != 1:
        raise MeshUsageError(
            f"proc_mesh(hosts={hosts!r}): this form starts processes on this host only; "
            "for several hosts start a host mesh (ssh_hosts, slurm_hosts, a job's "
            "state()) and call its spawn_procs(per_host={'gpus': N})"
        )
    if gpus is None:
        gpus = 1
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise MeshUsageError(f"proc_mesh(gpus={gpus!r}): gpus is a positive int")
    return this_host().spawn_procs(per_host={"gpus": gpus}, env=env, bootstrap=setup)
