"""MeshTensor: a controller-side handle to a tensor that lives on every rank of a mesh.

A MeshTensor is a ``torch.Tensor`` wrapper subclass with no data: its shape,
dtype and strides come from a meta tensor kept beside it. Every aten op on
MeshTensors (``__torch_dispatch__``) is first run on fake tensors shaped as
those (``FakeTensorMode``, on the ranks' device), so output shapes and dtypes
(and shape and device errors) are known at once, then recorded for the ranks.
Because this happens below autograd, ``loss.backward()`` and ``opt.step()`` run
here symbolically and send their ops to the ranks too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections.abc import Generator, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .._model._errors import MeshUsageError
from .._model._future import Future
from .._model._public import publish
from .._model._value_mesh import ValueMesh
from . import _active
from ._engine import View, engine_for, source_line
from ._symbolic import (
    SymbolNumbering,
    data_dependent_error,
    fake_mode,
    masked_rows,
    new_symbols,
    refuse_symbolic,
    symbols_exist,
    to_wire,
)
from ._worker import Ref, local_tensor

_REDUCE_OPS = ("sum", "avg", "max", "min", "product")
_READ_HINT = (
    "a mesh tensor's values live on the ranks: read them with monarch_nb.inspect(t, dim=index), "
    "monarch_nb.show(t) or t.fetch()"
)
_LIFT = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)
_DATA_DEPENDENT = (
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.item.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.equal.default,
)


def meta(shape: Sequence[int], dtype: torch.dtype, stride: Sequence[int] | None = None) -> Any:
    """A meta tensor (shape, strides and dtype, no data), made past any dispatch mode:
    inside ``activate()`` a plain ``torch.empty(..., device="meta")`` would itself
    become a mesh tensor."""
    with torch._C._DisableTorchDispatch():
        if stride is None:
            return torch.empty(shape, dtype=dtype, device="meta")
        if not all(type(s) is int for s in shape):
            # Value-dependent sizes: empty_strided asks sympy about them (about 1 ms);
            # most such tensors are contiguous, which plain empty() makes for 0.15 ms.
            plain = torch.empty(shape, dtype=dtype, device="meta")
            if [str(s) for s in plain.stride()] == [str(s) for s in stride]:
                return plain
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def _layout(meta: torch.Tensor) -> dict[str, Any]:
    """``meta``'s strides and offset, or nothing where they are those of a fresh
    tensor of a shape with value-dependent sizes: given, sympy checks them (2 ms)."""
    stride, offset = meta.stride(), meta.storage_offset()
    if not symbols_exist() or all(type(s) is int for s in meta.shape) or offset != 0:
        return {"strides": stride, "storage_offset": offset}
    with torch._C._DisableTorchDispatch():
        plain = torch.empty(meta.shape, dtype=meta.dtype, device="meta").stride()
    if [str(s) for s in plain] == [str(s) for s in stride]:
        return {}
    return {"strides": stride, "storage_offset": offset}


class MeshTensor(torch.Tensor):
    """A tensor on every rank of a mesh (or slice), programmed from the controller.

    Shape, dtype and device are known here; values stay on the ranks. Make one
    inside ``with procs.activate():`` (``torch.rand(3, 4)``), with
    :func:`monarch_nb.distribute`, or from ops on other mesh tensors. Read it
    with :func:`monarch_nb.inspect`, :func:`monarch_nb.show`, ``t.fetch()`` or
    ``await t``. Collectives go by dimension name: ``t.reduce("dp", "sum")``.
    """

    _mt_meta: torch.Tensor
    _mt_view: View
    _mt_ref: int
    _mt_placements: tuple[Any, ...] | None  # known for tensors made by distribute()
    _mt_dtensor: bool  # a DTensor on the ranks (distribute(), or ops on such tensors)
    _mt_stream: Any  # the Stream it belongs to (None: the main stream)
    _mt_access: str
    _mt_borrow: Any

    @staticmethod
    def __new__(cls, meta: torch.Tensor, view: View, ref: int) -> MeshTensor:
        if type(meta) is not torch.Tensor:
            raise TypeError(f"a MeshTensor's metadata must be a plain meta tensor, got {meta!r}")
        t = torch.Tensor._make_wrapper_subclass(
            cls,
            meta.shape,
            **_layout(meta),
            dtype=meta.dtype,
            device=view.engine.device,
            requires_grad=False,
        )
        t._mt_meta = meta
        t._mt_view = view
        t._mt_ref = ref
        t._mt_placements = None
        t._mt_dtensor = False
        t._mt_stream = _active.stream
        t._mt_access = "rw"  # "r" while borrowed immutably, "" while lent mutably or dropped
        t._mt_borrow = None  # the Borrow this handle came from, if any
        weakref.finalize(t, view.engine.drops.append, ref).atexit = False
        return t

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return dispatch(func, args, kwargs or {}, None)

    # -- what it is -----------------------------------------------------------------

    @property
    def mesh(self) -> Any:
        """The process mesh (view) this tensor lives on."""
        return self._mt_view.procs

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        extra = ", requires_grad=True" if self.requires_grad else ""
        if self.grad_fn is not None:
            extra = f", grad_fn=<{type(self.grad_fn).__name__}>"
        return (
            f"MeshTensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"mesh={self._mt_view!r}{extra})"
        )

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled into an actor call (``actors.step.call(t)``), a mesh tensor arrives on
        each rank as that rank's local tensor (Monarch's semantics). The ops that make
        it are sent first, so they run on the rank before the call does."""
        view = self._mt_view
        view.engine.flush()
        return (local_tensor, (view.engine.token, self._mt_ref, view.ranks))

    def __bool__(self) -> bool:
        raise MeshUsageError(f"bool() of a MeshTensor needs its value: {_READ_HINT}")

    def item(self) -> Any:
        raise MeshUsageError(f"t.item() needs the value: {_READ_HINT}")

    def tolist(self) -> Any:
        raise MeshUsageError(f"t.tolist() needs the value: {_READ_HINT}")

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise MeshUsageError(f"t.numpy() needs the value: {_READ_HINT}")

    # -- reading values -------------------------------------------------------------

    def fetch(self) -> Future[ValueMesh[torch.Tensor]]:
        """A future of every rank's copy (its shard, for a distributed tensor), as a
        ValueMesh of local tensors; ``await t`` is ``await t.fetch()``."""
        view = self._mt_view
        return view.engine.read(view, self._mt_ref)

    def __await__(self) -> Generator[Any, None, ValueMesh[torch.Tensor]]:
        return self.fetch().__await__()

    def full_tensor(self) -> torch.Tensor:
        """The whole value of a tensor made by :func:`monarch_nb.distribute` (its shards
        gathered on the ranks, then one copy sent here)."""
        if not self._mt_dtensor:
            raise MeshUsageError(
                "full_tensor() is for tensors sharded with monarch_nb.distribute(); this one "
                "has a separate value on each rank: use monarch_nb.inspect(t, dim=index) or "
                "t.fetch()"
            )
        view = self._mt_view
        engine = view.engine
        out = engine.new_ref()
        engine.record(view.ranks, ("full", out, self._mt_ref, source_line()))
        try:
            return engine.read(view, out, view.ranks[0]).get()[view.ranks[0]]
        finally:
            engine.drops.append(out)

    def to_local(self) -> MeshTensor:
        """Each rank's shard of a distributed tensor, as a plain mesh tensor (equal
        shards only: every rank's shard must have the same shape)."""
        placements = self._mt_placements
        if not self._mt_dtensor:
            return self
        if placements is None:
            raise MeshUsageError(
                "to_local() needs to know how the tensor is sharded, which is known for "
                "tensors made by monarch_nb.distribute() only; call it on those, or use "
                "full_tensor()"
            )
        from torch.distributed.tensor import Shard

        refuse_symbolic(self, "to_local()")
        shape = list(self.shape)
        for size, placement in zip(self._mt_view.shape.sizes, placements, strict=True):
            if isinstance(placement, Shard):
                dim = placement.dim % max(len(shape), 1)
                if shape[dim] % size:
                    raise MeshUsageError(
                        f"to_local() needs equal shards, but dimension {dim} (size "
                        f"{shape[dim]}) does not divide by {size}; pad it, or use full_tensor()"
                    )
                shape[dim] //= size
        return _unary(self, "local", meta(shape, self.dtype))

    # -- collectives along named mesh dimensions -------------------------------------

    def reduce(self, dims: str | Sequence[str], reduction: str = "sum") -> MeshTensor:
        """All-reduce along mesh dimension(s): every rank gets the result.
        ``reduction`` is one of sum, avg, max, min, product, or ``"stack"``
        (Monarch's spelling of :meth:`all_gather`)."""
        if reduction == "stack":
            return _collective(self, "all_gather", dims, "", None, inplace=False)
        return _collective(self, "reduce", dims, reduction, None, inplace=False)

    def reduce_(self, dims: str | Sequence[str], reduction: str = "sum") -> MeshTensor:
        """:meth:`reduce` in place (e.g. ``p.grad.reduce_("dp", "avg")``)."""
        return _collective(self, "reduce", dims, reduction, None, inplace=True)

    def all_gather(self, dim: str) -> MeshTensor:
        """Stack the copies along mesh dimension ``dim``: a new leading dimension."""
        return _collective(self, "all_gather", dim, "", None, inplace=False)

    def reduce_scatter(self, dim: str, reduction: str = "sum") -> MeshTensor:
        """Reduce along ``dim``, then rank ``i`` of that dimension keeps chunk ``i`` of
        the first tensor dimension (which must divide by the dimension's size)."""
        return _collective(self, "reduce_scatter", dim, reduction, None, inplace=False)

    def broadcast(self, dim: str, src: int = 0) -> MeshTensor:
        """Every rank gets the copy of the rank at index ``src`` along ``dim``."""
        return _collective(self, "broadcast", dim, "", src, inplace=False)

    # -- moving between meshes ---------------------------------------------------------

    def to_mesh(self, procs: Any) -> MeshTensor:
        """This tensor on another mesh of the same size (e.g. the next pipeline stage):
        point ``i`` of this mesh sends to point ``i`` of ``procs``, rank to rank over
        the data plane (RDMABuffer), not through the controller. A mesh with dimensions
        this one lacks gets copies along them (see :meth:`slice_mesh`)."""
        return _move(self, self._mt_view, procs)

    def slice_mesh(self, **selection: Any) -> MeshSliceTensor:
        """This tensor seen on a slice of its mesh (``t.slice_mesh(stage=0)``), to be
        moved with ``.to_mesh(procs)``: dimensions of ``procs`` that the slice lacks
        receive copies (one rank's tensor sent to many)."""
        return MeshSliceTensor(self, self._mt_view.procs.slice(**selection))


