"""Data-parallel helpers of a process mesh: scatter, gather and a load-balanced map.

::

    procs.scatter("shard", list(range(10)))   # rank 0: [0, 1, 2], rank 1: [3, 4, 5], ...
    procs.gather("shard")                     # [0, 1, ..., 9]: concatenated in rank order
    procs.map(lambda x: x * x, range(100)).get()   # each item on whichever rank is free

``push`` sends one value to every rank; ``scatter`` sends each rank its own
contiguous chunk (a list, a tuple, a string, a tensor or an array: anything
with ``len()`` and slicing), so each rank's chunk is pickled and sent alone.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .._model._errors import MeshUsageError
from .._model._shape import Shape
from .._runtime._actors import Actor
from .._runtime._balance import IN_FLIGHT, Map, MapFuture, split_bounds
from .._wire._messages import Push
from . import _cells
from ._calls import send_call
from ._interrupt import wait_for

if TYPE_CHECKING:
    from ._actor_mesh import ActorMesh
    from ._process_group import ProcGroup

A = TypeVar("A", bound=Actor)


class DataProcs(Protocol):
    """What scatter, gather and map need of a process mesh (a ProcMesh is one): its
    processes, the view of them to use, and spawning an actor on it."""

    _group: ProcGroup

    @property
    def shape(self) -> Shape: ...

    def spawn(self, name: str, actor_class: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]: ...


def scatter(procs: DataProcs, name: str, seq: Any) -> None:
    """Set ``name`` on each rank of ``procs`` to its contiguous chunk of ``seq``.

    Rank ``i`` (in the view's rank order) gets ``seq[start:stop]``; the first
    ``len(seq) % len(procs)`` ranks get one item more. A tensor or array is
    split along its first dimension.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise MeshUsageError(f"scatter() needs a Python name to set on the ranks, got {name!r}")
    try:
        length = len(seq)
        seq[0:0]
    except TypeError:
        raise MeshUsageError(
            f"scatter({name!r}, ...) splits something with len() and slicing (a list, "
            f"tuple, string, tensor or array), not {type(seq).__name__}; use push() to "
            "send one value to every rank"
        ) from None
    ranks = procs.shape.ranks
    history = procs._group.history
    futures = []
    for rank, (start, stop) in zip(ranks, split_bounds(length, len(ranks)), strict=True):
        shape = Shape([], [], [rank])
        values = {name: seq[start:stop]}
        future = send_call(procs._group, shape, Push, values, actor=f"scatter {name!r}").future
        history.watch(history.record("push", f"scatter {name}", shape, values), future)
        futures.append(future)
    for future in futures:
        wait_for(future)


def gather(procs: DataProcs, name: str) -> Any:
    """``name`` from every rank of ``procs``, concatenated in rank order.

    Lists, tuples and strings are joined; tensors and arrays are concatenated
    along their first dimension (stacked if 0-d). Anything else comes back as
    a list of the ranks' values.
    """
    values = wait_for(_cells.pull(procs, name))
    return concatenate(values.values())


def concatenate(parts: Sequence[Any]) -> Any:
    """The ranks' values as one value (see :func:`gather`)."""
    if not parts:
        return []
    kind = type(parts[0])
    if any(type(p) is not kind for p in parts):
        return list(parts)
    package = kind.__module__.partition(".")[0]
    if package == "torch" and hasattr(parts[0], "dim"):
        torch = sys.modules["torch"]  # loaded already: the values are torch tensors
        return torch.stack(parts) if parts[0].dim() == 0 else torch.cat(parts)
    if package == "numpy" and hasattr(parts[0], "ndim"):
        numpy = sys.modules["numpy"]
        return numpy.stack(parts) if parts[0].ndim == 0 else numpy.concatenate(parts)
    if kind is str:
        return "".join(parts)
    if kind in (list, tuple):
        return kind(item for part in parts for item in part)
    return list(parts)


# One Map actor per set of ranks of a process group, spawned on first use and
# again after a restart (a new generation of processes).
_mappers: weakref.WeakKeyDictionary[ProcGroup, dict[tuple[int, ...], ActorMesh[Map]]] = (
    weakref.WeakKeyDictionary()
)


def _mapper(procs: DataProcs) -> ActorMesh[Map]:
    group = procs._group
    by_ranks = _mappers.setdefault(group, {})
    mapper = by_ranks.get(procs.shape.ranks)
    if mapper is None or mapper._generation != group.generation:
        mapper = procs.spawn("map", Map)
        by_ranks[procs.shape.ranks] = mapper
    return mapper


def map_items(
    procs: DataProcs,
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    in_flight: int = IN_FLIGHT,
) -> MapFuture:
    """``fn(item)`` for each item, load-balanced over the ranks of ``procs``; a future
    of the results in input order (see ``Endpoint.map``)."""
    if not callable(fn):
        raise MeshUsageError(f"map(fn, items) needs a function first, got {fn!r}")
    return _mapper(procs).apply.map(((fn, item) for item in items), in_flight=in_flight)
