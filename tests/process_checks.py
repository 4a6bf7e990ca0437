"""Finding the worker processes a test session started, and proving they are gone.

Every worker this session starts (directly, through a kernel, or through a
subprocess controller) inherits ``SESSION_MARK`` in its environment, so the
checks find exactly ours even after a worker was re-parented.
"""

from __future__ import annotations

import os
import time
import uuid

import psutil

SESSION_MARK = "MONARCH_NB_TEST_SESSION"
os.environ.setdefault(SESSION_MARK, uuid.uuid4().hex)
LEAK_WAIT_S = 6.0


def our_workers() -> dict[int, str]:
    """pid -> command line of every live monarch_nb worker (or host agent started
    with our environment) of this test session."""
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or ())
            if "monarch_nb.worker" not in cmdline and "monarch_nb.agent" not in cmdline:
                continue
            ours = proc.environ().get(SESSION_MARK) == os.environ[SESSION_MARK]
            if ours and proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.info["pid"]] = cmdline
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_for_exit(pids: set[int], timeout: float) -> set[int]:
    """Wait up to ``timeout`` s for ``pids`` to exit; returns those still alive."""
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p) and not _is_zombie(p)}
        if alive:
            time.sleep(0.05)
    return alive


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def leaked_since(before: set[int]) -> set[int]:
    """Workers started after ``before`` was taken that do not exit in time; kills them."""
    leaked = wait_for_exit(set(our_workers()) - before, LEAK_WAIT_S)
    for pid in leaked:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    return leaked


def voluntary_switches(pid: int, tid: int) -> int:
    """How often thread ``tid`` of ``pid`` went to sleep (a wake-up each)."""
    with open(f"/proc/{pid}/task/{tid}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError(f"no context switch count for thread {tid} of {pid}")
