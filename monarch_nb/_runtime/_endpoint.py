"""The adverbs of an endpoint, written once for every caller.

The controller's :class:`~monarch_nb.Endpoint` and an actor's reference to
another mesh (:mod:`._peer_mesh`) differ only in how a call leaves the
process (the controller's socket, or the peer node); what ``call``,
``call_one``, ``choose``, ``stream``, ``broadcast`` and ``map`` mean is here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from .._model._errors import EndpointError, MeshUsageError, SerializationError
from .._model._future import Future, failed
from .._model._shape import Shape
from .._model._value_mesh import ValueMesh
from ._balance import IN_FLIGHT, MapFuture, balanced_map
from ._pending import PendingCall, ReplyStream
from ._tensor_link import tensor_engine

R = TypeVar("R")


class EndpointBase(Generic[R]):
    """One endpoint of an actor mesh, with the ways to call it (the adverbs)."""

    _round_robin = itertools.count()

    def __init__(self, mesh: Any, name: str) -> None:
        self._mesh = mesh
        self._name = name

    # What a caller provides -----------------------------------------------------------

    def _send(self, shape: Shape, collect: str, args: tuple, kwargs: dict) -> PendingCall:
        """Send a call to ``shape``'s ranks; never raises (a call that cannot be sent
        comes back failed)."""
        raise NotImplementedError

    def _broadcast(self, args: tuple, kwargs: dict) -> None:
        raise NotImplementedError

    def _load(self, rank: int) -> int:
        """Calls in flight to ``rank`` (``choose`` picks the least loaded)."""
        return 0

    # The adverbs ------------------------------------------------------------------------

    @property
    def label(self) -> str:
        return f"{self._mesh._cls_name}.{self._name}"

    def __repr__(self) -> str:
        return f"<Endpoint {self.label} on {self._mesh._shape!r}>"

    def __reduce__(self):
        # The mesh travels as its reference; the endpoint is looked up again there.
        return (getattr, (self._mesh, self._name))

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Call on every rank and keep the tensors it returns there, as mesh tensors
        (Monarch's ``rref``; see the tensor engine, docs/tensor.md)."""
        return tensor_engine("._actors").rref(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise MeshUsageError(
            f"{self.label} is an endpoint of a mesh; call it with an adverb: "
            ".call(...).get(), .call_one(...).get(), .broadcast(...), .choose(...), "
            ".stream(...) or .map(items)"
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
        start = next(self._round_robin)
        n = len(shape.ranks)
        order = [shape.ranks[(start + i) % n] for i in range(n)]
        rank = min(order, key=self._load)
        return self._send(Shape([], [], [rank]), "one", args, kwargs).future

    def stream(self, *args: Any, **kwargs: Any) -> ReplyStream:
        """Call every actor; iterate ``(point, value)`` as each reply arrives."""
        call = self._send(self._mesh._shape, "stream", args, kwargs)
        return ReplyStream(call.stream_futures)  # failed before sending: each item raises

    def map(self, items: Iterable[Any], *, in_flight: int = IN_FLIGHT) -> MapFuture:
        """Call the endpoint once per item, ``endpoint(item)``, load-balanced over the
        actors: each has at most ``in_flight`` items at a time and gets the next
        one as soon as one of its items finishes. A future of the results, in
        the order of ``items``; the first item that raises fails it.
        """
        shape = self._mesh._shape

        def send(rank: int, item: Any) -> Future[Any]:
            return self._send(Shape([], [], [rank]), "one", (item,), {}).future

        return balanced_map(shape.ranks, items, send, in_flight=in_flight)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Call every actor without waiting. An exception it raises is not lost:
        it fails this actor mesh (supervision), is logged, and the next call raises it.
        """
        self._broadcast(args, kwargs)


def no_such_endpoint(
    cls_name: str, name: str, endpoints: list[str], plain_methods: set[str]
) -> EndpointError:
    """The error for ``mesh.name`` where ``name`` is not an endpoint."""
    listed = ", ".join(endpoints) or "(none: mark methods with @endpoint)"
    if name in plain_methods:
        why = f"{cls_name}.{name} is a method but not an endpoint: decorate it with @endpoint"
    else:
        why = f"{cls_name} has no endpoint {name!r}"
    return EndpointError(
        f"{why}; its endpoints are: {listed}", actor=cls_name, endpoint=name, endpoints=endpoints
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


def send(
    endpoint: EndpointBase[Any],
    args: tuple = (),
    kwargs: dict[str, Any] | None = None,
    port: Any = None,
    selection: str = "all",
) -> None:
    """Monarch's low-level ``send``: call ``endpoint`` without waiting.

    ``selection`` is ``"all"`` (every actor of the mesh) or ``"choose"`` (one,
    the least loaded). Without ``port`` it is a broadcast (an error fails the
    actor mesh, as ``broadcast()`` does); with one, each actor's value is sent
    to ``port`` as it arrives (an error arrives there as an exception).
    """
    kwargs = dict(kwargs or {})
    if selection not in ("all", "choose"):
        raise MeshUsageError(f'send(..., selection={selection!r}): use "all" or "choose"')
    if port is None:
        if selection == "all":
            endpoint.broadcast(*args, **kwargs)
        else:
            endpoint.choose(*args, **kwargs)
        return

    def forward(future: Future[Any], unpack: bool) -> None:
        error = future.exception(timeout=0)
        if error is not None:
            port.exception(error)
        else:
            value = future.get(timeout=0)
            port.send(value[1] if unpack else value)

    if selection == "choose":
        endpoint.choose(*args, **kwargs).add_done_callback(lambda f: forward(f, False))
        return
    call = endpoint._send(endpoint._mesh._shape, "stream", args, kwargs)
    for item in call.stream_futures:
        item.add_done_callback(lambda f: forward(f, True))