class MeshSliceTensor:
    """A mesh tensor restricted to a slice of its mesh: what Monarch's ``slice_mesh``
    makes. Its one operation is :meth:`to_mesh`."""

    def __init__(self, tensor: MeshTensor, procs: Any) -> None:
        self.tensor = tensor
        self.procs = procs

    def to_mesh(self, procs: Any) -> MeshTensor:
        """The slice's values on ``procs``: point ``i`` to point ``i`` when the sizes match;
        otherwise dimensions the slice shares with ``procs`` by name pair up and the
        others receive copies."""
        return _move(self.tensor, self.tensor._mt_view.engine.view(self.procs), procs)

    def __repr__(self) -> str:
        return f"MeshSliceTensor({self.tensor!r} on {self.procs.shape!r})"


def _move(t: MeshTensor, src: View, procs: Any) -> MeshTensor:
    engine = src.engine
    dst_engine = engine_for(procs)
    if dst_engine is not engine:
        raise MeshUsageError(
            f"to_mesh() moves tensors between views of one process mesh ({src!r}); "
            f"{procs!r} belongs to another process mesh, which is not supported yet: "
            "fetch the values and distribute() them"
        )
    if t._mt_dtensor:
        raise MeshUsageError(
            "to_mesh() moves plain mesh tensors; for a distributed tensor, "
            "call .to_local() (or .full_tensor()) first"
        )
    refuse_symbolic(t, "to_mesh()")
    if t.requires_grad and torch.is_grad_enabled():
        raise MeshUsageError(
            "to_mesh() is not differentiable yet: move t.detach() (and send gradients "
            "back with another to_mesh()), or call it inside torch.no_grad()"
        )
    dst = engine.view(procs)
    if dst.ranks == src.ranks:
        return _unary(t, "local", t._mt_meta, view=dst)  # same ranks: an alias
    pairs = _pairs(src, dst)
    line = source_line()
    xid = next(engine.transfers)
    out = engine.new_ref()
    engine.record(src.ranks, ("send", xid, t._mt_ref, pairs, line))
    engine.record(dst.ranks, ("recv", out, xid, tuple(t.shape), t.dtype, line))
    return MeshTensor(meta(t.shape, t.dtype), dst, out)


