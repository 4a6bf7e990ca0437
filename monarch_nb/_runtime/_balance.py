"""A load-balanced map over ranks: each item to whichever rank is free first.

Shared by ``Endpoint.map`` (the controller's endpoints and actors' references
alike) and ``ProcMesh.map``: the caller says how one item is sent to one rank
(a future of its result); this module keeps at most ``in_flight`` items on
each rank and hands the next item to a rank as soon as one of its items
finishes, so a slow rank takes fewer items. Results come back in input
order.

Items are sent from the thread that completes the previous item's future
(the controller's I/O thread, or an actor's peer node), which may send: every
sender takes its own lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from .._model._errors import CallCancelled, MeshUsageError
from .._model._future import Future
from .._model._public import publish
from ._actors import Actor, endpoint

T = TypeVar("T")

IN_FLIGHT = 2  # items per rank at a time: one running, one queued behind it


class MapFuture(Future[list[Any]]):
    """The future of a :func:`balanced_map`: the results in input order.

    ``cancel()`` (or Ctrl-C on ``get()``) stops sending items; those already
    sent still run. The first item that fails fails the map with its error;
    the items not sent yet are not sent.
    """

    __slots__ = ("_stop", "on_progress", "progress")

    def __init__(self, total: int) -> None:
        super().__init__()
        self._stop = threading.Event()
        self.progress = [0, total]  # [done, total], updated as items finish
        # Set by a caller that shows progress: called with (done, total) as items
        # finish, on the thread that completed the item (keep it short).
        self.on_progress: Callable[[int, int], None] | None = None

    @property
    def done_count(self) -> int:
        """How many items have finished."""
        return self.progress[0]

    def cancel(self) -> bool:
        """Send no more items and complete with CallCancelled; False if the map had
        already completed."""
        self._stop.set()
        return self.set_exception(
            CallCancelled(
                f"map cancelled after {self.progress[0]} of {self.progress[1]} items; "
                "the items already sent run to their end"
            )
        )

    def get(self, timeout: float | None = None) -> list[Any]:
        try:
            return super().get(timeout)
        except KeyboardInterrupt:
            self._stop.set()  # the items in flight finish; nothing more is sent
            raise


def balanced_map(
    ranks: Sequence[int],
    items: Iterable[Any],
    send: Callable[[int, Any], Future[Any]],
    *,
    in_flight: int = IN_FLIGHT,
) -> MapFuture:
    """Send each item with ``send(rank, item)``, at most ``in_flight`` per rank.

    Returns a future of the results in input order.
    """
    if in_flight < 1:
        raise MeshUsageError(f"in_flight must be at least 1, got {in_flight!r}")
    if not ranks:
        raise MeshUsageError("map over an empty mesh: there is no rank to run the items")
    todo = list(items)
    result = MapFuture(len(todo))
    if not todo:
        result.set_result([])
        return result
    results: list[Any] = [None] * len(todo)
    lock = threading.Lock()
    cursor = [0]  # the next item to send

    def launch(rank: int) -> None:
        with lock:
            if result.done() or result._stop.is_set() or cursor[0] >= len(todo):
                return
            index = cursor[0]
            cursor[0] += 1
        start(rank, index)

    def start(rank: int, index: int) -> None:
        if result.done() or result._stop.is_set():
            return
        try:
            future = send(rank, todo[index])
        except BaseException as exc:  # a send that raises fails the map, not the sender
            result.set_exception(exc)
            return
        future.add_done_callback(lambda f: finished(rank, index, f))

    def finished(rank: int, index: int, future: Future[Any]) -> None:
        error = future.exception(timeout=0)
        if error is not None:
            result.set_exception(error)
            return
        results[index] = future.get(timeout=0)
        with lock:
            result.progress[0] += 1
            done = result.progress[0]
        report = result.on_progress
        if report is not None:
            report(done, len(todo))
        if done == len(todo):
            result.set_result(results)
        else:
            launch(rank)

    # Every rank's first items are chosen before any is sent: a rank that answers
    # while the others are still being served (its reply can be taken during the
    # next send) must not take the slots of the ranks after it.
    with lock:
        first = [(rank, index) for index, rank in enumerate(list(ranks) * in_flight)]
        first = first[: len(todo)]
        cursor[0] = len(first)
    for rank, index in first:
        start(rank, index)
    return result


class Map(Actor):
    """The actor behind ``ProcMesh.map``: applies the function that came with an item."""

    @endpoint
    def apply(self, job: tuple[Callable[[Any], Any], Any]) -> Any:
        fn, item = job
        return fn(item)


def split_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of ``parts`` contiguous chunks of ``length`` items, the first
    ``length % parts`` one item longer (as ``numpy.array_split`` splits)."""
    size, extra = divmod(length, parts)
    bounds = []
    start = 0
    for i in range(parts):
        stop = start + size + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


publish(globals())
