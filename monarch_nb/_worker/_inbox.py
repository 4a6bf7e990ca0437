"""The main thread's work: its queue, how it waits for the next piece, and the
actors' event loop that runs between pieces.

Work comes from the wire thread (the controller's messages), the peer node
(actors elsewhere calling ours) and other threads (:meth:`Inbox.post`). The
idle main thread waits on the socket itself and drains it; while tasks of the
actors' event loop are pending (``async def`` endpoint calls) it waits in that
loop instead. While user code waits on a future (a call to another actor of
this process), :meth:`Inbox.pump` serves the calls that arrive for other actors
meanwhile, holding the rest back, in order, until the main thread is free.
"""

from __future__ import annotations

import os
import queue
import select
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from .._runtime._peer import PeerRoute
from .._wire._messages import Message
from .._wire._signed import WireStats
from ._answers import ControllerRoute, Route
from ._endpoint_tasks import Ticket
from ._wire_thread import WireThread

# Messages the idle main thread receives at most before it runs the first.
_IDLE_DRAIN_BATCH = 64
# How long the idle main thread waits on the socket before it looks again anyway
# (a safety net: every message should wake it; the variable is for tests).
_IDLE_RECHECK_MS = int(os.environ.get("MONARCH_NB_IDLE_RECHECK_MS", "1000"))

# Put in the inbox to wake a waiting main thread (a future it waits on completed).
_WAKE = object()


def _resolve(waker: Any) -> None:
    if not waker.done():
        waker.set_result(None)


