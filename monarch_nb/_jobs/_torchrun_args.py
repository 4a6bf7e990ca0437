"""A torchrun command line read as torchrun reads it: how many ranks a host
runs, which script or module they run, and any master the command fixes.

Only what a mesh needs is kept; torchrun's restart, log and rendezvous
options are accepted and ignored (the mesh does their job), and options that
cannot mean anything here (``--no-python``, more than one node from a command
list) are refused by name.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

from .._model._errors import MeshUsageError

_TORCHRUN = ("torchrun", "torch.distributed.run")
_PYTHONS = ("python", "python3")


@dataclass(frozen=True)
class TorchrunCommand:
    """What one SPMD run needs from a torchrun command."""

    script_args: list[str]  # ["train.py", args...] or ["-m", "module", args...]
    nproc_per_node: int
    nnodes: int
    master_addr: str | None = None
    master_port: int | None = None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchrun", add_help=False, exit_on_error=False)
    parser.add_argument("--nnodes", default="1")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    parser.add_argument("--standalone", action="store_true")
    parser.add_argument("-m", "--module", action="store_true")
    parser.add_argument("--no-python", "--no_python", action="store_true")
    parser.add_argument("--run-path", "--run_path", action="store_true")
    parser.add_argument("--master-addr", "--master_addr")
    parser.add_argument("--master-port", "--master_port", type=int)
    for ignored in (
        "rdzv-backend",
        "rdzv-endpoint",
        "rdzv-id",
        "rdzv-conf",
        "max-restarts",
        "monitor-interval",
        "start-method",
        "role",
        "log-dir",
        "redirects",
        "tee",
        "local-ranks-filter",
        "node-rank",
        "local-addr",
    ):
        parser.add_argument(f"--{ignored}", f"--{ignored.replace('-', '_')}")
    parser.add_argument("-r", dest="redirects_short")
    parser.add_argument("-t", dest="tee_short")
    parser.add_argument("training_script", nargs="?")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def _nproc(value: str) -> int:
    """torchrun's ``--nproc-per-node``: a count, or ``gpu``, ``cpu`` or ``auto``."""
    if value.isdigit() and int(value) > 0:
        return int(value)
    if value in ("gpu", "auto"):
        gpus = _visible_gpus()
        if gpus:
            return gpus
        if value == "gpu":
            raise MeshUsageError(
                "--nproc-per-node=gpu: this host has no GPU visible; give a count "
                "(--nproc-per-node=4) or 'cpu'"
            )
    if value in ("cpu", "auto"):
        return len(os.sched_getaffinity(0))
    raise MeshUsageError(
        f"--nproc-per-node={value!r}: expected a positive count, 'gpu', 'cpu' or 'auto'"
    )


def _visible_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count())


def _nnodes(value: str) -> int:
    """torchrun's ``--nnodes``: ``N`` or ``MIN:MAX`` (elastic; a mesh has a fixed size)."""
    low, _, high = value.partition(":")
    try:
        low_n, high_n = int(low), int(high or low)
    except ValueError:
        raise MeshUsageError(f"--nnodes={value!r}: expected N or MIN:MAX") from None
    if low_n != high_n:
        raise MeshUsageError(
            f"--nnodes={value!r}: an elastic node range; a mesh has a fixed number of "
            f"hosts: give one number (--nnodes={high_n})"
        )
    return high_n


def parse_torchrun(command: Sequence[str]) -> TorchrunCommand:
    """Read ``command`` (``torchrun ...``, ``python -m torch.distributed.run ...``
    or ``python script.py ...``, a single rank) as torchrun would."""
    args = [str(a) for a in command]
    if not args:
        raise MeshUsageError("the command is empty: give ['torchrun', '--nproc-per-node=N', ...]")
    program = os.path.basename(args[0])
    if program in _TORCHRUN:
        rest = args[1:]
    elif program.startswith(_PYTHONS):
        if len(args) >= 3 and args[1] == "-m" and args[2] in _TORCHRUN:
            rest = args[3:]
        elif len(args) >= 2:
            return TorchrunCommand(script_args=args[1:], nproc_per_node=1, nnodes=1)
        else:
            raise MeshUsageError(f"{args!r}: no script or module after {args[0]!r}")
    else:
        raise MeshUsageError(
            f"{args[0]!r}: expected the command to start with torchrun, "
            "'python -m torch.distributed.run' or 'python' (a single rank)"
        )
    try:
        parsed, _unknown = _parser().parse_known_args(rest)
    except argparse.ArgumentError as exc:
        raise MeshUsageError(f"{' '.join(args)}: {exc}") from None
    if parsed.no_python:
        raise MeshUsageError(
            "--no-python: the ranks run a Python script or module in their own "
            "interpreter; run another program on every host with "
            "monarch_nb.job.exec_command instead"
        )
    if not parsed.training_script:
        raise MeshUsageError(f"{' '.join(args)}: no training script or module (-m) given")
    script = ["-m", parsed.training_script] if parsed.module else [parsed.training_script]
    return TorchrunCommand(
        script_args=[*script, *parsed.training_script_args],
        nproc_per_node=_nproc(str(parsed.nproc_per_node)),
        nnodes=1 if parsed.standalone else _nnodes(str(parsed.nnodes)),
        master_addr=parsed.master_addr,
        master_port=parsed.master_port,
    )
