"""``%mesh run [--mesh NAME] [--ranks R] [--timeout S] script.py ARGS...`` (or ``-m module``).

Runs an unmodified torchrun-style script on every selected rank, as a
``%%mesh`` cell would run code: output streams per rank while it runs, errors
are grouped by rank. The ranks get torchrun's variables (``monarch_nb.spmd``).
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from .._model._errors import MeshUsageError

USAGE = "%mesh run [--mesh NAME] [--ranks R] [--timeout S] script.py ARGS... (or -m module ARGS...)"
_OPTIONS = ("--mesh", "--ranks", "--timeout")


def parse(rest: str) -> tuple[dict[str, str], list[str]]:
    """Split ``rest`` into our options and the script's own command line."""
    words = shlex.split(rest)
    options: dict[str, str] = {}
    while words and words[0] in _OPTIONS:
        if len(words) < 2:
            raise MeshUsageError(f"{words[0]} needs a value; usage: {USAGE}")
        options[words[0][2:]] = words[1]
        words = words[2:]
    if not words or words == ["-m"]:
        raise MeshUsageError(f"no script given; usage: {USAGE}")
    if words[0] != "-m" and os.path.exists(words[0]):
        words[0] = os.path.abspath(words[0])  # the kernel's directory, not the worker's
    return options, words


def cell_source(script_args: list[str]) -> str:
    """The code each rank runs: torchrun's variables filled in, then the script."""
    return (
        "from monarch_nb._services._spmd import fill_torchrun_env, run_script\n"
        f"fill_torchrun_env()\nrun_script({script_args!r})\n"
    )


def run_line(registry: Any, rest: str) -> Any:
    options, script_args = parse(rest)
    timeout = options.get("timeout")
    try:
        seconds = float(timeout) if timeout is not None else None
    except ValueError:
        raise MeshUsageError(f"--timeout {timeout!r} is not a number of seconds") from None
    mesh = registry.get(options.get("mesh"))
    return mesh.run(cell_source(script_args), ranks=options.get("ranks"), timeout=seconds)
