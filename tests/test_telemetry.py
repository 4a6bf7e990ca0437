"""procs.telemetry() and monarch_nb.log_metric: resources and metrics per rank over time."""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Iterator

import pytest
from polling import read_until

from monarch_nb import MeshUsageError, TelemetrySample, log_metric, this_host
from monarch_nb._controller._telemetry import TelemetryHistory
from monarch_nb._wire._messages import ResourceSample

pytestmark = pytest.mark.timeout(240)

LOG_FIVE_STEPS = (
    "import monarch_nb\n"
    "for i in range(5):\n"
    "    monarch_nb.log_metric('loss', 1.0 / (i + 1 + rank), step=i)\n"
)


@pytest.fixture
def procs2() -> Iterator:
    with this_host().spawn_procs(per_host={"procs": 2}, name="telemetry") as procs:
        yield procs


def test_metrics_a_rank_logs_reach_the_dataframe(procs2) -> None:
    procs2.run(LOG_FIVE_STEPS, timeout=60)
    frame = read_until(
        lambda: procs2.telemetry(metrics="loss"), lambda f: len(f) == 10, 60, "10 loss points"
    )
    assert list(frame.columns) == ["time", "rank", "metric", "value", "step"]
    assert str(frame["time"].dtype) == "datetime64[ns, UTC]"
    assert str(frame["step"].dtype) == "Int64"
    rank1 = frame[frame["rank"] == 1].sort_values("step")
    assert rank1["step"].tolist() == [0, 1, 2, 3, 4]
    assert rank1["value"].tolist() == pytest.approx([1 / 2, 1 / 3, 1 / 4, 1 / 5, 1 / 6])
    assert set(frame["metric"]) == {"loss"}

    records = procs2.slice(procs=0).telemetry(metrics=["loss"], records=True)
    assert len(records) == 5
    assert all(isinstance(r, TelemetrySample) and r.rank == 0 for r in records)
    assert records[0].metric == "loss"
    assert records[0].step == 0


def test_resources_come_each_heartbeat_and_show_a_busy_rank(procs2) -> None:
    procs2.run(
        "import time\nend = time.monotonic() + 4\nwhile rank == 1 and time.monotonic() < end:\n"
        "    pass\n",
        timeout=120,
    )
    rows = read_until(
        lambda: procs2.telemetry(records=True, metrics=["cpu_percent", "rss_bytes"]),
        lambda rows: sum(r.metric == "cpu_percent" and r.rank == 0 for r in rows) >= 3,
        60,
        "three CPU samples of rank 0",
    )
    cpu = {
        rank: [r.value for r in rows if r.metric == "cpu_percent" and r.rank == rank]
        for rank in (0, 1)
    }
    assert max(cpu[1]) > 20.0  # it spun for 4 s (sharing 2 cores with whatever runs)
    assert max(cpu[1]) > max(cpu[0])
    times = [r.time for r in rows if r.metric == "rss_bytes" and r.rank == 0]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert 0.3 < statistics.median(gaps) < 5.0  # about one a second (the heartbeat)
    assert all(r.value > 1 << 20 for r in rows if r.metric == "rss_bytes")
    assert all(r.step is None for r in rows)


def test_rows_stay_after_a_rank_died_and_across_restart(procs2) -> None:
    procs2.run(LOG_FIVE_STEPS, timeout=60)
    read_until(
        lambda: procs2.telemetry(metrics="loss", records=True),
        lambda r: len(r) == 10,
        60,
        "10 points",
    )
    procs2.kill([1])
    assert {r.rank for r in procs2.telemetry(metrics="loss", records=True)} == {0, 1}
    procs2.restart(ranks=[1])
    procs2.run("import monarch_nb\nmonarch_nb.log_metric('loss', -1.0, step=99)", timeout=60)
    rows = read_until(
        lambda: procs2.telemetry(metrics="loss", records=True),
        lambda r: len(r) == 12,
        60,
        "12 points",
    )
    assert sorted(r.step for r in rows if r.rank == 1) == [0, 1, 2, 3, 4, 99]


def test_log_metric_says_what_is_wrong(procs2) -> None:
    with pytest.raises(MeshUsageError, match=r"log_metric\('loss'\) runs on a rank"):
        log_metric("loss", 1.0)
    with pytest.raises(Exception, match="a str is not a number"):
        procs2.run("import monarch_nb\nmonarch_nb.log_metric('loss', 'high')", timeout=60)
    with pytest.raises(Exception, match="step is an int or None"):
        procs2.run("import monarch_nb\nmonarch_nb.log_metric('loss', 1, step=1.5)", timeout=60)
    with pytest.raises(Exception, match="give a non-empty string"):
        procs2.run("import monarch_nb\nmonarch_nb.log_metric('', 1)", timeout=60)
    with pytest.raises(ValueError, match=r"telemetry\(minutes=-1\)"):
        procs2.telemetry(minutes=-1)


def test_the_window_drops_old_rows_and_its_setting_is_checked(monkeypatch) -> None:
    history = TelemetryHistory(minutes=1.0)
    first = ResourceSample(cpu_seconds=1.0, rss_bytes=100, sampled_at=10.0)
    now = time.time()
    history.add_heartbeat(0, first, None, [(now - 120, "loss", 3.0, 1), (now, "loss", 2.0, 2)])
    second = ResourceSample(cpu_seconds=1.5, rss_bytes=200, sampled_at=11.0)
    history.add_heartbeat(0, second, first)
    rows = history.samples([0], since=0)  # the point from 2 minutes ago is gone
    assert [(r.metric, r.value) for r in rows] == [
        ("loss", 2.0),
        ("rss_bytes", 100.0),
        ("rss_bytes", 200.0),
        ("cpu_percent", 50.0),
    ]

    monkeypatch.setenv("MONARCH_NB_TELEMETRY_MINUTES", "ten")
    with pytest.raises(MeshUsageError, match="MONARCH_NB_TELEMETRY_MINUTES='ten' is not a valid"):
        TelemetryHistory()


def test_recent_points_are_per_rank_and_metric() -> None:
    history = TelemetryHistory(minutes=1.0)
    now = time.time()
    sample = ResourceSample(cpu_seconds=1.0, rss_bytes=100, sampled_at=10.0)
    history.add_heartbeat(0, sample, None, [(now - 2, "loss", 3.0, 1), (now - 1, "loss", 2.0, 2)])
    history.add_heartbeat(1, sample, None, [(now - 1, "accuracy", 0.5, 1)])
    assert [(r.value, r.step) for r in history.recent(0, "loss", 5)] == [(3.0, 1), (2.0, 2)]
    assert [r.value for r in history.recent(0, "loss", 1)] == [2.0]
    assert history.recent(0, "accuracy", 5) == []  # another rank's metric
    assert history.recent(1, "loss", 5) == []
    assert history.recent(2, "loss", 5) == []  # a rank never heard from
    assert [r.value for r in history.recent(1, "rss_bytes", 5)] == [100.0]


def test_without_pandas_the_error_says_what_to_do(procs2, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(ImportError, match=r"pip install pandas.*records=True"):
        procs2.telemetry()
    assert isinstance(procs2.telemetry(records=True), list)


def test_series_are_each_ranks_newest_points_and_metrics_are_listed(procs2) -> None:
    procs2.run(LOG_FIVE_STEPS, timeout=60)
    series = read_until(
        lambda: procs2.telemetry_series("loss", points=3),
        lambda s: all(len(rows) == 3 for rows in s.values()),
        60,
        "three loss points of each rank",
    )
    assert sorted(series) == [0, 1]
    assert [r.step for r in series[1]] == [2, 3, 4]  # the newest three, oldest first
    assert [r.value for r in series[1]] == pytest.approx([1 / 4, 1 / 5, 1 / 6])
    assert list(procs2.slice(procs=1).telemetry_series("loss", 2)) == [1]
    assert procs2.telemetry_series("loss", 2, ranks=[0])[0][-1].step == 4
    names = procs2.telemetry_metrics()
    assert names.index("rss_bytes") < names.index("loss")  # resources first
    with pytest.raises(ValueError, match=r"\[7\] not in this mesh \(its ranks: 0-1\)"):
        procs2.telemetry_series("loss", ranks=[0, 7])
    with pytest.raises(ValueError, match=r"telemetry_series\(points=0\)"):
        procs2.telemetry_series("loss", points=0)
