"""Calls in flight: which ranks owe a reply, what to do with it, and the one way to send.

Who touches a :class:`PendingCall`, and from which thread:

- the caller's thread makes it and sends it (:func:`send_call`), registering it
  with the controller under the controller's lock, in the same step as the
  check that the mesh is healthy;
- the I/O thread adds replies (``add_value`` / ``add_failure``): the reply
  state (``values``, ``failures``, the arrival count) is the I/O thread's alone;
- any thread may end it early: ``fail`` (the mesh failed or stopped, the call
  could not be sent) or ``cancel`` (the caller gave up).

Completion happens exactly once: whoever completes the future first (its own
lock decides) runs the finish bookkeeping; every later attempt is a no-op.
Per-rank bookkeeping (``answered``, the controller's load counters) changes
under the controller's lock only, so a reply racing a failure can neither be
counted twice nor lost.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from .._common._errors import (
    CallCancelled,
    CallTimeout,
    RemoteError,
    RemoteFailure,
    SerializationError,
    format_ranks,
)
from .._common._future import Future
from .._common._messages import Message
from .._common._public import publish
from .._common._shape import Point, Shape
from .._common._value_mesh import ValueMesh

if TYPE_CHECKING:
    from ._client import Controller
    from ._process_group import ProcGroup


# Serves the waiting thread until the call completes or the deadline passes:
# the debugger's prompt must run on the thread that can read input (a kernel's
# main thread), which is the one blocked here. Set by monarch_nb.debug.install().
_wait_hook: Callable[[CallFuture, float | None], None] | None = None


def set_wait_hook(hook: Callable[[CallFuture, float | None], None] | None) -> None:
    """Install ``hook(future, deadline)`` for every blocking ``CallFuture.get``."""
    global _wait_hook
    _wait_hook = hook


class CallFuture(Future[Any]):
    """The future of a call: its timeout names the silent ranks, and Ctrl-C reaches them.

    ``get()`` interrupted by KeyboardInterrupt (Ctrl-C in a script, the
    kernel's interrupt in a notebook) forwards the interrupt to the ranks
    still running the call, waits a grace period, then kills any rank stuck
    outside Python; see :func:`._interrupt.stop_call`.
    """

    __slots__ = ("_call",)

    def __init__(self, call: PendingCall) -> None:
        super().__init__()
        self._call: PendingCall | None = call

    @property
    def label(self) -> str:
        call = self._call
        return call.label if call is not None else "call"

    def waiting_ranks(self) -> list[int]:
        """Ranks that have not replied yet (empty once the call completed)."""
        call = self._call
        return [] if call is None or self.done() else call.waiting_ranks()

    def cancel(self) -> bool:
        """Stop waiting: complete with CallCancelled; late replies are ignored.

        The ranks are not interrupted (use ``interrupt()`` for that). Returns
        False if the call had already completed.
        """
        call = self._call
        if call is None or self.done():
            return False
        return call.fail(CallCancelled(f"{call.label} was cancelled", ranks=call.waiting_ranks()))

    def interrupt(self, grace: float | None = None) -> None:
        """KeyboardInterrupt in the ranks still running this call, escalating to a kill
        after ``grace`` s; raises like ``get()`` after Ctrl-C."""
        from ._interrupt import GRACE_S, stop_call

        stop_call(self, why="interrupted", grace=GRACE_S if grace is None else grace)

    def get(self, timeout: float | None = None) -> Any:
        try:
            hook = _wait_hook
            if hook is not None and not self._done and self._call is not None:
                deadline = None if timeout is None else time.monotonic() + timeout
                hook(self, deadline)  # returns when done, or at the deadline
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            return super().get(timeout)
        except KeyboardInterrupt:
            if self.done() or self._call is None or self._call.group is None:
                raise
        from ._interrupt import GRACE_S, stop_call

        return stop_call(self, why="interrupted", grace=GRACE_S)

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
    """The state of one call to a set of ranks (see the module docstring for threads)."""

    def __init__(
        self,
        call_id: int,
        shape: Shape,
        *,
        actor: str,
        endpoint: str = "",
        collect: str = "mesh",  # "mesh": ValueMesh; "one": the single value; "stream"
        error_class: type[RemoteError] = RemoteError,
    ) -> None:
        self.call_id = call_id
        self.shape = shape
        self.ranks = shape.ranks
        self.actor, self.endpoint = actor, endpoint
        self.collect = collect
        self.error_class = error_class
        self.values: dict[int, Any] = {}
        self.failures: list[RemoteFailure] = []
        self.serialization_failures: list[RemoteFailure] = []
        self.future: CallFuture = CallFuture(self)
        self.stream_futures: list[Future[tuple[Point, Any]]] = (
            [Future() for _ in self.ranks] if collect == "stream" else []
        )
        self._arrived = 0
        self.group: ProcGroup | None = None  # set when sent
        self.controller: Controller | None = None  # set when sent
        self.answered: set[int] = set()
        self.closed = False  # finish bookkeeping done (under the controller's lock)

    @property
    def label(self) -> str:
        return f"{self.actor}.{self.endpoint}" if self.endpoint else self.actor

    def waiting_ranks(self) -> list[int]:
        """Ranks that have not replied yet."""
        answered = self.answered
        return [r for r in self.ranks if r not in answered]

    # -- replies (I/O thread) --------------------------------------------------------

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

    def _answer(self, rank: int) -> None:
        if self.controller is not None:
            self.controller.rank_answered(self, rank)
        else:
            self.answered.add(rank)

    def _next_stream_item(self, complete: Callable[[Future[Any]], Any]) -> None:
        if self.stream_futures:
            complete(self.stream_futures[self._arrived])
        self._arrived += 1

    def _maybe_finish(self) -> None:
        if self._arrived < len(self.ranks):
            return
        if self.serialization_failures:
            won = self.future.set_exception(self._error(self.serialization_failures, True))
        elif self.failures:
            won = self.future.set_exception(self._error(self.failures, False))
        elif self.collect == "one":
            won = self.future.set_result(self.values[self.ranks[0]])
        else:
            won = self.future.set_result(
                ValueMesh(self.shape, [self.values[r] for r in self.ranks])
            )
        if won:
            self._finished()

    # -- ending early (any thread) ---------------------------------------------------

    def fail(self, error: BaseException) -> bool:
        """Complete everything still open with ``error``; False if already complete."""
        for item in self.stream_futures:
            item.set_exception(error)
        if self.future.set_exception(error):
            self._finished()
            return True
        return False

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

    def _finished(self) -> None:
        if self.controller is not None:
            self.controller.call_finished(self)
        # The future and this call point at each other; untie them so both are
        # freed by reference counting, not left to the cyclic GC on every call.
        self.future._call = None


def send_call(
    group: ProcGroup,
    shape: Shape,
    message_for: Callable[[int], Message],
    payload: Any,
    *,
    actor: str,
    endpoint: str = "",
    collect: str = "mesh",
    error_class: type[RemoteError] = RemoteError,
    check: Callable[[], BaseException | None] | None = None,
    encode_error: Callable[[Exception], BaseException] | None = None,
) -> PendingCall:
    """Send one call to ``shape``'s ranks of ``group``: the only way calls go out.

    ``message_for(call_id)`` builds the message; ``check()`` may refuse the
    call first (an actor mesh that is stale or failed); ``encode_error(exc)``
    turns a pickling error into the error to raise. Never raises: a call
    that cannot be sent comes back already failed.
    """
    call = PendingCall(
        group.controller.next_call_id(),
        shape,
        actor=actor,
        endpoint=endpoint,
        collect=collect,
        error_class=error_class,
    )
    refused = check() if check is not None else None
    if refused is not None:
        call.fail(refused)
        return call
    try:
        encoded = group.signer.encode(message_for(call.call_id), payload)
    except Exception as exc:
        call.fail(
            encode_error(exc)
            if encode_error is not None
            else SerializationError(f"{call.label}: cannot pickle the payload: {exc}")
        )
        return call
    group.controller.send(group, shape.ranks, encoded, call)
    return call


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


publish(globals())
