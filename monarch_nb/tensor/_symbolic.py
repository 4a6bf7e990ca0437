"""Sizes that depend on values: ``nonzero``, ``unique``, boolean masks.

Such an op's output has a different size on each rank, so the controller
cannot know it. As Monarch does, the shape is propagated on fake tensors with a
:class:`ShapeEnv`, which gives each such size an *unbacked* symbol (``u0``);
the mesh tensor's shape says ``(u0, 2)``, and ops on it carry the symbol on
(``2*u0``). The ranks learn each symbol's value from the tensor that made it
(a ``sizes`` op right after), so an op whose arguments hold a symbolic size
(``torch.zeros(m.shape[0])``, autograd's ``expand`` in a sum's backward) is
sent as a :class:`~._worker.SizeExpr` that each rank evaluates with its own
values.

What cannot work is said where it is asked for: a collective or a move
between meshes needs one shape on every rank, and Python code that branches
on such a size (``int(t.shape[0])``) needs its value, which only a read gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._model._errors import MeshUsageError
from ._worker import SizeExpr

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
_fake_mode: Any = None


def fake_mode() -> Any:
    """The controller's one FakeTensorMode: every symbol lives in its ShapeEnv, so
    shapes made by one op mean the same in the next (local inputs are allowed:
    remote functions may close over small constants)."""
    global _fake_mode
    if _fake_mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        _fake_mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    return _fake_mode


def symbols_exist() -> bool:
    """Whether any value-dependent size was ever made here: until one is, every shape
    is fixed and the per-op checks for symbols are skipped (they cost a few us)."""
    if _fake_mode is None:
        return False
    return bool(getattr(_fake_mode.shape_env, "var_to_range", True))


# Fake tensors cache their kernels' results on the ShapeEnv under keys that name
# symbols; every value-dependent op makes new symbols, so the cache only grows.
_FAKE_CACHE_ENTRIES = 4096


def _bounded_shape_env() -> Any:
    """The ShapeEnv, its fake-kernel cache emptied once past _FAKE_CACHE_ENTRIES."""
    shape_env = fake_mode().shape_env
    if len(shape_env.fake_tensor_cache) > _FAKE_CACHE_ENTRIES:
        shape_env.fake_tensor_cache.clear()
    return shape_env


def new_symbol() -> Any:
    """A fresh size (>= 0) that only the ranks know."""
    size = _bounded_shape_env().create_unbacked_symint()
    try:  # a size's range (>= 0), set directly: torch._check(size >= 0) costs 2 ms
        from torch.fx.experimental.symbolic_shapes import _constrain_range_for_size

        _constrain_range_for_size(size)
    except (ImportError, TypeError):  # a private helper: if it goes, the public way
        torch._check(size >= 0)
    return size


def masked_rows(func: Any, args: Any) -> tuple[tuple[Any, ...], tuple[int, ...], Any] | None:
    """Shape, strides and dtype of ``x[mask]`` (a boolean mask over ``x``'s leading dims), made
    here with a fresh symbol: fake tensors work it out through ``nonzero`` and sympy,
    at some 6 ms an op (0.05 ms this way). None for any other op or index."""
    if func is not torch.ops.aten.index.Tensor or len(args) != 2 or len(args[1]) != 1:
        return None
    x, (mask,) = args
    if not (isinstance(x, torch.Tensor) and isinstance(mask, torch.Tensor)):
        return None
    if mask.dtype != torch.bool or not 1 <= mask.dim() <= x.dim():
        return None
    if has_symbolic_shape(x) or has_symbolic_shape(mask):
        return None
    if tuple(mask.shape) != tuple(x.shape[: mask.dim()]):
        return None  # the fake kernel says what is wrong
    rows = new_symbol()
    rest = tuple(x.shape[mask.dim() :])
    strides = [1] * len(rest)
    for i in range(len(rest) - 2, -1, -1):
        strides[i] = strides[i + 1] * rest[i + 1]
    row_stride = strides[0] * rest[0] if rest else 1
    return (rows, *rest), (row_stride, *strides), x.dtype


def is_symbolic(value: Any) -> bool:
    """A size (or scalar) whose value is not known here."""
    return isinstance(value, _SYMBOLIC) and value.node.maybe_as_int() is None


def has_symbolic_shape(t: torch.Tensor) -> bool:
    return any(is_symbolic(s) for s in t.shape) or any(is_symbolic(s) for s in t.stride())


def new_symbols(shape: Sequence[Any]) -> dict[str, int]:
    """``{symbol name: dim}`` for the dims of ``shape`` that are a bare symbol (the
    output of a value-dependent op): the ranks record their values by name."""
    found: dict[str, int] = {}
    _bounded_shape_env()
    for dim, size in enumerate(shape):
        if is_symbolic(size) and size.node.expr.is_Symbol:
            found.setdefault(str(size.node.expr), dim)
    return found


class SymbolNumbering:
    """An op's symbolic sizes numbered in the order met, so that shapes cached for
    ``(u3, 4) + (u3, 4)`` serve ``(u9, 4) + (u9, 4)``: a value-dependent tensor
    used in a loop meets new symbols every step but the same op each time."""

    def __init__(self) -> None:
        self.symbols: list[Any] = []
        self._numbers: dict[Any, int] = {}

    def key(self, size: Any) -> Any:
        """An input size as part of a cache key (None if it cannot be one)."""
        if isinstance(size, int) or not is_symbolic(size):
            return int(size)
        expr = size.node.expr
        if not expr.is_Symbol:
            return None  # e.g. 2*u0: rare enough not to cache
        if expr not in self._numbers:
            self._numbers[expr] = len(self.symbols)
            self.symbols.append(size)
        return ("sym", self._numbers[expr])

    def known(self, size: Any) -> Any:
        """An output size in terms of the inputs' symbols (None if it has others)."""
        if isinstance(size, int) or not is_symbolic(size):
            return int(size)
        number = self._numbers.get(size.node.expr)
        return None if number is None else ("sym", number)

    def size(self, encoded: Any) -> Any:
        return self.symbols[encoded[1]] if isinstance(encoded, tuple) else encoded


def to_wire(value: Any, what: Any) -> Any:
    """``value`` as the ranks should see it: a known size as an int, a symbolic one as
    an expression each rank evaluates over the sizes it recorded."""
    known = value.node.maybe_as_int() if isinstance(value, torch.SymInt) else None
    if known is not None:
        return known
    if not isinstance(value, torch.SymInt):
        raise MeshUsageError(
            f"{what} takes a {type(value).__name__} that depends on the values on each rank "
            f"({value}); read the value first (monarch_nb.inspect) or keep it a tensor"
        )
    from torch.utils._sympy.printers import PythonPrinter

    expr = value.node.expr
    names = tuple(sorted(str(s) for s in expr.free_symbols))
    return SizeExpr(PythonPrinter().doprint(expr), names)


def refuse_symbolic(t: torch.Tensor, what: str) -> None:
    """Raise if ``t``'s shape is not the same on every rank (known here)."""
    if has_symbolic_shape(t):
        raise MeshUsageError(
            f"{what} needs the same shape on every rank, but this tensor's shape "
            f"{tuple(t.shape)} depends on its values (each rank has its own size); make it a "
            "fixed size first (e.g. pad it, or use a mask and torch.where instead of indexing)"
        )


def data_dependent_error(func: Any, exc: BaseException) -> MeshUsageError:
    """What to say when an op (or the user's code) needs a value-dependent size's value."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return MeshUsageError(
        f"{func} needs to know a size that depends on the values on each rank ({first}); "
        "the controller does not have it: read the tensor (monarch_nb.inspect / fetch_shard), "
        "or keep sizes fixed (a mask with torch.where instead of indexing)"
    )
