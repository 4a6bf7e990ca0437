"""The failure panel, and a rank's last lines of output on demand."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import ipywidgets as w

from ._model import FailureRecord
from ._text import failures_html, output_html

TAIL_LINES = 30  # of the core's per-rank ring buffer (OUTPUT_TAIL_LINES)


class FailurePanel:
    """Failures as they happen (newest last); a rank picker shows that rank's output.

    Picking the rank of a failure is one click: the panel offers a button per
    failed rank, and a dropdown for any rank.
    """

    def __init__(self, ranks: Sequence[int], tail: Callable[[int], list[str]]) -> None:
        self._tail = tail
        self.list = w.HTML(failures_html(()))
        self.buttons = w.HBox([])
        self.picker = w.Dropdown(
            options=[("-", None)] + [(f"rank {r}", r) for r in ranks],
            value=None,
            description="output of",
            layout=w.Layout(width="180px"),
        )
        self.output = w.HTML()
        self.picker.observe(self._on_pick, names="value")
        self.widget = w.VBox([self.list, w.HBox([self.picker, self.buttons]), self.output])
        self.widget.add_class("mnb-failure-panel")
        self._shown: tuple[FailureRecord, ...] = ()
        self._button_ranks: tuple[int, ...] = ()

    def select(self, rank: int | None) -> None:
        """Show ``rank``'s last lines (None hides them)."""
        self.picker.value = rank

    def _on_pick(self, change: dict) -> None:
        self.refresh_output()

    def refresh_output(self) -> None:
        rank = self.picker.value
        value = "" if rank is None else output_html(rank, self._tail(rank)[-TAIL_LINES:])
        if self.output.value != value:
            self.output.value = value

    def update(self, failures: tuple[FailureRecord, ...]) -> None:
        if failures != self._shown:
            self._shown = failures
            with self.list.hold_sync():
                self.list.value = failures_html(failures)
            ranks = tuple(dict.fromkeys(f.rank for f in failures))
            if ranks != self._button_ranks:
                self._button_ranks = ranks
                self.buttons.children = [self._button(r) for r in ranks[-8:]]
        if self.picker.value is not None:
            self.refresh_output()

    def _button(self, rank: int) -> w.Button:
        button = w.Button(
            description=f"rank {rank}", button_style="danger", layout=w.Layout(width="auto")
        )
        button.on_click(lambda _: self.select(rank))
        return button

    def close(self) -> None:
        for child in self.buttons.children:
            child.close()
        for widget in (self.list, self.buttons, self.picker, self.output, self.widget):
            widget.close()
