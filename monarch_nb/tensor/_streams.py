"""Streams, as Monarch's ``monarch.Stream``: ordered lanes of work on each rank.

::

    comms = Stream("comms")
    g_comm, borrow = comms.borrow(grad, mutable=True)   # grad lent to "comms"
    with comms.activate():
        g_comm.reduce_("dp", "avg")        # starts on the ranks; they move on at once
    ...                                    # main-stream work overlaps the reduction
    borrow.drop()                          # later main-stream ops see the result

Every mesh tensor belongs to the stream that was active when it was made, and
ops may use only tensors of the active stream; a tensor reaches another stream
by a borrow. A mutable borrow lends it (its stream cannot touch it until
``drop()``); an immutable one lets both read and neither write. On the ranks,
reductions issued on a stream other than the main one run asynchronously and
complete when their output is first read or their borrow is dropped; other ops
run in issue order, as on the main stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._model._errors import MeshUsageError
from .._model._public import publish
from . import _active
from ._tensor import MeshTensor, _unary, check_use


class Stream:
    """A named stream of work on every rank (``Stream("comms")``); the main stream is
    :func:`get_active_stream` outside any ``stream.activate()``."""

    def __init__(self, name: str, *, _main: bool = False) -> None:
        self.name = name
        self._key: Stream | None = None if _main else self  # how tensors name it

    def __repr__(self) -> str:
        return f"Stream({self.name!r})"

    @contextmanager
    def activate(self) -> Iterator[Stream]:
        """Inside, ops (and the tensors they make) belong to this stream."""
        _active.push_stream(self._key)
        try:
            yield self
        finally:
            _active.pop_stream()

    def borrow(self, t: MeshTensor, mutable: bool = False) -> tuple[MeshTensor, Borrow]:
        """``t`` for use on this stream: ``(borrowed, borrow)``. With ``mutable`` this
        stream may write it and ``t``'s own stream may not touch it until
        ``borrow.drop()``; without, both may read it and neither write it."""
        if not isinstance(t, MeshTensor):
            raise MeshUsageError(f"borrow() takes a MeshTensor, got {type(t).__name__}")
        if t._mt_stream is self._key:
            raise MeshUsageError(f"this tensor belongs to {self!r} already: use it directly")
        if t._mt_dtensor:
            raise MeshUsageError("borrow() takes plain mesh tensors; call .to_local() first")
        if t._mt_access != "rw" and (mutable or t._mt_access != "r"):
            check_use(t, "borrow()", write=mutable)
        with self.activate():
            borrowed = _unary(t, "local", t._mt_meta)  # the same tensor on the ranks
        borrow = Borrow(t, borrowed, mutable)
        borrowed._mt_borrow = borrow
        return borrowed, borrow


class Borrow:
    """A tensor lent to another stream until :meth:`drop` (also ``with borrow:``)."""

    def __init__(self, origin: MeshTensor, borrowed: MeshTensor, mutable: bool) -> None:
        self.origin, self.borrowed, self.mutable = origin, borrowed, mutable
        self.dropped = False
        if mutable:
            origin._mt_access = ""
        else:
            origin._mt_access = borrowed._mt_access = "r"
            self._lends(+1)

    def _lends(self, change: int) -> int:
        count = getattr(self.origin, "_mt_lends", 0) + change
        self.origin._mt_lends = count  # type: ignore[attr-defined]
        return count

    def drop(self) -> None:
        """End the borrow: the borrowed handle becomes unusable, the tensor's own stream
        may use it again, and on the ranks that stream waits for this one's work on it."""
        if self.dropped:
            return
        self.dropped = True
        borrowed, origin = self.borrowed, self.origin
        borrowed._mt_access = ""
        if self.mutable or self._lends(-1) == 0:
            origin._mt_access = "rw"
        view = borrowed._mt_view
        view.engine.record(view.ranks, ("sync", borrowed._mt_ref))

    def __enter__(self) -> Borrow:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.drop()


_main = Stream("main", _main=True)


def get_active_stream() -> Stream:
    """The stream that ops issued now belong to (``Stream("main")`` by default)."""
    key = _active.stream
    return _main if key is None else key


publish(globals())
