"""The controller's I/O thread: one poll loop for every socket, pipe and process.

Other threads hand it work with :meth:`IOLoop.call_soon` (thread-safe; wakes
the loop through an eventfd) and get results back through futures. The loop
polls file descriptors, in one ``zmq.Poller``:

- the ``ZMQ_FD`` of the ROUTER socket all workers connect to,
- a pidfd per worker process, readable the instant the process exits, so a
  crash is seen at once with its exit code or signal,
- the stdout/stderr pipe of every worker, forwarded line by line as it arrives,
- the wake-up eventfd.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import zmq

from .._wire._eventfd import clear_eventfd

Callback = Callable[[], None]
T = TypeVar("T")
_log = logging.getLogger("monarch_nb")
# How long a batched callback (call_soon_batched) may wait for the others.
BATCH_S = 0.02


class IOLoop:
    """A single background thread running a ``zmq.Poller`` loop."""

    def __init__(self, name: str = "monarch_nb-io") -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pending: deque[Callback] = deque()
        self._after_poll: deque[Callback] = deque()
        self._after_poll_lock = threading.Lock()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._poller = zmq.Poller()
        self._poller.register(self._wake_fd, zmq.POLLIN)
        self._fds: dict[int, Callback] = {}
        # (when, tie-breaker, callback): timers, touched on the I/O thread only.
        self._timers: list[tuple[float, int, Callback]] = []
        self._timer_ids = itertools.count()
        # call_soon_batched: the callbacks, whether a wake-up for them is on its way
        # or due (any thread sets it), and when the loop runs them (loop thread only).
        self._batched: deque[Callback] = deque()
        self._batch_armed = False
        self._batch_due: float | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._ident: int | None = None  # the loop thread's, while it runs (_run sets it)
        self._thread.start()

    @property
    def stopping(self) -> bool:
        """True once stop() was called: nothing queued afterwards will run."""
        return self._stopping

    @property
    def in_loop_thread(self) -> bool:
        return threading.get_ident() == self._ident  # every send asks: no current_thread()

    # -- thread-safe entry points --------------------------------------------

    def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the loop thread and return its result (blocking)."""
        if self.in_loop_thread:
            return fn()
        box: list[Any] = []
        done = threading.Event()

        def task() -> None:
            try:
                box.append((True, fn()))
            except BaseException as exc:
                box.append((False, exc))
            done.set()

        self.call_soon(task)
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def call_soon(self, callback: Callback) -> None:
        """Run ``callback()`` on the I/O thread as soon as possible.

        Raises RuntimeError once the loop was stopped: nothing would run it.
        """
        if self._stopping:
            raise RuntimeError("monarch_nb's I/O loop was stopped (the controller shut down)")
        self._pending.append(callback)
        try:
            os.eventfd_write(self._wake_fd, 1)
        except OSError:
            pass  # loop already closed; nothing will run the callback

    def call_soon_batched(self, callback: Callback) -> None:
        """Run ``callback()`` on the I/O thread within :data:`BATCH_S`, with every
        other batched callback queued by then: the loop wakes once per batch, not
        once per callback.

        For what only observers see (a call's started/finished events, which a
        dashboard draws twice a second): woken for each, the I/O thread took the
        GIL and a core from the caller twice per call. Thread-safe; raises
        RuntimeError once the loop was stopped.
        """
        if self._stopping:
            raise RuntimeError("monarch_nb's I/O loop was stopped (the controller shut down)")
        self._batched.append(callback)
        if not self._batch_armed:
            self._batch_armed = True
            try:
                os.eventfd_write(self._wake_fd, 1)  # it sets the batch's deadline
            except OSError:
                pass  # loop already closed

    def stop(self) -> None:
        """Stop the loop and close its sockets (waits for the thread)."""
        if self._stopping:
            return
        self._stopping = True
        try:
            os.eventfd_write(self._wake_fd, 1)  # wake the loop so it sees _stopping
        except OSError:
            pass
        if not self.in_loop_thread:
            self._thread.join(timeout=5)

    # -- registration (I/O thread only) ---------------------------------------

    def call_later(self, delay: float, callback: Callback) -> None:
        """Run ``callback()`` on the I/O thread in ``delay`` s (call from the I/O thread)."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_ids), callback))

    def add_fd(self, fd: int, on_readable: Callback) -> None:
        self._fds[fd] = on_readable
        self._poller.register(fd, zmq.POLLIN)

    def remove_fd(self, fd: int) -> None:
        if self._fds.pop(fd, None) is not None:
            self._poller.unregister(fd)

    # -- the loop ---------------------------------------------------------------

    def _run(self) -> None:
        self._ident = threading.get_ident()
        try:
            while not self._stopping:
                self._poll_once()
            self._run_batch()  # queued before stop(), as call_soon's callbacks run
        finally:
            self._ident = None  # a later thread may be given the same number
            os.close(self._wake_fd)

    def call_after_poll(self, callback: Callback) -> None:
        """Run ``callback()`` on the I/O thread after the next poll has been handled:
        whatever was readable by then (a rank's last output lines) is read first."""
        with self._after_poll_lock:
            self._after_poll.append(callback)
        self.call_soon(lambda: None)  # wakes the loop for that poll

    def _poll_once(self) -> None:
        with self._after_poll_lock:
            after_poll, self._after_poll = self._after_poll, deque()
        if self._batch_armed and self._batch_due is None:
            self._batch_due = time.monotonic() + BATCH_S
        timeout_ms: int | None = 0 if self._pending or after_poll else None
        if timeout_ms is None:
            due = [self._timers[0][0]] if self._timers else []
            if self._batch_due is not None:
                due.append(self._batch_due)
            if due:
                timeout_ms = max(0, int((min(due) - time.monotonic()) * 1000) + 1)
        for item, _ in self._poller.poll(timeout_ms):
            if item == self._wake_fd:
                clear_eventfd(self._wake_fd)
            else:
                # An earlier callback in this batch may have removed the fd.
                callback = self._fds.get(item)
                if callback is not None:
                    _safely(callback)
        while after_poll:
            _safely(after_poll.popleft())
        while self._pending:
            _safely(self._pending.popleft())
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _safely(heapq.heappop(self._timers)[2])
        if self._batch_due is not None and self._batch_due <= now:
            self._run_batch()

    def _run_batch(self) -> None:
        self._batch_due = None
        # Disarmed before running: a callback queued from now on wakes the loop
        # again (at worst for one that this batch runs anyway).
        self._batch_armed = False
        batched = self._batched
        while batched:
            _safely(batched.popleft())


def _safely(callback: Callback) -> None:
    # One bad callback must not take down the thread every mesh depends on.
    try:
        callback()
    except Exception:
        _log.exception("monarch_nb I/O thread: a callback failed")
