"""Bookkeeping of one call in flight: which ranks owe a reply, and what to do with it.

A :class:`PendingCall` lives on the I/O thread from the moment the call is
sent until every expected rank answered or the mesh failed. It completes
exactly one :class:`CallFuture` (gathered adverbs) or a sequence of per-reply
futures (``stream()``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ._errors import (
    CallTimeout,
    RemoteError,
    RemoteFailure,
    SerializationError,
    SpawnError,
    format_ranks,
)
from ._future import Future
from ._shape import Point, Shape
from ._value_mesh import ValueMesh


class CallFuture(Future[Any]):
    """A future whose timeout error names the ranks that have not replied."""

    __slots__ = ("_call",)

    def __init__(self, call: PendingCall) -> None:
        super().__init__()
        self._call: PendingCall | None = call

    def waiting_ranks(self) -> list[int]:
        """Ranks that have not replied yet (empty once the call completed)."""
        call = self._call
        return [] if call is None or self.done() else call.waiting_ranks()

    def _timeout_error(self, timeout: float | None) -> BaseException:
        call = self._call
        if call is None:  # it completed just as the wait timed out
            return super()._timeout_error(timeout)
        waiting = call.waiting_ranks()
        replied = len(call.ranks) - len(waiting)
        return CallTimeout(
            f"{call.label} got no reply from rank(s) {format_ranks(waiting)} within "
            f"{timeout} s ({replied} of {len(call.ranks)} replied); the call is still "
            "running there: wait longer, interrupt it, or stop the mesh",
            ranks=waiting,
        )


class PendingCall:
    """The state of one call to a set of ranks (touched on the I/O thread only)."""

    def __init__(
        self,
        call_id: int,
        shape: Shape,
        *,
        actor: str,
        endpoint: str,
        collect: str = "mesh",  # "mesh": ValueMesh; "one": the single value; "stream"
        spawn: bool = False,
        error_class: type[RemoteError] | None = None,
    ) -> None:
        self.call_id = call_id
        self.shape = shape
        self.ranks = shape.ranks
        self.actor, self.endpoint = actor, endpoint
        self.collect = collect
        self.error_class = error_class or (SpawnError if spawn else RemoteError)
        self.values: dict[int, Any] = {}
        self.failures: list[RemoteFailure] = []
        self.serialization_failures: list[RemoteFailure] = []
        self.future: CallFuture = CallFuture(self)
        self.stream_futures: list[Future[tuple[Point, Any]]] = (
            [Future() for _ in self.ranks] if collect == "stream" else []
        )
        self._arrived = 0
        self.group: Any = None  # the ProcGroup it was sent to, set when sent
        self.answered: set[int] = set()
        self.on_answer: Callable[[PendingCall, int], None] | None = None
        self.on_finish: Callable[[PendingCall], None] | None = None

    @property
    def label(self) -> str:
        return f"{self.actor}.{self.endpoint}" if self.endpoint else self.actor

    def waiting_ranks(self) -> list[int]:
        """Ranks that have not replied yet."""
        return [r for r in self.ranks if r not in self.answered]

    def _answer(self, rank: int) -> None:
        self.answered.add(rank)
        if self.on_answer is not None:
            self.on_answer(self, rank)

    @property
    def finished(self) -> bool:
        return self.future.done()

    # -- replies ------------------------------------------------------------------

    def add_value(self, rank: int, value: Any) -> None:
        self.values[rank] = value
        self._answer(rank)
        self._next_stream_item(lambda f: f.set_result((self.shape.point_of_rank(rank), value)))
        self._maybe_finish()

    def add_failure(self, failure: RemoteFailure, *, serialization: bool = False) -> None:
        (self.serialization_failures if serialization else self.failures).append(failure)
        self._answer(failure.rank)
        self._next_stream_item(lambda f: f.set_exception(self._error([failure], serialization)))
        self._maybe_finish()

    def fail(self, error: Exception) -> None:
        """Complete everything still open with ``error`` (the mesh failed, or the
        call could not be sent)."""
        for item in self.stream_futures:
            item.set_exception(error)
        if self.future.set_exception(error):
            self._finished()

    def _next_stream_item(self, complete: Callable[[Future[Any]], Any]) -> None:
        if self.stream_futures:
            complete(self.stream_futures[self._arrived])
        self._arrived += 1

    def _error(self, failures: list[RemoteFailure], serialization: bool) -> Exception:
        if serialization:
            f = failures[0]
            ranks = sorted(x.rank for x in failures)
            return SerializationError(
                f"{self.label} on rank(s) {format_ranks(ranks)}: {f.message}",
                ranks=ranks,
                type_name=f.type_name,
            )
        return self.error_class(failures, actor=self.actor, endpoint=self.endpoint)

    def _maybe_finish(self) -> None:
        if self._arrived < len(self.ranks):
            return
        if self.serialization_failures:
            self.future.set_exception(self._error(self.serialization_failures, True))
        elif self.failures:
            self.future.set_exception(self._error(self.failures, False))
        elif self.collect == "one":
            self.future.set_result(self.values[self.ranks[0]])
        else:
            self.future.set_result(ValueMesh(self.shape, [self.values[r] for r in self.ranks]))
        self._finished()

    def _finished(self) -> None:
        if self.on_finish is not None:
            self.on_finish(self)
        self.on_finish = self.on_answer = None
        # The future and this call point at each other; untie them so both are
        # freed by reference counting, not left to the cyclic GC on every call.
        self.future._call = None


class ReplyStream:
    """``(point, value)`` pairs in the order replies arrive; iterate or ``async for``."""

    def __init__(self, items: list[Future[tuple[Point, Any]]]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[tuple[Point, Any]]:
        for item in self._items:
            yield item.get()

    async def _aiter(self) -> AsyncIterator[tuple[Point, Any]]:
        for item in self._items:
            yield await item

    def __aiter__(self) -> AsyncIterator[tuple[Point, Any]]:
        return self._aiter()
