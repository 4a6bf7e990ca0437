"""The notebook's stop: what the kernel's stop button and the panel's interrupt do.

An interrupt raises KeyboardInterrupt in the ranks' user code. A rank still
running ``interrupt_grace`` s later (the setting, or ``MONARCH_NB_INTERRUPT_GRACE``;
3 s by default) is stuck outside Python: in C, or in a collective waiting for a
rank that never joins. The runtime kills it (:class:`StuckRanksKilled`, its
exit reported as killed by monarch_nb, not as a crash); the notebook then
starts a fresh process in its place at once, so the mesh is usable without
``%mesh restart``, and says which ranks, why (the hang diagnosis) and what the
fresh ones lack (their namespaces start empty).

A ``%%mesh --no-block`` cell runs while the kernel is idle, when ipykernel
ignores SIGINT (the stop button did nothing). :func:`arm_idle_stop` leaves a
SIGINT handler that ipykernel restores after each cell; between cells it stops
the ``--no-block`` cells in flight, each on a thread of its own (a signal
handler must not wait), and writes the outcome into that cell's output.
"""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any

from .._controller import _interrupt
from .._model._errors import StuckRanksKilled
from ._replace import replace_stuck
from ._tracebacks import notebook_words

if TYPE_CHECKING:
    from ._registry import CellHandle, MeshRegistry, NotebookMesh


def stop_handle(mesh: NotebookMesh, handle: CellHandle, grace: float | None = None) -> str:
    """Interrupt a ``--no-block`` cell's ranks; kill and replace those that do not stop
    within ``grace`` s. Returns what happened, in words ("" if it had finished)."""
    if grace is None:
        grace = _interrupt.GRACE_S  # the setting, as configured now
    try:
        handle.future.interrupt(grace)
    except StuckRanksKilled as exc:
        error = replace_stuck(mesh, exc)
        cell = handle.cell
        if cell is not None:
            # The handle's own report skips this error (see _extension): said once, here.
            text = notebook_words(f"StuckRanksKilled: {error}")
            cell.frontend.write(cell.parent, "stderr", text + "\n")
        return notebook_words(f"StuckRanksKilled: {str(error).splitlines()[0]}")
    except KeyboardInterrupt as exc:
        return str(exc)  # the cell's output shows the error with where the ranks were
    except Exception as exc:  # the ranks turned the interrupt into an error of their own
        return f"{handle.label}: {type(exc).__name__}: {exc}"
    return ""


def stop_in_flight(mesh: NotebookMesh, grace: float | None = None) -> str:
    """The panel's interrupt: every ``--no-block`` cell of ``mesh`` in flight is stopped
    as :func:`stop_handle` does (in parallel), and any other busy rank interrupted."""
    handles = list(mesh.in_flight)
    busy = mesh.procs.busy_ranks()
    said: dict[int, str] = {}

    def stop(i: int, handle: CellHandle) -> None:
        said[i] = stop_handle(mesh, handle, grace)

    threads = [
        threading.Thread(target=stop, args=(i, h), name="monarch_nb stop", daemon=True)
        for i, h in enumerate(handles)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    busy = sorted({*busy, *mesh.interrupt()})  # and whatever else runs (actor calls)
    # A stopped cell says so in its own output; the ones that had to be killed, here too.
    killed = [said[i] for i in range(len(handles)) if "StuckRanksKilled" in said.get(i, "")]
    if not busy:
        return "no rank was busy"
    return "; ".join([f"interrupted ranks {busy}", *killed])


class _IdleStop:
    """The SIGINT handler between cells: stops the ``--no-block`` cells in flight."""

    def __init__(self, registry: MeshRegistry) -> None:
        self.registry = registry

    def __call__(self, signum: int, frame: Any) -> None:
        for mesh in self.registry.all():
            for handle in list(mesh.in_flight):
                threading.Thread(
                    target=stop_handle, args=(mesh, handle), name="monarch_nb stop", daemon=True
                ).start()


def arm_idle_stop(shell: Any, registry: MeshRegistry) -> None:
    """Make the kernel's stop button reach ``--no-block`` cells: call while a cell runs.

    ipykernel ignores SIGINT between cells: it saves that disposition before each
    cell (``saved_sigint_handler``) and restores it after. Saving ours in its
    place leaves it installed once this cell ends; with no ``--no-block`` cell in
    flight it does nothing, as ignoring did.
    """
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "saved_sigint_handler"):
        return  # not ipykernel (a terminal IPython gets Ctrl-C as it always did)
    if isinstance(kernel.saved_sigint_handler, _IdleStop):
        return
    if kernel.saved_sigint_handler not in (signal.SIG_IGN, None):
        return  # someone else's handler: keep it
    kernel.saved_sigint_handler = _IdleStop(registry)
