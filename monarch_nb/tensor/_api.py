"""The public functions of the tensor engine: activate a mesh, put values on it, read them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .._controller._proc_mesh import ProcMesh
from .._model._errors import MeshUsageError, format_ranks
from .._model._fold import fold
from .._model._future import Future
from .._model._public import publish
from .._model._shape import Selector
from .._model._value_mesh import ValueMesh
from ._active import current, pop, push
from ._engine import View, engine_for, source_line, then
from ._tensor import MeshSliceTensor, MeshTensor, _constant, dispatch, join_view, meta

M = TypeVar("M", bound=torch.nn.Module)
T = TypeVar("T")


class _MeshMode(TorchDispatchMode):
    """Inside ``activate()``: factories make mesh tensors on the innermost active mesh
    (none inside ``no_mesh``), and ops on mesh tensors go to their ranks."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return dispatch(func, args, kwargs or {}, current())


class Activation:
    """What ``procs.activate()`` returns: a context manager (``with``), or
    :meth:`enter` / :meth:`exit` for ``%mesh activate`` / ``%mesh deactivate``."""

    def __init__(self, procs: ProcMesh) -> None:
        self.procs = procs
        self.view = engine_for(procs).view(procs)
        self._mode: _MeshMode | None = None

    def __enter__(self) -> ProcMesh:
        if self._mode is not None:
            raise MeshUsageError("this activation is already entered; call procs.activate() again")
        self._mode = _MeshMode()
        self._mode.__enter__()
        push(self.view)
        return self.procs

    def __exit__(self, *exc_info: Any) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            pop(self.view)
            mode.__exit__(*exc_info)
            self.view.engine.flush()

    enter = __enter__

    def exit(self) -> None:
        self.__exit__(None, None, None)


def activate(procs: ProcMesh) -> Activation:
    """``with procs.activate():`` torch factory functions, and ops on mesh tensors,
    run on every rank of ``procs`` and return :class:`MeshTensor` handles."""
    return Activation(procs)


def _rank_of(view: View, point: dict[str, Selector], what: str) -> int:
    """The rank at ``point`` of ``view``; with no coordinates, its first (coordinate 0
    of every dimension, as Monarch's ``fetch_shard``)."""
    if not point:
        return view.ranks[0]
    shape = view.shape
    selected = shape.slice(**point)
    if len(selected) != 1:
        missing = [d for d in shape.labels if d not in point]
        raise MeshUsageError(
            f"{what}() reads one rank; name a coordinate for {missing!r} too, e.g. "
            f"{what}(t, {', '.join(f'{d}=0' for d in shape.labels)})"
        )
    return selected.ranks[0]


def fetch_shard(obj: T, shard: dict[str, Selector] | None = None, **coords: Selector) -> Future[T]:
    """A future of ``obj`` (a tensor, or a pytree holding tensors) with each mesh tensor
    replaced by one rank's local copy: the rank at ``shard`` / ``coords`` (a coordinate
    per mesh dimension), rank 0 of the mesh without them. For a distributed tensor,
    that rank's shard. Other leaves come back as they are.

    ``fetch_shard(loss, dp=1).get()``; ``await fetch_shard(t)``. The future raises
    MeshTensorError if an op these tensors depend on failed on any rank of their mesh.
    """
    point = {**(shard or {}), **coords}
    flat, spec = tree_flatten(obj)
    positions = [i for i, x in enumerate(flat) if isinstance(x, MeshTensor)]
    if not positions:
        raise MeshUsageError(
            f"fetch_shard() reads mesh tensors, and {type(obj).__name__} holds none"
        )
    view: View | None = None
    for i in positions:
        view = join_view(view, flat[i], "fetch_shard()")
    assert view is not None
    rank = _rank_of(view, point, "fetch_shard")
    refs = [flat[i]._mt_ref for i in positions]

    def rebuild(values: ValueMesh[Any]) -> Any:
        filled = list(flat)
        for i, value in zip(positions, values[rank], strict=True):
            filled[i] = value
        return tree_unflatten(filled, spec)

    return then(view.engine.read(view, refs, rank), rebuild)


def inspect(obj: T, shard: dict[str, Selector] | None = None, **coords: Selector) -> T:
    """``fetch_shard(obj, ...).get()``: one rank's copy of ``obj``'s mesh tensors, here.

    ``inspect(t)`` is rank 0's copy, ``inspect(t, procs=1)`` rank 1's. Raises
    MeshTensorError if an op ``t`` depends on failed."""
    return fetch_shard(obj, shard, **coords).get()


def show(t: Any, shard: dict[str, Selector] | None = None, **coords: Selector) -> None:
    """Print one rank's copy (``show(t, gpu=1)``: ``[1] tensor([...])``) or, without
    coordinates, every rank's copy with equal copies folded (``[0-3] tensor([...])``)."""
    if shard or coords:
        view = _mesh_tensor(t, "show")._mt_view
        rank = _rank_of(view, {**(shard or {}), **coords}, "show")
        pairs = [(rank, repr(inspect(t, shard, **coords)))]
    else:
        values: ValueMesh[torch.Tensor] = _mesh_tensor(t, "show").fetch().get()
        pairs = list(zip(values.shape.ranks, map(repr, values.values()), strict=True))
    lines = []
    for ranks, text in fold(pairs):
        sep = "\n" if "\n" in text else " "
        lines.append(f"[{format_ranks(ranks)}]{sep}{text}")
    print("\n".join(lines))


