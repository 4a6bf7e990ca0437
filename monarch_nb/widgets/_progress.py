"""A rank's progress bar (tqdm, or any ``\\r`` line) as a Jupyter progress widget.

The notebook's output router shows a rank's bar as one display updated in
place; where widgets render, that display carries this widget too, and each
update moves the bar (a comm message) instead of redrawing the output.
"""

from __future__ import annotations

import html

import ipywidgets as w

from ._model import parse_progress


class RankProgress:
    """``[1] ███████░░░ 70%|... 7/10``: a label, a bar, and the bar's own text."""

    def __init__(self, text: str) -> None:
        self.bar = w.FloatProgress(min=0.0, max=1.0, layout=w.Layout(width="30%"))
        self.text = w.HTML()
        self.widget = w.HBox([self.bar, self.text])
        self.widget.add_class("mnb-progress")
        self.set(text)

    def set(self, text: str) -> None:
        """Show ``text`` (``[1]  40%|████  | 4/10``): the fraction it names moves the bar."""
        progress = parse_progress(text)
        with self.widget.hold_sync():
            if progress.fraction is not None:
                self.bar.value = progress.fraction
            self.text.value = f"<code>{html.escape(text)}</code>"

    def bundle(self, text: str) -> dict[str, object]:
        """The display data: the widget, and ``text`` where widgets do not render."""
        data = dict(self.widget._repr_mimebundle_() or {})
        data["text/plain"] = text
        return data


class ProgressGroup:
    """The progress bars of one cell, in rank order (a rank's later bars after its
    earlier ones)."""

    def __init__(self) -> None:
        self.box = w.VBox([])
        self.box.add_class("mnb-progress-group")
        self._bars: dict[tuple[int, str], RankProgress] = {}
        self._texts: dict[tuple[int, str], str] = {}
        self._order: dict[tuple[int, str], int] = {}

    def set(self, key: tuple[int, str], text: str) -> None:
        """Bar ``key`` (rank, bar id) shows ``text``; a new key adds a bar in rank order."""
        self._texts[key] = text
        bar = self._bars.get(key)
        if bar is not None:
            bar.set(text)
            return
        self._bars[key] = RankProgress(text)
        self._order[key] = len(self._order)
        self.box.children = [self._bars[k].widget for k in self._sorted()]

    def _sorted(self) -> list[tuple[int, str]]:
        return sorted(self._bars, key=lambda k: (k[0], self._order[k]))

    def bundle(self) -> dict[str, object]:
        """The display data: the widget, and every bar's text in rank order."""
        data = dict(self.box._repr_mimebundle_() or {})
        data["text/plain"] = "\n".join(self._texts[k] for k in self._sorted())
        return data
