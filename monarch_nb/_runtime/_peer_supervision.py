"""Supervision of actor meshes spawned on a process mesh the spawner was handed.

An actor mesh belongs to whoever spawned it, wherever its processes came
from, as in Monarch's supervision tree. When an actor spawns on a process mesh
it started, that mesh's controller is the actor's own process, which hears of
every failure. When it spawns on a mesh it was handed (an argument, a return
value), the mesh's controller is someone else, who did not spawn these actors.
So such a spawn carries a supervision :class:`~._ports.Port` of the spawner's
process: a rank whose actor fails with nobody waiting for the answer (a failed
``broadcast()``) sends the failure there, and the spawner's ``__supervise__``
gets it as a ``MeshFailure`` naming the actor mesh and the rank (no actor
spawned it: ``unhandled_fault_hook``). One failure per rank, as Monarch's.
"""

from __future__ import annotations

import logging
from typing import Any

from .._model._errors import MeshFailure, RemoteError, RemoteFailure
from .._model._shape import Shape
from . import _owned
from ._peer import local_node
from ._ports import Port

_log = logging.getLogger("monarch_nb")


def supervision_port(procs: str, name: str, cls: type, shape: Shape) -> tuple[Port[Any], int]:
    """A port that turns a rank's report of a failed actor of the mesh ``name``
    (``cls`` on ``shape`` of the process mesh ``procs``) into a ``MeshFailure``
    for the running actor's ``__supervise__``; and its id, to close it with
    :func:`close` when the mesh is stopped."""
    owner = _owned.current_actor()
    node = local_node()

    def deliver(value: Any, is_error: bool) -> None:
        # On the peer thread: build the failure, hand it on (the owner's
        # __supervise__ runs on its own process's main thread, between calls).
        try:
            label, failure = value
            if is_error or not isinstance(failure, RemoteFailure):
                raise TypeError(f"not (label, RemoteFailure): {value!r}")
        except Exception as exc:
            _log.error("monarch_nb: a supervision report of %r was malformed: %s", name, exc)
            return
        _owned.report_failure(owner, _failure(procs, name, cls, shape, label, failure))

    port_id = node.open_port(deliver)
    return Port(node.address, port_id, "", tuple(node.tcp_addresses)), port_id


def close(port_id: int) -> None:
    """Stop listening for failures of a mesh (it was stopped)."""
    local_node().close_port(port_id)


def _failure(
    procs: str, name: str, cls: type, shape: Shape, label: str, failure: RemoteFailure
) -> MeshFailure:
    actor, _, endpoint = label.partition(".")
    error = RemoteError([failure], actor=actor, endpoint=endpoint)
    rank = failure.rank
    point = shape.point_of_rank(rank) if rank in shape.ranks else None
    return MeshFailure(
        failed_actor_text(label, failure, f"actor mesh {name!r}", error),
        ranks=(rank,),
        cause=error,
        mesh=procs,
        actor=name,
        actor_class=f"{cls.__module__}.{cls.__qualname__}",
        point=point,
    )


def failed_actor_text(label: str, failure: RemoteFailure, which: str, error: RemoteError) -> str:
    """What the owner of actor mesh ``which`` hears when ``label`` failed on a rank
    with nobody waiting (a broadcast), or ended its actor there (``actor_failed``:
    it raised a BaseException that is not an Exception)."""
    rank = failure.rank
    if failure.actor_failed:
        return (
            f"{label} raised {failure.type_name} on rank {rank}, which ended its actor there, "
            f"so {which} is failed; spawn it again: {error}"
        )
    return (
        f"broadcast of {label} failed on rank {rank}, so {which} is failed; spawn it again: {error}"
    )
