"""Mesh tensors meet actors: an endpoint's local tensors kept on the ranks as mesh tensors.

``actors.step.rref(x)`` calls ``step`` on every rank of the actor mesh, each
rank directly from its tensor engine (same process, same thread, in order
with the tensor ops), with mesh tensor arguments as that rank's tensors; the
tensors it returns stay on the ranks, as mesh tensors. Their shapes come from
the endpoint's ``propagate=`` function, run here on fake tensors (no round
trip: an error on the ranks surfaces where the result is used); without one,
from one round trip to the first rank (an error surfaces at the call). The
other direction, mesh tensors as arguments of ``call`` / ``broadcast``, is
MeshTensor's pickling (see ``MeshTensor.__reduce_ex__``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .._model._errors import MeshUsageError
from ._active import current, suspended
from ._engine import Engine, engine_for, source_line
from ._symbolic import fake_mode
from ._tensor import MeshTensor, join_view, meta
from ._worker import Ref, TensorMeta


def rref(endpoint: Any, args: tuple, kwargs: dict) -> Any:
    """``endpoint.rref(*args, **kwargs)``: see the module docstring."""
    mesh = endpoint._mesh
    procs = mesh._proc_view()
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
    propagate = mesh._propagator(endpoint._name)
    if callable(propagate):
        metas = [x._mt_meta if isinstance(x, MeshTensor) else x for x in flat]
        described = _propagated(endpoint.label, propagate, metas, spec, engine)
        where = "its propagate function"
    else:  # None, or Monarch's "inspect" / "cached" / "mocked": ask the first rank
        described = engine.describe(view.ranks[0], whole).get()
        where = f"rank {view.ranks[0]}"
    leaves, out_spec = tree_flatten(described)
    outs: list[int] = []
    result: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):  # from propagate: a fake tensor
            leaf = TensorMeta(tuple(leaf.shape), leaf.dtype, tuple(leaf.stride()))
        if isinstance(leaf, TensorMeta):
            outs.append(engine.new_ref())
            result.append(MeshTensor(meta(leaf.shape, leaf.dtype, leaf.stride), view, outs[-1]))
        else:
            result.append(leaf)
    if not outs:
        engine.drops.append(whole)
        raise MeshUsageError(
            f"{endpoint.label}.rref() keeps tensors on the ranks, but {where} returned no "
            "tensor; use .call() for other values"
        )
    engine.record(view.ranks, ("split", outs, whole, line))
    engine.drops.append(whole)
    return tree_unflatten(result, out_spec)


def _propagated(
    label: str, propagate: Callable[..., Any], metas: list[Any], spec: Any, engine: Engine
) -> Any:
    """``propagate(*args, **kwargs)`` on fake tensors shaped as the mesh tensor
    arguments: the structure of the endpoint's result, with no rank involved."""
    from torch.utils._python_dispatch import _disable_current_modes

    device = engine.device

    def fake(m: Any) -> Any:
        if isinstance(m, torch.Tensor) and m.device.type == "meta":
            return torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=device)
        return m

    # FakeTensorMode sits below user modes such as activate()'s: take those off.
    with suspended(), _disable_current_modes(), fake_mode():
        args, kwargs = tree_unflatten([fake(x) for x in metas], spec)
        try:
            result = propagate(*args, **kwargs)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise MeshUsageError(
                f"{label}.rref(): its propagate function failed on fake tensors "
                f"({type(exc).__name__}: {first}); it takes the endpoint's arguments "
                "(without self) and returns tensors of the shapes the endpoint returns"
            ) from exc
    return result
