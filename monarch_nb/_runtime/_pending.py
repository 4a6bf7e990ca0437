"""Calls in flight: which ranks owe a reply, what to do with it, and the future of it.

Shared by every caller: the controller (its calls go out through
``_controller._calls.send_call``) and any actor calling another actor (its
calls go out through its process's peer node, :mod:`._peer`).

Who touches a :class:`PendingCall`, and from which thread:

- the caller's thread makes it and sends it, registering it with its
  *tracker* (the controller, or a peer node) in the same step as the check
  that the target is healthy;
- the receiving thread adds replies (``add_value`` / ``add_failure``): the
  reply state (``values``, ``failures``, the arrival count) is its alone;
- any thread may end it early: ``fail`` (the target failed or stopped, the call
  could not be sent) or ``cancel`` (the caller gave up).

Completion happens exactly once: whoever completes the future first (the
futures' state lock decides) runs the finish bookkeeping; every later attempt
is a no-op.
Per-rank bookkeeping (``answered``, the tracker's load counters) changes
under the tracker's lock only, so a reply racing a failure can neither be
counted twice nor lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Generator, Iterator, Sequence
from typing import Any, Protocol

from .._model import _checks
from .._model._errors import (
    CallCancelled,
    CallTimeout,
    RemoteError,
    RemoteFailure,
    SerializationError,
    format_ranks,
)
from .._model._future import Future, before_wait, pumps_here
from .._model._public import publish
from .._model._shape import Point, Shape
from .._model._value_mesh import ValueMesh


class CallTracker(Protocol):
    """Who sent a call and keeps count of the ranks it still waits for."""

    def rank_answered(self, call: PendingCall, rank: int) -> None: ...

    def call_finished(self, call: PendingCall, error: BaseException | None) -> None: ...

    def last_answered(self, call: PendingCall, rank: int) -> None:
        """``rank_answered`` then ``call_finished(call, None)``: the reply that
        completes a call with no failure (most calls), in one step."""
        ...


# How a caller gives up on a call: interrupt the ranks still running it, kill
# them after ``grace`` s if they do not stop, and return or raise like get().
Stopper = Callable[["CallFuture", str, float], Any]


# Serves the waiting thread until the call completes or the deadline passes:
# the debugger's prompt must run on the thread that can read input (a kernel's
# main thread), which is the one blocked here. Set by monarch_nb.debug.install().
_wait_hook: Callable[[CallFuture, float | None], None] | None = None
# Guards each call's "settled" flag: one lock for all calls (held for a flag's
# test-and-set), not one more lock object per call.
_settle_lock = threading.Lock()
_NONE_ANSWERED: frozenset[int] = frozenset()


def set_wait_hook(hook: Callable[[CallFuture, float | None], None] | None) -> None:
    """Install ``hook(future, deadline)`` for every blocking ``CallFuture.get``."""
    global _wait_hook
    _wait_hook = hook


class CallFuture(Future[Any]):
    """The future of a call: its timeout names the silent ranks, and Ctrl-C reaches them.

    ``get()`` interrupted by KeyboardInterrupt (Ctrl-C in a script, the
    kernel's interrupt in a notebook) forwards the interrupt to the ranks
    still running the call, waits a grace period, then kills any rank stuck
    outside Python (the caller's *stopper*: for the controller,
    ``_controller._interrupt.stop_call``).
    """

    # The call's state lives on the future itself (a PendingCall is one): a
    # pipelining caller keeps thousands of calls in flight, and each tracked
    # object among them is one more for the garbage collector to scan and
    # promote (its full collections scan every object in the process).
    __slots__ = ()

    @property
    def _call(self) -> PendingCall | None:
        """The call's bookkeeping while it runs; None once it completed."""
        return None if self._done else self  # type: ignore[return-value]

    @property
    def label(self) -> str:
        raise NotImplementedError

    def _repr_name(self) -> str:
        return f"CallFuture {self.label}"  # what the caller holds: a future of that call

    def waiting_ranks(self) -> list[int]:
        """Ranks that have not replied yet (empty once the call completed)."""
        call = self._call
        return [] if call is None else call.unanswered_ranks()

    def cancel(self) -> bool:
        """Stop waiting: complete with CallCancelled; late replies are ignored.

        The ranks are not interrupted (use ``interrupt()`` for that). Returns
        False if the call had already completed.
        """
        call = self._call
        if call is None or self.done():
            return False
        return call.fail(
            CallCancelled(f"{call.label} was cancelled", ranks=call.unanswered_ranks())
        )

    def interrupt(self, grace: float | None = None) -> None:
        """KeyboardInterrupt in the ranks still running this call, escalating to a kill
        after ``grace`` s; raises like ``get()`` after Ctrl-C."""
        call = self._call
        if call is None or call.stopper is None or self.done():
            return
        call.stopper(self, "interrupted", call.grace if grace is None else grace)

    def get(self, timeout: float | None = None) -> Any:
        if timeout is not None:  # before any wait: a bad one must not lose the reply
            timeout = _checks.timeout(timeout, "get")
        before_wait()  # (again in _wait: cheap) before this thread receives
        try:
            call = self._call
            wait = timeout
            if not self._done and call is not None:
                deadline = None if timeout is None else time.monotonic() + timeout
                hook = _wait_hook
                if hook is not None:
                    hook(self, deadline)  # returns when done, or at the deadline
                # The controller lets a waiting caller receive its replies itself
                # (not a worker's main thread: its waits serve other actors).
                receive = getattr(call.tracker, "receive_until_done", None)
                if receive is not None and not self._done and not pumps_here():
                    receive(self, deadline)
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            return self._get(wait, timeout)  # a timeout names the one asked for
        except KeyboardInterrupt:
            call = self._call
            if self.done() or call is None or call.stopper is None:
                raise
        return call.stopper(self, "interrupted", call.grace)

    def _timeout_error(self, timeout: float | None) -> BaseException:
        call = self._call
        if call is None:  # it completed just as the wait timed out
            return super()._timeout_error(timeout)
        waiting = call.unanswered_ranks()
        replied = len(call.ranks) - len(waiting)
        # Which of them the controller has not heard from at all lately: in a
        # collective, the others are most likely waiting for those.
        silent_ranks = getattr(call.group, "silent_ranks", None)
        silent = silent_ranks(waiting) if silent_ranks is not None else {}
        why = ""
        if silent:
            quiet = ", ".join(f"rank {r} for {age:.0f} s" for r, age in sorted(silent.items()))
            busy = [r for r in waiting if r not in silent]
            why = (
                f"; no heartbeat from {quiet} (the process is stopped, e.g. SIGSTOP or a "
                "debugger, or holds the GIL in C code)"
            )
            if busy:
                why += (
                    f"; rank(s) {format_ranks(busy)} are alive, most likely waiting for "
                    "the silent one(s) in a collective"
                )
        return CallTimeout(
            f"{call.label} got no reply from rank(s) {format_ranks(waiting)} within "
            f"{timeout} s ({replied} of {len(call.ranks)} replied){why}; the call is still "
            "running there: wait longer, interrupt it, or stop the mesh",
            ranks=waiting,
            silent=sorted(silent),
        )


class PendingCall(CallFuture):
    """The state of one call to a set of ranks (see the module docstring for threads),
    and the caller's future of it (:attr:`future` is the same object)."""

    __slots__ = (
        "_arrived",
        "_settled",
        "actor",
        "answered",
        "call_id",
        "closed",
        "collect",
        "endpoint",
        "error_class",
        "failures",
        "grace",
        "group",
        "on_failure",
        "ranks",
        "serialization_failures",
        "shape",
        "stopper",
        "stream_futures",
        "tracker",
        "values",
    )

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
        super().__init__()
        self.call_id = call_id
        self.shape = shape
        self.ranks = shape.ranks
        self.actor, self.endpoint = actor, endpoint
        self.collect = collect
        self.error_class = error_class
        self.values: dict[int, Any] = {}
        # Lists once something arrives; () until then: a pipelined caller keeps
        # thousands of calls in flight, and each container is one more object
        # for the garbage collector to scan.
        self.failures: Sequence[RemoteFailure] = ()
        self.serialization_failures: Sequence[RemoteFailure] = ()
        self.stream_futures: Sequence[Future[tuple[Point, Any]]] = (
            [Future._new() for _ in self.ranks] if collect == "stream" else ()
        )
        self._arrived = 0
        self.group: Any = None  # the controller's ProcGroup, set when sent
        self.tracker: CallTracker | None = None  # set when sent
        self.stopper: Stopper | None = None  # how Ctrl-C reaches the ranks
        self.grace = 3.0  # seconds the stopper waits before it kills
        # The ranks that replied: one shared empty set until one does (a set a
        # call in flight is one more object for the collector to scan).
        self.answered: Collection[int] = _NONE_ANSWERED
        self.closed = False  # finish bookkeeping done (under the tracker's lock)
        self._settled = False  # its outcome is decided (under _settle_lock)
        # Called with each rank's failure as it arrives, on the receiving thread,
        # before the call completes (``--fail-fast`` interrupts the other ranks).
        self.on_failure: Callable[[RemoteFailure], None] | None = None

    @property
    def future(self) -> CallFuture:
        """What the caller waits on: this same object, seen as a future."""
        return self

    @property
    def label(self) -> str:
        return f"{self.actor}.{self.endpoint}" if self.endpoint else self.actor

    def mark_answered(self, rank: int) -> None:
        """``rank`` replied (under the tracker's lock, where it has one)."""
        answered = self.answered
        if isinstance(answered, set):
            answered.add(rank)
        else:
            self.answered = {rank}

    def all_answered(self) -> None:
        """The last rank replied (under the tracker's lock, where it has one): every
        rank has, so the ranks themselves are the answered set (no set to build
        for a call that just completed, which a caller may keep for long)."""
        self.answered = self.ranks

    def unanswered_ranks(self) -> list[int]:
        """Ranks that have not replied yet (also once the call completed early:
        whose share of it has nobody waiting any more)."""
        answered = self.answered
        return [r for r in self.ranks if r not in answered]

    # -- replies (I/O thread) --------------------------------------------------------

    def add_value(self, rank: int, value: Any) -> None:
        self.values[rank] = value
        if self.stream_futures:
            self._answer(rank)
            self._next_stream_item(lambda f: f.set_result((self.shape.point_of_rank(rank), value)))
            self._maybe_finish()
            return
        # Every reply of a gather comes here: no closure to build.
        self._arrived += 1
        if self._arrived < len(self.ranks):  # more to come: only this rank's answer is news
            self._answer(rank)
            return
        if self.failures or self.serialization_failures or self.tracker is None:
            self._answer(rank)
            self._maybe_finish()
            return
        # The reply that completes a call that had no failure (most calls): the
        # rank's answer and the call's end are one step of the tracker's.
        # (_collected, inlined: this is the path of every call that succeeds; a
        # ReducedCall never comes here)
        if self.collect == "one":
            result = value
        else:
            result = ValueMesh(self.shape, [self.values[r] for r in self.ranks])
        with _settle_lock:
            settled, self._settled = self._settled, True
        if settled:  # failed or cancelled first: only the answer is news
            self.tracker.rank_answered(self, rank)
            return
        try:
            self.tracker.last_answered(self, rank)
        finally:  # as _settle: whatever the bookkeeping did, the caller is not left waiting
            self.set_result(result)

    def add_failure(self, failure: RemoteFailure, *, serialization: bool = False) -> None:
        failures = self.serialization_failures if serialization else self.failures
        if isinstance(failures, list):
            failures.append(failure)
        elif serialization:
            self.serialization_failures = [failure]
        else:
            self.failures = [failure]
        self._answer(failure.rank)
        if self.on_failure is not None:
            self.on_failure(failure)
        self._next_stream_item(lambda f: f.set_exception(self._error([failure], serialization)))
        self._maybe_finish()

    def _answer(self, rank: int) -> None:
        if self.tracker is not None:
            self.tracker.rank_answered(self, rank)
        else:
            self.mark_answered(rank)

    def _next_stream_item(self, complete: Callable[[Future[Any]], Any]) -> None:
        if self.stream_futures:
            complete(self.stream_futures[self._arrived])
        self._arrived += 1

    def _maybe_finish(self) -> None:
        if self._arrived < len(self.ranks):
            return
        if self.serialization_failures:
            self._settle(None, self._error(self.serialization_failures, True))
        elif self.failures:
            self._settle(None, self._error(self.failures, False))
        else:
            self._settle(self._collected(), None)

    def _collected(self) -> Any:
        """What a call whose every rank replied without failure answers (a
        subclass that collects otherwise says what it has instead)."""
        if self.collect == "one":
            return self.values[self.ranks[0]]
        return ValueMesh(self.shape, [self.values[r] for r in self.ranks])

    # -- ending early (any thread) ---------------------------------------------------

    def fail(self, error: BaseException) -> bool:
        """Complete everything still open with ``error``; False if already complete."""
        for item in self.stream_futures:
            item.set_exception(error)
        return self._settle(None, error)

    def error_so_far(self) -> Exception:
        """The error of the failures that arrived so far, with the values so far (for a
        call ended before every rank answered)."""
        return self._error(list(self.failures), False)

    def _error(self, failures: Sequence[RemoteFailure], serialization: bool) -> Exception:
        if serialization:
            f = failures[0]
            ranks = sorted(x.rank for x in failures)
            return SerializationError(
                f"{self.label} on rank(s) {format_ranks(ranks)}: {f.message}",
                ranks=ranks,
                type_name=f.type_name,
            )
        succeeded = [r for r in self.ranks if r in self.values]
        values = None
        if succeeded:
            shape = Shape(("ranks",), (len(succeeded),), succeeded)
            values = ValueMesh(shape, [self.values[r] for r in succeeded])
        return self.error_class(failures, actor=self.actor, endpoint=self.endpoint, values=values)

    def _settle(self, value: Any, error: BaseException | None) -> bool:
        """Complete the call once; False if it already was. The bookkeeping
        (timeline, load, events) comes first, so a caller woken by the future
        finds the call ended everywhere (a rank that died shows "died")."""
        with _settle_lock:
            if self._settled:
                return False
            self._settled = True
        try:
            if self.tracker is not None:
                self.tracker.call_finished(self, error)
        finally:  # whatever the bookkeeping did, the caller is not left waiting
            if error is None:
                self.set_result(value)
            else:
                self.set_exception(error)
        return True


class StreamItem(tuple):
    """One reply of a stream: a ``(point, value)`` pair, which is also Monarch's
    "future of the value" (``item.get()``, ``item.result()``, ``await item``),
    so a loop written for either API reads it."""

    __slots__ = ()

    def get(self, timeout: float | None = None) -> Any:
        return self[1]

    result = get

    def __await__(self) -> Generator[Any, None, Any]:
        return self[1]
        yield  # a generator that finishes at once: nothing to wait for


class ArrivingItem:
    """One reply of a stream iterated inside a coroutine, not arrived yet: a future
    of its value (``await item``, ``item.get()``), or its ``(point, value)`` pair
    when unpacked (which waits for it)."""

    __slots__ = ("_future",)

    def __init__(self, future: Future[tuple[Point, Any]]) -> None:
        self._future = future

    def get(self, timeout: float | None = None) -> Any:
        return self._future.get(timeout)[1]

    result = get

    def __await__(self) -> Generator[Any, None, Any]:
        pair = yield from self._future.__await__()
        return pair[1]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._future.get())

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> Any:
        return self._future.get()[index]


def _loop_runs_here() -> bool:
    """Whether an asyncio loop runs on this thread (the caller is inside a coroutine)."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class ReplyStream:
    """Replies in the order they arrive: iterate (or ``async for``) to get
    ``(point, value)`` pairs; each is also a future of its value, as Monarch's
    ``stream()`` yields (``for f in ep.stream(): f.get()``)."""

    def __init__(self, items: Sequence[Future[tuple[Point, Any]]]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[StreamItem | ArrivingItem]:
        for item in self._items:
            if _loop_runs_here():
                # Iterated inside a coroutine (an async endpoint): as Monarch's, each
                # item is a future to await, not a reply waited for here, which
                # would hold the loop that runs the very endpoint answering it.
                yield ArrivingItem(item)
            else:
                yield StreamItem(item.get())

    async def _aiter(self) -> AsyncIterator[StreamItem]:
        for item in self._items:
            yield StreamItem(await item)

    def __aiter__(self) -> AsyncIterator[StreamItem]:
        return self._aiter()


publish(globals())
