"""Torchrun-style SPMD scripts on a mesh, as Monarch's ``monarch.spmd``.

Every rank gets torchrun's environment (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``,
``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``ROLE_NAME``, ``MASTER_ADDR``,
``MASTER_PORT``) and runs the script or module as ``__main__``, as torchrun
would. Our meshes are started with most of these already set, with the first
rank's host as master: ``setup_torch_elastic_env`` keeps that master and fills
in what is missing, so calling it is harmless where Monarch needs it.
"""

from __future__ import annotations

import math
import os
import runpy
import socket
import sys
from collections.abc import Sequence
from typing import Any

from .._runtime._actors import Actor, endpoint
from .._runtime._context import current_rank, current_size
from .._wire._network import free_port


def _address(use_ipaddr: str | None) -> str:
    hostname = socket.gethostname()
    if use_ipaddr is None:
        return hostname
    family = {"ipv4": socket.AF_INET, "ipv6": socket.AF_INET6}.get(str(use_ipaddr).lower())
    if family is None:
        raise ValueError(f"use_ipaddr={use_ipaddr!r}: expected None, 'ipv4' or 'ipv6'")
    return str(socket.getaddrinfo(hostname, None, family)[0][4][0])


def torchrun_env(
    rank: int, local_rank: int, world_size: int, local_world_size: int, addr: str, port: int
) -> dict[str, str]:
    """The variables torchrun gives one rank (one role, called ``rank``)."""
    return {
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(rank // local_world_size),
        "GROUP_WORLD_SIZE": str(-(-world_size // local_world_size)),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": "rank",
    }


def run_script(script_args: Sequence[str]) -> None:
    """Run ``["script.py", args...]`` or ``["-m", "module", args...]`` as ``__main__``.

    ``sys.argv`` is the script's for the run and restored after it; a
    ``SystemExit`` with status 0 is success, any other status raises.
    """
    args = list(script_args)
    if not args or (args[0] == "-m" and len(args) < 2):
        raise ValueError("no script or module given: pass ['train.py', ...] or ['-m', 'mod', ...]")
    saved_argv = sys.argv
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = args
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError(f"{' '.join(args)} exited with status {exc.code!r}") from None
    finally:
        sys.argv = saved_argv


def fill_torchrun_env() -> None:
    """Set the torchrun variables this worker lacks, from those its launch set."""
    env = os.environ
    rank = int(env.get("RANK", "0"))
    world = int(env.get("WORLD_SIZE", "1"))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    wanted = torchrun_env(
        rank,
        int(env.get("LOCAL_RANK", str(rank % local_world))),
        world,
        local_world,
        env.get("MASTER_ADDR", "127.0.0.1"),
        int(env.get("MASTER_PORT", "29500")),
    )
    for name, value in wanted.items():
        env.setdefault(name, value)


class SPMDActor(Actor):
    """Runs an unmodified torchrun-style script on every rank of its mesh.

    The last dimension of the mesh counts the ranks of one host (``gpus`` or
    ``procs``), as torchrun's ``--nproc-per-node``::

        actors = procs.spawn("_SPMDActor", SPMDActor)
        first = actors.slice(**dict.fromkeys(procs.shape.labels, 0))
        addr, port = first.get_host_port.call_one(None).get()
        actors.main.call(addr, port, ["train.py", "--lr", "0.001"]).get()
    """

    def __init__(self) -> None:
        point = current_rank()
        sizes = current_size()
        per_host = list(sizes)[-1]
        self.rank = point.rank
        self.local_rank = point[per_host]
        self.local_world_size = sizes[per_host]
        self.world_size = math.prod(sizes.values())

    def _setup_env(self, master_addr: str, master_port: int) -> None:
        os.environ.update(
            torchrun_env(
                self.rank,
                self.local_rank,
                self.world_size,
                self.local_world_size,
                master_addr,
                master_port,
            )
        )

    @endpoint
    def get_host_port(self, use_ipaddr: str | None = None) -> tuple[str, int]:
        """This host's name (or its ``"ipv4"`` / ``"ipv6"`` address) and a free port."""
        return _address(use_ipaddr), free_port()

    @endpoint
    def launch_master(self, use_ipaddr: str | None = None) -> tuple[str, int]:
        """The master the mesh was started with, or this host and a free port."""
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        return _address(use_ipaddr), free_port()

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set torchrun's variables in this process."""
        self._setup_env(master_addr, master_port)

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Set torchrun's variables, then run the script (``["-m", module, ...]`` or a path)."""
        self._setup_env(master_addr, master_port)
        run_script(script_args)
        return True


def _first(procs: Any, actors: Any) -> Any:
    return actors.slice(**dict.fromkeys(procs.shape.labels, 0))


def _check_master(master_addr: str | None, master_port: int | None) -> None:
    if (master_addr is None) != (master_port is None):
        raise ValueError("give both master_addr and master_port, or neither")


async def setup_torch_elastic_env_async(
    proc_mesh: Any,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: str | None = None,
) -> None:
    """Give every rank of ``proc_mesh`` torchrun's environment (awaitable form).

    Without a master, the one the mesh was started with is kept (the first
    rank's host), else the first rank's host and a free port are used.
    """
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    if master_addr is None:
        master_addr, master_port = await _first(proc_mesh, actors).launch_master.call_one(
            use_ipaddr
        )
    await actors.setup_env.call(master_addr, master_port)


def setup_torch_elastic_env(
    proc_mesh: Any,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: str | None = None,
    timeout: float | None = 60.0,
) -> None:
    """Give every rank of ``proc_mesh`` torchrun's environment (see the async form)."""
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    if master_addr is None:
        master_addr, master_port = (
            _first(proc_mesh, actors).launch_master.call_one(use_ipaddr).get(timeout=timeout)
        )
    actors.setup_env.call(master_addr, master_port).get(timeout=timeout)
