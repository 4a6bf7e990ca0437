"""What the controller holds of an actor mesh that failed, and why its calls are refused.

``group.actor_failures[actor_id]`` is one ``MeshFailure`` per actor mesh that
failed on some of its ranks (a broadcast failed there, an endpoint ended its
actor, or it was stopped), naming every rank failed so far: a call that
includes one of them is refused at once with a ``SupervisionError``; a slice
of its other ranks is called as ever, as in Monarch.
"""

from __future__ import annotations

import copy

from .._model._errors import MeshFailure
from .._model._shape import Point, Shape
from ._lifecycle import SpawnRecord, plural_ranks


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
