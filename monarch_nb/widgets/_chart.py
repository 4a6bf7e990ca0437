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


def value_range(metric: str, values: Any) -> tuple[float, float]:
    """The value axis for ``metric``: resources from zero (flat memory is not a
    wave; CPU up to at least 100 %), a logged metric around its own values with a
    twentieth of their range to spare (a flat line sits mid-axis)."""
    import numpy as np

    finite = values[np.isfinite(values)] if values.size else values
    if not finite.size:
        return 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    if metric in RESOURCES:
        top = max(high, 100.0 if metric in ("cpu_percent", "gpu_utilization") else 0.0)
        return 0.0, (top * 1.05) or 1.0
    spare = (high - low) / 20 or abs(high) / 20 or 1.0
    return low - spare, high + spare


class MetricChart:
    """A bqplot figure of one metric, a line per rank, time along the bottom."""

    def __init__(self) -> None:
        import bqplot as bq
        import ipywidgets as w

        self._value = value = bq.LinearScale()
        # The metric's name sits left of the tick labels ("27.3M" is the widest),
        # inside the figure's margin: none of it is cut off.
        self.value_axis = bq.Axis(
            scale=value,
            orientation="vertical",
            tick_format=".3s",
            grid_lines="dashed",
            label_offset="48px",
        )
        # Two x axes: time for resources, the step for a metric logged with one
        # (a fast loop logs many steps within one heartbeat).
        self._x = {}
        for x, scale, axis in (
            ("time", bq.DateScale(), {"tick_format": "%H:%M:%S", "num_ticks": 5}),
            (
                "step",
                bq.LinearScale(),
                {"tick_format": "d", "label": "step", "label_offset": "28px"},
            ),
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
            # Room on the right for half of the last time label ("08:45:11").
            fig_margin={"top": 10, "bottom": 40, "left": 64, "right": 36},
            layout=w.Layout(width="100%", height="220px"),
        )
        self.widget.add_class("mnb-chart")
        self._drawn: Any = None
        self.sent = 0  # redraws sent, for tests and the benchmark

    def draw(self, metric: str, series: Mapping[int, Sequence[TelemetrySample]]) -> bool:
        """Show ``series`` (each rank's rows, oldest first); False if nothing changed.

        A metric logged with a step (``log_metric(name, v, step=i)``) is drawn
        along its steps, each rank's own (lines of different lengths end where
        their rank got to); anything else along time, every line with the same
        number of points (the shortest rank's newest ones: ranks report at the
        same rate, so this drops a point or two at most). The value axis is
        fitted to this metric's values at every draw: switching from CPU (0-50)
        to a loss (0.03-1.2) rescales it."""
        import numpy as np

        ranks = [rank for rank, rows in sorted(series.items()) if len(rows) >= 2]
        if not ranks:
            return False  # nothing to draw yet: the axis stays as it is
        by_step = bool(ranks) and all(row.step is not None for r in ranks for row in series[r])
        length = (max if by_step else min)((len(series[r]) for r in ranks), default=0)
        signature = (metric, tuple((r, len(series[r]), series[r][-1].time) for r in ranks))
        if signature == self._drawn:
            return False
        self._drawn = signature
        values = np.full((len(ranks), length), np.nan)
        if by_step:
            x = np.full((len(ranks), length), np.nan)
            for i, rank in enumerate(ranks):
                rows = series[rank][-length:]
                # A line shorter than the longest repeats its last point: bqplot
                # draws every column, and a repeated point draws nothing new.
                steps = [row.step for row in rows] + [rows[-1].step] * (length - len(rows))
                ys = [row.value for row in rows] + [rows[-1].value] * (length - len(rows))
                x[i], values[i] = steps, ys
        else:
            times = np.array([[row.time for row in series[r][-length:]] for r in ranks])
            x = (times.reshape(len(ranks), length) * 1000).astype("datetime64[ms]")
            for i, rank in enumerate(ranks):
                values[i] = [row.value for row in series[rank][-length:]]
        low, high = value_range(metric, values)
        with self.widget.hold_sync():
            lines, x_axis = self._x["step" if by_step else "time"]
            if lines is not self.lines:
                # The other mark keeps no data: a scale's range would follow it too.
                self.lines.x, self.lines.y, self.lines.labels = [], [], []
                self.lines = lines
                self.widget.marks = [lines]
                self.widget.axes = [x_axis, self.value_axis]
            self._value.min, self._value.max = low, high
            self.value_axis.tick_format = (
                ".3~s" if metric.endswith("_bytes") or metric.startswith("gpu_memory") else ".4~g"
            )
            self.lines.x, self.lines.y = x, values
            self.lines.labels = [f"rank {rank}" for rank in ranks]
            self.value_axis.label = metric
        self.sent += 1
        return True

    def close(self) -> None:
        self.widget.close()
