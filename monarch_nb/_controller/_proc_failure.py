"""A process death, as the supervision tree hears of it: through an actor that ran there.

In Monarch an actor mesh's owner learns that a process died from the actors
that ran on it: the supervision event names the actor, its point and
``the process this actor was running on failed: Killed(sig=9)``. The calls
waiting on the rank fail with the mesh's own ``MeshFailure``; what goes up the
tree (the owner's ``__supervise__``, or ``unhandled_fault_hook``) is this
failure, which names an actor mesh that lived on the lost rank, so a report
several levels up still says which actor was lost, and where.
"""

from __future__ import annotations

from .._model._errors import MeshFailure
from .._model._shape import Shape
from ._group_core import GroupCore


def describe_status(cause: object) -> str:
    """How a process ended, in the words of Monarch's process status:
    ``Killed(sig=9)``, ``Stopped(exit=1)``, or ``Failed(<why>)``."""
    if isinstance(cause, int) and not isinstance(cause, bool):
        if cause < 0:
            return f"Killed(sig={-cause})"
        return f"Stopped(exit={cause})"
    return f"Failed({cause})"


def naming_an_actor(group: GroupCore, ranks: tuple[int, ...], error: MeshFailure) -> MeshFailure:
    """``error`` (``ranks`` of ``group`` died) as told by the first actor mesh that
    lived on one of them; ``error`` itself where none did."""
    for record in group.spawned.values():
        lost = [r for r in ranks if r in record.ranks and r not in record.stopped]
        if not lost:
            continue
        shape = Shape(list(record.labels), list(record.sizes), list(record.ranks))
        cls = record.cls
        return MeshFailure(
            f"the process this actor was running on failed: {describe_status(error.cause)}; "
            f"{error.args[0] if error.args else error}",
            ranks=ranks,
            cause=error.cause,
            mesh=error.mesh or group.name,
            actor=record.name,
            actor_class=f"{cls.__module__}.{cls.__qualname__}",
            point=shape.point_of_rank(lost[0]),
        )
    return error
