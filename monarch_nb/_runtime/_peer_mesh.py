"""Meshes as another actor sees them: references that call the ranks' processes directly.

An actor that receives an actor mesh or a process mesh (as an argument, a
spawn argument, a return value) gets one of these. They have the API of the
controller's meshes (endpoints as attributes with every adverb, ``slice``,
``spawn``) and send through this process's peer node (:mod:`._peer`), so
the controller is not on the path. Pickled again, they travel on as the same
reference (a mesh passed through any number of hops).
"""

from __future__ import annotations

import secrets
from typing import Any, Generic, TypeVar

from .._model._errors import EndpointFailed, MeshUsageError, SerializationError, SpawnError
from .._model._future import Future, completed, done_as_none
from .._model._shape import Selector, Shape
from .._wire._messages import Call, Spawn, StopActor
from . import _owned, _peer_supervision, _refs
from ._actors import Actor, check_endpoint_kinds, endpoint_names
from ._endpoint import EndpointBase, unpicklable_argument
from ._mesh_base import ActorMeshBase, endpoints_over_methods
from ._peer import local_node
from ._pending import CallFuture, PendingCall
from ._tensor_link import tensor_engine

A = TypeVar("A", bound=Actor)
R = TypeVar("R")

# How long a caller in an actor waits, after Ctrl-C (or an interrupt of its own
# call), for the ranks it called to stop before it gives up on them.
_INTERRUPT_GRACE_S = 3.0


def _send(
    procs: _refs.ProcsRef,
    shape: Shape,
    message_for: Any,
    payload: Any,
    *,
    actor: str,
    endpoint: str = "",
    collect: str = "mesh",
    error_class: Any = None,
    encode_error: Any = None,
) -> PendingCall:
    """Send one call to ``shape``'s ranks of ``procs`` through this process's node."""
    node = local_node()
    kwargs = {} if error_class is None else {"error_class": error_class}
    call = PendingCall(
        node.next_call_id(), shape, actor=actor, endpoint=endpoint, collect=collect, **kwargs
    )
    call.stopper = _stop
    call.grace = _INTERRUPT_GRACE_S
    try:
        procs.check_reachable()
        encoded = node.encode(message_for(call.call_id), payload)
    except MeshUsageError as exc:
        call.fail(exc)
        return call
    except Exception as exc:
        call.fail(
            encode_error(exc)
            if encode_error is not None
            else SerializationError(f"{call.label}: cannot pickle the payload: {exc}")
        )
        return call
    ranks = list(shape.ranks)
    call.group = procs  # who the stopper interrupts
    node.send([procs.address(r) for r in ranks], encoded, call, ranks)
    return call


def _stop(future: CallFuture, why: str, grace: float) -> Any:
    """Ctrl-C while an actor waits on another: interrupt the ranks still running it."""
    call = future._call
    if call is not None and not future.done():
        waiting = call.unanswered_ranks()
        procs: _refs.ProcsRef = call.group
        local_node().interrupt([procs.address(r) for r in waiting], call.call_id)
        if future.exception(timeout=grace) is None and future.done():
            return future.get()
    if future.done():
        return future.get()
    raise KeyboardInterrupt


class PeerActorMesh(ActorMeshBase, Generic[A]):
    """An actor mesh held by another actor (or by a controller that did not spawn it)."""

    def __init__(
        self, ref: _refs.ActorRef, shape: Shape, initialized: Future[None] | None = None
    ) -> None:
        self._ref = ref
        self._actor_id = ref.actor_id
        self._shape = shape
        self._initialized = initialized
        self._spawned = ref.spawned.shape()
        self._name = ref.name
        self._cls_name = ref.cls_name
        self._endpoints = list(ref.endpoints)
        self._plain_methods = set()
        # The port where its ranks report failures, on the mesh this process
        # spawned (not on slices, references): closed when it is stopped.
        self._supervision_port: int | None = None
        self.__class__ = endpoints_over_methods(type(self), self._endpoints)

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name!r} {self._cls_name} {self._shape!r} (reference)>"

    def _proc_view(self) -> PeerProcMesh:
        return PeerProcMesh(self._ref.procs, self._shape)

    @property
    def initialized(self) -> Future[None]:
        """Done once every actor's ``__init__`` has returned: None, or SpawnError (see
        the controller's ``ActorMesh.initialized``). On a mesh this process did
        not spawn (a reference it was given) it is done at once: whoever spawned
        it knows, and calls to an actor whose ``__init__`` failed raise that error.
        """
        return self._initialized if self._initialized is not None else completed(None)

    def _new_with_shape(self, shape: Shape) -> PeerActorMesh[A]:
        return PeerActorMesh(self._ref, shape, self._initialized)

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Remove these actors from their processes (the processes keep running).

        Sent at once; the future is done once each actor's ``__cleanup__`` ran."""
        actor_id = self._ref.actor_id
        if self._supervision_port is not None:  # stopped on purpose: no failure to hear
            _peer_supervision.close(self._supervision_port)
            self._supervision_port = None
        call = _send(
            self._ref.procs,
            self._shape,
            lambda call_id: StopActor(actor_id, call_id),
            None,
            actor=self._cls_name,
            endpoint="stop",
        )
        return done_as_none(call.future)

    def __reduce__(self):
        return (rebuild_actors, (self._ref, _refs.ViewRef.of(self._shape)))


