"""Small helpers shared by the test clusters: running system commands, killing pids."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import TypeVar

_Self = TypeVar("_Self", bound="ClosedOnExit")


class CommandError(RuntimeError):
    """A system command a cluster needs failed; carries its output for the report."""


def check(argv: Sequence[str], timeout: float = 20.0, input: str | None = None) -> str:
    """Run ``argv``, return its stdout; raise CommandError with stderr when it fails."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, input=input
        )
    except subprocess.TimeoutExpired as e:
        raise CommandError(f"{' '.join(argv)}: timed out after {timeout} s") from e
    if done.returncode != 0:
        output = done.stderr.strip() or done.stdout.strip()
        raise CommandError(f"{' '.join(argv)}: exit {done.returncode}: {output}")
    return done.stdout


def attempt(argv: Sequence[str], timeout: float = 20.0) -> bool:
    """Run ``argv`` for cleanup, where failing (already gone) is fine; True if it worked."""
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=timeout).returncode == 0
    except (subprocess.TimeoutExpired, OSError):
        return False


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie is dead, only unreaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The state follows the command name, which is parenthesised and may hold spaces.
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def kill_and_wait(pids: Iterable[int], timeout: float = 5.0) -> set[int]:
    """SIGKILL ``pids`` and wait for them to go; returns those still alive after ``timeout``."""
    alive = set(pids)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while True:
        alive = {p for p in alive if pid_alive(p)}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


def missing_tools(*names: str) -> list[str]:
    """Those of the executables ``names`` (absolute paths or PATH names) that are absent."""
    return [n for n in names if not (os.access(n, os.X_OK) if "/" in n else shutil.which(n))]


def root_and_tools_reason(tools: Sequence[str], root_for: str) -> str | None:
    """Why this process cannot build a test cluster needing root and ``tools``, or None."""
    if os.geteuid() != 0:
        return f"{root_for} need root"
    missing = missing_tools(*tools)
    if missing:
        return f"missing {', '.join(missing)} (run .ci/install_multihost.sh)"
    return None


class ClosedOnExit:
    """Base of the test clusters: ``close()`` at the end of a ``with`` block, and at
    interpreter exit for one never closed (a test run interrupted by Ctrl-C)."""

    def close(self) -> None:
        raise NotImplementedError

    def _close_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _register_close_at_exit(self) -> None:
        atexit.register(self._close_at_exit)

    def _unregister_close_at_exit(self) -> None:
        atexit.unregister(self._close_at_exit)

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()  # raises, naming them, if things are left behind
        else:
            # Do not hide the with block's own exception behind a cleanup report.
            self._close_at_exit()


_FLUSH_AND_DIE = "import os, signal, sys; sys.stdout.flush(); os.kill(os.getpid(), signal.SIGKILL)"


def run_then_sigkill_itself(code: str, timeout: float = 60.0) -> list[str]:
    """Run ``code`` in a new interpreter (in this directory) that then SIGKILLs itself,
    as pytest-timeout or the OOM killer would: no cleanup runs. Returns the words
    it printed."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{_FLUSH_AND_DIE}"],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.abspath(__file__)),
        timeout=timeout,
    )
    if done.returncode != -signal.SIGKILL:
        raise CommandError(f"expected SIGKILL, got exit {done.returncode}: {done.stderr}")
    return done.stdout.split()
