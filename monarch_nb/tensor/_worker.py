"""The rank side of the tensor engine: an actor that holds real tensors by ref id.

The controller sends batches of ops (fire and forget, in order) to
:class:`TensorWorker` on the ranks of a mesh; each op names its inputs and
outputs by integer ref ids. An op that raises stores a :class:`DeferredError`
in its outputs instead of a tensor, and ops that read such a ref store the
same error without running, so every dependent names the root cause. The
batch itself never raises: a failed broadcast would fail the whole mesh.

Ops (tuples, first item the kind)::

    ("op", outs, name, args, kwargs, src, factory)   an aten op; refs in args are Ref
    ("const", out, tensor)                           a value sent by the controller
    ("view", view_id, labels, sizes, ranks)          a DeviceMesh (sent to every rank)
    ("coll", out, ref, view_id, kind, dims, reduce, arg, src, (shape, dtype), side)
    ("sync", ref)                                    a side stream's work on ref completes
    ("dist", out, tensor, view_id, placements, src)  distribute_tensor
    ("local" | "full", out, ref, src)                DTensor.to_local / full_tensor
    ("send", xid, ref, pairs, src) / ("recv", out, xid, shape, dtype, src)
    ("call", outs, fn, args, kwargs, src, whole)     a @remote function (by value or path)
    ("endpoint", out, actor_id, name, args, kwargs, src) / ("split", outs, ref, src)
    ("seed", seed) / ("drop", refs)
    ("sizes", {name: (ref, dim)})                     record value-dependent sizes by name

Collectives (``coll``, ``sync``) are in :mod:`._worker_collectives` and moves
between meshes (``send``, ``recv``) in :mod:`._worker_transfers`: the actor's
parts by concern, over the state it owns here. This module imports nothing
from the controller side.
"""

from __future__ import annotations

import functools
import os
import traceback
from typing import Any

from .._runtime._actors import Actor, endpoint
from ._errors import DeferredError
from ._streams_rank import RefTable
from ._worker_collectives import Collectives
from ._worker_transfers import Transfers


class Ref:
    """A tensor named by its ref id inside an op's arguments."""

    __slots__ = ("id",)

    def __init__(self, ref_id: int) -> None:
        self.id = ref_id

    def __reduce__(self):
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


class SizeExpr:
    """A size that depends on values on each rank (``u0``, ``2*u0``), inside an op's
    arguments: a Python expression over sizes recorded by name with a ``sizes`` op."""

    __slots__ = ("expr", "names")

    def __init__(self, expr: str, names: tuple[str, ...]) -> None:
        self.expr = expr
        self.names = names

    def __reduce__(self):
        return (SizeExpr, (self.expr, self.names))

    def __repr__(self) -> str:
        return f"SizeExpr({self.expr!r})"


def _rank_side(method: Any) -> Any:
    """Run an endpoint with torch local: where an actor in this process drives a
    tensor engine itself, its ``activate()`` dispatch mode is on this thread's
    stack while its async endpoint awaits, and must not turn this rank's own
    ops into mesh tensors."""

    @functools.wraps(method)
    def run(self: TensorWorker, *args: Any, **kwargs: Any) -> Any:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return method(self, *args, **kwargs)

    return run