def _pairs(src: View, dst: View) -> list[tuple[int, int]]:
    """(source rank, destination rank) for each destination point: in order when the
    sizes match; else by dimension name, sending copies along dimensions ``src`` lacks."""
    if len(src.shape) == len(dst.shape):
        return list(zip(src.ranks, dst.ranks, strict=True))
    extent = dst.shape.extent
    unmatched = [d for d in src.shape.labels if d not in extent and src.shape.extent[d] > 1]
    mismatched = [d for d in src.shape.labels if d in extent and src.shape.extent[d] != extent[d]]
    if unmatched or mismatched:
        raise MeshUsageError(
            f"to_mesh() pairs points in order, but {src!r} has {len(src.shape)} and "
            f"{dst!r} has {len(dst.shape)}; slice them to the same size, or to dimensions "
            "that the destination has (the others receive copies)"
        )
    pairs = []
    for point in dst.shape.points():
        coords = {d: point[d] if d in extent else 0 for d in src.shape.labels}
        pairs.append((src.shape.slice(**coords).ranks[0], point.rank))
    return pairs


def _unary(t: MeshTensor, kind: str, meta: torch.Tensor, view: View | None = None) -> MeshTensor:
    view = view or t._mt_view
    out = view.engine.new_ref()
    view.engine.record(view.ranks, (kind, out, t._mt_ref, source_line()))
    return MeshTensor(meta, view, out)


