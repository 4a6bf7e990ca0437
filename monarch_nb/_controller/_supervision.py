"""The top of the supervision tree: failures of meshes the controller owns.

A mesh an actor started reports its failure to that actor's ``__supervise__``
(in the actor's worker); a mesh the controller started (or one whose owner
did not handle a child's failure, which fails the owner's own mesh) ends up
here, and :func:`unhandled_fault_hook` is called with its ``MeshFailure``.

Monarch programs replace the hook by assignment, as in Monarch::

    import monarch_nb.actor

    def on_fault(failure: MeshFailure) -> None:
        print("lost:", failure)

    monarch_nb.actor.unhandled_fault_hook = on_fault

The default hook does nothing: the mesh is failed already, and the next call
or cell on it raises the failure (Monarch's default exits the process). A
hook that returns drops the fault (the mesh stays failed all the same); a
hook that raises, ``sys.exit()`` included, makes it unhandled: the error is
logged with the failure and the main thread gets a KeyboardInterrupt, as in
Monarch. The hook runs on a thread of its own, never on the I/O thread, so it
may call meshes and block.
"""

from __future__ import annotations

import _thread
import logging
import queue
import signal
import threading
from collections.abc import Callable

from .._model._errors import MeshFailure
from .._runtime import _context

_log = logging.getLogger("monarch_nb")


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """Do nothing: the failed mesh raises ``failure`` at its next call or cell."""


_hook: Callable[[MeshFailure], object] = default_unhandled_fault_hook
_faults: queue.SimpleQueue[MeshFailure] = queue.SimpleQueue()
_runner: threading.Thread | None = None
_runner_lock = threading.Lock()


def get_unhandled_fault_hook() -> Callable[[MeshFailure], object]:
    return _hook


def set_unhandled_fault_hook(hook: Callable[[MeshFailure], object] | None) -> None:
    """Call ``hook(failure)`` for every unhandled mesh failure (None: the default)."""
    global _hook
    if hook is not None and not callable(hook):
        raise TypeError(f"unhandled_fault_hook must be a function of one MeshFailure, got {hook!r}")
    _hook = hook or default_unhandled_fault_hook
    custom = _hook is not default_unhandled_fault_hook
    _context.set_unowned_failure_hook(_on_unowned_failure if custom else None)


def _on_unowned_failure(failure: MeshFailure) -> None:
    # Called on the I/O thread: hand over, never run user code here.
    global _runner
    with _runner_lock:
        if _runner is None:
            _runner = threading.Thread(target=_run_hooks, name="monarch_nb-faults", daemon=True)
            _runner.start()
    _faults.put(failure)


def _run_hooks() -> None:
    while True:
        failure = _faults.get()
        hook = _hook
        try:
            hook(failure)
        except BaseException as exc:  # sys.exit() too: the fault is unhandled
            _log.error(
                "monarch_nb: unhandled_fault_hook %r raised %s, so this failure is "
                "unhandled and the main thread is interrupted: %s",
                getattr(hook, "__name__", hook),
                type(exc).__name__,
                failure.report(),
                exc_info=not isinstance(exc, SystemExit),
            )
            _interrupt_main_thread()


def _interrupt_main_thread() -> None:
    """KeyboardInterrupt in the main thread now, even inside ``time.sleep`` or a
    blocking wait: ``_thread.interrupt_main`` only sets a flag that a sleeping
    thread reads when it wakes. A real SIGINT interrupts the system call; it is
    sent only when Python handles SIGINT (otherwise it would kill the process)."""
    if callable(signal.getsignal(signal.SIGINT)):
        main = threading.main_thread().ident
        assert main is not None
        signal.pthread_kill(main, signal.SIGINT)
    else:
        _thread.interrupt_main()
