"""``%mesh restart --replay`` in a notebook: one header per replayed step, output hidden.

A replay runs the notebook's cells again to rebuild the ranks' state; what
they printed, drew or displayed the first time is already on the page.
Shown again it buries the notebook (every print, progress bars on stderr,
figures, widgets) and costs time to render. So each step gets one line,
``replaying [3] (1/5)``, and its output is counted, not shown
(``--show-output`` shows it under its header). ``--skip-display`` leaves out
the cells that only display (see :func:`only_displays`): they build no state.
"""

from __future__ import annotations

import ast
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from .._model._fold import format_ranks
from ._output import CellOutput
from ._selection import select

if TYPE_CHECKING:
    from .._controller._history import Step
    from ._registry import NotebookMesh

# Calls that only show something: print/display and their kin, and matplotlib's
# pyplot (plt.plot(...), plt.show()). Anything else may change state.
_SHOWING = frozenset({"print", "display", "pprint", "repr", "str", "len", "type"})
_SHOWING_MODULES = frozenset({"plt", "pyplot", "IPython.display"})
_CELL_NUMBER = re.compile(r"<mesh-cell-([\d.]+)>")
_SETTLE_S = 10.0  # the I/O thread hands out a step's last output well within this


def only_displays(source: str) -> bool:
    """Whether a cell does nothing but show things: every statement an expression that
    names values or calls only ``print``, ``display``, ``pprint`` (and ``repr``,
    ``str``, ``len``, ``type``) or matplotlib's ``plt.*``. An assignment, an
    import, a definition, a loop or any other call builds state: not skipped."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    if not tree.body:
        return False
    return all(isinstance(node, ast.Expr) and _shows(node.value) for node in tree.body)


def _shows(expression: ast.expr) -> bool:
    for node in ast.walk(expression):
        if isinstance(node, ast.Call) and not _showing_call(node.func):
            return False
        if isinstance(node, ast.Await | ast.Yield | ast.YieldFrom | ast.NamedExpr):
            return False
    return True


def _showing_call(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in _SHOWING
    if isinstance(func, ast.Attribute):
        return ast.unparse(func.value) in _SHOWING_MODULES
    return False


def step_title(step: Step) -> str:
    """``[3]`` for the cell In [3], else the step's own label (``push lr``)."""
    if step.kind == "cell":
        match = _CELL_NUMBER.search(step.payload[0])
        if match:
            return f"[{match.group(1)}]"
    return step.label


class _HiddenOutput(CellOutput):
    """A replay's output, counted and not shown."""

    lines = 0
    displays = 0

    def line(self, rank: int, stream: str, text: str, end: str = "\n") -> None:
        if end != "\r":  # a progress bar's updates are not lines
            self.lines += 1

    def display(self, rank: int, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        self.displays += 1


def replay_restart(
    mesh: NotebookMesh,
    ranks: str | list[int] | None,
    *,
    show_output: bool = False,
    skip_display: bool = False,
) -> tuple[Any, str]:
    """``%mesh restart [--ranks R] --replay``: the restart's record, and the summary
    line to show after the headers."""
    router = mesh.registry.router
    frontend = router.frontend
    parent = frontend.capture()
    started = time.monotonic()  # then, from the first step: the restart took its own time
    skipped: list[str] = []
    cell: CellOutput | None = None
    restarted = select(mesh.procs, ranks, None).shape.ranks if ranks else mesh.procs.shape.ranks

    def settle() -> None:
        # What the last step printed, handed out before the next header.
        done = threading.Event()
        mesh.procs.events.after_received(done.set)
        done.wait(_SETTLE_S)

    def on_step(index: int, total: int, step: Step) -> None:
        nonlocal cell, started
        if index > 1:
            settle()
        else:
            started = time.monotonic()
        if cell is None:
            kind = CellOutput if show_output else _HiddenOutput
            cell = router.attach(kind(router, mesh.name, restarted, label="replay", ordered=False))
        shown = tuple(r for r in step.shape.ranks if r in restarted)
        on = f" on ranks {format_ranks(shown)}" if shown != mesh.procs.shape.ranks else ""
        frontend.write(parent, "stdout", f"replaying {step_title(step)}{on} ({index}/{total})\n")

    def skip(step: Step) -> bool:
        if skip_display and step.kind == "cell" and only_displays(step.payload[1]):
            skipped.append(step_title(step))
            return True
        return False

    try:
        record = mesh.restart(ranks, replay=True, on_step=on_step, skip=skip)
    finally:
        if cell is not None:
            settle()
            cell.close()
    seconds = time.monotonic() - started
    restarted_in = f"restarted in {record.seconds:.1f} s, " if record.seconds else ""
    parts = [
        f"{restarted_in}replayed {len(record.replayed)} step(s) of mesh {mesh.name!r} "
        f"in {seconds:.1f} s"
    ]
    if skipped:
        parts.append(f"skipped {len(skipped)} cell(s) that only display: {', '.join(skipped)}")
    if isinstance(cell, _HiddenOutput) and (cell.lines or cell.displays):
        parts.append(
            f"their output ({cell.lines} line(s), {cell.displays} display(s)) is not shown "
            "again: --show-output shows it"
        )
    return record, "; ".join(parts) + " (%mesh history lists the steps)"
