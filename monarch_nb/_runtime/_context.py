"""Where am I? The rank and actor that the code now running belongs to.

Set by the worker around every actor call (and every ``%%mesh`` cell), read
by :func:`current_rank` and :func:`context`. Actors run one call at a time on
the worker's main thread, so one module-level slot is enough, and threads an
endpoint starts see the same answer.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from .._model._errors import MeshFailure, MeshUsageError
from .._model._public import publish
from .._model._shape import Point
from . import _owned


@dataclass(frozen=True)
class ActorInstance:
    """The running actor as Monarch names it: ``context().actor_instance``."""

    rank: Point  # its point in the mesh it was spawned on
    actor_id: str  # "<mesh name>/<actor name>[<rank>]", unique in the tree
    proc_mesh: Any  # the process mesh it runs in (a reference: spawn on it, pass it on)
    actor: Any  # the actor object itself

    @property
    def proc(self) -> Any:
        """This rank's own process, as a one-process mesh."""
        mesh = self.proc_mesh
        return None if mesh is None else mesh._view_of_rank(self.rank.rank)

    def abort(self, reason: str | None = None) -> NoReturn:
        """End this actor now, as a failure (Monarch's ``abort``): the call running
        raises ``SupervisionError`` naming ``reason``, and so do later calls to it;
        its owner's ``__supervise__`` (else ``unhandled_fault_hook``) hears of it."""
        raise ActorAborted(reason or "no reason provided")


class ActorAborted(BaseException):
    """Raised by ``context().actor_instance.abort(reason)``: not an ``Exception``,
    so nothing in between catches it, and it ends the actor as any such one does."""


@dataclass(frozen=True)
class Context:
    """What the running code belongs to.

    ``point`` is this rank's point in the actor mesh (``point.rank`` is its
    global rank in the process mesh); ``actor`` is the actor instance, or None
    in a ``%%mesh`` cell. ``message_rank`` is the point in the slice that the
    message being handled was sent to (Monarch's definition: the same as
    ``point`` for a call to the whole mesh).
    """

    point: Point
    world_size: int
    mesh_name: str
    actor_name: str = ""
    actor: Any = None
    actor_id: int = 0
    procs: Any = None  # a _refs.ProcsRef of the process group, where known
    shape: Any = None  # the Shape the actor was spawned on
    message_shape: Any = None  # the Shape of the slice this message went to, if a slice

    @property
    def message_rank(self) -> Point:
        if self.message_shape is None:
            return self.point
        return self.message_shape.point_of_rank(self.point.rank)

    @property
    def actor_label(self) -> str:
        """``"<mesh name>/<actor name>[<rank>]"``: unique in the tree."""
        return f"{self.mesh_name}/{self.actor_name or 'cell'}[{self.point.rank}]"

    @property
    def actor_instance(self) -> ActorInstance:
        procs = None
        if self.procs is not None:
            from ._peer_mesh import PeerProcMesh

            procs = PeerProcMesh(self.procs, self.procs.world.shape())
        return ActorInstance(self.point, self.actor_label, procs, self.actor)


_current: Context | None = None
# A concurrent endpoint's task keeps its own context while others interleave
# (asyncio gives each task a copy of the context variables it was created with).
_task_context: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "monarch_nb_context", default=None
)
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
    current = _task_context.get() or _current
    if current is None:
        raise MeshUsageError(
            "context() and current_rank() work inside an actor endpoint or a %%mesh cell, "
            "not on the controller"
        )
    return current


def set_task_context(ctx: Context | None) -> None:
    """Make ``ctx`` current for the running asyncio task only (worker use)."""
    _task_context.set(ctx)


def current_rank() -> Point:
    """This rank's point in the slice the current message was sent to (Monarch's
    rule; the actor's own point for a call to the whole mesh);
    ``current_rank().rank`` is the global rank."""
    return context().message_rank


def current_size() -> dict[str, int]:
    """``{dimension: size}`` of the slice the current message was sent to (the
    actor's whole mesh for a call to all of it), as Monarch's ``current_size()``."""
    return dict(context().message_rank.extent)


def current_actor_name() -> str:
    """The running actor's id as text, as Monarch's ``current_actor_name()``:
    ``"<mesh name>/<actor name>[<rank>]"``, different for each rank of an actor
    mesh; ``"<mesh name>/cell[<rank>]"`` in a ``%%mesh`` cell, and ``"client"`` on the
    controller (Monarch's name for its client actor), where no actor runs."""
    current = _task_context.get() or _current
    if current is None:
        return "client"
    return current.actor_label


def current_actor_or_none() -> Any:
    return _current.actor if _current is not None else None


def _running_actor() -> Any:
    # An async endpoint's task has its own context; else the main thread's.
    current = _task_context.get() or _current
    return current.actor if current is not None else None


_owned.current_actor = _running_actor


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


_owned.report_failure = report_child_failure


publish(globals())