def _collective(
    t: MeshTensor,
    kind: str,
    dims: str | Sequence[str],
    reduction: str,
    arg: int | None,
    *,
    inplace: bool,
) -> MeshTensor:
    view = t._mt_view
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    labels = view.shape.labels
    unknown = [d for d in names if d not in labels]
    if not names or unknown:
        raise MeshUsageError(
            f"{kind}() along {dims!r}: this tensor's mesh has dimensions {list(labels)!r}; "
            "name one of them (procs.rename(...) / procs.split(...) make others)"
        )
    if kind != "reduce" and len(names) != 1:
        raise MeshUsageError(f"{kind}() takes one mesh dimension, got {list(names)!r}")
    if kind in ("reduce", "reduce_scatter") and reduction not in _REDUCE_OPS:
        raise MeshUsageError(
            f"unknown reduction {reduction!r}; use one of {', '.join(_REDUCE_OPS)}"
        )
    if t._mt_stream is not _active.stream or t._mt_access != "rw":
        check_use(t, f"{kind}()", write=inplace)
    if t._mt_dtensor:
        raise MeshUsageError(
            f"{kind}() by dimension takes plain mesh tensors; this one is distributed "
            "(a DTensor on the ranks): use .to_local() first, or DTensor ops"
        )
    if t.requires_grad and torch.is_grad_enabled():
        raise MeshUsageError(
            f"{kind}() is not differentiable yet: call it on t.detach(), on gradients "
            "(p.grad), or inside torch.no_grad()"
        )
    refuse_symbolic(t, f"{kind}()")
    size = view.shape.extent[names[0]]
    shape = list(t.shape)
    if kind == "all_gather":
        shape.insert(0, size)
    elif kind == "reduce_scatter":
        if not shape or shape[0] % size:
            raise MeshUsageError(
                f"reduce_scatter() along {names[0]!r} (size {size}) needs a first tensor "
                f"dimension that divides by {size}, got shape {tuple(t.shape)}"
            )
        shape[0] //= size
    elif kind == "broadcast" and not (isinstance(arg, int) and 0 <= arg < size):
        raise MeshUsageError(f"broadcast() src must be an index along {names[0]!r}: 0..{size - 1}")
    engine = view.engine
    mesh_id = engine.device_mesh(view)
    out = None if inplace else engine.new_ref()
    layout = (tuple(t.shape), t.dtype)
    side = _active.stream is not None  # a side stream's reductions overlap what follows
    op = ("coll", out, t._mt_ref, mesh_id, kind, names, reduction, arg, source_line(), layout, side)
    engine.record(view.ranks, op)
    if inplace:
        torch.autograd.graph.increment_version(t)
        return t
    assert out is not None
    return MeshTensor(meta(shape, t.dtype), view, out)


# -- the dispatcher: aten op -> meta run + recorded op ------------------------------------


