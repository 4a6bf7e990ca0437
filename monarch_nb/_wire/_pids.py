"""Whether a process id names a live process."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (someone else's counts; a zombie, which has
    exited and only waits to be reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
