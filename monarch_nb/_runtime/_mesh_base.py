"""What every actor mesh object has, wherever it is held.

The controller's :class:`~monarch_nb.ActorMesh` and an actor's reference to a
mesh (:mod:`._peer_mesh`) differ in how calls leave the process; their shape,
names, endpoint lookup and slice bookkeeping are here, once.
"""

from __future__ import annotations

from typing import Any

from .._model._shape import MeshShape, Shape
from ._endpoint import EndpointBase, no_such_endpoint

# (mesh class, endpoint names that are also its methods) -> its subclass where those
# names are the endpoints: made once per pair, so a mesh is still one class lookup.
_OVER_METHODS: dict[tuple[type, frozenset[str]], type] = {}


def _endpoint_property(name: str) -> property:
    def get(self: ActorMeshBase) -> Any:
        return self._endpoint_type(self, name)

    get.__name__ = name
    get.__doc__ = (
        f"The actors' own endpoint {name!r} (named like a mesh method: see docs/actors.md)."
    )
    return property(get)


def endpoints_over_methods(mesh_type: type, endpoints: list[str]) -> type:
    """``mesh_type``, or a subclass of it where each endpoint named like one of its
    methods (``stop``, ``slice``...) is that endpoint.

    An actor's own ``stop`` endpoint is what ``mesh.stop`` calls, as in Monarch
    programs (its GRPO example stops a scorer so); the mesh's method stays
    reachable through the class, ``ActorMesh.stop(mesh)``.
    """
    names = frozenset(
        name
        for name in endpoints
        if not name.startswith("_") and callable(getattr(mesh_type, name, None))
    )
    if not names:
        return mesh_type
    key = (mesh_type, names)
    made = _OVER_METHODS.get(key)
    if made is None:
        members = {name: _endpoint_property(name) for name in sorted(names)}
        made = type(mesh_type.__name__, (mesh_type,), members)
        made.__module__ = mesh_type.__module__
        made.__qualname__ = mesh_type.__qualname__
        _OVER_METHODS[key] = made
    return made


class ActorMeshBase(MeshShape):
    """Shape, name and endpoints of an actor mesh; ``mesh.ep`` is an endpoint.

    A subclass makes a view of itself with ``_new_with_shape`` (``slice``,
    ``flatten``, ``split`` and ``rename`` come from :class:`MeshShape`).
    """

    _shape: Shape
    _spawned: Shape  # the shape it was spawned on: message_rank is relative to a slice
    _name: str
    _cls_name: str
    _endpoints: list[str]
    _plain_methods: set[str]
    _endpoint_type: type[EndpointBase[Any]]
    _propagators: dict[str, Any] = {}  # endpoint -> its propagate= (for rref), where known
    _actor_id: int

    def _proc_view(self) -> Any:
        """The process mesh under this view: what ``rref`` runs its tensor ops on."""
        raise NotImplementedError

    def _propagator(self, endpoint: str) -> Any:
        return self._propagators.get(endpoint)

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

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._endpoints:
            return self._endpoint_type(self, name)
        raise no_such_endpoint(self._cls_name, name, self._endpoints, self._plain_methods)

    def _sent_to(self, shape: Shape) -> tuple[Any, ...]:
        """What a call tells the callee about the slice it went to (message_rank)."""
        if shape is self._spawned or shape == self._spawned:  # is: most calls, no __eq__
            return ()
        return (shape.labels, shape.sizes, shape.ranks)
