"""One worker process as the controller tracks it, and the settings it starts by.

:class:`WorkerProcess` is what every part of a process group reads of a rank's
process (exit, output, heartbeats); :class:`LocalWorker` is one this process
started, a host agent's is :class:`~._hosts.RemoteWorker`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections import deque
from typing import Any

from .._services import _py_spy
from .._services._descendants import kill_tree
from .._services._spawn import WorkerHandle, kill_leftovers, open_pidfd
from .._wire._messages import ResourceSample
from . import _events as ev
from ._oom import OomWitness, describe_oom
from ._status import describe_exit

# The settings' starting values. ``config.configure()`` sets the copies that
# ``_process_group`` and ``_hosts`` hold, which their users read at use.
START_TIMEOUT_S = float(os.environ.get("MONARCH_NB_START_TIMEOUT", "60"))
HEARTBEAT_S = float(os.environ.get("MONARCH_NB_HEARTBEAT", "1.0"))
STOP_GRACE_S = float(os.environ.get("MONARCH_NB_STOP_GRACE", "5"))
KILL_WAIT_S = 10.0  # after SIGKILL: at once locally; a remote exit is reported by its agent
_STDERR_TAIL_LINES = 20
OUTPUT_TAIL_LINES = 200  # per rank, for status views of what a rank printed last


class WorkerProcess:
    """One worker as the controller tracks it: identity, exit, output, heartbeats.

    Touched on the I/O thread. How it is killed and waited for depends on who
    started it: :class:`LocalWorker` (this process) or a host agent's worker
    (:class:`~._hosts.RemoteWorker`).
    """

    def __init__(self, rank: int, identity: bytes, pid: int, host: str) -> None:
        self.rank = rank
        self.identity = identity
        self.pid = pid
        self.host = host
        self.returncode: int | None = None
        self.lost: str | None = None  # why its host stopped answering, if it did
        # Why monarch_nb itself killed it (a rank that did not stop after an
        # interrupt): its exit is then reported as that, not as a crash.
        self.killed_because: str | None = None
        self.partial = {"stdout": b"", "stderr": b""}
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL_LINES)
        # What faulthandler printed when the process crashed (a segfault, an abort):
        # from its "Fatal Python error" line on, every thread's Python stack.
        self.fault_report: list[str] = []
        self.output_tail: deque[ev.Output] = deque(maxlen=OUTPUT_TAIL_LINES)
        # The last two heartbeats (monotonic time, sample): CPU % is their slope.
        self.heartbeat: tuple[float, ResourceSample] | None = None
        self.previous_heartbeat: tuple[float, ResourceSample] | None = None
        self.started = time.monotonic()  # silent since then, until a first heartbeat
        self.work = ""  # as of the last heartbeat
        self.work_seconds = 0.0
        self.oom: OomWitness | None = None  # what its cgroup said at start (local workers)
        self.out_of_memory: str | None = None  # the evidence, if it was OOM-killed

    def exit_cause(self) -> str:
        """Why it is gone: its host lost, out of memory, or its exit code or signal."""
        assert self.returncode is not None
        if self.lost:
            return self.lost
        if self.out_of_memory:
            return describe_oom(self.out_of_memory)
        if self.killed_because:
            return f"was killed by monarch_nb: {self.killed_because}"
        return describe_exit(self.returncode)

    @property
    def route(self) -> bytes | None:
        """The agent that relays to this worker, or None if it talks to us directly."""
        return None

    def kill(self) -> None:
        """SIGKILL it (any thread); its exit is reported as usual."""
        raise NotImplementedError

    def wait(self, timeout: float | None) -> bool:
        """Wait until it exited; False if still running after ``timeout`` s."""
        raise NotImplementedError

    def py_spy(self, **options: Any) -> _py_spy.Outcome:
        """Run py-spy on it, on its host (see ``_py_spy.execute``; any thread, blocking)."""
        raise NotImplementedError


class LocalWorker(WorkerProcess):
    """A worker this process started (a child, or the child of its zygote) with a
    pidfd and two pipes."""

    def __init__(self, rank: int, identity: bytes, popen: WorkerHandle) -> None:
        super().__init__(rank, identity, popen.pid, socket.gethostname())
        self.popen = popen
        self.pidfd = open_pidfd(popen)
        self.oom = OomWitness(popen.pid)
        self._leftovers_killed = False

    def kill(self) -> None:
        if self.popen.poll() is None:
            kill_tree(self.popen.pid)  # what it started too, in any session

    def wait(self, timeout: float | None) -> bool:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        # Reaped here (a stop), the I/O thread's exit handler may never run: the
        # stop forgets the pidfd, and on a busy host it may do so first.
        self.kill_leftovers()
        return True

    def kill_leftovers(self) -> None:
        """What is left of its process group, killed once, by whoever reaped it
        first: later, its pid may lead another process's group (see
        ``_spawn.kill_leftovers``)."""
        if not self._leftovers_killed:
            self._leftovers_killed = True
            kill_leftovers(self.pid)

    def py_spy(self, **options: Any) -> _py_spy.Outcome:
        return _py_spy.execute(self.pid, **options)
