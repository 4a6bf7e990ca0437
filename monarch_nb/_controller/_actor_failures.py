"""What the controller holds of an actor mesh that failed, and why its calls are refused.

``group.actor_failures[actor_id]`` is one ``MeshFailure`` per actor mesh that
failed on some of its ranks (a broadcast failed there, an endpoint ended its
actor, or it was stopped), naming every rank failed so far: a call that
includes one of them is refused at once with a ``SupervisionError``; a slice
of its other ranks is called as ever, as in Monarch.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from .._model._errors import EndpointFailed, MeshFailure, MeshStopped, SupervisionError
from .._model._shape import Point, Shape
from ._lifecycle import SpawnRecord, plural_ranks

if TYPE_CHECKING:
    from .._runtime._pending import PendingCall
    from ._group_protocol import ClientGroup


def qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def point_in(record: SpawnRecord, rank: int) -> Point | None:
    """Where ``rank`` is in the actor mesh ``record`` spawned (None: not one of its)."""
    if rank not in record.ranks:
        return None
    return Shape(list(record.labels), list(record.sizes), list(record.ranks)).point_of_rank(rank)


def with_ranks_of(previous: MeshFailure | None, latest: MeshFailure) -> MeshFailure:
    """What an actor mesh's record of its failure holds: ``latest``, naming every
    rank failed so far."""
    if previous is None or set(previous.ranks) <= set(latest.ranks):
        return latest
    merged = copy.copy(latest)
    merged.ranks = tuple(sorted({*previous.ranks, *latest.ranks}))
    return merged


def stopped(record: SpawnRecord, ranks: tuple[int, ...], reason: str, mesh: str) -> MeshFailure:
    """The failure calls to the actor mesh ``record`` spawned raise once ``ranks``
    of it were stopped (``ActorMesh.stop(reason)``)."""
    return MeshFailure(
        f"actor mesh {record.name!r} was stopped on {plural_ranks(ranks)} ({reason}); "
        f"spawn it again to call it there",
        ranks=ranks,
        mesh=mesh,
        actor=record.name,
        actor_class=qualified(record.cls),
        point=point_in(record, ranks[0]),
    )


def call_error(group: ClientGroup, call: PendingCall, error: BaseException) -> BaseException:
    """``error``, which ends ``call`` before its ranks answered, as the call raises
    it: an endpoint call's plain ``MeshFailure`` (its processes failed or
    stopped) is a ``SupervisionError``, as Monarch's, naming the actor mesh the
    call went to where it is known (the one actor mesh of the call's class on
    those ranks)."""
    if (
        call.error_class is not EndpointFailed
        or not isinstance(error, MeshFailure)
        or type(error) not in (MeshFailure, MeshStopped)  # not a SupervisionError already
    ):
        return error
    if error.actor_class is not None:  # it names its actor already
        return SupervisionError.of(error, call.label)
    ranks = error.ranks or call.ranks
    callees = [
        record
        for record in group.spawned.values()
        if record.cls.__name__ == call.actor and any(r in record.ranks for r in ranks)
    ]
    if len(callees) != 1:  # none, or several of that class: say the class only
        return SupervisionError.of(error, call.label)
    (record,) = callees
    first = next(r for r in ranks if r in record.ranks)
    return SupervisionError.of(
        error,
        call.label,
        actor=record.name,
        actor_class=qualified(record.cls),
        point=point_in(record, first),
    )
