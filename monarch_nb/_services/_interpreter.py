"""The interpreter a process's own new processes run, as Monarch's
``HostMesh.with_python_executable(path)`` wants it: a process started through
such a host mesh gets ``path`` again when it spawns processes on its own host
(``this_host().spawn_procs(...)`` inside an actor), so a wrapper (a shell
script that sets the environment, then execs Python) runs for every level of
a recursive spawn, not only the first.

The worker learns it from its bootstrap (``host_python``), before any code of
the user's runs; the controller's process has none (``None``: this interpreter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_inherited: str | None = None


def remember(boot: Mapping[str, Any]) -> None:
    """Keep the ``with_python_executable`` path this worker was started with, if any."""
    global _inherited
    python = boot.get("host_python")
    _inherited = str(python) if python else None


def inherited() -> str | None:
    """The interpreter this process's ``this_host()`` starts processes with, or None."""
    return _inherited
