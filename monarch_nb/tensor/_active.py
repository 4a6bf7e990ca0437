"""Which mesh torch runs on right now (the innermost ``activate()`` or ``no_mesh``),
and which stream.

One stack for the process (as Monarch's active mesh is one global): entries
are mesh views, or None where ``no_mesh`` made torch local again. ``stream`` is
the active :class:`~._streams.Stream`, None for the main stream (this layer
only compares it; streams themselves live above the tensors).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._model._errors import MeshUsageError
from .._model._public import publish
from ._engine import View

_stack: list[View | None] = []
_streams: list[Any] = []
stream: Any = None  # the active stream; None: the main one


def push_stream(value: Any) -> None:
    global stream
    _streams.append(value)
    stream = value


def pop_stream() -> None:
    global stream
    _streams.pop()
    stream = _streams[-1] if _streams else None


def current() -> View | None:
    """The view torch factories make tensors on now, or None (torch is local)."""
    return _stack[-1] if _stack else None


def push(view: View | None) -> None:
    _stack.append(view)


def pop(view: View | None) -> None:
    """Remove ``view``'s innermost entry (``%mesh deactivate`` may close out of order)."""
    for i in range(len(_stack) - 1, -1, -1):
        if _stack[i] is view:
            del _stack[i]
            return


@contextmanager
def suspended() -> Iterator[None]:
    """torch is local inside (shape propagation runs user code on fake tensors)."""
    push(None)
    try:
        yield
    finally:
        pop(None)


def get_active_mesh() -> Any:
    """The process mesh of the innermost ``with procs.activate():``.

    Raises MeshUsageError (a ValueError) when none is active, or inside ``no_mesh``.
    """
    view = current()
    if view is None:
        raise MeshUsageError(
            "no mesh is active: call this inside `with procs.activate():` (and outside no_mesh)"
        )
    return view.procs


class _NoMesh:
    """``with no_mesh.activate():`` (or ``with no_mesh():``): torch runs locally again
    inside an ``activate()`` block, as Monarch's ``monarch.no_mesh``."""

    def activate(self) -> Any:
        return suspended()

    __call__ = activate

    def __repr__(self) -> str:
        return "monarch_nb.no_mesh"


no_mesh = _NoMesh()

publish(globals())
