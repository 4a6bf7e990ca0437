"""The failure panel, and a rank's last lines of output on demand."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import ipywidgets as w

from ._model import FailureRecord
from ._text import failures_html, output_html, search_html

TAIL_LINES = 30  # of the core's per-rank ring buffer (OUTPUT_TAIL_LINES)
MAX_RANK_BUTTONS = 8


class FailurePanel:
    """Failures as they happen, identical ones folded by rank set, newest first; a
    rank picker shows that rank's output; ``clear`` empties the list.

    Picking the rank of a failure is one click: the panel offers a button per
    recently failed rank, and a dropdown for any rank.
    """

    def __init__(
        self,
        ranks: Sequence[int],
        tail: Callable[[int], list[str]],
        clear: Callable[[], None] | None = None,
        search: Callable[[int, str], list[str]] | None = None,
    ) -> None:
        self._tail = tail
        self._clear = clear
        self._search = search
        self.list = w.HTML(failures_html(()))
        self.buttons = w.HBox([])
        self.clear_button = w.Button(
            description="clear",
            tooltip="forget the failures listed (the ranks are not touched)",
            layout=w.Layout(width="auto", display="none"),
        )
        self.clear_button.add_class("mnb-clear-failures")
        self.clear_button.on_click(lambda _: self.clear())
        self.picker = w.Dropdown(
            options=[("-", None)] + [(f"rank {r}", r) for r in ranks],
            value=None,
            description="output of",
            layout=w.Layout(width="180px"),
        )
        # Searches the picked rank's log file (all it ever wrote, not just the
        # last lines); run on Enter, not on every key.
        self.search = w.Text(
            placeholder="search its log (regex)",
            continuous_update=False,
            layout=w.Layout(width="220px", display="" if search else "none"),
        )
        self.output = w.HTML()
        self.picker.observe(self._on_pick, names="value")
        self.search.observe(self._on_pick, names="value")
        self.widget = w.VBox(
            [
                self.list,
                w.HBox([self.picker, self.search, self.buttons, self.clear_button]),
                self.output,
            ]
        )
        self.widget.add_class("mnb-failure-panel")
        self._shown: tuple[FailureRecord, ...] = ()
        self._button_ranks: tuple[int, ...] = ()

    def set_ranks(self, ranks: Sequence[int]) -> None:
        """Offer these ranks in the picker (the mesh was resized)."""
        self.picker.value = None
        self.picker.options = [("-", None)] + [(f"rank {r}", r) for r in ranks]

    def select(self, rank: int | None) -> None:
        """Show ``rank``'s last lines (None hides them)."""
        self.picker.value = rank

    def _on_pick(self, change: dict) -> None:
        self.refresh_output()

    def refresh_output(self, *, searched: bool = True) -> None:
        """Show the picked rank's last lines, or its log lines matching the search
        (``searched=False``: leave a search's result as it is, as redraws do)."""
        rank = self.picker.value
        pattern = self.search.value.strip()
        if rank is None:
            value = ""
        elif pattern and self._search is not None:
            if not searched:
                return
            try:
                value = search_html(rank, pattern, self._search(rank, pattern)[-TAIL_LINES:])
            except Exception as exc:  # a bad regex, a mesh whose files are elsewhere
                value = search_html(rank, pattern, [], error=str(exc))
        else:
            value = output_html(rank, self._tail(rank)[-TAIL_LINES:])
        if self.output.value != value:
            self.output.value = value

    def clear(self) -> None:
        """Forget the failures listed (the mesh's log too); the next draw shows none."""
        if self._clear is not None:
            self._clear()
        self.update(())

    def update(self, failures: tuple[FailureRecord, ...]) -> None:
        if failures != self._shown:
            self._shown = failures
            with self.list.hold_sync():
                self.list.value = failures_html(failures)
            # The ranks of the newest failures first.
            ranks = tuple(dict.fromkeys(f.rank for f in reversed(failures)))[:MAX_RANK_BUTTONS]
            if ranks != self._button_ranks:
                self._button_ranks = ranks
                old, self.buttons.children = self.buttons.children, [self._button(r) for r in ranks]
                for button in old:
                    button.close()
            self.clear_button.layout.display = "" if failures else "none"
        if self.picker.value is not None:
            self.refresh_output(searched=False)  # a search reads files: only when asked

    def _button(self, rank: int) -> w.Button:
        button = w.Button(
            description=f"rank {rank}", button_style="danger", layout=w.Layout(width="auto")
        )
        button.on_click(lambda _: self.select(rank))
        return button

    def close(self) -> None:
        for child in self.buttons.children:
            child.close()
        widgets = [self.list, self.buttons, self.clear_button, self.picker, self.search]
        for widget in (*widgets, self.output, self.widget):
            widget.close()
