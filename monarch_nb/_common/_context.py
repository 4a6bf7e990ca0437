"""Where am I? The rank and actor that the code now running belongs to.

Set by the worker around every actor call (and every ``%%mesh`` cell), read
by :func:`current_rank` and :func:`context`. Actors run one call at a time on
the worker's main thread, so one module-level slot is enough, and threads an
endpoint starts see the same answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._errors import MeshFailure, MeshUsageError
from ._public import publish
from ._shape import Point


@dataclass(frozen=True)
class Context:
    """What the running code belongs to.

    ``point`` is this rank's point in the actor mesh (``point.rank`` is its
    global rank in the process mesh); ``actor`` is the actor instance, or None
    in a ``%%mesh`` cell.
    """

    point: Point
    world_size: int
    mesh_name: str
    actor_name: str = ""
    actor: Any = None


_current: Context | None = None
# Set by the worker: how to hand a child mesh's failure to its owner actor.
_supervision_hook: Callable[[Any, MeshFailure], None] | None = None
# Set by the controller side: what to do with the failure of a mesh no actor owns.
_unowned_hook: Callable[[MeshFailure], None] | None = None


def set_current(ctx: Context | None) -> Context | None:
    """Make ``ctx`` current; returns the previous one (worker use)."""
    global _current
    previous, _current = _current, ctx
    return previous


def context() -> Context:
    """The :class:`Context` of the running actor or ``%%mesh`` cell.

    Raises MeshUsageError on the controller, where no rank is running.
    """
    if _current is None:
        raise MeshUsageError(
            "context() and current_rank() work inside an actor endpoint or a %%mesh cell, "
            "not on the controller"
        )
    return _current


def current_rank() -> Point:
    """This rank's point in its mesh; ``current_rank().rank`` is the global rank."""
    return context().point


def current_size() -> dict[str, int]:
    """The size of each dimension of the mesh the running code belongs to:
    ``{"hosts": 2, "gpus": 8}`` (Monarch's ``current_size()``)."""
    return dict(context().point.extent)


def current_actor_or_none() -> Any:
    return _current.actor if _current is not None else None


def set_supervision_hook(hook: Callable[[Any, MeshFailure], None] | None) -> None:
    global _supervision_hook
    _supervision_hook = hook


def set_unowned_failure_hook(hook: Callable[[MeshFailure], None] | None) -> None:
    global _unowned_hook
    _unowned_hook = hook


def report_child_failure(owner: Any, error: MeshFailure) -> None:
    """A mesh that ``owner`` (an actor, or None: no actor) started has failed."""
    if owner is None:
        if _unowned_hook is not None:
            _unowned_hook(error)
    elif _supervision_hook is not None:
        _supervision_hook(owner, error)


publish(globals())