def check_use(t: MeshTensor, what: Any, *, write: bool) -> None:
    """Raise if ``t`` may not be used here: it belongs to another stream than the
    active one, is lent to another stream, or is read-only while borrowed."""
    if t._mt_stream is not _active.stream:
        here, there = _stream_name(_active.stream), _stream_name(t._mt_stream)
        raise MeshUsageError(
            f"{what} uses a tensor of stream {there!r} while stream {here!r} is active; "
            f"borrow it for this stream with {here}.borrow(t) (Monarch's streams)"
        )
    borrow = t._mt_borrow
    if t._mt_access == "" and borrow is not None and borrow.dropped:
        raise MeshUsageError(f"{what} uses a borrowed tensor after its borrow.drop()")
    if t._mt_access == "":
        raise MeshUsageError(
            f"{what} uses a tensor lent mutably to another stream; call borrow.drop() first"
        )
    if write and t._mt_access == "r":
        raise MeshUsageError(
            f"{what} writes a tensor that is borrowed immutably (both streams may read it, "
            "neither may write it until borrow.drop()); borrow it with mutable=True"
        )


def _stream_name(stream: Any) -> str:
    return "main" if stream is None else stream.name


def join_view(view: View | None, t: MeshTensor, what: Any) -> View:
    """``view`` (None before the first mesh tensor), checked to hold ``t`` too: the
    tensors of one op or call live on one mesh."""
    other = t._mt_view
    if view is None:
        return other
    if other.ranks != view.ranks or other.engine is not view.engine:
        raise MeshUsageError(
            f"{what} mixes tensors on different meshes ({view!r} and {other!r}); "
            "move one with t.to_mesh(other_mesh)"
        )
    return view


def dispatch(func: Any, args: tuple, kwargs: dict, active: View | None) -> Any:
    """Run ``func`` on mesh tensors: shapes here (meta), the real op on the ranks.

    ``active`` is the mesh of the enclosing ``activate()`` (which also turns
    factory functions into mesh tensors), or None.
    """
    flat, spec = tree_flatten((args, kwargs))
    view: View | None = None
    wire = list(flat)
    metas = list(flat)
    inputs: dict[int, MeshTensor] = {}
    local: list[int] = []
    for i, x in enumerate(flat):
        if isinstance(x, MeshTensor):
            view = join_view(view, x, func)
            if x._mt_stream is not _active.stream or x._mt_access != "rw":
                check_use(x, func, write=False)
            wire[i] = Ref(x._mt_ref)
            metas[i] = x._mt_meta
            inputs[id(x._mt_meta)] = x
        elif isinstance(x, torch.Tensor):
            local.append(i)
        elif isinstance(x, _SYMBOLIC):  # a size known here, or one each rank works out
            wire[i] = to_wire(x, func)
    if view is None:
        if active is None:  # only local tensors, outside activate(): not ours
            with torch._C._DisableTorchDispatch():
                return func(*args, **kwargs)
        if local:
            # torch.tensor(data) inside activate(): the data goes to the ranks. A
            # 0-dim literal stays here as a scalar (it mixes with mesh tensors by
            # value), so optimizers' counters (Adam's step) work inside activate().
            if func in _LIFT and flat[local[0]].dim() != 0:
                return _constant(flat[local[0]], active)
            return func(*args, **kwargs)  # a local op inside activate() stays local
        if not _is_factory(func):  # e.g. the profiler's record_function: not a tensor
            return func(*args, **kwargs)
        view = active
    for i in local:
        x = flat[i]
        if x.dim() != 0:
            raise MeshUsageError(
                f"{func} mixes a local tensor of shape {tuple(x.shape)} with a mesh tensor on "
                f"{view!r}; put it on the mesh first with monarch_nb.distribute(tensor, procs) "
                "(or make it inside procs.activate())"
            )
        wire[i] = x.detach().cpu()
        metas[i] = x.detach().to("meta")
    if func in _DATA_DEPENDENT:
        raise MeshUsageError(f"{func} needs the tensor's value: {_READ_HINT}")
    if active is not None and active.ranks == view.ranks and active.engine is view.engine:
        view = active
    factory = not inputs
    dtensor = any(t._mt_dtensor for t in inputs.values())
    symbols = SymbolNumbering() if symbols_exist() else None
    key = _meta_key(func, spec, metas, symbols)
    cached = _meta_cache.get(key) if key is not None else None
    if cached is not None:
        outputs = cached if symbols is None else _from_cache(cached, symbols)
    else:
        mesh_positions = [i for i, x in enumerate(flat) if isinstance(x, MeshTensor)]
        outputs = _propagate(func, spec, metas, factory, mesh_positions, view.engine.device)
        entry = _cacheable(outputs, symbols or SymbolNumbering()) if key is not None else None
        if key is not None and entry is not None and len(_meta_cache) < _META_CACHE_SIZE:
            _meta_cache[key] = entry
    engine = view.engine
    outs: list[int] = []
    described, out_spec = outputs
    out_flat: list[Any] = []
    sizes: dict[str, tuple[int, int]] = {}
    for kind, what in described:
        if kind == "alias":  # in place, or out=: the same handle
            alias = flat[what]
            if alias._mt_access != "rw":
                check_use(alias, func, write=True)
            outs.append(alias._mt_ref)
            out_flat.append(alias)
        elif kind == "new":
            ref = engine.new_ref()
            outs.append(ref)
            shape, stride, dtype = what
            out = MeshTensor(meta(shape, dtype, stride), view, ref)
            out._mt_dtensor = dtensor
            out_flat.append(out)
            if symbols_exist():
                for name, dim in new_symbols(shape).items():
                    sizes.setdefault(name, (ref, dim))
        else:
            out_flat.append(what)
    wire_args, wire_kwargs = tree_unflatten(wire, spec)
    engine.record(
        view.ranks, ("op", outs, str(func), wire_args, wire_kwargs, source_line(), factory)
    )
    if sizes:
        engine.record(view.ranks, ("sizes", sizes))
    return tree_unflatten(out_flat, out_spec)


