"""Running code cells on ranks, from the controller: the runtime side of ``%%mesh``.

A cell is compiled here first (a SyntaxError never reaches a worker) and
registered in ``linecache`` under the same ``<mesh-cell-N>`` name the ranks
use, so remote tracebacks show the cell's own lines. Each rank runs it in its
persistent namespace (:mod:`monarch_nb._worker._namespace`).

Nothing here imports IPython: magics/ translates between this and a notebook.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._model._errors import CellError
from .._runtime._cell_source import cache_source, compile_cell, next_cell_name
from .._wire._messages import Pull, Push, RunCell
from . import _interrupt
from ._calls import CallFuture, send_call

if TYPE_CHECKING:
    from .._model._shape import Shape
    from ._process_group import ProcGroup


class CellTarget(Protocol):
    """What running a cell needs of a process mesh (a ProcMesh is one): its
    processes, and the view of them to run on."""

    _group: ProcGroup

    @property
    def shape(self) -> Shape: ...


def run_cell(
    procs: CellTarget,
    source: str,
    *,
    name: str | None = None,
    fail_fast: bool = False,
    replay: bool = True,
    record: bool = True,
) -> CallFuture:
    """Run ``source`` on every rank of ``procs``; a future of the last expression's values.

    Raises SyntaxError at once (locally) if the cell does not compile. With
    ``fail_fast`` the first rank that raises interrupts the others (see
    :func:`~._interrupt.fail_fast`). The cell becomes a step of the mesh's
    history (``record``), sent again by ``restart(replay=True)`` if it
    succeeded and ``replay`` is true.
    """
    filename = name or next_cell_name()[1]
    compile_cell(source, filename)  # SyntaxError here, before anything is sent
    cache_source(filename, source)
    future = send_call(
        procs._group,
        procs.shape,
        lambda call_id: RunCell(call_id, filename),
        source,
        actor=f"cell {filename}",
        error_class=CellError,
    ).future
    if fail_fast:
        _interrupt.fail_fast(future)
    if record:
        history = procs._group.history
        step = history.record(
            "cell", f"cell {filename}", procs.shape, (filename, source), replay=replay
        )
        history.watch(step, future)
    return future


def push(procs: CellTarget, values: Mapping[str, Any], *, record: bool = True) -> CallFuture:
    """Set names in every rank's namespace (the values are pickled once)."""
    values = dict(values)
    future = send_call(procs._group, procs.shape, Push, values, actor="push").future
    if record:
        history = procs._group.history
        history.watch(
            history.record("push", f"push {', '.join(values)}", procs.shape, values), future
        )
    return future


def pull(procs: CellTarget, name: str) -> CallFuture:
    """A future of a ValueMesh of ``name`` in every rank's namespace."""
    return send_call(
        procs._group,
        procs.shape,
        lambda call_id: Pull(call_id, name),
        None,
        actor=f"pull {name!r}",
    ).future
