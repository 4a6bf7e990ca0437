"""The actor base class and the ``@endpoint`` mark: what user code defines.

Both sides use these: the controller to list a class's endpoints, workers
to construct the actors and run the endpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from ._public import publish

if TYPE_CHECKING:
    from ._errors import MeshFailure

P = ParamSpec("P")
R = TypeVar("R")

_ENDPOINT_MARK = "_monarch_nb_endpoint"


class Actor:
    """Base class of actors: subclass it and mark methods with :func:`endpoint`.

    An actor instance lives in a worker process, one per point of the mesh it
    is spawned on. Calls to one actor run one at a time, in the order sent.

    ``__supervise__(failure)`` is called on the actor (in its worker) when a
    process mesh that this actor spawned fails. Return True to say "handled":
    the child mesh stays failed, and nothing else happens. Return False (the
    default) or raise, and the failure propagates: the process mesh this
    actor lives in is marked failed, with the child's failure as the cause.
    """

    def __supervise__(self, failure: MeshFailure) -> bool:
        return False


def endpoint(method: Callable[P, R]) -> Callable[P, R]:
    """Mark an actor method (sync or ``async def``) as callable across the mesh.

    Inside the actor the method stays an ordinary method.
    """
    setattr(method, _ENDPOINT_MARK, True)
    return method


def endpoint_names(cls: type) -> list[str]:
    """Names of the endpoints a class defines, sorted."""
    return sorted(
        name for name in dir(cls) if getattr(getattr(cls, name, None), _ENDPOINT_MARK, False)
    )


publish(globals())