class PeerEndpoint(EndpointBase[R]):
    """An endpoint of a referenced actor mesh: the same adverbs, sent peer to peer."""

    _mesh: PeerActorMesh[Any]

    def _send(self, shape: Shape, collect: str, args: tuple, kwargs: dict) -> PendingCall:
        mesh = self._mesh
        ref, name = mesh._ref, self._name
        sent_to = mesh._sent_to(shape)
        return _send(
            ref.procs,
            shape,
            lambda call_id: Call(call_id, ref.actor_id, name, True, sent_to),
            (args, kwargs),
            actor=mesh._cls_name,
            endpoint=name,
            collect=collect,
            error_class=EndpointFailed,
            encode_error=lambda exc: unpicklable_argument(self.label, args, kwargs, exc),
        )

    def _broadcast(self, args: tuple, kwargs: dict) -> None:
        mesh = self._mesh
        ref = mesh._ref
        ref.procs.check_reachable()
        node = local_node()
        message = Call(0, ref.actor_id, self._name, False, mesh._sent_to(mesh._shape))
        try:
            encoded = node.encode(message, (args, kwargs))
        except Exception as exc:
            raise unpicklable_argument(self.label, args, kwargs, exc) from exc
        node.send([ref.procs.address(r) for r in mesh._shape.ranks], encoded)


class PeerProcMesh:
    """A process mesh held by an actor: spawn actors on it, slice it, pass it on."""

    def __init__(self, ref: _refs.ProcsRef, shape: Shape) -> None:
        self._ref = ref
        self._shape = shape

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def name(self) -> str:
        return self._ref.name

    def __len__(self) -> int:
        return len(self._shape)

    def __repr__(self) -> str:
        return f"<ProcMesh {self._ref.name!r} {self._shape!r} (reference)>"

    def slice(self, **selection: Selector) -> PeerProcMesh:
        return PeerProcMesh(self._ref, self._shape.slice(**selection))

    def activate(self) -> Any:
        """Run torch on this mesh from inside the actor that holds it, as the
        controller's ``procs.activate()`` does: this actor drives the ranks'
        tensor engine itself (its own engine, apart from the controller's)."""
        return tensor_engine().activate(self)

    def _view_of_rank(self, rank: int) -> PeerProcMesh:
        return PeerProcMesh(self._ref, Shape([], [], [rank]))

    def spawn(self, name: str, actor_class: type[A], *args: Any, **kwargs: Any) -> PeerActorMesh[A]:
        """Start ``actor_class(*args, **kwargs)`` in every process of this mesh.

        Returns at once (see the controller's ``ProcMesh.spawn``): calls made
        meanwhile wait behind ``__init__`` on each rank, and if it raises, they
        raise its error, as ``actors.initialized.get()`` does (a SpawnError with
        the rank and the remote traceback).
        """
        if not (isinstance(actor_class, type) and issubclass(actor_class, Actor)):
            raise MeshUsageError(
                f"spawn({name!r}, ...) needs a subclass of monarch_nb.Actor, got {actor_class!r}"
            )
        check_endpoint_kinds(actor_class)
        shape = self._shape
        # Unique in every process of the mesh whoever spawns (the controller
        # counts from 1; these never collide with its ids).
        actor_id = secrets.randbits(62) | (1 << 62)
        # Its failures are ours to supervise, not the process mesh's controller's.
        supervisor, port_id = _peer_supervision.supervision_port(
            self._ref.name, name, actor_class, shape
        )
        call = _send(
            self._ref,
            shape,
            lambda call_id: Spawn(call_id, actor_id, name, shape.labels, shape.sizes, shape.ranks),
            (actor_class, args, kwargs, supervisor),
            actor=f"{actor_class.__name__} {name!r}",
            error_class=SpawnError,
            encode_error=lambda exc: unpicklable_argument(
                f"{actor_class.__name__}.__init__", args, kwargs, exc
            ),
        )
        if call.group is None:  # never sent (unreachable, unpicklable): say it now
            _peer_supervision.close(port_id)
            call.get()
        ref = _refs.ActorRef(
            self._ref,
            actor_id,
            name,
            actor_class.__name__,
            tuple(endpoint_names(actor_class)),
            _refs.ViewRef.of(shape),
        )
        actors: PeerActorMesh[A] = PeerActorMesh(ref, shape, done_as_none(call.future))
        actors._supervision_port = port_id
        _owned.own(actors)  # an actor's: stopped when it is
        return actors

    def spawn_async(
        self, name: str, actor_class: type[A], *args: Any, **kwargs: Any
    ) -> Future[PeerActorMesh[A]]:
        """:meth:`spawn`, as a future of the actor mesh done once it is initialized
        (``await`` it from an ``async`` endpoint); its error is ``initialized``'s."""
        actors = self.spawn(name, actor_class, *args, **kwargs)
        result: Future[PeerActorMesh[A]] = Future._new()

        def done(fut: Future[None]) -> None:
            error = fut.exception(timeout=0)
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(actors)

        actors.initialized.add_done_callback(done)
        return result

    def __reduce__(self):
        return (rebuild_procs, (self._ref, _refs.ViewRef.of(self._shape)))


PeerActorMesh._endpoint_type = PeerEndpoint


def rebuild_procs(ref: _refs.ProcsRef, view: _refs.ViewRef) -> Any:
    """What a pickled process mesh becomes: this process's own mesh if it owns it,
    else a peer mesh that reaches its ranks directly."""
    shape = view.shape()
    local = _refs.local_procs(ref, shape)
    return local if local is not None else PeerProcMesh(ref, shape)


def rebuild_actors(ref: _refs.ActorRef, view: _refs.ViewRef) -> Any:
    """What a pickled actor mesh becomes (see :func:`rebuild_procs`)."""
    shape = view.shape()
    local = _refs.local_actors(ref, shape)
    return local if local is not None else PeerActorMesh(ref, shape)
