"""What the main thread runs: the call at the front, the calls queued behind it,
and interrupts of either.

Interrupts come on the wire thread (the controller's) or the peer node's (an
actor elsewhere that called ours) and target one call while the main thread
moves through the queue: a call still queued is answered as interrupted at
once and skipped when its turn comes; the running one is signalled (SIGINT,
raised as ``KeyboardInterrupt`` only inside user code); an ``async def``
endpoint's call waiting at an await has its task cancelled.
"""

from __future__ import annotations

import inspect
import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from .._model._errors import RemoteFailure
from .._runtime import _context
from .._wire._messages import Call, Failure, Message, Pull, Push, Renumber, RunCell, Spawn
from ._answers import Route
from ._endpoint_tasks import NO_TICKET, TaskCall, Ticket
from ._log_file import RankLog
from ._wire_thread import WireThread

# Result types no endpoint awaits (see Running.user_code).
_NEVER_AWAITABLE = frozenset({bool, int, float, complex, str, bytes, tuple, list, dict, set})
_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})

# Handles one work message (message, frames, route); False means shut down.
Handler = Callable[[Message, list[Any], Route], bool]


def _call_id_of(message: Message) -> int:
    """The call a work message answers (0 for a broadcast or a non-call)."""
    match message:
        case Call(call_id, _, _, True) | Spawn(call_id) | RunCell(call_id) | Push(call_id):
            return call_id
        case Pull(call_id) | Renumber(call_id):
            return call_id
    return 0


class _Ranked(Protocol):
    """The worker, as interrupts name it: its rank now (a resize changes it)."""

    rank: int