# Output metadata per (op, input metadata): the fake kernels are most of the
# cost of issuing an op, and a training loop issues the same ops again and again.
_META_CACHE_SIZE = 8192
_meta_cache: dict[tuple, tuple[list[tuple[str, Any]], Any]] = {}
_HASHABLE = (
    int,
    float,
    bool,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


def _meta_key(
    func: Any, spec: Any, metas: list[Any], symbols: SymbolNumbering | None
) -> tuple | None:
    """The shape cache's key; ``symbols`` None: no size anywhere is symbolic."""
    key: list[Any] = [func, spec]
    for x in metas:
        if isinstance(x, torch.Tensor):
            shape, stride = tuple(x.shape), x.stride()
            if symbols is None or all(type(s) is int for s in shape + stride):
                key.append((shape, stride, x.dtype))
                continue
            sizes = [symbols.key(s) for s in shape + stride]
            if None in sizes:
                return None
            key.append((len(shape), tuple(sizes), x.dtype))
        elif isinstance(x, _HASHABLE):
            key.append((type(x), x))  # 1 and 1.0 promote differently
        else:
            return None
    return tuple(key)


Outputs = tuple[list[tuple[str, Any]], Any]


def _cacheable(outputs: Outputs, symbols: SymbolNumbering) -> Outputs | None:
    """``outputs`` with sizes in terms of the inputs' numbered symbols, or None when
    they hold a new one (a value-dependent output gets a new symbol each time)."""
    if not symbols.symbols:  # inputs of fixed sizes: outputs are too, or hold new symbols
        static = all(
            not any(isinstance(s, _SYMBOLIC) for s in (*what[0], *what[1]))
            if kind == "new"
            else not isinstance(what, _SYMBOLIC)
            for kind, what in outputs[0]
        )
        return outputs if static else None
    described = []
    for kind, what in outputs[0]:
        if kind == "new":
            shape, stride, dtype = what
            sizes = [symbols.known(s) for s in (*shape, *stride)]
            if None in sizes:
                return None
            what = (len(shape), sizes, dtype)
        elif kind == "value" and isinstance(what, _SYMBOLIC):
            return None
        described.append((kind, what))
    return described, outputs[1]


def _from_cache(cached: Outputs, symbols: SymbolNumbering) -> Outputs:
    if not symbols.symbols:
        return cached  # the common case: no symbols, the entry as it is
    described = []
    for kind, what in cached[0]:
        if kind == "new":
            dim, sizes, dtype = what
            sizes = [symbols.size(s) for s in sizes]
            what = (tuple(sizes[:dim]), tuple(sizes[dim:]), dtype)
        described.append((kind, what))
    return described, cached[1]


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)

# How output metadata is computed: "fake" runs the op on FakeTensors on the ranks'
# device (device mismatches and device-only ops are caught here; value-dependent
# sizes become symbols, see _symbolic); "meta" on meta tensors (device-blind, the
# engine's first way; kept to compare in benchmarks).
PROPAGATION = "fake"


