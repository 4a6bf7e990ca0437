"""Where rank output goes: each cell's output area, live or ordered by rank.

Worker stdout/stderr lines and rich displays arrive as events of each
mesh's stream, on monarch_nb's I/O thread. A :class:`CellOutput` is opened
for a cell before it is sent and holds that cell's destination (the
``parent`` token its frontend captured when the cell started), so a
non-blocking cell keeps writing into its own
output area after the kernel moved on. Ranks run their work in order, so the
oldest open cell on a rank owns that rank's output; output that belongs to
no cell goes wherever the kernel is writing now.

Two modes per cell: *live* (each line written as it arrives, prefixed by
rank) and *ordered* (buffered, then written rank by rank when the cell ends:
deterministic, for nbval and CI). Figures (rich displays) may be held back
in either mode and shown by rank, or as one grid, when the cell ends
(``figures``: see ``_figures``).

Progress bars (updates ending in ``\r``) are shown live as one display per
rank updated in place, where the frontend can (Jupyter); elsewhere, and in
ordered mode, only the finished line is shown, as a terminal would leave it.

A rank that raises while other ranks of its cell still run is announced in
the cell at once, one line naming the rank and the error (live mode only:
the full traceback comes when the cell ends, in either mode).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from .._controller._events import DisplayData, Event, Output, RankFailed
from .._controller._log_stream import OutputPrinter
from .._model._errors import format_ranks
from ..widgets import _render
from ._figures import grid_bundle


@dataclass(frozen=True)
class BarUpdate:
    """A progress bar's new line: which cell's group, which bar (rank, id), its text."""

    group: str  # one per cell: its bars are shown together
    rank: int
    bar_id: str  # a rank's later bars after its earlier ones
    text: str
    first: bool  # the bar's first update
    final: bool  # its last (the line ended with a newline)

    @property
    def key(self) -> tuple[int, str]:
        return (self.rank, self.bar_id)


class Frontend(Protocol):
    """How text and displays reach the user (a notebook cell, a terminal)."""

    live_updates: bool  # can replace a display in place (progress bars)

    def capture(self) -> Any:
        """A token for "the cell running now", to write into it later from any thread."""

    def write(self, parent: Any, stream: str, text: str) -> None: ...

    def display(self, parent: Any, data: dict[str, Any], metadata: dict[str, Any]) -> None: ...

    def update(
        self, parent: Any, display_id: str, text: str, *, first: bool, final: bool = False
    ) -> None: ...

    def progress(self, parent: Any, bar: BarUpdate) -> None:
        """One update of a rank's bar in a cell's group of bars, shown in rank order
        where the front end can."""

    def end_progress(self, parent: Any, group: str) -> None:
        """The cell of ``group`` ended."""


class PlainFrontend:
    """No notebook: text on our own stdout/stderr (scripts, plain ``python``)."""

    live_updates = False

    def update(
        self, parent: Any, display_id: str, text: str, *, first: bool, final: bool = False
    ) -> None:
        pass

    def progress(self, parent: Any, bar: BarUpdate) -> None:
        pass

    def end_progress(self, parent: Any, group: str) -> None:
        pass

    def capture(self) -> Any:
        return None

    def write(self, parent: Any, stream: str, text: str) -> None:
        out = sys.stderr if stream == "stderr" else sys.stdout
        out.write(text)
        out.flush()

    def display(self, parent: Any, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        self.write(parent, "stdout", str(data.get("text/plain", "")) + "\n")


class CellOutput:
    """The output of one cell (or push/pull) on some ranks of one mesh."""

    def __init__(
        self,
        router: OutputRouter,
        mesh: str,
        ranks: tuple[int, ...],
        *,
        label: str,
        ordered: bool,
        option: tuple[bool, float | None] = (True, None),
    ) -> None:
        self.router = router
        self.frontend = router.frontend
        self.parent = self.frontend.capture()
        self.mesh, self.ranks, self.label, self.ordered = mesh, ranks, label, ordered
        self.started = time.monotonic()
        self.closed = threading.Event()
        self._items: dict[int, list[tuple[str, Any]]] = {r: [] for r in ranks}
        self._progress: dict[int, str] = {}  # rank -> id of its live progress bar
        self._bars = 0
        self.wrote = False
        # The cell's call, once sent: its label tells its failures from those of
        # other work on the same ranks, its waiting ranks who still runs.
        self.future: Any = None
        self.fail_fast = False
        self.figures = "arrival"  # or "rank", "grid": held until the cell ends
        self._held: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._early: list[RankFailed] = []  # failures that came before the future
        # procs.logging_option() (stream_to_client, aggregate_window_sec): lines
        # dropped, or identical ones folded by rank set.
        self.stream_to_client, aggregate_window_sec = option
        self._folder: OutputPrinter | None = None
        if aggregate_window_sec is not None and not ordered:
            self._folder = OutputPrinter(
                lambda stream, text: self.frontend.write(self.parent, stream, text)
            )
            self._folder.configure(True, aggregate_window_sec)

    # -- I/O thread ------------------------------------------------------------------

    def line(self, rank: int, stream: str, text: str, end: str = "\n") -> None:
        if not self.stream_to_client:
            return  # in the ranks' log files only (procs.logs())
        if self.ordered:
            if end == "\n":
                self._items[rank].append((stream, text))
            return
        if end == "\r" or rank in self._progress:
            self._update_progress(rank, text, final=end != "\r")
            return
        self.wrote = True
        if self._folder is not None:
            self._folder(Output(self.mesh, rank, stream, text, end))
            return
        # Live lines of many ranks interleave: each rank's prefix in its colour (in
        # Jupyter; ordered output, as nbval compares it, stays plain).
        line = _render.rank_prefix(rank, text, colour=self.frontend.live_updates)
        self.frontend.write(self.parent, stream, line)

    def _update_progress(self, rank: int, text: str, *, final: bool) -> None:
        if not self.frontend.live_updates:
            if final:
                self.frontend.write(self.parent, "stderr", _render.rank_prefix(rank, text))
            return
        first = rank not in self._progress
        if first:  # a bar of its own, after this rank's earlier ones
            self._bars += 1
            self._progress[rank] = f"monarch-nb-{id(self)}-{rank}-{self._bars}"
        self.wrote = True
        label = _render.rank_prefix(rank, text).rstrip("\n")
        bar = BarUpdate(f"monarch-nb-{id(self)}", rank, self._progress[rank], label, first, final)
        self.frontend.progress(self.parent, bar)
        if final:
            del self._progress[rank]  # the next bar on this rank is a new one

    def display(self, rank: int, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        if self.figures != "arrival":
            self._held.append((rank, data, metadata))
        elif self.ordered:
            self._items[rank].append(("display", (data, metadata)))
        else:
            self.wrote = True
            self.frontend.display(self.parent, *_render.label_bundle(rank, data, metadata))

    def attach(self, future: Any) -> None:
        """The cell's call was sent (caller's thread); failures that raced it are told now."""
        with self._lock:
            self.future = future
            early, self._early = self._early, []
        for event in early:
            self.failed(event)

    def failed(self, event: RankFailed) -> None:
        """A rank of this cell raised: say so now if other ranks still run (live mode)."""
        if self.ordered or event.cause.startswith("KeyboardInterrupt"):
            return  # ordered output is deterministic; an interrupt is not a failure
        with self._lock:
            future = self.future
            if future is None:  # the rank answered before exec() returned here
                self._early.append(event)
                return
        if future.label != event.label:
            return  # another call on this rank failed, not this cell (or it ended)
        running = [r for r in future.waiting_ranks() if r != event.rank]
        if not running:
            return  # the cell ends now: its traceback follows at once
        if self.fail_fast:
            then = f"--fail-fast: interrupting rank(s) {format_ranks(running)}"
        else:
            then = f"rank(s) {format_ranks(running)} still running; traceback at the end"
        self.wrote = True
        text = _render.rank_prefix(event.rank, f"failed: {event.cause} ({then})")
        self.frontend.write(self.parent, "stderr", text)

    def close(self) -> None:
        """Write what ordered mode held back, rank by rank, and stop receiving."""
        try:
            self.router.detach(self)
            if self._folder is not None:
                self._folder.flush()
            if self._bars:
                self.frontend.end_progress(self.parent, f"monarch-nb-{id(self)}")
            for rank in self.ranks:
                for kind, item in self._items[rank]:
                    self.wrote = True
                    if kind == "display":
                        self.frontend.display(self.parent, *_render.label_bundle(rank, *item))
                    else:
                        self.frontend.write(self.parent, kind, _render.rank_prefix(rank, item))
            self._items.clear()
            self._show_held()
        finally:
            self.closed.set()

    def _show_held(self) -> None:
        """The figures held back: by rank (each rank's in the order it made them),
        or as one grid."""
        held, self._held = sorted(self._held, key=lambda item: item[0]), []
        if not held:
            return
        self.wrote = True
        if self.figures == "grid":
            self.frontend.display(self.parent, *grid_bundle(held))
            return
        for rank, data, metadata in held:
            self.frontend.display(self.parent, *_render.label_bundle(rank, data, metadata))


class MapProgress:
    """``map: 37/100 items`` in the running cell, updated in place (Jupyter) at most
    ten times a second; elsewhere only the final line."""

    MIN_INTERVAL_S = 0.1

    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend
        self.parent = frontend.capture()
        self.display_id = f"monarch-nb-map-{id(self)}"
        self._lock = threading.Lock()
        self._shown = False
        self._last = 0.0
        self._final = False

    def update(self, done: int, total: int, *, final: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if self._final or (not final and now - self._last < self.MIN_INTERVAL_S):
                return
            self._last, self._final = now, final
            text = f"map: {done}/{total} items"
            if self.frontend.live_updates:
                first, self._shown = not self._shown, True
                self.frontend.update(self.parent, self.display_id, text, first=first, final=final)
            elif final:
                self.frontend.write(self.parent, "stderr", text + "\n")


class OutputRouter:
    """Observes the notebook meshes' events: sends each rank's output to its cell."""

    def __init__(self, frontend: Frontend | None = None) -> None:
        self.frontend: Frontend = frontend or PlainFrontend()
        self._lock = threading.Lock()
        self._cells: dict[tuple[str, int], deque[CellOutput]] = {}

    def open(
        self,
        mesh: str,
        ranks: tuple[int, ...],
        *,
        label: str,
        ordered: bool,
        option: tuple[bool, float | None] = (True, None),
    ) -> CellOutput:
        cell = CellOutput(self, mesh, ranks, label=label, ordered=ordered, option=option)
        return self.attach(cell)

    def attach(self, cell: CellOutput) -> CellOutput:
        """Route the output of ``cell.ranks`` of ``cell.mesh`` to ``cell``, once the cells
        opened before it on those ranks are closed."""
        with self._lock:
            for rank in cell.ranks:
                self._cells.setdefault((cell.mesh, rank), deque()).append(cell)
        return cell

    def detach(self, cell: CellOutput) -> None:
        with self._lock:
            for rank in cell.ranks:
                queue = self._cells.get((cell.mesh, rank))
                if queue is not None:
                    try:
                        queue.remove(cell)
                    except ValueError:
                        pass
                    if not queue:
                        del self._cells[(cell.mesh, rank)]

    def owner(self, mesh: str, rank: int) -> CellOutput | None:
        with self._lock:
            queue = self._cells.get((mesh, rank))
            return queue[0] if queue else None

    # -- I/O thread ---------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if isinstance(event, Output):
            self.on_output(event)
        elif isinstance(event, DisplayData):
            self.on_display(event)
        elif isinstance(event, RankFailed) and event.returncode is None:
            cell = self.owner(event.mesh, event.rank)
            if cell is not None:
                cell.failed(event)

    def on_output(self, output: Output) -> None:
        cell = self.owner(output.mesh, output.rank)
        if cell is not None:
            cell.line(output.rank, output.stream, output.line, output.end)
        elif output.end == "\r":
            return  # a progress update outside any cell: only its final line is shown
        else:
            text = _render.rank_prefix(output.rank, output.line)
            self.frontend.write(None, output.stream, text)

    def on_display(self, event: DisplayData) -> None:
        cell = self.owner(event.mesh, event.rank)
        if cell is not None:
            cell.display(event.rank, event.data, event.metadata)
        else:
            bundle = _render.label_bundle(event.rank, event.data, event.metadata)
            self.frontend.display(None, *bundle)
