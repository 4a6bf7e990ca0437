"""py-spy, the optional sampling profiler behind native stacks and profiles.

py-spy reads another process's memory (ptrace), so it needs no cooperation
from the rank: it sees a rank stuck in C holding the GIL, and native frames.
Everything that can go wrong (not installed, ptrace refused, a rank on another
host) becomes one :class:`ProfilerUnavailable` that says what to do.
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
from pathlib import Path
from typing import TypeVar

from .._common._errors import ProfilerUnavailable
from .._common._fold import format_ranks

T = TypeVar("T")


class PySpyFailed(Exception):
    """py-spy ran but failed on one rank (it exited meanwhile, ...): that rank's note."""


INSTALL_HINT = "pip install py-spy (or pip install 'monarch-nb[profile]')"
_YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")
# How long one `py-spy dump` may take: it stops the process briefly and reads it.
DUMP_TIMEOUT_S = 30.0


def executable() -> str:
    """The py-spy binary: ``$MONARCH_NB_PY_SPY``, on PATH, or beside this Python
    (a virtualenv's bin/, which a notebook kernel may not have on PATH)."""
    override = os.environ.get("MONARCH_NB_PY_SPY")
    if override:
        return override
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise ProfilerUnavailable(
            f"native stacks and profiles use py-spy, which is not installed here: {INSTALL_HINT}"
        )
    return found


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


def _run(args: list[str], pid: int, rank: int, timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            [executable(), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise ProfilerUnavailable(
            f"py-spy was not found at {executable()!r}: {INSTALL_HINT}", ranks=(rank,)
        ) from None
    except subprocess.TimeoutExpired:
        raise PySpyFailed(f"py-spy did not finish within {timeout:g} s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        if _REFUSED.search(said):
            raise ProfilerUnavailable(f"rank {rank} (pid {pid}): {refusal_hint()}", ranks=(rank,))
        raise PySpyFailed(f"py-spy failed (exit status {done.returncode}): {said}")
    return done


def dump(pid: int, rank: int, *, native: bool = True, timeout: float = DUMP_TIMEOUT_S) -> str:
    """``py-spy dump`` of one process: every thread's stack, innermost first."""
    args = ["dump", "--pid", str(pid)] + (["--native"] if native else [])
    return _run(args, pid, rank, timeout).stdout


def record(pid: int, rank: int, *, seconds: int, fmt: str, native: bool, rate: int) -> bytes:
    """``py-spy record`` of one process for ``seconds``: the output file's bytes."""
    with tempfile.TemporaryDirectory(prefix="monarch-nb-profile-") as tmp:
        out = Path(tmp) / f"rank{rank}"
        args = ["record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate)]
        args += ["--format", fmt, "--output", str(out), "--nonblocking"]
        args += ["--native"] if native else []
        _run(args, pid, rank, timeout=seconds + DUMP_TIMEOUT_S)
        try:
            return out.read_bytes()
        except FileNotFoundError:  # py-spy saw no sample at all (an idle rank)
            return b""


def check_local(pids: dict[int, int | None], hosts: dict[int, str]) -> None:
    """Raise unless every rank runs on this host (py-spy runs here, on local pids)."""
    remote = sorted(r for r, pid in pids.items() if pid is None)
    if remote:
        where = sorted({hosts[r] for r in remote})
        which = (
            f"rank {remote[0]} runs" if len(remote) == 1 else f"ranks {format_ranks(remote)} run"
        )
        raise ProfilerUnavailable(
            f"native stacks and profiles run py-spy on the controller's host; {which} on "
            f"{', '.join(where)} through a host agent, which does not run py-spy yet: run "
            "`py-spy dump --native --pid PID` there (procs.status() lists each rank's pid)",
            ranks=remote,
        )
    executable()  # fail once, up front, if py-spy is missing


def each(ranks: Iterable[int], fn: Callable[[int], T]) -> dict[int, T]:
    """``fn(rank)`` for every rank in parallel threads (py-spy runs are subprocesses)."""
    ranks = list(ranks)
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(ranks)))) as pool:
        return dict(zip(ranks, pool.map(fn, ranks), strict=True))
