"""Async endpoint calls as tasks on the actors' event loop.

An actor's ``async def`` endpoints run concurrently, as Monarch's do: each
call's body is a task on the worker's one event loop, the tasks start in the
order their messages came, and they interleave at their awaits. Everything
else (sync endpoints, spawns, cells) runs on the main thread between the
loop's steps, one message at a time, and the loop waits for it.

The worker runs each step a task takes through :func:`stepped`, which calls
its hooks before and after the step: while a step runs, its call is the
running call, as a sync call is (an interrupt targets it, a status names it,
its actor is the current one), and between steps it is only in flight.
"""

from __future__ import annotations

import linecache
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from .._runtime._context import Context

# A call as this rank knows it: (its sender, b"" for the controller; its call id
# there, 0 for a broadcast).
Ticket = tuple[bytes, int]
# No call: none runs, or one with nobody waiting for its answer.
NO_TICKET: Ticket = (b"", 0)


class TaskCall:
    """One async endpoint call in flight: its task, and what the worker knows of it."""

    __slots__ = (
        "actor_id",
        "context",
        "coro",
        "interrupted",
        "label",
        "loop",
        "since",
        "started",
        "stopping",
        "task",
        "ticket",
    )

    def __init__(
        self,
        ticket: Ticket,
        actor_id: int,
        label: str,
        context: Context,
        since: float,
        loop: Any,
    ) -> None:
        self.ticket = ticket
        self.actor_id = actor_id
        self.label = label  # "Generator.generate"
        self.context = context
        self.since = since  # time.monotonic() when its message was taken
        self.loop = loop  # the actors' event loop its task runs on
        self.task: Any = None  # its asyncio.Task, once made
        self.coro: Any = None  # the endpoint's coroutine, once its task began
        self.started = False  # its first step began: a cancel reaches its body
        self.interrupted = False  # an interrupt asked for it
        self.stopping = False  # its actor is being stopped

    def cancel(self) -> None:
        """Cancel the call's body (on the loop's thread). One not started yet is not
        cancelled: it sees ``interrupted`` or ``stopping`` as it starts and ends."""
        if self.started and self.task is not None:
            self.task.cancel()


def where_awaiting(call: TaskCall, skip: Callable[[str], bool]) -> str:
    """``file:line in function: code`` of the innermost frame of ``call``'s await
    chain whose file ``skip`` does not reject, or "" if it has none (yet)."""
    found = None
    coro = call.coro
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        if not skip(frame.f_code.co_filename):
            found = frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    if found is None:
        return ""
    code = linecache.getline(found.f_code.co_filename, found.f_lineno).strip()
    place = f"{found.f_code.co_filename}:{found.f_lineno} in {found.f_code.co_name}"
    return f"{place}: {code}" if code else place


Step = Callable[[TaskCall], Any]


@types.coroutine
def stepped(
    coro: Coroutine[Any, Any, Any], call: TaskCall, enter: Step, leave: Callable[[Any], None]
) -> Generator[Any, Any, Any]:
    """``await coro``, with ``enter(call)`` before each of its steps and
    ``leave(what enter returned)`` after it (the loop runs other tasks between)."""
    send, throw = coro.send, coro.throw
    value: Any = None
    error: BaseException | None = None
    while True:
        saved = enter(call)
        try:
            yielded = send(value) if error is None else throw(error)
        except StopIteration as stop:
            return stop.value
        finally:
            leave(saved)
        value = error = None
        try:
            value = yield yielded  # what the coroutine awaits: the task waits on it
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # a cancellation, thrown in at this await
            error = exc
