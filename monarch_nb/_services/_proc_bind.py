"""What a new worker does first, before it runs anything of the user's: its CPU
binding (``spawn_procs(proc_bind=...)``) and its bootstrap function
(``spawn_procs(bootstrap=...)``).

``proc_bind`` is Monarch's format: one dict per process of a host, mapping
``cpus`` (a CPU list, as ``taskset -c`` reads it: ``"0-3,8"``), ``physcpubind``
(the same, as ``numactl --physcpubind``) or ``cpunodebind`` (NUMA nodes, whose
CPUs the kernel lists under ``/sys/devices/system/node``) to a value. Monarch
wraps the command in ``numactl`` or ``taskset``; here the worker binds itself
with ``os.sched_setaffinity`` as it starts, which needs neither tool.
``membind`` (a memory policy) needs ``numactl`` and is refused.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from .._model._errors import MeshUsageError
from . import _interpreter

BIND_KEYS = ("cpus", "physcpubind", "cpunodebind")
_NODE_DIR = "/sys/devices/system/node"
# A worker whose bootstrap function raised exits with this code, its traceback on stderr.
BOOTSTRAP_FAILED = 3


def parse_cpu_list(text: str) -> set[int]:
    """``"0-3,8"`` -> ``{0, 1, 2, 3, 8}``; ValueError on anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part!r} is not a CPU number or range")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"{part!r} is a range that ends before it starts")
        cpus.update(range(low, high + 1))
    return cpus


def check_proc_bind(proc_bind: Any, per_host: int) -> list[dict[str, str]]:
    """``proc_bind`` as given to ``spawn_procs``, checked: one dict per process of
    a host, of known keys and well-formed CPU or node lists (MeshUsageError)."""
    example = "proc_bind=[{'cpus': '0-3'}, {'cpus': '4-7'}]"
    if not isinstance(proc_bind, Sequence) or isinstance(proc_bind, str | bytes):
        raise MeshUsageError(f"proc_bind takes a list of dicts, e.g. {example}; got {proc_bind!r}")
    if len(proc_bind) != per_host:
        raise MeshUsageError(
            f"proc_bind length ({len(proc_bind)}) must equal procs_per_host ({per_host}): "
            f"give one dict per process of a host, e.g. {example}"
        )
    checked = []
    for index, bind in enumerate(proc_bind):
        if not isinstance(bind, Mapping):
            raise MeshUsageError(f"proc_bind[{index}] must be a dict, e.g. {{'cpus': '0-3'}}")
        for key, value in bind.items():
            if key == "membind":
                raise MeshUsageError(
                    f"proc_bind[{index}]: 'membind' (a NUMA memory policy) needs numactl, "
                    "which monarch_nb does not run; bind CPUs with 'cpus', 'physcpubind' "
                    "or 'cpunodebind'"
                )
            if key not in BIND_KEYS:
                raise MeshUsageError(
                    f"proc_bind[{index}] has key {key!r}; the keys are {', '.join(BIND_KEYS)}"
                )
            try:
                if not isinstance(value, str):
                    raise ValueError("it is not a string")
                parse_cpu_list(value)
            except ValueError as exc:
                raise MeshUsageError(
                    f"proc_bind[{index}][{key!r}] = {value!r} is not a list like '0-3,8': {exc}"
                ) from None
        checked.append(dict(bind))
    return checked


def cpus_of(bind: Mapping[str, str]) -> set[int]:
    """The CPUs one process's binding names on this host (empty: no binding)."""
    cpus: set[int] = set()
    for key in ("physcpubind", "cpus"):
        if key in bind:
            cpus |= parse_cpu_list(bind[key])
    for node in sorted(parse_cpu_list(bind["cpunodebind"]) if "cpunodebind" in bind else ()):
        path = os.path.join(_NODE_DIR, f"node{node}", "cpulist")
        try:
            with open(path) as f:
                cpus |= parse_cpu_list(f.read().strip())
        except OSError:
            raise ValueError(f"cpunodebind: this host has no NUMA node {node} ({path})") from None
    return cpus


def start_rank(boot: Mapping[str, Any], rank: int) -> None:
    """Set this rank's environment, bind its CPUs and run the bootstrap function,
    as ``boot`` says.

    A failure prints its traceback to stderr, which the controller reads, and
    exits with BOOTSTRAP_FAILED: the spawn fails naming this rank.
    """
    _interpreter.remember(boot)  # this_host() here starts the same wrapper again
    try:
        envs = boot.get("rank_env")  # spawn_procs(bootstrap_command=...)'s, by rank
        if envs:
            os.environ.update(envs[rank % len(envs)])
        binds = boot.get("proc_bind")
        if binds:
            cpus = cpus_of(binds[rank % len(binds)])
            if cpus:
                os.sched_setaffinity(0, cpus)
        if boot.get("bootstrap"):
            from .._wire._serialize import loads

            function = loads(bytes.fromhex(boot["bootstrap"]))
            result = function()
            if hasattr(result, "__await__"):  # an async bootstrap (asyncio loaded only then)
                import asyncio

                asyncio.run(_awaited(result))
    except BaseException:
        print(f"rank {rank}: spawn_procs bootstrap failed:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(BOOTSTRAP_FAILED)


async def _awaited(awaitable: Any) -> None:
    await awaitable
