"""What each actor started: stopped when it is (Monarch's recursive stop).

The process meshes an actor spawns and the actor meshes it spawns anywhere are
recorded here, by the id of its instance, as they are made; the worker stops
them when it stops the actor. Its own module so that the meshes of either side
(the controller's and an actor's references) can record what they make without
importing the context, which imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The running actor's instance, or None (set by _context: it knows).
current_actor: Callable[[], Any] = lambda: None  # noqa: E731
# report_failure(owner, failure): a mesh ``owner`` started failed (set by
# _context: its report_child_failure, the owner's __supervise__ or the hook).
report_failure: Callable[[Any, Any], None] = lambda owner, failure: None  # noqa: E731

# Popped when the actor stops, so a stopped actor's id is not reused here.
_owned: dict[int, list[Any]] = {}


def own(mesh: Any) -> None:
    """``mesh`` (anything with ``stop()``) was started by the running actor, if any:
    it is stopped when that actor is."""
    owner = current_actor()
    if owner is not None:
        _owned.setdefault(id(owner), []).append(mesh)


def take_owned(owner: Any) -> list[Any]:
    """What ``owner`` started (see :func:`own`), newest first; forgotten here."""
    return _owned.pop(id(owner), [])[::-1]
