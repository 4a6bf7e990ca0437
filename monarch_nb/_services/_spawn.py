"""Starting a worker process: fresh (``start_worker``: host agents, and where the
zygote is off or cannot serve) or forked from a zygote (``start_local_worker``:
the controller's own ranks, by default; see ``_zygote``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from . import _zygote
from ._zygote import ForkedWorker

# What the controller watches a local rank by: a fresh interpreter, or a forked one.
WorkerHandle = subprocess.Popen[bytes] | ForkedWorker


def start_worker(env: Mapping[str, str], bootstrap: Mapping[str, Any]) -> subprocess.Popen[bytes]:
    """``python -m monarch_nb.worker`` with ``env``; ``bootstrap`` (the signing key
    included) goes to its stdin, never on a command line. Its stdout and stderr
    are pipes for the caller to watch; it runs in a session of its own, so a
    terminal's Ctrl-C reaches the controller only. Call from the thread that
    lives as long as the worker should: its parent-death signal fires when the
    thread that forked it ends. ``bootstrap["python"]``, if set, is the interpreter
    (``HostMesh.with_python_executable``)."""
    popen = subprocess.Popen(
        [bootstrap.get("python") or sys.executable, "-m", "monarch_nb.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
    )
    assert popen.stdin is not None
    try:
        popen.stdin.write(json.dumps(dict(bootstrap)).encode() + b"\n")
        popen.stdin.close()
    except BrokenPipeError:
        # It died before reading (a broken interpreter, a bad environment): its
        # exit code and stderr, which the caller watches, say why better than we can.
        with contextlib.suppress(OSError):
            popen.stdin.close()
    return popen


def start_local_worker(env: Mapping[str, str], bootstrap: Mapping[str, Any]) -> WorkerHandle:
    """A rank of this host: forked from the zygote unless ``MONARCH_NB_ZYGOTE=0``
    (in ``env`` or ours), fresh where the zygote cannot serve. Either way the
    rank sees the same environment, working directory, session and bootstrap."""
    # Only for this very interpreter: another one (with_python_executable) is
    # often a wrapper that sets the environment or the CPU set before it execs
    # Python, which a rank forked from a zygote would never run.
    if _zygote.enabled(env) and _zygote.python_of(bootstrap) == sys.executable:
        try:
            return _zygote.fork_worker(sys.executable, env, bootstrap)
        except _zygote.ZygoteError:
            pass  # a fresh interpreter says better why a rank cannot start, if it cannot
    return start_worker(env, bootstrap)


def open_pidfd(handle: WorkerHandle) -> int:
    """A pidfd of the rank (the caller closes it): readable once the rank exited."""
    if isinstance(handle, ForkedWorker):
        return handle.pidfd()
    return os.pidfd_open(handle.pid)


def kill_leftovers(pid: int) -> None:
    """SIGKILL what is left of the process group of worker ``pid`` (its children that
    did not leave it), once the worker itself is gone and reaped: a rank's
    subprocesses do not outlive it. Safe after the reap: Linux does not reuse a
    pid while a process group of that id still has members."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
