"""The Unix link's flusher: a thread that writes what connections could not send at once.

A send never waits (:class:`._link_connection.Connection`): what the kernel
does not take queues on the connection, and this thread writes it when the
socket can take more, so two sides sending big messages to each other cannot
deadlock. It also runs what is due later: the router's write-behind.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._link_connection import Connection

_log = logging.getLogger("monarch_nb")


class Flusher:
    """A thread that writes connections' backlogs when their sockets can take more,
    and runs what is due later (the router's write-behind)."""

    def __init__(self, name: str) -> None:
        self._waiting: set[Connection] = set()
        self._due: list[tuple[float, Callable[[], None]]] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def want(self, conn: Connection) -> None:
        with self._lock:
            if self._closed:  # the socket closed: its connections' backlogs went with it
                return
            self._waiting.add(conn)
            self._wake()

    def later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on this thread in ``delay_s`` seconds."""
        with self._lock:
            if self._closed:
                return
            self._due.append((time.monotonic() + delay_s, fn))
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    def close(self) -> None:
        with self._lock:
            if self._closed:  # (the thread may have closed the pipe already)
                return
            self._closed = True
            self._wake()

    def _run_due(self) -> float | None:
        """Run what is due; milliseconds until the next, None if nothing waits."""
        with self._lock:
            if not self._due:
                return None
            now = time.monotonic()
            ready = [fn for when, fn in self._due if when <= now]
            self._due = [(when, fn) for when, fn in self._due if when > now]
            next_ms = min((when - now) * 1000 for when, _ in self._due) if self._due else None
        for fn in ready:
            try:
                fn()
            except Exception:  # (a bug) this thread must go on writing backlogs
                _log.exception("monarch_nb: a Unix link's timer failed")
        return next_ms

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        registered: set[int] = set()
        while not self._closed:
            next_ms = self._run_due()
            with self._lock:
                waiting = list(self._waiting)
            for conn in waiting:
                if conn.eof or not conn.flush():
                    with self._lock:
                        if not conn.backlog or conn.eof:
                            self._waiting.discard(conn)
            with self._lock:
                fds = {c.fd for c in self._waiting if not c.eof}
            for fd in registered - fds:
                poller.unregister(fd)
            for fd in fds - registered:
                poller.register(fd, select.POLLOUT)
            registered = fds
            timeout = 1000.0 if fds else None
            if next_ms is not None:
                timeout = next_ms if timeout is None else min(timeout, next_ms)
            for fd, _ in poller.poll(timeout):
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
        # Under the lock: close() sets _closed and then wakes us, both under it,
        # and this loop reads _closed without it, so it may end (on a timeout)
        # between the two. Closed outside the lock, the wake-up would write to a
        # closed fd number, or to whatever file opened next with that number.
        with self._lock:
            os.close(self._wake_r)
            os.close(self._wake_w)
