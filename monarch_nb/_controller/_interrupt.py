"""Stopping a call the caller gave up on: Ctrl-C or a timeout reaches the ranks.

The ranks still running the call get an ``Interrupt`` (KeyboardInterrupt in
their user code; Python code stops at once and the mesh stays usable). After
a grace period a rank that is still busy is stuck outside Python (in C, in a
collective) and is killed, which fails the mesh with an error naming it. A
second Ctrl-C during the grace period kills at once.

Lives in the runtime, so a plain script's Ctrl-C on ``.get()`` leaves no
rank running; the notebook layer only wires the kernel's interrupt to it.

:func:`fail_fast` applies the same to the ranks of a call as soon as one of
them failed: the others stop instead of running on (or waiting forever in a
collective for the rank that failed).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from .._model._errors import (
    CallTimeout,
    MeshFailure,
    RemoteError,
    RemoteFailure,
    StuckRanksKilled,
    format_ranks,
)
from .._model._hints import restart_hint, restart_ranks_hint
from ._diagnose import diagnose_all

if TYPE_CHECKING:
    from .._runtime._pending import CallFuture, PendingCall
    from ._group_protocol import InterruptibleGroup

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
    if killed and group is not None and call is not None:
        # Where they are stuck (a collective a rank never joined?), read before the kill.
        where_stuck = _where_stuck(group)
        stuck = (
            f"{label} {why}; rank(s) {format_ranks(killed)} did not stop within {grace} s "
            f"of the interrupt (stuck outside Python?) and were killed"
        )
        failure = StuckRanksKilled(
            f"{stuck}; {_after_kill(group.name, killed)}{where_stuck}",
            ranks=killed,
            cause=call.error_so_far() if call.failures else None,
            mesh=group.name,
            stuck=stuck,
            where=where_stuck,
        )
        # The call fails with this error, not with the deaths the kill brings: a
        # --no-block cell's handle says the same as a blocking cell.
        call.fail(failure)
        group.kill_ranks(killed, why=f"it did not stop within {grace} s of the interrupt")
        _wait_dead(group, killed)
        raise failure
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


def _wait_dead(group: InterruptibleGroup, ranks: list[int]) -> None:
    """Until the I/O thread has seen ``ranks`` exit (their pidfds report a SIGKILL at
    once) and reported it, so that what follows (a restart, a status) sees them dead
    and their deaths are on record."""
    deadline = time.monotonic() + _AFTER_KILL_S
    while time.monotonic() < deadline:
        if all(group.workers[r].returncode is not None for r in ranks):
            break
        time.sleep(0.02)
    loop = group.controller.loop
    if loop.in_loop_thread:
        return
    # The I/O thread sets a returncode first, then drains the rank's output and
    # reports its death, in the same callback. A restart begun before that report
    # took it for the replaced process's exit and dropped it: the rank's death
    # was never recorded (seen under load). One more turn of the loop waits for it.
    reported = threading.Event()
    try:
        loop.call_soon(reported.set)
    except RuntimeError:
        return  # the controller shut down: nothing left to report
    reported.wait(max(0.0, deadline - time.monotonic()) + 1.0)


def _where_stuck(group: InterruptibleGroup) -> str:
    """The hang diagnosis as a paragraph of an error message, or "" when no rank is in a
    collective. Of every rank of the mesh, not only those still busy: the
    rank a collective waits for has often finished its cell and is idle."""
    try:
        report = diagnose_all(group, timeout=1.0, py_spy=False)
    except BaseException:  # never in the way of the kill: not even a second Ctrl-C
        return ""
    if not report.collectives():
        return ""
    return "; where the ranks were before the kill:\n" + str(report)


def fail_fast(future: CallFuture, *, grace: float = GRACE_S) -> None:
    """When a rank of ``future``'s call fails, interrupt the ranks still running it.

    A rank that is still busy ``grace`` s later (stuck outside Python, e.g. in
    a collective waiting for the rank that failed) is killed, and the call
    fails with a MeshFailure naming it, whose ``.cause`` is the call's
    RemoteError. Otherwise the call fails as usual, with a RemoteError whose
    interrupted ranks are named on one line and whose ``.values`` hold what
    the ranks that finished returned.
    """
    call = future._call
    if call is None or future.done() or call.group is None:
        return
    group = call.group
    lock = threading.Lock()
    fired: list[RemoteFailure] = []

    def on_failure(failure: RemoteFailure) -> None:
        if failure.type_name == "KeyboardInterrupt":
            return  # an interrupt is what stops the others, not a reason to
        with lock:
            if fired:
                return
            fired.append(failure)
        others = [r for r in future.waiting_ranks() if r != failure.rank]
        if not others:
            return
        group.interrupt(others, call.call_id)
        loop = group.controller.loop

        def escalate() -> None:
            _kill_stuck(future, call, failure, others, grace)

        loop.call_soon(lambda: loop.call_later(grace, escalate))

    call.on_failure = on_failure
    for failure in list(call.failures):  # any that arrived before the hook was set
        on_failure(failure)


def _kill_stuck(
    future: CallFuture,
    call: PendingCall,
    first: RemoteFailure,
    interrupted: list[int],
    grace: float,
) -> None:
    """``grace`` s after a fail-fast interrupt: kill the ranks still running the call."""
    stuck = future.waiting_ranks()
    if not stuck:
        return
    group = call.group
    error = MeshFailure(
        f"{call.label} failed on rank {first.rank} ({first.type_name}: {first.message}); "
        f"fail-fast interrupted rank(s) {format_ranks(interrupted)}, and rank(s) "
        f"{format_ranks(stuck)} did not stop within {grace} s (stuck outside Python, e.g. "
        f"in a collective waiting for rank {first.rank}) and were killed; "
        f"{_after_kill(group.name, stuck)}",
        ranks=stuck,
        cause=call.error_so_far(),
    )
    call.fail(error)  # before the kill, so this error wins over the mesh failure's
    group.kill_ranks(stuck, why=f"it did not stop within {grace} s of fail-fast's interrupt")


def _after_kill(mesh: str, killed: list[int]) -> str:
    """What a user does next once fail-fast killed ``killed``: the other ranks
    keep their state, so both a partial restart and the survivors are offered."""
    return (
        f"the other ranks of mesh {mesh!r} keep their state (healthy() is their view); "
        f"{restart_ranks_hint(mesh, killed)} to replace the killed ones, or "
        f"{restart_hint(mesh)} for every rank"
    )


def _only_interrupts(error: BaseException) -> bool:
    return isinstance(error, RemoteError) and all(
        f.type_name == "KeyboardInterrupt" for f in error.failures
    )
