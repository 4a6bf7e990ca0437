"""What every actor mesh object has, wherever it is held.

The controller's :class:`~monarch_nb.ActorMesh` and an actor's reference to a
mesh (:mod:`._peer_mesh`) differ in how calls leave the process; their shape,
names, endpoint lookup and slice bookkeeping are here, once.
"""

from __future__ import annotations

from typing import Any

from ._endpoint import EndpointBase, no_such_endpoint
from ._shape import MeshShape, Shape


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
