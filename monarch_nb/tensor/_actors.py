"""Mesh tensors meet actors: an endpoint's local tensors kept on the ranks as mesh tensors.

``actors.step.rref(x)`` calls ``step`` on every rank of the actor mesh, each
rank directly from its tensor engine (same process, same thread, in order
with the tensor ops), with mesh tensor arguments as that rank's tensors; the
tensors it returns stay on the ranks, as mesh tensors. The other direction,
mesh tensors as arguments of ``call`` / ``broadcast``, is MeshTensor's
pickling (see ``MeshTensor.__reduce_ex__``).
"""

from __future__ import annotations

from typing import Any

from torch.utils._pytree import tree_flatten, tree_unflatten

from .._common._errors import MeshUsageError
from .._controller._proc_mesh import ProcMesh
from ._active import current
from ._engine import engine_for, source_line
from ._tensor import MeshTensor, join_view, meta
from ._worker import Ref, TensorMeta


def rref(endpoint: Any, args: tuple, kwargs: dict) -> Any:
    """``endpoint.rref(*args, **kwargs)``: see the module docstring. The result's
    structure (and its tensors' shapes) comes from one round trip to the first rank."""
    mesh = endpoint._mesh
    procs = ProcMesh(mesh._group, mesh._shape)
    engine = engine_for(procs)
    view = engine.view(procs)
    active = current()
    if active is not None and active.ranks == view.ranks and active.engine is engine:
        view = active
    flat, spec = tree_flatten((args, kwargs))
    wire = list(flat)
    for i, x in enumerate(flat):
        if isinstance(x, MeshTensor):
            join_view(view, x, f"{endpoint.label}.rref()")
            wire[i] = Ref(x._mt_ref)
    wire_args, wire_kwargs = tree_unflatten(wire, spec)
    line = source_line()
    whole = engine.new_ref()
    engine.record(
        view.ranks,
        ("endpoint", whole, mesh._actor_id, endpoint._name, wire_args, wire_kwargs, line),
    )
    first = view.ranks[0]
    described = engine.describe(first, whole).get()
    leaves, out_spec = tree_flatten(described)
    outs: list[int] = []
    result: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, TensorMeta):
            outs.append(engine.new_ref())
            result.append(MeshTensor(meta(leaf.shape, leaf.dtype, leaf.stride), view, outs[-1]))
        else:
            result.append(leaf)
    if not outs:
        engine.drops.append(whole)
        raise MeshUsageError(
            f"{endpoint.label}.rref() keeps tensors on the ranks, but it returned no tensor "
            f"on rank {first}; use .call() for other values"
        )
    engine.record(view.ranks, ("split", outs, whole, line))
    engine.drops.append(whole)
    return tree_unflatten(result, out_spec)
