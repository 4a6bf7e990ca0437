"""A sparkline per tile: one metric's last values as a row of block characters.

The `sparklines` package draws them (a character a value, eight heights), so
a tile stays one HTML string: the row of 16 tiles it sits in is still one
comm message, and an idle rank's line is the same string from one refresh to
the next (nothing is sent). Without the package, tiles show no sparkline.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from .._controller._telemetry import RESOURCES

SPARK_POINTS = 16
SPARK_POINTS_COMPACT = 11
# Resources are drawn from zero, so a flat 40 MB does not look like a wave;
# CPU up to at least 100 %, so an idle rank reads low. Logged metrics (a loss)
# use their own range: their shape is what matters.
_PERCENT = ("cpu_percent", "gpu_utilization")
LABELS = {
    "cpu_percent": "cpu",
    "rss_bytes": "rss",
    "gpu_memory_allocated": "gpu",
    "gpu_utilization": "gpu%",
}


def label(metric: str) -> str:
    """The metric's short name on a tile."""
    return LABELS.get(metric, metric[:8])


def sparkline(metric: str, values: Sequence[float]) -> str:
    """``values`` (oldest first) as block characters, or "" where there is
    nothing to draw (fewer than two values, or no `sparklines` package)."""
    if len(values) < 2:
        return ""
    try:
        from sparklines import sparklines
    except ImportError:
        return ""
    if metric in RESOURCES:
        top = max(max(values), 100.0 if metric in _PERCENT else 0.0)
        if top <= 0:
            return ""
        return sparklines(list(values), minimum=0.0, maximum=top)[0]
    return sparklines(list(values))[0]


def spark_html(metric: str, values: Sequence[float]) -> str:
    """The tile's sparkline row: the metric's short name, then its line."""
    line = sparkline(metric, values)
    if not line:
        return ""
    title = html.escape(f"{metric}: the last {len(values)} values, oldest first")
    return (
        f'<span class="mnb-spark" data-metric="{html.escape(metric)}" title="{title}">'
        f"{html.escape(label(metric))} {line}</span>"
    )
