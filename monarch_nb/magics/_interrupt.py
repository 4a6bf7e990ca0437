"""Waiting for a cell so that Ctrl-C and ``--timeout`` reach the ranks.

The kernel's interrupt raises KeyboardInterrupt in the thread blocked on the
cell's future. We forward it: SIGINT to every busy rank of the mesh (Python
code there stops with KeyboardInterrupt, and the mesh stays usable), then
wait a grace period; a rank still busy after that is stuck in C code and is
killed, which fails the mesh with an error naming it (``%mesh restart``).
A second interrupt during the grace period kills at once.
"""

from __future__ import annotations

import os
from typing import Any

from .._errors import CallTimeout, MeshFailure, RemoteError, format_ranks
from .._future import Future
from .._proc_mesh import ProcMesh

GRACE_S = float(os.environ.get("MONARCH_NB_INTERRUPT_GRACE", "3"))
_AFTER_KILL_S = 10.0  # the pidfd reports a SIGKILLed rank at once; this is a safety net


def wait_for(
    future: Future[Any],
    procs: ProcMesh,
    *,
    label: str,
    timeout: float | None = None,
    grace: float = GRACE_S,
) -> Any:
    """``future.get()``, forwarding an interrupt (or ``timeout``) to the busy ranks.

    Raises KeyboardInterrupt if the ranks stopped on the interrupt, CallTimeout
    on ``timeout``, MeshFailure naming the ranks that had to be killed, or the
    cell's own error.
    """
    try:
        return future.get(timeout=timeout)
    except KeyboardInterrupt:
        why = "interrupted"
    except CallTimeout:
        why = f"did not finish within {timeout} s"
    busy = _waiting_ranks(future, procs)
    procs.interrupt(busy)
    killed: list[int] = []
    try:
        future.exception(timeout=grace)
    except KeyboardInterrupt:
        killed = _waiting_ranks(future, procs)  # interrupted twice: do not wait any longer
    except TimeoutError:
        killed = _waiting_ranks(future, procs)
    if killed:
        procs.kill(killed)
        try:
            future.exception(timeout=_AFTER_KILL_S)
        except TimeoutError:
            pass
        raise MeshFailure(
            f"{label} {why}; rank(s) {format_ranks(killed)} did not stop within {grace} s "
            f"of the interrupt (stuck outside Python?) and were killed, so mesh "
            f"{procs.name!r} is failed: run %mesh restart (or .restart()) to continue",
            ranks=killed,
            cause=future.exception(timeout=0) if future.done() else None,
        )
    error = future.exception(timeout=0)
    if error is not None and not _only_interrupts(error):
        raise error  # the ranks turned the interrupt into an error of their own
    where = format_ranks(busy) if busy else "none (they had finished)"
    if why == "interrupted":
        raise KeyboardInterrupt(
            f"{label} interrupted on rank(s) {where}; the mesh is usable"
        ) from error
    raise CallTimeout(
        f"{label} {why}; rank(s) {where} were interrupted and the mesh is usable",
        ranks=busy,
    ) from error


def _waiting_ranks(future: Future[Any], procs: ProcMesh) -> list[int]:
    """Ranks that have not answered ``future`` yet."""
    waiting = getattr(future, "waiting_ranks", None)
    return list(waiting()) if waiting is not None else procs.busy_ranks()


def _only_interrupts(error: BaseException) -> bool:
    return isinstance(error, RemoteError) and all(
        f.type_name == "KeyboardInterrupt" for f in error.failures
    )
