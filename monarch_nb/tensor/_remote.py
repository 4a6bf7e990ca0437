"""``@remote`` functions: plain Python run on every rank, on the ranks' tensors.

::

    @remote(propagate=lambda x: x)           # output metadata from a shape function
    def clip(x): return x.clamp_(-1, 1)

    @remote                                  # or inferred by running it on fake tensors
    def top(x, k): return x.topk(k).values

    with procs.activate():
        y = top(torch.rand(8), 3)            # a MeshTensor of shape (3,), known at once
    call_on_shard_and_fetch(top, y, 2, shard={"procs": 1}).get()   # any value, one rank

A remote function is also a mesh of functions, one per rank of the active mesh,
with an endpoint's adverbs (inside ``activate()``): ``fn.call(...)`` is a future
of each rank's whole result as a ValueMesh, and ``call_one``, ``choose``,
``stream``, ``map``, ``broadcast`` and ``send(fn, args, kwargs, port=)`` are the
endpoint's, written once in :mod:`.._runtime._endpoint`. Each runs after the
tensor ops issued before it, on the ranks' own tensors.

The function travels by value when it was defined in a notebook or script
(cloudpickle), by reference when importable, or by path (``remote("pkg.mod.fn")``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .._controller._calls import send_call
from .._model._errors import MeshUsageError
from .._model._future import Future, failed
from .._model._public import publish
from .._model._shape import Selector, Shape
from .._runtime._endpoint import EndpointBase, unpicklable_argument
from .._runtime._peer_mesh import PeerActorMesh
from .._runtime._pending import PendingCall
from .._wire._messages import Call
from .._wire._serialize import _by_reference
from ._active import current, suspended
from ._api import _rank_of
from ._engine import View, source_line
from ._symbolic import (
    fake_mode,
    has_symbolic_shape,
    is_symbolic,
    new_symbols,
    symbols_exist,
    to_wire,
)
from ._tensor import MeshTensor, join_view, meta
from ._worker import Ref

P = ParamSpec("P")
R = TypeVar("R")

_CACHE_SIZE = 1024


class Remote(EndpointBase[R], Generic[P, R]):
    """A function that runs on the ranks: call it like the function (inside
    ``activate()`` or on mesh tensors) to get mesh tensors back at once, or with an
    endpoint's adverb (``fn.call(...)``, inside ``activate()``) to get its values."""

    def __init__(self, fn: Callable[P, R] | str, propagate: Callable[..., Any] | None) -> None:
        self.fn = fn
        self.propagate = propagate
        self._cache: dict[tuple, tuple[list[Any], Any]] = {}
        if callable(fn):
            functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"remote({getattr(self.fn, '__qualname__', self.fn)!r})"

    def _target(self) -> Callable[..., Any] | str:
        """How the function travels: ``"module:qualname"`` when this remote function
        can be imported under its name (as an actor class, by reference), else the
        function itself (cloudpickle sends a notebook's or a local one by value)."""
        target = self.__dict__.get("_wire_target")
        if target is None:
            target = self.fn
            if callable(target) and _by_reference(target):
                module, qualname = target.__module__, target.__qualname__
                found: Any = sys.modules.get(module)
                for part in qualname.split("."):
                    found = getattr(found, part, None)
                if found is self:
                    target = f"{module}:{qualname}"
            self.__dict__["_wire_target"] = target
        return target

    def __reduce__(self):
        return (Remote, (self.fn, self.propagate))

    @property
    def name(self) -> str:
        return self.fn if isinstance(self.fn, str) else getattr(self.fn, "__qualname__", "fn")

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.rref(*args, **kwargs)

    # -- the endpoint's adverbs, on the active mesh -----------------------------------

    @property
    def _mesh(self) -> _ActiveMesh:
        """The mesh the adverbs call: the active one (as Monarch's remote functions)."""
        return _ActiveMesh(self._active(), self.name)

    @property
    def _name(self) -> str:  # type: ignore[override]
        return self.name

    @property
    def label(self) -> str:
        return f"remote function {self.name}"

    def _active(self) -> View:
        view = current()
        if view is None:
            raise MeshUsageError(
                f"{self.label} is called on the active mesh, but none is active; call it "
                f"inside `with procs.activate():`, e.g. with procs.activate(): "
                f"{self.name}.call(...).get()"
            )
        return view

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        view = self._active()
        if len(view.shape) != 1:
            first = view.shape.labels[0] if view.shape.labels else "dim"
            return failed(
                MeshUsageError(
                    f"call_one() needs an active mesh of exactly one point, but "
                    f"{view.procs.name!r} has {len(view.shape)} {view.shape!r}; activate one "
                    f"point: with procs.slice({first}=0).activate(): "
                    f"{self.name}.call_one(...), or use .call() / .choose()"
                )
            )
        return super().call_one(*args, **kwargs)

    def _send(self, shape: Shape, collect: str, args: tuple, kwargs: dict) -> PendingCall:
        """Run on ``shape``'s ranks after the ops issued before; a usage error (bad
        arguments) raises here, at the call."""
        engine, wire = self._wire(shape, args, kwargs)
        engine.flush()  # the ops issued before run first: same ranks, same order
        actors = engine.actors
        if isinstance(actors, PeerActorMesh):  # driven from inside an actor
            return actors.call_function._send(shape, collect, (self._target(), *wire), {})
        sent_to = actors._sent_to(shape)
        return send_call(
            actors._group,
            shape,
            lambda call_id: Call(call_id, actors._actor_id, "call_function", True, sent_to),
            ((self._target(), *wire), {}),
            actor=self.label,
            collect=collect,
            check=actors._check_usable,
            encode_error=lambda exc: unpicklable_argument(self.label, args, kwargs, exc),
        )

    def _broadcast(self, args: tuple, kwargs: dict) -> None:
        # An op among the tensor ops: a failure is kept on the rank and raised by the
        # next read there (or the next adverb call), as a failed tensor op's is;
        # it does not fail the mesh.
        view = self._active()
        engine, wire = self._wire(view.shape, args, kwargs)
        engine.record(view.ranks, ("call", [], self._target(), *wire, source_line(), True))
        engine.flush()

    def _wire(self, shape: Shape, args: tuple, kwargs: dict) -> tuple[Any, list[Any]]:
        """The engine of the active mesh and the arguments as they travel (mesh
        tensors by ref); the tensors must live on the ranks called."""
        view = self._active()
        call = _Call(self, args, kwargs)
        engine = view.engine
        if call.view.engine is not engine or not set(shape.ranks) <= set(call.view.ranks):
            raise MeshUsageError(
                f"{self.label} got mesh tensors on {call.view!r}, but is called on the "
                f"active mesh {view!r}; activate the tensors' mesh (or a slice of it)"
            )
        return engine, list(call.wire)

    def rref(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run on every rank of the tensors' mesh (or of the active mesh); return the
        result's tensors as mesh tensors, with shapes from ``propagate``."""
        call = _Call(self, args, kwargs)
        described, out_spec = self._outputs(call)
        engine = call.view.engine
        outs: list[int] = []
        leaves: list[Any] = []
        sizes: dict[str, tuple[int, int]] = {}
        for kind, what in described:
            if kind == "tensor":
                ref = engine.new_ref()
                outs.append(ref)
                leaves.append(MeshTensor(meta(*what), call.view, ref))
                if symbols_exist():
                    for name, dim in new_symbols(what[0]).items():
                        sizes.setdefault(name, (ref, dim))
            else:
                leaves.append(what)
        engine.record(
            call.view.ranks,
            ("call", outs, self._target(), *call.wire, source_line(), False),
        )
        if sizes:
            engine.record(call.view.ranks, ("sizes", sizes))
        return tree_unflatten(leaves, out_spec)

    # -- output metadata ------------------------------------------------------------

    def _outputs(self, call: _Call) -> tuple[list[Any], Any]:
        key = call.key()
        hit = self._cache.get(key) if key is not None else None
        if hit is not None:
            return hit
        result = self._run_propagation(call)
        out_flat, out_spec = tree_flatten(result)
        described = [
            ("tensor", (tuple(x.shape), x.dtype, tuple(x.stride())))
            if isinstance(x, torch.Tensor)
            else ("value", x)
            for x in out_flat
        ]
        symbolic = any(
            kind == "tensor" and any(is_symbolic(s) for s in what[0] + what[2])
            for kind, what in described
        )
        if key is not None and len(self._cache) < _CACHE_SIZE and not symbolic:
            self._cache[key] = (described, out_spec)  # new symbols each call: not cached
        return described, out_spec

    def _run_propagation(self, call: _Call) -> Any:
        """Run ``propagate`` (or the function itself) here on fake tensors shaped as
        the arguments: no data, no rank involved."""
        target = self.propagate if self.propagate is not None else self.fn
        if isinstance(target, str):
            raise MeshUsageError(
                f"remote({target!r}) names its function by path, so its output shapes cannot "
                "be inferred here; pass propagate=, a function of the same arguments that "
                "returns tensors of the right shapes"
            )
        from torch.utils._python_dispatch import _disable_current_modes

        device = call.view.engine.device
        # FakeTensorMode sits below user modes such as activate()'s: take those off.
        with suspended(), _disable_current_modes(), fake_mode():
            args, kwargs = call.stand_ins(
                lambda m: torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=device)
            )
            try:
                return target(*args, **kwargs)
            except Exception as exc:
                how = "its propagate function" if target is self.propagate else "it"
                first = (str(exc).strip().splitlines() or [""])[0]  # torch's hints run long
                raise MeshUsageError(
                    f"could not infer the output shapes of {self.name} by running {how} on "
                    f"fake tensors ({type(exc).__name__}: {first}); pass @remote(propagate=fn), "
                    "a function of the same arguments that returns tensors of the right shapes"
                ) from exc


