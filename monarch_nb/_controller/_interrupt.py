"""Stopping a call the caller gave up on: Ctrl-C or a timeout reaches the ranks.

The ranks still running the call get an ``Interrupt`` (KeyboardInterrupt in
their user code; Python code stops at once and the mesh stays usable). After
a grace period a rank that is still busy is stuck outside Python (in C, in a
collective) and is killed, which fails the mesh with an error naming it. A
second Ctrl-C during the grace period kills at once.

Lives in the runtime, so a plain script's Ctrl-C on ``.get()`` leaves no
rank running; the notebook layer only wires the kernel's interrupt to it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._common._errors import CallTimeout, MeshFailure, RemoteError, format_ranks

if TYPE_CHECKING:
    from .._common._pending import CallFuture

GRACE_S = float(os.environ.get("MONARCH_NB_INTERRUPT_GRACE", "3"))
_AFTER_KILL_S = 10.0  # the pidfd reports a SIGKILLed rank at once; this is a safety net


def wait_for(
    future: CallFuture,
    *,
    timeout: float | None = None,
    grace: float = GRACE_S,
) -> Any:
    """``future.get()``; on ``timeout`` the ranks still running are interrupted too.

    Raises KeyboardInterrupt if the ranks stopped on an interrupt, CallTimeout
    on ``timeout``, MeshFailure naming the ranks that had to be killed, or the
    call's own error.
    """
    try:
        return future.get(timeout=timeout)
    except CallTimeout:
        return stop_call(future, why=f"did not finish within {timeout} s", grace=grace)


def stop_call(future: CallFuture, *, why: str, grace: float) -> Any:
    """Interrupt the ranks still running ``future``'s call, kill them after ``grace`` s.

    Returns the call's value if it finished anyway; otherwise raises (see
    :func:`wait_for`).
    """
    call = future._call
    group = call.group if call is not None else None
    label = future.label
    busy = future.waiting_ranks()
    if group is not None and busy and call is not None:
        group.interrupt(busy, call.call_id)  # this call only, queued or running
    killed: list[int] = []
    try:
        future.exception(timeout=grace)
    except KeyboardInterrupt:
        killed = future.waiting_ranks()  # interrupted twice: do not wait any longer
    except TimeoutError:
        killed = future.waiting_ranks()
    if killed and group is not None:
        group.kill_ranks(killed)
        try:
            future.exception(timeout=_AFTER_KILL_S)
        except TimeoutError:
            pass
        raise MeshFailure(
            f"{label} {why}; rank(s) {format_ranks(killed)} did not stop within {grace} s "
            f"of the interrupt (stuck outside Python?) and were killed, so mesh "
            f"{group.name!r} is failed: call restart() (%mesh restart) to continue",
            ranks=killed,
            cause=future.exception(timeout=0) if future.done() else None,
        )
    error = future.exception(timeout=0)
    if error is None and why != "interrupted":
        return future.get(timeout=0)  # it finished just as the timeout struck: no harm
    if error is None:  # Ctrl-C means stop here, even if the call finished meanwhile
        raise KeyboardInterrupt(f"{label} interrupted (it had finished on every rank)")
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


def _only_interrupts(error: BaseException) -> bool:
    return isinstance(error, RemoteError) and all(
        f.type_name == "KeyboardInterrupt" for f in error.failures
    )
