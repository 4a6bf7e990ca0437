"""Writing into a notebook cell from monarch_nb's I/O thread.

ipykernel keys buffered output by the *parent header* of the request that
produced it. A thread that is not running a cell falls back to the header of
whatever cell runs now, so output of a non-blocking cell would land in a
later cell. We capture the header when the cell starts and set it as the
writing thread's parent around each write (``set_thread_parent``, which
ipykernel's streams and display publisher provide). In a terminal IPython
there is no such thing, and text simply goes to stdout.
"""

from __future__ import annotations

import sys
from typing import Any


class IPythonFrontend:
    """Text and displays into the cell that was running when ``capture()`` was called."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        # Jupyter can replace a display in place; a terminal IPython cannot.
        self.live_updates = hasattr(shell.display_pub, "set_thread_parent")
        self._bars: dict[str, Any] = {}  # display id -> its RankProgress widget
        self._groups: dict[str, Any] = {}  # a cell's id -> its ProgressGroup widget

    def capture(self) -> Any:
        stdout: Any = sys.stdout  # ipykernel's OutStream, or a plain stream
        if hasattr(stdout, "set_thread_parent"):
            return dict(stdout.parent_header)
        return None

    def write(self, parent: Any, stream: str, text: str) -> None:
        out: Any = sys.stderr if stream == "stderr" else sys.stdout
        if parent and hasattr(out, "set_thread_parent"):
            token = out.set_thread_parent(parent)
            try:
                out.write(text)
            finally:
                out.reset_thread_parent(token)
            return  # ipykernel sends it within its flush interval, from its own thread
        out.write(text)
        out.flush()

    def display(self, parent: Any, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        self._publish(parent, data=data, metadata=metadata)

    def update(
        self, parent: Any, display_id: str, text: str, *, first: bool, final: bool = False
    ) -> None:
        """One progress bar per rank, replaced in place (``update_display_data``).

        Where widgets render it is a progress widget: the display is sent first
        and last, and the updates between move the widget.
        """
        bar = self._bars.get(display_id)
        if first:
            bar = self._progress_widget(text)
        elif bar is not None:
            bar.set(text)
            if not final:
                return
        data = bar.bundle(text) if bar is not None else {"text/plain": text}
        if bar is not None and first:
            self._bars[display_id] = bar
        if final:
            self._bars.pop(display_id, None)
        self._publish(
            parent,
            data=data,
            metadata={},
            transient={"display_id": display_id},
            update=not first,
        )

    def progress(self, parent: Any, bar: Any) -> None:
        """A cell's rank bars (``_output.BarUpdate``) as one widget display, in rank
        order; where widgets do not render, one text display per bar."""
        bars = self._groups.get(bar.group)
        if bars is None:
            bars = self._progress_group()
            if bars is None:
                self.update(parent, bar.bar_id, bar.text, first=bar.first, final=bar.final)
                return
            self._groups[bar.group] = bars
            bars.set(bar.key, bar.text)
            self._show_group(parent, bar.group, bars, update=False)
            return
        bars.set(bar.key, bar.text)
        if bar.final:  # the text of a saved notebook, or a front end without widgets
            self._show_group(parent, bar.group, bars, update=True)

    def end_progress(self, parent: Any, group: str) -> None:
        """The cell ended: its bars stay as they are, their text too (a bar left
        unfinished, by an interrupt or an error, included)."""
        bars = self._groups.pop(group, None)
        if bars is not None:
            self._show_group(parent, group, bars, update=True)

    def _show_group(self, parent: Any, group: str, bars: Any, *, update: bool) -> None:
        transient = {"display_id": group}
        self._publish(parent, data=bars.bundle(), metadata={}, transient=transient, update=update)

    def _progress_group(self) -> Any:
        from ..widgets._dashboard import widgets_available

        if not widgets_available(self.shell):
            return None
        try:
            from ..widgets._progress import ProgressGroup

            return ProgressGroup()
        except Exception:  # no comm to open (the kernel is going away): text it is
            return None

    def _progress_widget(self, text: str) -> Any:
        from ..widgets._dashboard import widgets_available

        if not widgets_available(self.shell):
            return None
        try:
            from ..widgets._progress import RankProgress

            return RankProgress(text)
        except Exception:  # no comm to open (the kernel is going away): text it is
            return None

    def _publish(self, parent: Any, **message: Any) -> None:
        publisher = self.shell.display_pub
        stdout: Any = sys.stdout
        if parent and hasattr(publisher, "set_thread_parent"):
            token = publisher.set_thread_parent(parent)
            out_token = stdout.set_thread_parent(parent)
            try:
                publisher.publish(**message)
            finally:
                stdout.reset_thread_parent(out_token)
                publisher.reset_thread_parent(token)
            return
        publisher.publish(**message)