class _ActiveMesh:
    """What the endpoint adverbs read of a mesh, for a remote function's active mesh."""

    __slots__ = ("_cls_name", "_name", "_shape")

    def __init__(self, view: View, name: str) -> None:
        self._shape = view.shape
        self._name = view.procs.name
        self._cls_name = "remote"


class _Call:
    """One call's arguments: the mesh they run on, what goes on the wire, and
    stand-ins (fake tensors) for shape propagation."""

    def __init__(self, remote: Remote[Any, Any], args: tuple, kwargs: dict) -> None:
        flat, self.spec = tree_flatten((args, kwargs))
        self.flat = flat
        view: View | None = None
        wire = list(flat)
        for i, x in enumerate(flat):
            if isinstance(x, MeshTensor):
                view = join_view(view, x, remote.name)
                wire[i] = Ref(x._mt_ref)
            elif isinstance(x, torch.Tensor):
                wire[i] = x.detach().cpu()
            elif isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
                wire[i] = to_wire(x, remote.name)
        active = current()
        if view is None:
            if active is None:
                raise MeshUsageError(
                    f"calling remote function {remote.name} needs a mesh: call it inside "
                    "`with procs.activate():`, or pass it mesh tensors"
                )
            view = active
        elif active is not None and active.ranks == view.ranks and active.engine is view.engine:
            view = active
        for x in flat:
            if type(x) is not MeshTensor and isinstance(x, torch.Tensor) and x.dim() != 0:
                raise MeshUsageError(
                    f"{remote.name} got a local tensor of shape {tuple(x.shape)}; put it on "
                    "the mesh first with monarch_nb.distribute(tensor, procs)"
                )
        self.view = view
        self.wire = tree_unflatten(wire, self.spec)

    def stand_ins(self, make: Callable[[torch.Tensor], Any]) -> tuple[tuple, dict]:
        """The arguments with each mesh tensor replaced by ``make(its meta tensor)``."""
        flat = [make(x._mt_meta) if isinstance(x, MeshTensor) else x for x in self.flat]
        args, kwargs = tree_unflatten(flat, self.spec)
        return args, kwargs

    def key(self) -> tuple | None:
        """A hashable summary of the arguments' metadata, or None if some are not hashable."""
        key: list[Any] = [self.spec]
        for x in self.flat:
            if isinstance(x, torch.Tensor):
                if has_symbolic_shape(x):
                    return None
                key.append((tuple(x.shape), x.stride(), x.dtype, isinstance(x, MeshTensor)))
            else:
                try:
                    hash(x)
                except TypeError:
                    return None
                key.append((type(x), x))
        return tuple(key)


