"""Starting a worker process: the one way, for the controller and host agents alike."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from typing import Any


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


def kill_leftovers(pid: int) -> None:
    """SIGKILL what is left of the process group of worker ``pid`` (its children that
    did not leave it), once the worker itself is gone and reaped: a rank's
    subprocesses do not outlive it. Safe after the reap: Linux does not reuse a
    pid while a process group of that id still has members."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
