"""Actor meshes, endpoints and the adverbs that call them across a mesh.

::

    class Counter(Actor):
        def __init__(self, start: int):
            self.value = start

        @endpoint
        def add(self, n: int) -> int:
            self.value += n
            return self.value

    counters = procs.spawn("counter", Counter, 0)
    counters.add.call(1).get()           # ValueMesh, one value per rank
    counters.slice(procs=0).add.call_one(1).get()
    counters.add.broadcast(1)            # fire and forget; failures reach supervision
    counters.add.choose(1).get()         # one rank, the least busy
    for point, value in counters.add.stream(1): ...
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .._model._errors import (
    EndpointFailed,
    MeshFailure,
    MeshUsageError,
    supervision_error_of,
)
from .._model._future import Future, completed, done_as_none
from .._model._public import publish
from .._model._shape import Shape
from .._runtime import _refs
from .._runtime._actors import Actor, endpoint_names, endpoint_propagators
from .._runtime._endpoint import EndpointBase, unpicklable_argument
from .._runtime._mesh_base import ActorMeshBase, endpoints_over_methods
from .._runtime._peer_mesh import rebuild_actors
from .._runtime._pending import PendingCall
from .._wire._messages import Call, StopActor
from ._actor_failures import stopped, with_ranks_of
from ._calls import send_call

if TYPE_CHECKING:
    from ._process_group import ProcGroup

R = TypeVar("R")
A = TypeVar("A", bound=Actor)

__all__ = ["ActorMesh", "Endpoint", "unpicklable_argument"]


# How long passing an actor mesh on waits for its ranks' __init__ (see _wait_for_spawn).
SPAWN_WAIT_S = 600.0


class SpawnedOn(Protocol):
    """What an actor mesh needs of the process mesh it was spawned on (a ProcMesh is
    one): its processes, and views of it (what ``rref`` runs tensor ops on)."""

    _group: ProcGroup

    def _new_with_shape(self, shape: Shape) -> SpawnedOn: ...


class ActorMesh(ActorMeshBase, Generic[A]):
    """Handles to one actor per point of a mesh. Endpoints are attributes.

    Slicing (``.slice(procs=0)``) selects a subset of the same actors; the shape
    reads as every mesh's (``extent``, ``size(dim)``, ``flatten``, ``split``, ...).
    An actor mesh is a value: pass it to another actor (as an argument, a spawn
    argument, inside a container) and that actor calls it directly.
    """

    def __init__(
        self,
        procs: SpawnedOn,
        shape: Shape,
        *,
        actor_id: int,
        name: str,
        cls: type[A],
        generation: int,
        initialized: Future[None],
    ) -> None:
        self._procs = procs
        self._initialized = initialized
        self._group: ProcGroup = procs._group
        self._shape = shape
        self._spawned = shape
        self._actor_id = actor_id
        self._name = name
        self._cls_name = cls.__name__
        self._endpoints = endpoint_names(cls)
        self._plain_methods = {n for n in dir(cls) if callable(getattr(cls, n, None))}
        self._propagators = endpoint_propagators(cls)
        self._generation = generation
        self.__class__ = endpoints_over_methods(type(self), self._endpoints)

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name!r} {self._cls_name} {self._shape!r}>"

    def _proc_view(self) -> SpawnedOn:
        return self._procs._new_with_shape(self._shape)

    @property
    def initialized(self) -> Future[None]:
        """Done once every actor's ``__init__`` has returned (spawning does not wait).

        ``actors.initialized.get()`` (or ``await actors.initialized``) returns None,
        or raises SpawnError naming the ranks whose ``__init__`` raised, with their
        tracebacks, or MeshFailure if a process died first. The same future for
        every view of the mesh.
        """
        return self._initialized

    def _wait_for_spawn(self) -> None:
        """Passed to another actor before its ``__init__`` ended, the mesh could be
        called from there before the spawn reached its ranks: wait for the spawn
        first. Its outcome is not ours to raise here: the receiver's calls get it
        (a failed ``__init__`` answers every call with its error)."""
        initialized = self._initialized
        if initialized.done() or self._group.controller.loop.in_loop_thread:
            return  # the I/O thread brings the replies: never wait on it
        try:
            initialized.exception(timeout=SPAWN_WAIT_S)
        except TimeoutError:
            pass  # an __init__ that does not end: what the receiver calls will wait too

    def _new_with_shape(self, shape: Shape) -> ActorMesh[A]:
        # A view of the same actors at the points ``shape`` keeps.
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        view._shape = shape
        return view

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Remove these actors from their processes (the processes keep running).

        The stop is sent at once: calls made after it reach the actors after the
        stop, so they fail. Returns a future that is done once every actor has
        stopped: its async calls unwound and its ``__cleanup__`` ran, as Monarch's.
        On a mesh with failed ranks it is done at once. (``reason`` is accepted as
        Monarch's is.)
        """
        group = self._group
        if not self._is_current():
            return completed(None)
        record = group.spawned.get(self._actor_id)
        if record is not None:  # not to be spawned again on a rank that restarts
            record.stopped.update(self._shape.ranks)
            # Its later calls raise SupervisionError at once, as Monarch's.
            failures = group.actor_failures
            failures[self._actor_id] = with_ranks_of(
                failures.get(self._actor_id),
                stopped(record, self._shape.ranks, reason, group.name),
            )
        if group.failure_for(self._shape.ranks) is not None:
            return completed(None)  # the mesh takes no message: nothing to wait for
        actor_id = self._actor_id
        call = send_call(
            group,
            self._shape,
            lambda call_id: StopActor(actor_id, call_id),
            None,
            actor=self._cls_name,
            endpoint="stop",
        )
        return done_as_none(call.future)

    def _is_current(self) -> bool:
        """Spawned in its process mesh's present processes (or spawned again there by
        a replay), not in processes a restart replaced."""
        group = self._group
        return group.generation in (self._generation, group.replayed_actors.get(self._actor_id))

    def _check_usable(self) -> Exception | None:
        group = self._group
        if not self._is_current():
            return MeshFailure(
                f"actor mesh {self._name!r} was spawned before its process mesh restarted; "
                f"spawn it again with procs.spawn({self._name!r}, {self._cls_name}, ...)",
                ranks=self._shape.ranks,
            )
        failed = group.actor_failures.get(self._actor_id)
        if failed is not None and any(r in failed.ranks for r in self._shape.ranks):
            return failed  # (a slice of its other ranks works on, as in Monarch)
        error = group.init_failures.get(self._actor_id)
        if error is not None:
            return error
        return group.failure_for(self._shape.ranks) or group.actor_missing(
            self._actor_id, self._name, self._shape.ranks
        )

    def __reduce__(self):
        self._wait_for_spawn()
        procs = self._group.ref()
        if procs is None:
            raise MeshUsageError(
                f"actor mesh {self._name!r} runs on several hosts: passing it to another actor "
                "is not supported yet for meshes started through host agents; call it from "
                "the controller, or pass the values it returns"
            )
        procs = dataclasses.replace(
            procs, generation=self._group.generation if self._is_current() else self._generation
        )
        ref = _refs.ActorRef(
            procs,
            self._actor_id,
            self._name,
            self._cls_name,
            tuple(self._endpoints),
            _refs.ViewRef.of(self._spawned),
        )
        # Sent away and come back (returned by an actor): this same mesh again.
        _refs.register_actors(ref, self, ActorMesh._new_with_shape)
        return (rebuild_actors, (ref, _refs.ViewRef.of(self._shape)))