class Running:
    """The main thread's call now, the calls queued, and what interrupts them.

    The worker connects it once the rest is made: ``wire``, ``run_async`` (the
    actors' loop runs what user code returns to await), ``on_call`` (a
    :class:`Call`: most work) and ``on_other`` (any other work message).
    """

    def __init__(self, worker: _Ranked) -> None:
        self._worker = worker
        self.wire: WireThread
        self.run_async: Callable[[Any], Any]
        self.on_call: Callable[[Call, list[Any], Route], None]
        self.on_other: Handler
        self.log: RankLog | None = None  # the rank's log file, flushed after user code
        self._in_user_code = False
        # What the main thread runs now and since when, for heartbeats and status:
        # one tuple, so the wire thread never reads a label with another's start.
        self._work: tuple[str, float] = ("", 0.0)
        # Serving other actors while one waits (see Inbox.pump): the actors running
        # on this thread now, innermost last.
        self.active: list[int] = []
        # Which calls are queued, which runs, which to skip: interrupts target
        # one call (wire thread) while the main thread moves through the queue.
        self._lock = threading.Lock()
        self._queued: dict[Ticket, Route] = {}
        self.ticket = NO_TICKET  # the running call
        self.interrupted = NO_TICKET  # the running call, once an interrupt for it arrived
        self._skip: set[Ticket] = set()
        # The async endpoint calls in flight that have a caller waiting (a call id):
        # an interrupt of one cancels its task.
        self._task_calls: dict[Ticket, TaskCall] = {}

    def catch_interrupts(self) -> None:
        """Take SIGINT on the main thread: raised as KeyboardInterrupt in user code only."""
        signal.signal(signal.SIGINT, self._on_sigint)

    # -- what the main thread is doing (read by the wire thread) ----------------------

    def busy(self) -> tuple[str, float]:
        label, since = self._work
        return (label, time.monotonic() - since) if label else ("", 0.0)

    # -- calls queued, and interrupts of one call (wire thread, peer node) ------------

    def queued_item(self, message: Message, frames: list[Any], origin: bytes, route: Route) -> Any:
        """The work item of ``message``, its call queued (an interrupt can skip it)."""
        if message.__class__ is Call:  # most work: its id without pattern matching
            ticket = (origin, message.call_id if message.reply else 0)
        else:
            ticket = (origin, _call_id_of(message))
        if ticket[1]:
            with self._lock:
                self._queued[ticket] = route
        return (message, frames, ticket, route)

    def interrupt(self, call_id: int) -> None:
        """The controller's interrupt of ``call_id`` (0: whatever runs)."""
        self.interrupt_ticket((b"", call_id))

    def interrupt_ticket(self, ticket: Ticket) -> None:
        """Stop call ``ticket`` (call id 0: whatever runs): signal it if it runs; if it
        is still queued, answer it as interrupted now and skip it when its turn comes."""
        with self._lock:
            route = self._queued.pop(ticket, None) if ticket[1] else None
            if route is not None:
                self._skip.add(ticket)
            elif ticket[1] == 0 or ticket == self.ticket:
                self.interrupted = self.ticket
                if ticket[1] == 0:  # whatever runs: async calls waiting at an await too
                    for waiting in list(self._task_calls.values()):
                        self._interrupt_task(waiting)
                call = self._task_calls.get(ticket) if ticket[1] else None
                if call is not None:  # a step of an async call runs: should the
                    # signal land after the step, the cancel stops it at its await
                    self._interrupt_task(call)
                # Signalled under the lock: the main thread cannot finish this call
                # (handle takes the lock at its end) and start the next before the
                # signal is sent. Sent after, it could land in the next call: a
                # KeyboardInterrupt there, or EINTR in its C code (torch's TCPStore
                # connect then backs off for tens of seconds: a rendezvous after a
                # rank died stalled so).
                self.wire.interrupt_main()
                return
            else:
                call = self._task_calls.get(ticket)
                if call is not None:  # an async call, waiting at an await
                    self._interrupt_task(call)
                return  # else already answered: nothing to stop
        failure = RemoteFailure(
            self._worker.rank, "KeyboardInterrupt", "interrupted before it started on this rank", ""
        )
        route.send(Failure(ticket[1], failure, False))

    def _interrupt_task(self, call: TaskCall) -> None:
        """Cancel async call ``call`` where it awaits (any thread; its task then
        answers its caller as interrupted)."""
        call.interrupted = True
        try:
            call.loop.call_soon_threadsafe(call.cancel)
        except RuntimeError:
            pass  # the loop closed: the worker is exiting

    def task_started(self, call: TaskCall) -> None:
        """Async call ``call`` (its caller waits) is in flight: an interrupt cancels it."""
        with self._lock:
            self._task_calls[call.ticket] = call
            # Interrupted while its arguments were unpickled: it ends as it starts.
            call.interrupted = self.interrupted == call.ticket

    def task_ended(self, ticket: Ticket) -> None:
        with self._lock:
            self._task_calls.pop(ticket, None)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # An interrupt is meant for user code. Raised anywhere else (between
        # calls, or while a reply is being sent) it would lose a reply.
        if self._in_user_code:
            raise KeyboardInterrupt

    # -- running one message ----------------------------------------------------------

    def handle(self, message: Message, frames: list[Any], ticket: Ticket, route: Route) -> bool:
        """Handle one work message; False means shut down."""
        if ticket[1]:  # a call reaches the front, unless an interrupt skipped it
            with self._lock:
                self._queued.pop(ticket, None)
                if ticket in self._skip:
                    self._skip.discard(ticket)
                    return True  # interrupted while queued: already answered
                self.ticket = ticket
                self.interrupted = NO_TICKET
        try:
            if message.__class__ is Call:  # most work: no pattern matching to run
                self.on_call(message, frames, route)
                return True
            return self.on_other(message, frames, route)
        finally:
            with self._lock:
                self.ticket = self.interrupted = NO_TICKET
            if self.wire.status_held:  # work that never reached user code
                self.wire.release_status()

    def handle_nested(
        self, message: Message, frames: list[Any], ticket: Ticket, route: Route
    ) -> None:
        """Handle a message while the main thread waits inside another's user code,
        then go back to that one (its call, label and interrupts)."""
        saved = (self.ticket, self.interrupted, self._work, self._in_user_code)
        try:
            self.handle(message, frames, ticket, route)
        finally:
            self.ticket, self.interrupted, self._work, self._in_user_code = saved

    def nestable(self, message: Message) -> bool:
        """Whether ``message`` may run while the main thread waits: a call to an
        actor not waiting now, or a spawn; the rest waits until it is free."""
        match message:
            case Call(_, actor_id):
                return actor_id not in self.active
            case Spawn():
                return True
        return False

    def user_code(
        self,
        label: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] = _NO_KWARGS,
        *,
        awaits: bool = True,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` with interrupts enabled (main thread),
        labelled for status; an awaitable it returns (an ``async def`` endpoint)
        runs to its end on the actors' loop, unless ``awaits`` is False."""
        self._work = (label, time.monotonic())
        self._in_user_code = True
        wire = self.wire
        if wire.status_held:  # a status asked meanwhile describes this
            wire.release_status()
        try:
            if self.interrupted[1] and self.interrupted == self.ticket:
                raise KeyboardInterrupt  # it came while the arguments were unpickled
            result = fn(*args, **kwargs)
            # The common results skip isawaitable: its check against the Awaitable ABC
            # runs two interpreted frames, on every call that returns a value.
            if (
                awaits
                and result is not None
                and result.__class__ not in _NEVER_AWAITABLE
                and inspect.isawaitable(result)
            ):
                result = self.run_async(result)
            return result
        finally:
            self._in_user_code = False
            self._work = ("", 0.0)
            log = self.log
            if log is not None and log.dirty:  # before the reply: a kill after it loses no line
                log.flush()

    # -- the steps of async endpoint calls --------------------------------------------

    def enter_step(self, call: TaskCall) -> Any:
        """A step of async call ``call`` begins: it is the running call until
        :meth:`leave_step` (what this returns is what that restores)."""
        saved = (
            self.ticket,
            self.interrupted,
            self._work,
            self._in_user_code,
            _context.set_current(call.context),
        )
        self.active.append(call.actor_id)
        with self._lock:
            self.ticket, self.interrupted = call.ticket, NO_TICKET
        self._work = (call.label, call.since)
        self._in_user_code = True
        if self.wire.status_held:  # a status asked meanwhile describes this
            self.wire.release_status()
        return saved

    def leave_step(self, saved: Any) -> None:
        # Out of user code first: an interrupt signal that lands from here on is
        # dropped, not raised in the worker's code (the call's cancel stands in).
        self._in_user_code = False
        running, interrupted, work, in_user_code, context = saved
        with self._lock:
            self.ticket, self.interrupted = running, interrupted
        self.active.pop()
        self._work = work
        self._in_user_code = in_user_code
        _context.set_current(context)
        log = self.log
        if log is not None and log.dirty:
            log.flush()