def _mesh_tensor(t: Any, what: str) -> MeshTensor:
    if not isinstance(t, MeshTensor):
        raise MeshUsageError(f"{what}() takes a MeshTensor, got {type(t).__name__}")
    return t


def distribute(
    tensor: torch.Tensor, procs: ProcMesh, placements: Sequence[Any] | None = None
) -> MeshTensor:
    """Put a controller tensor on ``procs``: ``placements`` (one per mesh dimension,
    default ``Replicate()``) as in ``torch.distributed.tensor.distribute_tensor``;
    the ranks hold a DTensor. The value is sent once to each rank."""
    from torch.distributed.tensor import Replicate

    if isinstance(tensor, MeshTensor):
        raise MeshUsageError("this tensor is on a mesh already; move it with t.to_mesh(procs)")
    if not isinstance(tensor, torch.Tensor):
        raise MeshUsageError(f"distribute() takes a torch.Tensor, got {type(tensor).__name__}")
    engine = engine_for(procs)
    view = engine.view(procs)
    labels = view.shape.labels
    placements = list(placements) if placements is not None else [Replicate()] * len(labels)
    if len(placements) != len(labels):
        raise MeshUsageError(
            f"placements needs one entry per mesh dimension {list(labels)!r}, got {placements!r}"
        )
    mesh_id = engine.device_mesh(view)
    ref = engine.new_ref()
    value = tensor.detach().cpu().contiguous()
    engine.record(view.ranks, ("dist", ref, value, mesh_id, placements, source_line()))
    result = MeshTensor(meta(value.shape, value.dtype, value.stride()), view, ref)
    result._mt_placements = tuple(placements)
    result._mt_dtensor = True
    result.requires_grad_(tensor.requires_grad)
    return result


def slice_mesh(tensors: Any, **selection: Selector) -> Any:
    """Each mesh tensor in ``tensors`` (a pytree) seen on a slice of its mesh, to be
    moved with :func:`to_mesh`: ``to_mesh(slice_mesh(h, stage=0), stages.slice(stage=1))``."""
    return tree_map(
        lambda t: t.slice_mesh(**selection) if isinstance(t, MeshTensor) else t, tensors
    )


def to_mesh(tensors: Any, procs: ProcMesh) -> Any:
    """Each mesh tensor (or slice of one) in ``tensors`` (a pytree) moved to ``procs``,
    rank to rank: see :meth:`MeshTensor.to_mesh`."""
    return tree_map(
        lambda t: t.to_mesh(procs) if isinstance(t, MeshTensor | MeshSliceTensor) else t, tensors
    )


def module_to_mesh(module: M, procs: ProcMesh, placements: Sequence[Any] | None = None) -> M:
    """Move ``module``'s parameters and buffers onto ``procs``, in place (like
    ``module.to(device)``), and return it.

    Without ``placements`` every rank holds a full replica (plain tensors, as in
    DDP: reduce gradients with ``p.grad.reduce_("procs", "avg")``); with them
    each parameter is distributed with ``distribute_tensor`` (DTensors).
    Tied parameters stay tied.
    """
    view = engine_for(procs).view(procs)
    moved: dict[int, Any] = {}

    def move(value: torch.Tensor) -> MeshTensor:
        if placements is None:
            return _constant(value, view)
        return distribute(value.detach(), procs, placements)

    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is None or isinstance(param, MeshTensor):
                continue
            if id(param) not in moved:
                moved[id(param)] = torch.nn.Parameter(move(param), param.requires_grad)
            sub._parameters[name] = moved[id(param)]
        for name, buffer in list(sub._buffers.items()):
            if buffer is None or isinstance(buffer, MeshTensor):
                continue
            if id(buffer) not in moved:
                moved[id(buffer)] = move(buffer)
            sub._buffers[name] = moved[id(buffer)]
    return module


def manual_seed(seed: int, procs: ProcMesh) -> None:
    """``torch.manual_seed(seed)`` on every rank of ``procs`` (in order with its ops).

    Ranks start with different seeds (torch seeds each process by itself), so
    ``torch.rand`` inside ``activate()`` gives each rank its own values; after
    ``manual_seed(seed, procs)`` every rank draws the same ones. (``torch.manual_seed``
    inside ``activate()`` seeds the controller only.)"""
    engine = engine_for(procs)
    engine.record(engine.view(procs).ranks, ("seed", int(seed)))


def ref_counts(procs: ProcMesh) -> ValueMesh[int]:
    """How many tensors each rank of ``procs``'s process mesh holds (tests, debugging)."""
    stats = engine_for(procs).stats()
    return ValueMesh(stats.shape, [s["refs"] for s in stats.values()])


publish(globals())