class TensorWorker(Actor, Collectives, Transfers):
    """Holds this rank's tensors (``refs``) and runs the ops the controller sends."""

    def __init__(self, token: str = "") -> None:
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        self.rank = int(os.environ.get("RANK", "0"))
        cuda = torch.cuda.is_available() and bool(os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        if "OMP_NUM_THREADS" not in os.environ:
            # As torchrun does: ranks sharing a host share its cores, or their
            # spinning intra-op threads slow every op down many times over.
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
        if not dist.is_initialized():  # a %%mesh cell may have done it already
            from .._services._dist import init_process_group  # no port open on one host

            init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
        self.store: Any = dist.PrefixStore(
            "monarch_nb.tensor/", dist.distributed_c10d._get_default_store()
        )
        self.refs = RefTable()  # collectives on side streams settle when read
        self.meshes: dict[int, Any] = {}  # view id -> DeviceMesh
        self.pinned: dict[str, Any] = {}  # transfer -> (RDMABuffer, tensor, reader keys)
        self._ops: dict[str, Any] = {}
        self.unreported: list[DeferredError] = []  # failures of ops with no outputs
        # Value-dependent sizes by name (nonzero's row count, ...): an int each, or the
        # error of the op that should have made it. Kept for the actor's life, as the
        # controller keeps the symbols: autograd may use a size long after its tensor.
        self.sizes: dict[str, Any] = {}
        self.fused = 0  # reductions that shared a collective with the one before
        self.overlapped = 0  # reductions started on a side stream, finished when read
        self.token = token  # names the controller's engine: mesh tensors it pickled resolve here
        _by_token[token] = self

    def __cleanup__(self, exc: BaseException | None) -> None:
        _by_token.pop(self.token, None)

    # -- endpoints --------------------------------------------------------------------

    @endpoint
    @_rank_side
    def device_name(self) -> str:
        return str(self.device)

    @endpoint
    @_rank_side
    def run(self, batch: list[tuple]) -> None:
        with self.torch.no_grad():
            i = 0
            while i < len(batch):
                op = batch[i]
                fused = self._fusable_run(batch, i)
                try:
                    if len(fused) > 1:
                        self._coll_fused(fused)
                    else:
                        getattr(self, f"_{op[0]}")(*op[1:])
                except KeyboardInterrupt as exc:
                    for rest in batch[i:]:
                        self._fail_outputs(rest, self._error(str(rest[0]), "", exc))
                    return
                except Exception as exc:  # a bug of ours, not the op's: keep the actor up
                    error = self._error(str(op[0]), "", exc)
                    for each in fused or [op]:
                        self._fail_outputs(each, error)
                    self.unreported.append(error)
                i += max(1, len(fused))
        if self.pinned:
            self._release_read_buffers()

    @endpoint
    @_rank_side
    def read(self, refs: int | list[int], value_rank: int | None) -> tuple[str, Any]:
        """``("err", DeferredError)`` or ``("ok", value)`` (value only on ``value_rank``);
        for a list of refs, ``("ok", [value, ...])``."""
        if self.unreported:
            error, self.unreported = self.unreported[0], []
            return ("err", error)
        values = []
        for ref in [refs] if isinstance(refs, int) else refs:
            value = self.refs.get(ref, _MISSING)
            if isinstance(value, DeferredError):
                return ("err", value)
            if value is _MISSING:
                return ("err", self._error("read", "", LookupError(f"no tensor with ref {ref}")))
            values.append(value)
        if value_rank is not None and value_rank != self.rank:
            return ("ok", None)
        from torch.utils._pytree import tree_map

        local = tree_map(self._to_host, values)
        return ("ok", local[0] if isinstance(refs, int) else local)

    def _to_host(self, value: Any) -> Any:
        """A copy the controller can hold: a DTensor's local shard, on the CPU."""
        if not isinstance(value, self.torch.Tensor):
            return value
        if hasattr(value, "to_local"):  # a DTensor: this rank's shard
            value = value.to_local()
        return value.detach().cpu().clone()

    @endpoint
    @_rank_side
    def stats(self) -> dict[str, int]:
        return {
            "refs": len(self.refs),
            "pinned": len(self.pinned),
            "meshes": len(self.meshes),
            "fused": self.fused,
            "overlapped": self.overlapped,
        }

    @endpoint
    @_rank_side
    def call_function(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """A ``@remote`` function called with an adverb (``fn.call()``, ``send(fn, ...)``):
        run it here, after every op sent before, and reply with its whole result
        (tensors as CPU copies). An error it raises is the caller's, as an
        endpoint's is; so is an input that failed, or a failed ``fn.broadcast()``
        not yet reported."""
        if self.unreported:
            error, self.unreported = self.unreported[0], []
            raise _failed_before(error)
        (args, kwargs), failed = self._resolve((args, kwargs))
        if failed is not None:
            raise _failed_before(failed)
        if isinstance(fn, str):
            fn = _import_function(fn)
        from torch.utils._pytree import tree_map

        return tree_map(self._to_host, fn(*args, **kwargs))

    # -- ops --------------------------------------------------------------------------

    def _op(self, outs, name, args, kwargs, src, factory) -> None:
        func = self._ops.get(name)
        if func is None:
            namespace, op, overload = name.split(".")
            func = getattr(getattr(getattr(self.torch.ops, namespace), op), overload)
            self._ops[name] = func
        from torch.utils._pytree import tree_leaves

        raw = (args, kwargs)
        (args, kwargs), failed = self._resolve(raw)
        if failed is not None:
            self._store(outs, failed)
            return
        if factory and kwargs.get("device") is None:
            kwargs["device"] = self.device
        try:
            result = func(*args, **kwargs)
        except Exception as exc:
            error = self._error(name, src, exc)
            if outs:
                self._store(outs, error)
            else:
                # An op that only checks (torch.linalg's error checks): nothing to
                # store it in, so its inputs carry it, and the next read on this
                # rank reports it whatever it reads.
                self._store([x.id for x in tree_leaves(raw) if type(x) is Ref], error)
                self.unreported.append(error)
            return
        tensors = [x for x in tree_leaves(result) if isinstance(x, self.torch.Tensor)]
        for ref, tensor in zip(outs, tensors, strict=False):
            self.refs[ref] = tensor  # an in-place op's output is its input: same ref

    def _call(self, outs, fn, args, kwargs, src, whole) -> None:
        """A ``@remote`` function: its tensors go to ``outs`` in pytree order (or,
        when ``whole``, its whole result to ``outs[0]``, for call_on_shard_and_fetch)."""
        (args, kwargs), failed = self._resolve((args, kwargs))
        if failed is not None:
            self._store(outs, failed)
            if not outs:
                self.unreported.append(failed)
            return
        name = _function_name(fn)
        try:
            if isinstance(fn, str):
                fn = _import_function(fn)
            result = fn(*args, **kwargs)
        except Exception as exc:
            error = self._error(name, src, exc)
            self._store(outs, error)
            if not outs:  # fn.broadcast(): nothing holds it, so the next read reports it
                self.unreported.append(error)
            return
        if not outs:
            return
        if whole:
            self.refs[outs[0]] = result
        else:
            self._split_into(outs, result, name, src)

    def _endpoint(self, out, actor_id, name, args, kwargs, src) -> None:
        """``endpoint.rref(...)``: call an actor of this process directly, here, and keep
        its whole result under ``out`` (split into tensors by a later ``split``)."""
        import inspect

        from .._runtime import _context
        from .._worker._main import live_actor

        (args, kwargs), failed = self._resolve((args, kwargs))
        if failed is not None:
            self.refs[out] = failed
            return
        live = live_actor(actor_id)
        try:
            if live is None:
                raise LookupError(f"no actor {actor_id} on rank {self.rank}: it was stopped")
            instance, context, run_async = live
            previous = _context.set_current(context)
            try:
                result = getattr(instance, name)(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = run_async(result)  # on the actors' loop, as a call would be
            finally:
                _context.set_current(previous)
        except Exception as exc:
            self.refs[out] = self._error(f"{name}.rref", src, exc)
            return
        self.refs[out] = result

    @endpoint
    @_rank_side
    def describe(self, ref: int) -> tuple[str, Any]:
        """The structure of the value under ``ref``, each tensor replaced by its
        TensorMeta: what the controller needs to make mesh tensors of it."""
        value = self.refs.get(ref, _MISSING)
        if isinstance(value, DeferredError):
            return ("err", value)
        from torch.utils._pytree import tree_map

        def describe(x: Any) -> Any:
            if isinstance(x, self.torch.Tensor):
                return TensorMeta(tuple(x.shape), x.dtype, tuple(x.stride()))
            return x

        return ("ok", tree_map(describe, value))

    def _split(self, outs, ref, src) -> None:
        value = self.refs.get(ref)
        if isinstance(value, DeferredError):
            self._store(outs, value)
            return
        self._split_into(outs, value, "rref", src)

    def _split_into(self, outs, result, name, src) -> None:
        """Store ``result``'s tensors under ``outs``, in pytree order (as many as the
        controller expects, or the mismatch as every output's error)."""
        from torch.utils._pytree import tree_leaves

        tensors = [x for x in tree_leaves(result) if isinstance(x, self.torch.Tensor)]
        if len(tensors) != len(outs):
            error = TypeError(
                f"{name} returned {len(tensors)} tensor(s) here, but {len(outs)} on the "
                "controller's shape propagation; make its propagate= match what it returns"
            )
            self._store(outs, self._error(name, src, error))
            return
        for ref, tensor in zip(outs, tensors, strict=True):
            self.refs[ref] = tensor

    def local_value(self, token: str, ref: int, ranks: tuple[int, ...]) -> Any:
        """A mesh tensor that arrived pickled inside an actor call: this rank's tensor."""
        if token != self.token or self.rank not in ranks:
            where = f"ranks {list(ranks)}" if token == self.token else "another process mesh"
            raise ValueError(
                f"a mesh tensor on {where} was sent to rank {self.rank}; mesh tensors reach "
                "actors only on the processes that hold them (move it with t.to_mesh())"
            )
        value = self.refs.get(ref, _MISSING)
        if isinstance(value, DeferredError):
            raise RuntimeError(f"{value.op} issued at {value.source} failed: {value.message}")
        if value is _MISSING:
            raise LookupError(f"no tensor with ref {ref} on rank {self.rank}")
        return value.to_local() if hasattr(value, "to_local") else value

    def _resolve(self, tree: Any) -> tuple[Any, DeferredError | None]:
        """``tree`` with each Ref replaced by its tensor, and the first failure among them."""
        from torch.utils._pytree import tree_map

        refs = self.refs
        failed: list[DeferredError] = []

        def resolve(x: Any) -> Any:
            if type(x) is Ref:
                value = refs[x.id]
                if isinstance(value, DeferredError):
                    failed.append(value)
                return value
            if type(x) is SizeExpr:
                return self._size(x, failed)
            return x

        resolved = tree_map(resolve, tree)
        return resolved, (failed[0] if failed else None)

    def _size(self, size: SizeExpr, failed: list[DeferredError]) -> int:
        values = {name: self.sizes.get(name) for name in size.names}
        for name, value in values.items():
            if isinstance(value, DeferredError):
                failed.append(value)
                return 0
            if value is None:
                failed.append(self._error("size", "", LookupError(f"no size named {name}")))
                return 0
        return int(eval(size.expr, {"__builtins__": {}}, values))  # the controller's own text

    def _sizes(self, entries: dict[str, tuple[int, int]]) -> None:
        for name, (ref, dim) in entries.items():
            value = self.refs.get(ref, _MISSING)
            if isinstance(value, DeferredError):
                self.sizes[name] = value
            elif value is not _MISSING:
                self.sizes[name] = int(value.shape[dim])

    def _const(self, out, tensor) -> None:
        self.refs[out] = tensor.to(self.device)

    def _drop(self, refs) -> None:
        for ref in refs:
            self.refs.pop(ref, None)

    def _seed(self, seed) -> None:
        self.torch.manual_seed(seed)

    def _view(self, view_id, labels, sizes, ranks) -> None:
        from torch.distributed.device_mesh import DeviceMesh

        # Every rank of the world takes part in making the groups, even ranks
        # outside this view (torch.distributed.new_group is collective).
        layout = self.torch.tensor(ranks).reshape(sizes)
        self.meshes[view_id] = DeviceMesh(self.device.type, layout, mesh_dim_names=tuple(labels))

    def _dist(self, out, tensor, view_id, placements, src) -> None:
        from torch.distributed.tensor import distribute_tensor

        try:
            # Every rank got the whole value, so each takes its shard locally.
            self.refs[out] = distribute_tensor(
                tensor.to(self.device), self.meshes[view_id], placements, src_data_rank=None
            )
        except Exception as exc:
            self.refs[out] = self._error("distribute", src, exc)

    def _local(self, out, ref, src) -> None:
        self._unary(out, ref, src, "to_local", _to_local)

    def _full(self, out, ref, src) -> None:
        self._unary(out, ref, src, "full_tensor", lambda t: t.full_tensor())

    def _unary(self, out, ref, src, label, fn) -> None:
        value = self.refs[ref]
        if isinstance(value, DeferredError):
            self.refs[out] = value
            return
        try:
            self.refs[out] = fn(value)
        except Exception as exc:
            self.refs[out] = self._error(label, src, exc)

    # -- failures ---------------------------------------------------------------------

    def _error(self, op: str, src: str, exc: BaseException) -> DeferredError:
        text = "".join(traceback.format_exception_only(type(exc), exc))
        return DeferredError(op, src, self.rank, type(exc).__name__, str(exc), text)

    def _store(self, outs, error: DeferredError) -> None:
        for ref in outs:
            self.refs[ref] = error

    def _fail_outputs(self, op: tuple, error: DeferredError) -> None:
        kind = op[0]
        if kind in ("op", "call", "split"):
            self._store(op[1], error)
        elif kind in ("const", "dist", "local", "full", "recv", "endpoint"):
            self.refs[op[1]] = error
        elif kind == "coll":  # in place (no output ref): the input holds the error
            self.refs[op[1] if op[1] is not None else op[2]] = error


_MISSING = object()
# This process's TensorWorkers by their engine's token: the controller's, and
# one for each actor that drives this mesh's tensor engine itself.
_by_token: dict[str, TensorWorker] = {}


class TensorMeta:
    """A tensor's shape, dtype and strides, as :meth:`TensorWorker.describe` reports them."""

    __slots__ = ("dtype", "shape", "stride")

    def __init__(self, shape: tuple, dtype: Any, stride: tuple) -> None:
        self.shape, self.dtype, self.stride = shape, dtype, stride

    def __reduce__(self):
        return (TensorMeta, (self.shape, self.dtype, self.stride))


def local_tensor(token: str, ref: int, ranks: tuple[int, ...]) -> Any:
    """Unpickles a mesh tensor on a rank (an actor endpoint's argument): the tensor
    this rank holds for it."""
    worker = _by_token.get(token)
    if worker is None:
        if not _by_token:
            raise ValueError(
                "a mesh tensor was sent to a process that runs no tensor engine; mesh "
                "tensors reach actors only on the processes that hold them"
            )
        worker = next(iter(_by_token.values()))  # says "another process mesh"
    return worker.local_value(token, ref, ranks)


def _import_function(path: str) -> Any:
    """``"package.module.function"``, imported here (a remote function named by path);
    or ``"package.module:qualname"``, a ``@remote`` function of an importable module
    (sent by reference): the function it wraps."""
    import importlib

    if ":" in path:
        module, _, qualname = path.partition(":")
        value: Any = importlib.import_module(module)
        for part in qualname.split("."):
            value = getattr(value, part)
        return value.fn
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _failed_before(error: DeferredError) -> RuntimeError:
    """What a call raises for an op that failed before it (the same text on every rank)."""
    return RuntimeError(
        f"{error.op} issued at {error.source} failed: {error.type_name}: {error.message}"
    )


def _function_name(fn: Any) -> str:
    if isinstance(fn, str) and ":" in fn:
        return fn.partition(":")[2]
    return getattr(fn, "__qualname__", repr(fn))


def _to_local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t