class Endpoint(EndpointBase[R]):
    """One endpoint of an actor mesh, with the ways to call it (the adverbs)."""

    _mesh: ActorMesh[Any]
    _folds_on_the_way = True  # collect="fold:sum" (Accumulator's named reducers)

    def _load(self, rank: int) -> int:
        group = self._mesh._group
        return group.controller.outstanding.get((group.id, rank), 0)

    def _broadcast(self, args: tuple, kwargs: dict) -> None:
        mesh = self._mesh
        error = mesh._check_usable()
        if error is not None:
            raise supervision_error_of(error, self.label)
        group = mesh._group
        message = Call(0, mesh._actor_id, self._name, False, mesh._sent_to(mesh._shape))
        try:
            encoded = group.encode(message, (args, kwargs))
        except Exception as exc:
            raise unpicklable_argument(self.label, args, kwargs, exc) from exc
        group.controller.send(group, mesh._shape.ranks, encoded)

    def _send(self, shape: Shape, collect: str, args: tuple, kwargs: dict) -> PendingCall:
        mesh = self._mesh
        actor_id, name = mesh._actor_id, self._name
        sent_to = mesh._sent_to(shape)
        return send_call(
            mesh._group,
            shape,
            lambda call_id: Call(call_id, actor_id, name, True, sent_to),
            (args, kwargs),
            actor=mesh._cls_name,
            endpoint=name,
            collect=collect,
            error_class=EndpointFailed,
            check=mesh._check_usable,
            encode_error=lambda exc: unpicklable_argument(self.label, args, kwargs, exc),
        )


ActorMesh._endpoint_type = Endpoint

publish(globals())