@overload
def remote(fn: Callable[P, R], *, propagate: Callable[..., Any] | None = None) -> Remote[P, R]: ...
@overload
def remote(fn: str, *, propagate: Callable[..., Any] | None = None) -> Remote[..., Any]: ...
@overload
def remote(
    *, propagate: Callable[..., Any] | None = None
) -> Callable[[Callable[P, R]], Remote[P, R]]: ...


def remote(fn: Any = None, *, propagate: Callable[..., Any] | None = None) -> Any:
    """Make ``fn`` a function that runs on the ranks: ``@remote``, ``@remote(propagate=f)``,
    or ``remote("package.module.function", propagate=f)``.

    Called with mesh tensors (or inside ``procs.activate()``), it runs on every rank of
    that mesh, each rank on its own tensors, and returns mesh tensors at once, without
    waiting. Their shapes come from ``propagate`` (called with the same arguments, mesh
    tensors replaced by fake tensors) or, without it, from running ``fn`` itself on fake
    tensors here (no data needed). Tensors it changes in place
    stay changed on the ranks. It is not differentiable: autograd does not see it.
    """
    if fn is None:
        return functools.partial(remote, propagate=propagate)
    if isinstance(fn, Remote):
        return fn
    if not (callable(fn) or isinstance(fn, str)):
        raise MeshUsageError(f"remote() takes a function or a 'module.function' path, got {fn!r}")
    return Remote(fn, propagate)


def call_on_shard_and_fetch(
    fn: Remote[..., Any] | Callable[..., Any],
    *args: Any,
    shard: dict[str, Selector] | None = None,
    **kwargs: Any,
) -> Future[Any]:
    """Run ``fn`` on one rank (``shard``: a coordinate per mesh dimension; rank 0 of the
    mesh without it) with that rank's tensors, and return a future of its whole
    result, whatever it is (tensors come back as CPU tensors)."""
    call = _Call(remote(fn), args, kwargs)
    view = call.view
    rank = _rank_of(view, dict(shard or {}), "call_on_shard_and_fetch")
    engine = view.engine
    out = engine.new_ref()
    target = remote(fn)._target()
    engine.record((rank,), ("call", [out], target, *call.wire, source_line(), True))
    try:
        return engine.read_rank(rank, out)
    finally:
        engine.drops.append(out)


publish(globals())
