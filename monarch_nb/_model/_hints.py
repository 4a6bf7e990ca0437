"""What an error message tells the user to do next, in the words of where they are.

In a script the next step is a method (``procs.restart()``); in a notebook it
is a magic (``%mesh restart``). The runtime asks :func:`restart_hint` when it
builds a message; the notebook layer, which knows which meshes it started,
installs its own spelling with :func:`set_restart_hint`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# mesh name -> what to type, or None for the runtime's own words
_restart_hint: Callable[[str], str | None] | None = None


def set_restart_hint(hint: Callable[[str], str | None] | None) -> None:
    """Install ``hint(mesh_name)``: how to restart that mesh where the user is
    (None from it: the method)."""
    global _restart_hint
    _restart_hint = hint


def restart_hint(mesh: str) -> str:
    """``"call restart() on process mesh 'm'"``, or the notebook's ``"run %mesh restart"``."""
    hint = _restart_hint
    spelled = hint(mesh) if hint is not None else None
    return spelled or f"call restart() on process mesh {mesh!r}"


def restart_ranks_hint(mesh: str, ranks: Sequence[int]) -> str:
    """``"call restart(ranks=[1]) on process mesh 'm'"``, or ``"run %mesh restart --ranks 1"``."""
    hint = _restart_hint
    spelled = hint(mesh) if hint is not None else None
    if spelled:
        return f"{spelled} --ranks {','.join(map(str, ranks))}"
    return f"call restart(ranks=[{', '.join(map(str, ranks))}]) on process mesh {mesh!r}"
