"""A rank's descendants, in every session and process group, ended with it (Linux).

A rank makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process
it started that double-forks, or calls ``setsid`` and then loses its parent, is
reparented to the rank rather than to init. So the rank's tree in /proc holds
every process it started, whatever session or group they moved to, for as long
as the rank lives. The rank kills that tree when it stops; the controller or
agent that must SIGKILL a rank first stops it (SIGSTOP: it can neither fork nor
lose an orphan any more) and kills its tree from outside (``kill_tree``).

Why not a cgroup: an unprivileged user can make one only where systemd or an
administrator delegated a writable cgroup v2 subtree, which most containers
and batch hosts do not; a subreaper needs no privilege on any Linux since 3.4.
What it cannot do: a rank killed outright by someone else (the OOM killer, a
``kill -9`` from a shell) hands its adopted descendants to init before anyone
can look, and only the killing of its process group after the reap
(``_spawn.kill_leftovers``) still applies. Adopted orphans that exit stay
zombies until the rank exits (reaping them could steal an exit status from
user code's own ``subprocess`` objects).

Elsewhere (no prctl, no /proc) every function here does nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

_PR_SET_CHILD_SUBREAPER = 36
# Killing a tree that keeps forking ends when every member has a SIGKILL pending
# (a process with one can no longer fork); this bounds the rounds all the same.
_KILL_DEADLINE_S = 5.0


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants; False where it cannot."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """The live (not zombie) processes below ``pid``, parents before children."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def kill_descendants(pid: int) -> None:
    """SIGKILL every process below ``pid`` (this process's, or a stopped one's),
    again until none is left alive: children a member forked before its signal
    came are found in the next round."""
    deadline = time.monotonic() + _KILL_DEADLINE_S
    while (found := descendants(pid)) and time.monotonic() < deadline:
        for child in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        time.sleep(0.005)  # let the kernel turn them into zombies


def kill_tree(pid: int) -> None:
    """SIGKILL process ``pid`` and everything below it. Call only while ``pid`` is
    a child of the caller not yet reaped (so that its pid cannot name another
    process); its tree is taken while it is stopped, complete."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGSTOP)
    kill_descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
