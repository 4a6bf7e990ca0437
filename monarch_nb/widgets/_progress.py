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
