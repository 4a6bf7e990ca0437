"""``default_bootstrap_cmd()`` and ``spawn_procs(bootstrap_command=...)``, as Monarch's.

A :class:`BootstrapCommand` says how a worker process starts: the program
(the Python interpreter), its arguments and extra environment variables.
``spawn_procs(bootstrap_command=cmd)`` starts every process of the new mesh
with ``cmd``'s program and environment; a function of the point
(``lambda point: base.with_env({"CUDA_VISIBLE_DEVICES": str(point["gpus"])})``)
gives each process its own. Here a worker is always ``python -m
monarch_nb.worker``: of a command, the program and the environment are
honoured; other arguments are refused, naming what to do instead. The
environment is set in the worker before anything else runs in it (before the
``bootstrap=`` function, before any actor imports torch).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from .._model._errors import MeshUsageError
from .._model._shape import Point, Shape

WORKER_ARGS = ("-m", "monarch_nb.worker")


class BootstrapCommand:
    """How a worker process starts: ``program``, ``arg0``, ``args``, ``env``."""

    def __init__(
        self,
        program: str,
        arg0: str | None = None,
        args: list[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.program = program
        self.arg0 = arg0
        self.args = list(args if args is not None else WORKER_ARGS)
        self.env = dict(env or {})

    def with_env(self, env: Mapping[str, str]) -> BootstrapCommand:
        """A copy with ``env`` merged over this command's environment."""
        return BootstrapCommand(self.program, self.arg0, self.args, {**self.env, **env})

    def __repr__(self) -> str:
        return (
            f"BootstrapCommand(program={self.program!r}, arg0={self.arg0!r}, "
            f"args={self.args!r}, env={self.env!r})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BootstrapCommand) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, as Monarch's


def default_bootstrap_cmd() -> BootstrapCommand:
    """The command workers start with: this interpreter, ``-m monarch_nb.worker``,
    no extra environment. Customise it with ``with_env`` (or its attributes)."""
    return BootstrapCommand(sys.executable, None, list(WORKER_ARGS), {})


def resolve(
    command: BootstrapCommand | Callable[[Point], BootstrapCommand], shape: Shape
) -> tuple[str | None, list[dict[str, str]] | None]:
    """(the interpreter, if not this one; each rank's extra environment, by global
    rank, or None) for a new mesh of ``shape``: what the workers read at start."""
    commands = [command(point) if callable(command) else command for point in shape.points()]
    programs = set()
    for point, each in zip(shape.points(), commands, strict=True):
        where = f"bootstrap_command for point {dict(point)}"
        if not isinstance(each, BootstrapCommand):
            raise MeshUsageError(
                f"{where} is {each!r}: give a BootstrapCommand, e.g. "
                "default_bootstrap_cmd().with_env({...}), or a function of the point "
                "returning one"
            )
        if tuple(each.args) != WORKER_ARGS:
            raise MeshUsageError(
                f"{where} has args {each.args!r}: a worker here always runs "
                f"{' '.join(WORKER_ARGS)}; change the program or env instead "
                "(or use spawn_procs(bootstrap=fn) to run code first)"
            )
        bad = [k for k, v in each.env.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise MeshUsageError(f"{where}: env values must be strings; {bad[0]!r} is not")
        programs.add(each.program)
    if len(programs) > 1:
        raise MeshUsageError(
            f"bootstrap_command gives the ranks different programs {sorted(programs)}: "
            "one mesh runs one interpreter; vary env by point instead"
        )
    (program,) = programs
    envs = [dict(each.env) for each in commands]
    return (
        None if program == sys.executable else program,
        envs if any(envs) else None,
    )


def boot_extras(command: Any, shape: Shape) -> dict[str, Any]:
    """What ``spawn_procs(bootstrap_command=command)`` adds to every worker's start."""
    python, envs = resolve(command, shape)
    extras: dict[str, Any] = {}
    if python is not None:
        extras["python"] = python
    if envs is not None:
        extras["rank_env"] = envs
    return extras
