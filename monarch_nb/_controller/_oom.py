"""Was a SIGKILLed worker killed for lack of memory? The host's evidence, if it has any.

Linux's OOM killer ends a process with SIGKILL, which on its own reads like
any other kill. Two witnesses tell them apart, and we ask both when a worker
dies by SIGKILL:

- the memory cgroup the worker started in counts its OOM kills (cgroup v2
  ``memory.events``, v1 ``memory.oom_control``: the ``oom_kill`` line); a
  count higher than when the worker started means the kernel killed
  something in it;
- the kernel log (``/dev/kmsg``, when this process may read it) names the
  pid: ``Killed process 1234 (python)``.

Neither is guaranteed to exist (containers hide both at times): without
evidence a kill is reported as the bare signal, never guessed.
"""

from __future__ import annotations

import os
import re
import time

_CGROUP_ROOT = "/sys/fs/cgroup"
_KMSG = "/dev/kmsg"
_KMSG_MAX_RECORDS = 100_000  # the ring buffer is bounded; this is only a guard


def memory_cgroup(pid: int) -> str | None:
    """The file counting OOM kills in ``pid``'s memory cgroup, or None."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            candidate = f"{_CGROUP_ROOT}/memory{path.rstrip('/')}/memory.oom_control"
            if os.path.exists(candidate):
                return candidate
    for line in lines:
        if line.startswith("0::"):  # cgroup v2
            candidate = f"{_CGROUP_ROOT}{line[3:].rstrip('/')}/memory.events"
            if os.path.exists(candidate):
                return candidate
    return None


def oom_kills(counter: str | None) -> int | None:
    """The ``oom_kill`` count in ``counter`` (see :func:`memory_cgroup`), or None."""
    if counter is None:
        return None
    try:
        with open(counter) as f:
            text = f.read()
    except OSError:
        return None
    match = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def kernel_log_names(pid: int, since_us: int = 0) -> bool:
    """Whether the kernel log says the OOM killer killed ``pid``, in a record no older
    than ``since_us`` (the kernel's clock, microseconds since boot: a pid used again
    must not inherit an old kill)."""
    try:
        fd = os.open(_KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    pattern = re.compile(rf"(Killed process {pid} \(|oom-kill:.*,pid={pid},)".encode())
    found = False
    try:
        for _ in range(_KMSG_MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break  # read to the end
            except OSError:
                continue  # a record overwritten while we read (EPIPE): go on
            if not record:
                break
            if pattern.search(record) and _record_time_us(record) >= since_us:
                found = True
    finally:
        os.close(fd)
    return found


def _record_time_us(record: bytes) -> int:
    """``/dev/kmsg`` records start ``priority,sequence,microseconds,flags;``."""
    try:
        return int(record.split(b",", 3)[2])
    except (IndexError, ValueError):
        return 0


def _now_us() -> int:
    # The kernel stamps its log with its monotonic clock: the same as CLOCK_MONOTONIC.
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class OomWitness:
    """What a worker's cgroup said when it started, to compare at its death."""

    __slots__ = ("baseline", "counter", "pid", "started_us")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.started_us = _now_us() - 1_000_000  # a second of slack between the clocks
        self.counter = memory_cgroup(pid)
        self.baseline = oom_kills(self.counter)

    def evidence(self) -> str | None:
        """Why we believe the worker ran out of memory, or None: ask once it died."""
        now = oom_kills(self.counter)
        if now is not None and self.baseline is not None and now > self.baseline:
            return f"{os.path.basename(self.counter or '')} of its cgroup counts oom_kill {now}"
        if kernel_log_names(self.pid, self.started_us):
            return f"the kernel log says it killed pid {self.pid}"
        return None


def describe_oom(evidence: str) -> str:
    """The exit description of a worker the OOM killer ended."""
    return f"was killed by the kernel's OOM killer: out of memory (SIGKILL; {evidence})"
