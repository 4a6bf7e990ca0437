"""Wake-up eventfds: one thread writes to wake another out of its poll."""

from __future__ import annotations

import os


def clear_eventfd(fd: int) -> None:
    """Take the wake-ups pending on non-blocking eventfd ``fd``; none is fine (another
    reader, or a poll that woke for a different fd, may have taken them)."""
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass
