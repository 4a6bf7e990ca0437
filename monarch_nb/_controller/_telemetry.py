"""What each rank used and reported over the last minutes: ``procs.telemetry()``.

Every heartbeat (one a second per rank) adds the rank's CPU (the slope of its
CPU time over its own clock), resident memory and, where the rank uses a GPU,
GPU memory and utilisation; ``monarch_nb.log_metric`` points ride along on
the same heartbeat. Rows older than the window (``MONARCH_NB_TELEMETRY_MINUTES``,
10 by default) are dropped as new ones come, so memory stays bounded: about
4 rows a second per rank, plus what the rank logs.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, NamedTuple

from .._services import _config
from .._wire._messages import ResourceSample

# A rank that logs thousands of points a second keeps its newest ones.
MAX_ROWS_PER_RANK = 200_000


class TelemetrySample(NamedTuple):
    """One value of one metric of one rank at one time (a row of the DataFrame)."""

    time: float  # wall clock, seconds (the controller's for resources, the rank's for metrics)
    rank: int
    metric: str  # "cpu_percent", "rss_bytes", "gpu_memory_allocated", "gpu_utilization", or yours
    value: float
    step: int | None  # the step given to log_metric, None for resources


# What every heartbeat carries (GPU ones only from ranks that use a GPU).
RESOURCES = ("cpu_percent", "rss_bytes", "gpu_memory_allocated", "gpu_utilization")


def window_minutes() -> float:
    """``MONARCH_NB_TELEMETRY_MINUTES`` (``configure(telemetry_minutes=30)``), at
    least a few seconds."""
    return max(_config.get("telemetry_minutes"), 0.1)


class TelemetryHistory:
    """Per-rank rows within the window, oldest first (thread-safe)."""

    def __init__(self, minutes: float | None = None) -> None:
        self.minutes = window_minutes() if minutes is None else minutes
        self._lock = threading.Lock()
        self._rows: dict[int, deque[TelemetrySample]] = {}
        self._names: set[str] = set()  # every metric seen, kept as rows come and go
        # Per rank, every metric it has had a row of: recent() answers at once for
        # one it never reported (a dashboard asks for every metric of every rank).
        self._rank_names: dict[int, set[str]] = {}

    def add_heartbeat(
        self,
        rank: int,
        sample: ResourceSample,
        before: ResourceSample | None,
        metrics: Iterable[tuple[float, str, float, int | None]] = (),
    ) -> None:
        """A heartbeat of ``rank`` (I/O thread); ``before`` is its previous sample."""
        now = time.time()
        # The points logged since the last heartbeat first: they are older.
        rows = [TelemetrySample(t, rank, name, v, step) for t, name, v, step in metrics]
        rows.append(TelemetrySample(now, rank, "rss_bytes", float(sample.rss_bytes), None))
        if before is not None and sample.sampled_at - before.sampled_at > 0.05:
            used = sample.cpu_seconds - before.cpu_seconds
            cpu = 100.0 * used / (sample.sampled_at - before.sampled_at)
            rows.append(TelemetrySample(now, rank, "cpu_percent", cpu, None))
        if sample.gpu_memory_allocated is not None:
            gpu = float(sample.gpu_memory_allocated)
            rows.append(TelemetrySample(now, rank, "gpu_memory_allocated", gpu, None))
        if sample.gpu_utilization is not None:
            util = float(sample.gpu_utilization)
            rows.append(TelemetrySample(now, rank, "gpu_utilization", util, None))
        horizon = now - 60.0 * self.minutes
        with self._lock:
            kept = self._rows.get(rank)
            if kept is None:
                kept = self._rows[rank] = deque(maxlen=MAX_ROWS_PER_RANK)
            kept.extend(rows)
            names = {row.metric for row in rows}
            self._names.update(names)
            self._rank_names.setdefault(rank, set()).update(names)
            while kept and kept[0].time < horizon:
                kept.popleft()

    def samples(
        self, ranks: Iterable[int], since: float, metrics: Iterable[str] | None = None
    ) -> list[TelemetrySample]:
        """Rows of ``ranks`` at or after ``since`` (of ``metrics`` only, if given),
        in time order."""
        wanted = set(metrics) if metrics is not None else None
        with self._lock:
            rows = [
                row
                for rank in ranks
                for row in self._rows.get(rank, ())
                if row.time >= since and (wanted is None or row.metric in wanted)
            ]
        rows.sort(key=lambda row: (row.time, row.rank))
        return rows

    def recent(self, rank: int, metric: str, count: int) -> list[TelemetrySample]:
        """The last ``count`` rows of one metric of one rank, oldest first.

        Reads from the newest end, so a dashboard asking every second for a few
        points of each of 256 ranks costs a few rows per point, not the window."""
        found: list[TelemetrySample] = []
        with self._lock:
            if metric not in self._rank_names.get(rank, ()):
                return found
            for row in reversed(self._rows.get(rank, ())):
                if row.metric == metric:
                    found.append(row)
                    if len(found) >= count:
                        break
        found.reverse()
        return found

    def metric_names(self) -> list[str]:
        """Every metric name some rank has had a row of, resources first."""
        with self._lock:
            names = set(self._names)
        return [n for n in RESOURCES if n in names] + sorted(names - set(RESOURCES))


def as_dataframe(rows: list[TelemetrySample]) -> Any:
    """The rows as a pandas DataFrame: time (UTC), rank, metric, value, step."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(
            "procs.telemetry() returns a pandas DataFrame: pip install pandas "
            "(or monarch_nb[telemetry]), or call procs.telemetry(records=True) for "
            "plain TelemetrySample records"
        ) from None
    frame = pd.DataFrame(rows, columns=list(TelemetrySample._fields))
    frame["time"] = pd.to_datetime(frame["time"], unit="s", utc=True)
    frame["rank"] = frame["rank"].astype("int64")
    frame["value"] = frame["value"].astype("float64")
    frame["step"] = frame["step"].astype("Int64")  # None where a resource has no step
    return frame
