"""py-spy, the optional sampling profiler behind native stacks and profiles.

py-spy reads another process's memory (ptrace), so it needs no cooperation
from the rank: it sees a rank stuck in C holding the GIL, and native frames.
It runs on the host of the process it reads: the controller runs it for its
own workers, a host agent for the workers it started (:func:`execute` on both
sides, the raw :class:`Outcome` sent up). :func:`check` turns what can go
wrong (not installed, ptrace refused) into one :class:`ProfilerUnavailable`
that says what to do.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .._model._errors import ProfilerUnavailable

T = TypeVar("T")

INSTALL_HINT = "pip install py-spy (or pip install 'monarch-nb[profile]')"
_YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")
# How long one `py-spy dump` may take: it stops the process briefly and reads it.
DUMP_TIMEOUT_S = 30.0
# Outcome.returncode values that are not py-spy's own exit status.
NOT_INSTALLED, TIMED_OUT, NO_SUCH_WORKER = -1001, -1002, -1003


class PySpyFailed(Exception):
    """py-spy ran but failed on one rank (it exited meanwhile, ...): that rank's note."""


@dataclass(frozen=True)
class Outcome:
    """What one py-spy run gave, on whichever host it ran: its exit status (or one
    of NOT_INSTALLED, TIMED_OUT, NO_SUCH_WORKER), its output, and for ``record``
    the bytes of the file it wrote."""

    returncode: int
    stdout: str
    stderr: str
    data: bytes = b""


def find() -> str | None:
    """The py-spy binary: ``$MONARCH_NB_PY_SPY``, on PATH, or beside this Python
    (a virtualenv's bin/, which a notebook kernel may not have on PATH)."""
    override = os.environ.get("MONARCH_NB_PY_SPY")
    if override:
        return override
    return shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


def executable() -> str:
    """The py-spy binary here, or ProfilerUnavailable saying how to install it."""
    found = find()
    if found is None:
        raise ProfilerUnavailable(
            f"native stacks and profiles use py-spy, which is not installed here: {INSTALL_HINT}"
        )
    return found


def execute(
    pid: int,
    *,
    mode: str,
    native: bool,
    seconds: int = 0,
    fmt: str = "flamegraph",
    rate: int = 100,
    timeout: float = DUMP_TIMEOUT_S,
    full_filenames: bool = False,
) -> Outcome:
    """Run ``py-spy dump`` (``mode="dump"``) or ``py-spy record`` for ``seconds`` on
    ``pid``, a process of this host; never raises. ``full_filenames``: whole paths,
    not py-spy's short ``package/module.py``."""
    binary = find()
    if binary is None:
        return Outcome(NOT_INSTALLED, "", "py-spy is not installed")
    args = [binary, mode, "--pid", str(pid)] + (["--native"] if native else [])
    args += ["--full-filenames"] if full_filenames else []
    with tempfile.TemporaryDirectory(prefix="monarch-nb-py-spy-") as tmp:
        out = Path(tmp) / "profile"
        if mode == "record":
            args += ["--duration", str(seconds), "--rate", str(rate), "--format", fmt]
            args += ["--output", str(out), "--nonblocking"]
        try:
            done = subprocess.run(
                args, capture_output=True, text=True, timeout=timeout, check=False
            )
        except FileNotFoundError:
            return Outcome(NOT_INSTALLED, "", f"py-spy was not found at {binary!r}")
        except subprocess.TimeoutExpired:
            return Outcome(TIMED_OUT, "", f"py-spy did not finish within {timeout:g} s")
        data = out.read_bytes() if out.exists() else b""
    return Outcome(done.returncode, done.stdout, done.stderr, data)


def refusal_hint() -> str:
    """What to do when the kernel refused ptrace, in the words of this machine's setting."""
    try:
        scope = _YAMA.read_text().strip()
    except OSError:
        scope = None
    yama = f" (Yama ptrace_scope is {scope})" if scope not in (None, "0") else ""
    return (
        f"the OS refused to let py-spy attach to the rank{yama}: allow it with "
        "`sudo sysctl kernel.yama.ptrace_scope=0`, or run the controller with "
        "CAP_SYS_PTRACE (in a container: `docker run --cap-add SYS_PTRACE`), or as root"
    )


_REFUSED = re.compile(r"permission denied|operation not permitted|EPERM", re.IGNORECASE)


def check(outcome: Outcome, *, rank: int, pid: int, host: str | None = None) -> Outcome:
    """``outcome`` if py-spy succeeded; ProfilerUnavailable if it cannot run at all
    (missing, refused), PySpyFailed for a failure of this one rank."""
    on = f" on host {host}" if host else " here"
    if outcome.returncode == NOT_INSTALLED:
        raise ProfilerUnavailable(
            f"native stacks and profiles use py-spy, which is not installed{on} "
            f"({outcome.stderr}): {INSTALL_HINT}",
            ranks=(rank,),
        )
    if outcome.returncode == TIMED_OUT:
        raise PySpyFailed(outcome.stderr)
    if outcome.returncode == NO_SUCH_WORKER:
        raise PySpyFailed(outcome.stderr)
    if outcome.returncode != 0:
        said = (outcome.stderr or outcome.stdout).strip()
        if _REFUSED.search(said):
            where = f" (host {host})" if host else ""
            raise ProfilerUnavailable(
                f"rank {rank} (pid {pid}{where}): {refusal_hint()}", ranks=(rank,)
            )
        raise PySpyFailed(f"py-spy failed (exit status {outcome.returncode}): {said}")
    return outcome


def dump(pid: int, rank: int, *, native: bool = True, timeout: float = DUMP_TIMEOUT_S) -> str:
    """``py-spy dump`` of one process of this host: every thread's stack, innermost first."""
    outcome = execute(pid, mode="dump", native=native, timeout=timeout)
    return check(outcome, rank=rank, pid=pid).stdout


def each(ranks: Iterable[int], fn: Callable[[int], T]) -> dict[int, T]:
    """``fn(rank)`` for every rank in parallel threads (py-spy runs are subprocesses)."""
    ranks = list(ranks)
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(ranks)))) as pool:
        return dict(zip(ranks, pool.map(fn, ranks), strict=True))
