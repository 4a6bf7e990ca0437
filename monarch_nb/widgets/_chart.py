"""The dashboard's chart: one metric of several ranks over the last minutes.

Drawn by bqplot (an ipywidgets chart library: scales, axes and the legend are
its job, the data travels as binary arrays): one ``Lines`` mark holds a line
per rank, so a redraw is one comm message whatever the number of lines.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .._controller._telemetry import RESOURCES, TelemetrySample

CHART_POINTS = 300  # the last five minutes at one heartbeat a second
MAX_LINES = 8  # more lines than this stop being readable: the highest are drawn


_library_loaded = threading.Event()
_library_missing = False
_library_lock = threading.Lock()
_library_loading = False


def load_library() -> bool | None:
    """Whether bqplot can be used: True or False once known, None while a
    background thread still imports it. Its import takes 0.3-1 s (more on a busy
    machine): on the dashboard's own thread it would stall the tiles."""
    global _library_loading
    with _library_lock:
        if not _library_loading:
            _library_loading = True
            threading.Thread(target=_import_library, name="monarch_nb bqplot", daemon=True).start()
    if not _library_loaded.is_set():
        return None
    return not _library_missing


def _import_library() -> None:
    global _library_missing
    try:
        importlib.import_module("bqplot")
    except ImportError:
        _library_missing = True
    _library_loaded.set()


def chart_ranks(latest: Mapping[int, float], limit: int = MAX_LINES) -> list[int]:
    """The ranks to draw: all of them up to ``limit``, else the ``limit`` whose
    latest value is highest (the outliers: most memory, slowest step, worst loss)."""
    if len(latest) <= limit:
        return sorted(latest)
    highest = sorted(latest, key=lambda rank: (-latest[rank], rank))[:limit]
    return sorted(highest)


class MetricChart:
    """A bqplot figure of one metric, a line per rank, time along the bottom."""

    def __init__(self) -> None:
        import bqplot as bq
        import ipywidgets as w

        self._value = value = bq.LinearScale()
        self.value_axis = bq.Axis(
            scale=value, orientation="vertical", tick_format=".3s", grid_lines="dashed"
        )
        # Two x axes: time for resources, the step for a metric logged with one
        # (a fast loop logs many steps within one heartbeat).
        self._x = {}
        for x, scale, axis in (
            ("time", bq.DateScale(), {"tick_format": "%H:%M:%S", "num_ticks": 5}),
            ("step", bq.LinearScale(), {"tick_format": "d", "label": "step"}),
        ):
            lines = bq.Lines(
                x=[],
                y=[],
                scales={"x": scale, "y": value},
                labels=[],
                display_legend=True,
                stroke_width=1.5,
            )
            self._x[x] = (lines, bq.Axis(scale=scale, grid_lines="none", **axis))
        self.lines, time_axis = self._x["time"]
        self.widget = bq.Figure(
            marks=[self.lines],
            axes=[time_axis, self.value_axis],
            legend_location="top-left",
            fig_margin={"top": 10, "bottom": 35, "left": 55, "right": 10},
            layout=w.Layout(width="100%", height="220px"),
        )
        self.widget.add_class("mnb-chart")
        self._drawn: Any = None
        self.sent = 0  # redraws sent, for tests and the benchmark

    def draw(self, metric: str, series: Mapping[int, Sequence[TelemetrySample]]) -> bool:
        """Show ``series`` (each rank's rows, oldest first); False if nothing changed.

        Along steps where every row has one, else along time. Every line gets
        the same number of points (the shortest rank's newest ones): ranks
        report at the same rate, so this drops a point or two at most."""
        import numpy as np

        ranks = [rank for rank, rows in sorted(series.items()) if len(rows) >= 2]
        length = min((len(series[rank]) for rank in ranks), default=0)
        signature = (metric, tuple((rank, series[rank][-1].time) for rank in ranks), length)
        if signature == self._drawn:
            return False
        self._drawn = signature
        rows = [series[rank][-length:] for rank in ranks]
        by_step = bool(rows) and all(row.step is not None for line in rows for row in line)
        lines, x_axis = self._x["step" if by_step else "time"]
        if by_step:
            x = np.array([[row.step for row in line] for line in rows], dtype=float)
        else:
            times = np.array([[row.time for row in line] for line in rows], dtype=float)
            x = (times * 1000).astype("datetime64[ms]")
        values = np.array([[row.value for row in line] for line in rows], dtype=float)
        with self.widget.hold_sync():
            if lines is not self.lines:
                self.lines = lines
                self.widget.marks = [lines]
                self.widget.axes = [x_axis, self.value_axis]
            self.lines.x = x.reshape(len(ranks), length)
            self.lines.y = values.reshape(len(ranks), length)
            # Resources from zero (flat memory is not a wave), in whole units or
            # with an SI prefix (27M bytes); a logged metric in its own range.
            self._value.min = 0.0 if metric in RESOURCES else None
            self.value_axis.tick_format = (
                ".3~s" if metric.endswith("_bytes") or metric.startswith("gpu_memory") else ".4~g"
            )
            self.lines.labels = [f"rank {rank}" for rank in ranks]
            self.value_axis.label = metric
        self.sent += 1
        return True

    def close(self) -> None:
        self.widget.close()
