"""File descriptors: as many as the host allows, and running out as a failed
request, never a dead process.

A process holding a network endpoint gets one fd per connection before any
key is checked, so a keyless flood can take every fd it has. The agent, the
workers and the controller raise their soft ``RLIMIT_NOFILE`` to the hard
limit when they start (:func:`raise_fd_limit`), and the requests that need a
new fd (a port probe, a worker's pipes, a log file) catch :func:`exhausted`
errors and fail alone, said once through :class:`ExhaustionWarning`.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading
import time

_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE})


def raise_fd_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; returns the
    soft limit now in force (unchanged where the system refuses)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
            return soft
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    except (OSError, ValueError):  # a sandbox that forbids it: keep what we have
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` says this process (EMFILE) or the system (ENFILE) is out of fds."""
    return isinstance(exc, OSError) and exc.errno in _EXHAUSTED


def open_fds() -> int:
    """How many fds this process holds now (Linux; -1 where unknown)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1
    except OSError:
        return -1


class ExhaustionWarning:
    """Says "out of file descriptors" once per process role, not once per failed
    request (a flood fails thousands): the first failure with what failed and
    what to do, then a count of the rest at most once a minute."""

    _REPEAT_S = 60.0

    def __init__(self, logger: logging.Logger, who: str) -> None:
        self._log = logger
        self._who = who
        self._lock = threading.Lock()
        self._said_at: float | None = None  # when it last said so
        self.failures = 0
        self._unsaid = 0

    def failed(self, what: str, exc: BaseException) -> None:
        """``what`` (a request, e.g. "a port probe") failed with ``exc``, an fd error."""
        now = time.monotonic()
        with self._lock:
            self.failures += 1
            said_at = self._said_at
            first = said_at is None
            if said_at is not None and now - said_at < self._REPEAT_S:
                self._unsaid += 1
                return
            unsaid, self._unsaid, self._said_at = self._unsaid, 0, now
        if first:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            self._log.warning(
                "%s is out of file descriptors (%s, holding %d of %d): %s failed, and "
                "so will other requests that need a new one until some are released; "
                "it keeps serving. A connection flood on a listening port does this: "
                "firewall the port, or raise `ulimit -n`.",
                self._who,
                exc,
                open_fds(),
                soft,
                what,
            )
        else:
            self._log.warning(
                "%s is still short of file descriptors: %d more requests failed (%s: %s)",
                self._who,
                unsaid + 1,
                what,
                exc,
            )