def _propagate(
    func: Any,
    spec: Any,
    metas: list[Any],
    factory: bool,
    mesh_positions: list[int],
    device: torch.device,
) -> tuple[list[tuple[str, Any]], Any]:
    """Run ``func`` on stand-ins of its tensors (no data); describe each output: an
    input it aliases (by position), a new tensor's metadata, or a plain value."""
    from torch.utils._python_dispatch import _disable_current_modes

    fake = PROPAGATION == "fake"
    if fake and (rows := masked_rows(func, tree_unflatten(metas, spec)[0])) is not None:
        return [("new", rows)], tree_flatten(None)[1]
    on_mesh = set(mesh_positions)
    with (
        _disable_current_modes(),
        fake_mode() if fake else contextlib.nullcontext(),
        _quiet(_FAKE_LOGGER),
    ):
        stand_ins = list(metas)
        for i, m in enumerate(metas):
            if isinstance(m, torch.Tensor):
                where = torch.device("meta") if not fake else device if i in on_mesh else "cpu"
                stand_ins[i] = torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=where)
            elif isinstance(m, torch.device) and not fake:
                stand_ins[i] = torch.device("meta")
        args, kwargs = tree_unflatten(stand_ins, spec)
        if factory:
            kwargs["device"] = (kwargs.get("device") or device) if fake else torch.device("meta")
            if not fake:
                kwargs.pop("pin_memory", None)
        try:
            result = func(*args, **kwargs)
        except NotImplementedError as exc:  # meta: no kernel, or a data-dependent shape
            raise _refused(func, exc) from None
        except RuntimeError as exc:
            if type(exc).__name__ in _FAKE_REFUSALS:
                raise _refused(func, exc) from None
            if type(exc).__name__ == "GuardOnDataDependentSymNode":
                raise data_dependent_error(func, exc) from None
            raise
    positions = {id(stand_ins[i]): i for i in mesh_positions}
    out_flat, out_spec = tree_flatten(result)
    described: list[tuple[str, Any]] = []
    for leaf in out_flat:
        if not isinstance(leaf, torch.Tensor):
            described.append(("value", leaf))
            continue
        position = positions.get(id(leaf))
        if position is None:
            if fake and leaf.device.type not in (device.type, "cpu"):
                raise MeshUsageError(
                    f"{func} would make a tensor on {leaf.device}, but this mesh's ranks keep "
                    f"their tensors on {device.type}; leave device= out inside activate()"
                )
            described.append(("new", (tuple(leaf.shape), leaf.stride(), leaf.dtype)))
            continue
        if (tuple(leaf.shape), leaf.stride()) != (
            tuple(metas[position].shape),
            metas[position].stride(),
        ):
            raise MeshUsageError(
                f"{func} changes the shape or strides of a mesh tensor in place, which is "
                "not supported; use the out-of-place op"
            )
        described.append(("alias", position))
    return described, out_spec


# FakeTensorMode logs every kernel error it re-raises; the error itself reaches the user.
_FAKE_LOGGER = logging.getLogger("torch._subclasses.fake_tensor")


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Any:
    was, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = was


# Fake tensors' ways of saying an op's output shape depends on the values.
_FAKE_REFUSALS = frozenset(
    {"DynamicOutputShapeException", "DataDependentOutputException", "UnsupportedOperatorException"}
)


def _refused(func: Any, exc: BaseException) -> MeshUsageError:
    return MeshUsageError(
        f"{func} cannot run on mesh tensors: its output shape depends on the values, or it "
        f"has no shape kernel ({type(exc).__name__}: {exc}); {_READ_HINT}"
    )


@functools.cache
def _is_factory(func: Any) -> bool:
    """Ops that make tensors from nothing: they take a device and return tensors."""
    schema = func._schema
    return any(a.name == "device" for a in schema.arguments) and any(
        "Tensor" in str(r.type) for r in schema.returns
    )


def _constant(value: torch.Tensor, view: View) -> MeshTensor:
    """A controller value copied to every rank of ``view`` (small literals, weights)."""
    engine = view.engine
    ref = engine.new_ref()
    engine.record(view.ranks, ("const", ref, value.detach().cpu().clone()))
    return MeshTensor(meta(value.shape, value.dtype, value.stride()), view, ref)


publish(globals())