class Inbox:
    """The main thread's queue of work, and its waits for work (made on the main thread).

    ``queued_item`` makes a message's work item (its call queued, for interrupts);
    ``nestable`` says whether a message may run while the main thread waits inside
    another's user code, and ``handle_nested`` runs it there.
    """

    def __init__(
        self,
        stats: WireStats,
        queued_item: Callable[[Message, list[Any], bytes, Route], Any],
        nestable: Callable[[Message], bool],
        handle_nested: Callable[[Message, list[Any], Ticket, Route], None],
    ) -> None:
        self._stats = stats
        self._queued_item = queued_item
        self._nestable = nestable
        self._handle_nested = handle_nested
        # Set by the worker once made (it takes this inbox's deliver).
        self.wire: WireThread
        self.controller_route: ControllerRoute
        # (message, frames, its ticket, where replies go) from the wire thread or
        # the peer node, or a posted task.
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Written when work is put while the idle main thread waits on the socket
        # (see _receive_until_work); read by that wait.
        self._inbox_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # The work the idle main thread's own drain took (see _hold_or_deliver).
        self._held: Any = None
        self._hold_here = self._hold_or_deliver  # bound once: its drain passes it
        self._main_ident = threading.get_ident()  # made on the main thread
        self._waiting_on_socket = False
        self._idle_poller: Any = None  # select.poll of the socket and _inbox_fd
        self._loop: Any = None  # an asyncio loop, made for the first async endpoint
        self._fresh_tasks = False  # endpoint calls were made tasks since the loop last ran
        self._waker: Any = None  # an asyncio future the idle loop waits on for work
        # Work held back while the main thread waits inside user code, in order.
        self._deferred: deque[Any] = deque()

    # -- work arrives (any thread) ------------------------------------------------------

    def deliver(self, message: Message, frames: list[Any]) -> None:
        """(wire thread) Work from the controller."""
        self._enqueue(message, frames, b"", self.controller_route)

    def deliver_from_peer(self, message: Message, frames: list[Any], route: PeerRoute) -> None:
        """(peer node) Work from an actor elsewhere."""
        self._enqueue(message, frames, route.sender, route)

    def _enqueue(self, message: Message, frames: list[Any], origin: bytes, route: Route) -> None:
        self._inbox.put(self._queued_item(message, frames, origin, route))
        self._wake()

    def _hold_or_deliver(self, message: Message, frames: list[Any]) -> None:
        """How the idle main thread's drain hands work on: the first piece, where
        nothing waits in the inbox before it, it keeps for itself (_held, taken
        by _receive_until_work), not through the inbox and back; the rest as
        :meth:`deliver`. The drain lock keeps the wire thread from delivering
        meanwhile, so nothing of the controller's can come before it."""
        if self._held is None and self._inbox.empty():
            self._held = self._queued_item(message, frames, b"", self.controller_route)
        else:
            self.deliver(message, frames)

    def post(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the main thread between messages (any thread may call)."""
        self._inbox.put(task)
        self._wake()

    def _wake(self) -> None:
        """New work in the inbox: wake whichever wait the main thread is in."""
        if self._waker is not None:  # it waits in the actors' event loop
            self._wake_loop()
        if self._waiting_on_socket and threading.get_ident() != self._main_ident:
            self.poke_main()

    def poke_main(self) -> None:
        os.eventfd_write(self._inbox_fd, 1)

    def _wake_loop(self) -> None:
        waker = self._waker
        if waker is not None:
            try:
                waker.get_loop().call_soon_threadsafe(_resolve, waker)
            except RuntimeError:
                pass  # the loop closed: the main thread is not waiting in it

    # -- the main thread takes work -----------------------------------------------------

    def serve(self, handle: Callable[..., bool]) -> None:
        """Run work as it comes, each item with ``handle`` (a posted task itself),
        until ``handle`` says to shut down."""
        while True:
            if self._loop is None and not self._deferred:  # (what _next_item does first)
                item = self._receive_until_work()
            else:
                item = self._next_item()
            if item is _WAKE:
                continue
            if callable(item):
                item()
            elif not handle(*item):
                return

    def _next_item(self) -> Any:
        """The next work item; while tasks of the actors' event loop are pending
        (async endpoint calls, tasks they created), they run meanwhile. Tasks
        made by the last message take their first step before the next is taken
        (the loop runs its ready tasks in the order they were made)."""
        loop = self._loop
        if loop is not None:
            import asyncio  # only once an async endpoint made the loop: workers start lean

            if self._fresh_tasks:  # their first steps, and no more: most short calls
                # end there, and the idle thread can then wait on the socket itself
                self._fresh_tasks = False
                loop.call_soon(loop.stop)
                loop.run_forever()
            if asyncio.all_tasks(loop):
                self.wire.watch()
                return loop.run_until_complete(self._next_item_async())
        while self._deferred:
            item = self._deferred.popleft()
            if item is not _WAKE:
                return item
        return self._receive_until_work()

    def _receive_until_work(self) -> Any:
        """The idle main thread waits on the socket itself and drains it, so a call
        reaches the code that runs it without a hand-off between threads (on a
        busy host each costs about as much as the work of a small call). Work
        from elsewhere (the peer node, posted tasks) wakes it through _inbox_fd."""
        inbox, wire = self._inbox, self.wire
        if not inbox.empty():  # this thread is the only one that takes from it
            return inbox.get_nowait()
        poller = self._idle_poller
        if poller is None:
            poller = self._idle_poller = select.poll()
            poller.register(wire.socket_fd, select.POLLIN)
            poller.register(self._inbox_fd, select.POLLIN)
        try:
            # Before the first poll, a drain only where the poll could miss input.
            look = wire.main_begins_receiving()
            timed_out = False
            while True:
                self._waiting_on_socket = True
                # What came while nobody watched first (a zmq socket's fd is
                # edge-triggered), then what the poll announced. A batch at most:
                # the first piece of work waits for no more than that. Not behind
                # the wire thread's drain: its deliveries wake us.
                more: bool | None = False
                if look:
                    try:
                        more = wire.drain(
                            at_most=_IDLE_DRAIN_BATCH, wait=False, deliver=self._hold_here
                        )
                    except Exception:  # a bug here must not stop the rank: say it, go on
                        traceback.print_exc()
                        # What the batch took after the one that raised waits in
                        # the rank, where no poll announces it: go on with it now.
                        # (Not a busy loop: each raise consumed its own message.)
                        more = wire.holds_taken()
                    held = self._held
                    if held is not None:  # first in line: nothing waited in the inbox
                        self._held = None
                        if timed_out:
                            self._missed_wakeup()
                        return held
                look = True
                if timed_out and (more or not inbox.empty()):
                    self._missed_wakeup()
                if not inbox.empty():
                    return inbox.get_nowait()
                if more:  # a batch of control messages only: the rest gives no notice
                    continue
                if wire.status_held:  # idle: a status asked meanwhile says so
                    wire.release_status()
                # With a deadline all the same: were a notice ever missed, the
                # rank would answer a second late rather than never (and say so).
                ready = poller.poll(_IDLE_RECHECK_MS)
                timed_out = not ready
                for fd, _ in ready:
                    if fd == self._inbox_fd:
                        self._waiting_on_socket = False
                        os.eventfd_read(self._inbox_fd)
        finally:
            self._waiting_on_socket = False
            wire.main_stops_receiving()

    def _missed_wakeup(self) -> None:
        """Work waited for the idle main thread's deadline: a wake-up was lost
        somewhere. Counted (``WireStats.missed_wakeups``); said once on stderr."""
        stats = self._stats
        stats.missed_wakeups += 1
        if stats.missed_wakeups == 1:
            print(
                "monarch_nb: a message waited for the idle rank's 1 s recheck (a lost "
                "wake-up, answered late, not lost): please report it",
                file=sys.stderr,
                flush=True,
            )

    async def _next_item_async(self) -> Any:
        loop = self.event_loop()
        deferred = self._deferred  # held back while the main thread waited: first
        while deferred:
            item = deferred.popleft()
            if item is not _WAKE:
                return item
        while True:
            try:
                return self._inbox.get_nowait()
            except queue.Empty:
                pass
            self._waker = loop.create_future()
            try:
                try:  # put before the waker was visible to the putting thread
                    return self._inbox.get_nowait()
                except queue.Empty:
                    pass
                await self._waker
            finally:
                self._waker = None

    # -- serving other actors while one waits ------------------------------------------

    def pump(self, future: Any, timeout: float | None) -> None:
        """The main thread waits on ``future``: until it is done (or ``timeout``),
        run the calls that arrive for *other* actors of this process (an actor
        that calls another actor of its own process would otherwise wait
        forever). Work for a waiting actor, cells and tasks are held back, in
        order, until the main thread is free."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def wake(_: Any) -> None:
            self._inbox.put(_WAKE)
            self._wake_loop()

        future.add_done_callback(wake)
        self.wire.watch()  # this thread waits on its inbox now, not on the socket
        while not future.done():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            if self._loop_can_run():
                # Async endpoint calls are in flight (perhaps the very one this
                # waits on, served nested a moment ago): their steps run while
                # this waits, or a sync endpoint calling an async one of its own
                # process would wait forever.
                self._loop.run_until_complete(self._work_arrives(remaining))
                self._serve_arrived()
                continue
            try:
                item = self._inbox.get(timeout=remaining)
            except queue.Empty:
                return
            self._serve_nested(item)

    def _loop_can_run(self) -> bool:
        """Whether the actors' loop has tasks and may run here: not where a step
        of one of its own tasks waits (it runs already, and cannot run again)."""
        loop = self._loop
        if loop is None or loop.is_running():
            return False
        import asyncio

        return bool(asyncio.all_tasks(loop))

    async def _work_arrives(self, timeout: float | None) -> None:
        """Run the actors' loop until work arrives for the main thread (a wake of
        :meth:`pump` among it), or ``timeout``."""
        import asyncio

        if not self._inbox.empty():
            return
        self._waker = asyncio.get_running_loop().create_future()
        try:
            if self._inbox.empty():
                await asyncio.wait([self._waker], timeout=timeout)
        finally:
            self._waker = None

    def _serve_nested(self, item: Any) -> None:
        if item is _WAKE:
            return
        if callable(item) or not self._nestable(item[0]):
            self._deferred.append(item)
            return
        self._handle_nested(*item)

    def _serve_arrived(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._serve_nested(item)

    # -- the actors' event loop ---------------------------------------------------------

    def event_loop(self) -> Any:
        """The actors' asyncio loop (made on first use: workers start without asyncio)."""
        if self._loop is None:
            import asyncio  # here: workers start without asyncio

            self._loop = asyncio.new_event_loop()
        return self._loop

    def start_task(self, coro: Any) -> Any:
        """A task of ``coro`` on the actors' loop; its first step runs before the
        next message is taken."""
        task = self.event_loop().create_task(coro)
        self._fresh_tasks = True
        return task

    def run_async(self, awaitable: Any) -> Any:
        """Run ``awaitable`` to its end on the actors' loop (main thread), serving
        other actors' calls that arrive while it awaits."""
        import asyncio

        task = asyncio.ensure_future(awaitable, loop=self.event_loop())
        self.wire.watch()  # this thread waits in the actors' loop now, not on the socket
        try:
            while True:
                self._loop.run_until_complete(self._task_or_item(task))
                if task.done():
                    return task.result()
                self._serve_arrived()  # other actors' calls, while this one awaits
        except BaseException:
            # Interrupted (or failed) mid-await: unwind the coroutine now, so it
            # does not resume inside a later call on this loop.
            if not task.done():
                task.cancel()
                try:
                    self._loop.run_until_complete(task)
                except BaseException:
                    pass
            raise

    async def _task_or_item(self, task: Any) -> None:
        """Wait until ``task`` is done or work arrives for the main thread."""
        import asyncio

        if not self._inbox.empty():
            return
        self._waker = asyncio.get_running_loop().create_future()
        try:
            if self._inbox.empty():
                await asyncio.wait([task, self._waker], return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waker = None

    def wait_for(self, tasks: list[Any]) -> None:
        """Run the actors' loop until ``tasks`` (cancelled) have ended, unless it runs
        already (they unwind as it goes on)."""
        if not self._loop.is_running():
            import asyncio

            self.run_async(asyncio.wait(tasks))

    def stop_tasks(self) -> None:
        """The worker exits: cancel the tasks endpoints left on the actors' loop
        (after every actor's ``__cleanup__``) and let them unwind."""
        loop = self._loop
        if loop is None or loop.is_running():
            return
        import asyncio

        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            self.run_async(asyncio.wait(tasks))
