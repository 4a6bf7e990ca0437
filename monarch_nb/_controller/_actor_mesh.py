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

import itertools
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._common._actors import Actor, endpoint_names
from .._common._errors import EndpointError, MeshFailure, MeshUsageError, SerializationError
from .._common._future import Future, completed, failed
from .._common._messages import Call, StopActor
from .._common._public import publish
from .._common._shape import MeshShape, Shape
from .._common._value_mesh import ValueMesh
from ._calls import ReplyStream, send_call

if TYPE_CHECKING:
    from ._proc_mesh import ProcMesh
    from ._process_group import ProcGroup

R = TypeVar("R")
A = TypeVar("A", bound=Actor)


class ActorMesh(MeshShape, Generic[A]):
    """Handles to one actor per point of a mesh. Endpoints are attributes.

    Slicing (``.slice(procs=0)``) selects a subset of the same actors; the shape
    reads as every mesh's (``extent``, ``size(dim)``, ``flatten``, ``split``, ...).
    """

    def __init__(
        self,
        procs: ProcMesh,
        shape: Shape,
        *,
        actor_id: int,
        name: str,
        cls: type[A],
        generation: int,
    ) -> None:
        self._procs = procs
        self._group: ProcGroup = procs._group
        self._shape = shape
        self._actor_id = actor_id
        self._name = name
        self._cls_name = cls.__name__
        self._endpoints = endpoint_names(cls)
        self._plain_methods = {n for n in dir(cls) if callable(getattr(cls, n, None))}
        self._generation = generation

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def name(self) -> str:
        return self._name

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    def __len__(self) -> int:
        return len(self._shape)

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name!r} {self._cls_name} {self._shape!r}>"

    def __getattr__(self, name: str) -> Endpoint[Any]:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._endpoints:
            return Endpoint(self, name)
        listed = ", ".join(self._endpoints) or "(none: mark methods with @endpoint)"
        if name in self._plain_methods:
            why = (
                f"{self._cls_name}.{name} is a method but not an endpoint: "
                "decorate it with @endpoint"
            )
        else:
            why = f"{self._cls_name} has no endpoint {name!r}"
        raise EndpointError(
            f"{why}; its endpoints are: {listed}",
            actor=self._cls_name,
            endpoint=name,
            endpoints=self._endpoints,
        )

    def _new_with_shape(self, shape: Shape) -> ActorMesh[A]:
        # A view of the same actors at the points ``shape`` keeps.
        view = object.__new__(ActorMesh)
        view.__dict__.update(self.__dict__)
        view._shape = shape
        return view

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Remove these actors from their processes (the processes keep running).

        Returns a future that is done once the stop is sent: calls made after it
        reach the actors after the stop, so they fail. (``reason`` is accepted as
        Monarch's is.)
        """
        group = self._group
        if self._generation == group.generation:
            group.controller.send(group, self._shape.ranks, group.encode(StopActor(self._actor_id)))
        return completed(None)

    def _check_usable(self) -> MeshFailure | None:
        group = self._group
        if self._generation != group.generation:
            return MeshFailure(
                f"actor mesh {self._name!r} was spawned before its process mesh restarted; "
                f"spawn it again with procs.spawn({self._name!r}, {self._cls_name}, ...)",
                ranks=self._shape.ranks,
            )
        error = group.actor_failures.get(self._actor_id)
        if error is not None:
            return error
        return group.failure_for(self._shape.ranks)

    def __reduce__(self):
        raise MeshUsageError(
            f"actor mesh {self._name!r} cannot be sent to a rank; call it from the controller, "
            "or pass the values it returns"
        )


class Endpoint(Generic[R]):
    """One endpoint of an actor mesh, with the ways to call it (the adverbs)."""

    _round_robin = itertools.count()

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh = mesh
        self._name = name

    @property
    def label(self) -> str:
        return f"{self._mesh._cls_name}.{self._name}"

    def __repr__(self) -> str:
        return f"<Endpoint {self.label} on {self._mesh._shape!r}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise MeshUsageError(
            f"{self.label} is an endpoint of a mesh; call it with an adverb: "
            f".call(...).get(), .call_one(...).get(), .broadcast(...), .choose(...) or .stream(...)"
        )

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Call every actor of the mesh; a future of their values as a ValueMesh."""
        return self._send(self._mesh._shape, "mesh", args, kwargs).future

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the single actor of a one-point mesh; a future of its value."""
        shape = self._mesh._shape
        if len(shape) != 1:
            return failed(
                MeshUsageError(
                    f"call_one() needs a mesh of exactly one point, but {self._mesh._name!r} "
                    f"has {len(shape)} {shape!r}; slice it first, e.g. "
                    f"mesh.slice({shape.labels[0]}=0).{self._name}.call_one(...), "
                    "or use .call() / .choose()"
                )
            )
        return self._send(shape, "one", args, kwargs).future

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one actor of the mesh, the one with the fewest calls in flight."""
        shape = self._mesh._shape
        group = self._mesh._group
        load = group.controller.outstanding
        start = next(self._round_robin)
        n = len(shape.ranks)
        order = [shape.ranks[(start + i) % n] for i in range(n)]
        rank = min(order, key=lambda r: load.get((group.id, r), 0))
        single = Shape([], [], [rank])
        return self._send(single, "one", args, kwargs).future

    def stream(self, *args: Any, **kwargs: Any) -> ReplyStream:
        """Call every actor; iterate ``(point, value)`` as each reply arrives."""
        call = self._send(self._mesh._shape, "stream", args, kwargs)
        return ReplyStream(call.stream_futures)  # failed before sending: each item raises

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Call every actor without waiting. An exception it raises is not lost:
        it fails this actor mesh (supervision), is logged, and the next call raises it.
        """
        mesh = self._mesh
        error = mesh._check_usable()
        if error is not None:
            raise error
        group = mesh._group
        try:
            message = group.encode(Call(0, mesh._actor_id, self._name, False), (args, kwargs))
        except Exception as exc:
            raise unpicklable_argument(self.label, args, kwargs, exc) from exc
        group.controller.send(group, mesh._shape.ranks, message)

    def _send(self, shape: Shape, collect: str, args: tuple, kwargs: dict) -> Any:
        mesh = self._mesh
        actor_id, name = mesh._actor_id, self._name
        return send_call(
            mesh._group,
            shape,
            lambda call_id: Call(call_id, actor_id, name, True),
            (args, kwargs),
            actor=mesh._cls_name,
            endpoint=name,
            collect=collect,
            check=mesh._check_usable,
            encode_error=lambda exc: unpicklable_argument(self.label, args, kwargs, exc),
        )


def unpicklable_argument(
    label: str, args: tuple, kwargs: dict, exc: Exception
) -> SerializationError:
    """Name the first argument that cannot be pickled (re-pickling each, only on failure)."""
    import cloudpickle

    named = [(f"argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for where, value in named:
        try:
            cloudpickle.dumps(value)
        except Exception as inner:
            return SerializationError(
                f"{where} of {label} ({type(value).__name__}) cannot be pickled: {inner}; "
                "pass plain data, tensors or arrays instead",
                type_name=type(value).__name__,
            )
    return SerializationError(f"the arguments of {label} cannot be pickled: {exc}")


publish(globals())
