"""The dashboard's pure parts: failures, progress, throttling, text and tiles.

No kernel, no processes: snapshots are built from the core's own dataclasses.
"""

from __future__ import annotations

import dataclasses

import pytest

from monarch_nb import MeshState, MeshStatus, RankStatus
from monarch_nb._model._shape import Shape
from monarch_nb._wire._messages import ResourceSample
from monarch_nb._wire._signed import WireStats
from monarch_nb.events import (
    CallFinished,
    Heartbeat,
    Output,
    RankFailed,
    RankState,
    RankStateChanged,
)
from monarch_nb.widgets._chart import chart_ranks
from monarch_nb.widgets._model import DashboardFeed, FailureLog, Throttle, parse_progress
from monarch_nb.widgets._render import NotebookMeshStatus, render_status
from monarch_nb.widgets._sparks import spark_html, sparkline
from monarch_nb.widgets._text import failures_html, render_text, tile_html

pytestmark = pytest.mark.timeout(10)
SHAPE = Shape.from_sizes({"procs": 2})


def rank_status(rank: int, state: RankState = RankState.IDLE, **changes) -> RankStatus:
    status = RankStatus(
        rank=rank,
        point=SHAPE.point_of_rank(rank),
        host="node1",
        pid=1000 + rank,
        state=state,
        work="",
        work_seconds=0.0,
        cpu_percent=3.2,
        rss_bytes=40 * 2**20,
        gpu_memory_allocated=None,
        gpu_memory_reserved=None,
        gpu_utilization=None,
        heartbeat_age=0.4,
        returncode=None,
        failure=None,
    )
    return dataclasses.replace(status, **changes)


def mesh_status(*ranks: RankStatus, state: MeshState = MeshState.RUNNING) -> NotebookMeshStatus:
    status = MeshStatus("m", state, None, SHAPE, ranks, WireStats(), 0.0)
    return NotebookMeshStatus(status, None, True)


def killed(rank: int = 1) -> RankFailed:
    return RankFailed("m", rank, "was killed by signal SIGKILL", returncode=-9, at=3600.0)


def test_failure_log_keeps_the_newest_failures_and_counts_all() -> None:
    log = FailureLog(maxlen=2)
    for rank in range(3):
        log(killed(rank))
    log(Output("m", 0, "stdout", "not a failure"))
    assert [r.rank for r in log.records()] == [1, 2]
    assert log.total == 3
    record = log.records()[-1]
    assert (record.returncode, record.died, record.cause) == (
        -9,
        True,
        "was killed by signal SIGKILL",
    )


@pytest.mark.parametrize(
    ("line", "fraction"),
    [
        (" 40%|████      | 4/10 [00:01<00:02,  3.9it/s]", 0.4),
        ("epoch 3/4", 0.75),
        ("loading 55%", 0.55),
        ("no numbers here", None),
        ("0/0 done", None),
    ],
)
def test_progress_is_parsed_from_a_progress_bar_line(line: str, fraction: float | None) -> None:
    progress = parse_progress(line)
    assert progress.fraction == fraction
    assert progress.text == line.strip()


def test_a_very_long_progress_line_is_cut() -> None:
    assert len(parse_progress("x" * 500).text) == 80


def test_feed_keeps_the_last_progress_update_per_rank_and_drops_it_when_the_call_ends() -> None:
    feed = DashboardFeed()
    for i in range(1, 101):  # a tqdm bar: 100 updates, one entry
        feed(Output("m", 0, "stderr", f"{i}%|", end="\r"))
    urgent, dirty, progress = feed.take()
    assert (urgent, dirty) == (False, True)
    assert progress[0].fraction == 1.0
    feed(CallFinished("m", 1, "<mesh-cell-1>", (0, 1), None))
    urgent, dirty, progress = feed.take()
    assert (urgent, dirty, progress) == (True, True, {})


def test_feed_marks_state_changes_urgent_and_heartbeats_not() -> None:
    feed = DashboardFeed()
    sample = ResourceSample(cpu_seconds=1.0, rss_bytes=1)
    feed(Heartbeat("m", 0, sample, "", 0.0))
    feed(Output("m", 0, "stdout", "a plain line"))  # in the core's tail, not the feed's
    assert not feed.wake.is_set()
    assert feed.take()[:2] == (False, True)
    feed(RankStateChanged("m", 1, RankState.DEAD, "was killed by signal SIGKILL"))
    assert feed.wake.is_set()
    assert feed.take()[:2] == (True, True)
    assert not feed.wake.is_set()
    assert feed.take()[:2] == (False, False)


def test_throttle_draws_urgent_changes_at_most_every_min_interval() -> None:
    throttle = Throttle(min_interval=0.1, refresh=1.0)
    assert throttle.due(0.0, urgent=False)  # the first draw is always due
    throttle.drew(0.0)
    assert not throttle.due(0.05, urgent=True)
    assert throttle.next_wait(0.05, urgent=True) == pytest.approx(0.05)
    assert throttle.due(0.1, urgent=True)
    assert not throttle.due(0.5, urgent=False)
    assert throttle.next_wait(0.5, urgent=False) == pytest.approx(0.5)
    assert throttle.due(1.0, urgent=False)


def test_throttle_caps_redraws_at_ten_a_second_under_a_storm_of_events() -> None:
    throttle = Throttle(min_interval=0.1, refresh=1.0)
    draws = 0
    for step in range(10_000):  # an urgent event every millisecond for 10 s
        now = step / 1000
        if throttle.due(now, urgent=True):
            throttle.drew(now)
            draws += 1
    assert draws == 100


def test_text_summary_is_the_status_table_when_nothing_failed() -> None:
    status = mesh_status(rank_status(0), rank_status(1))
    assert render_text(status) == render_status([status])


def test_text_summary_lists_failures_and_progress() -> None:
    status = mesh_status(
        rank_status(0, RankState.BUSY, work="cell <mesh-cell-4>", work_seconds=2.0),
        rank_status(1, RankState.DEAD, returncode=-9, failure="was killed by signal SIGKILL"),
    )
    log = FailureLog()
    log(dataclasses.replace(killed(), label="<mesh-cell-4>"))
    text = render_text(status, log.records(), {0: parse_progress(" 40%|████  | 4/10")})
    assert "1     node1  1001  dead" in text
    assert "progress:\n  [0] 40%|████  | 4/10" in text
    assert "failures (1, newest first):\n  rank 1 · " in text
    assert text.endswith("was killed by signal SIGKILL · during %%mesh cell [4]")


def test_tiles_are_coloured_by_state_and_name_the_signal() -> None:
    dead = tile_html(
        rank_status(1, RankState.DEAD, returncode=-9, failure="was killed by signal SIGKILL")
    )
    assert 'class="mnb-tile mnb-dead"' in dead
    assert "background:var(--mnb-dead-bg,#c62828)" in dead  # a dark theme sets its own
    assert "SIGKILL" in dead
    assert "returncode -9" in dead
    idle = tile_html(rank_status(0))
    assert "mnb-idle" in idle
    assert "node1 · pid 1000" in idle
    assert "cpu 3% · rss 40 MiB" in idle


def test_an_idle_tile_does_not_change_between_heartbeats() -> None:
    # Only changed tiles are sent to the browser: small jitter must not change the text.
    first = tile_html(rank_status(0, cpu_percent=0.2, heartbeat_age=0.1))
    second = tile_html(rank_status(0, cpu_percent=0.4, heartbeat_age=0.9))
    assert first == second


def test_a_busy_tile_shows_work_elapsed_time_progress_and_gpu() -> None:
    tile = tile_html(
        rank_status(
            0,
            RankState.BUSY,
            work="cell <mesh-cell-7>",
            work_seconds=12.3,
            gpu_memory_allocated=2**30,
            gpu_memory_reserved=2 * 2**30,
            gpu_utilization=87.0,
        ),
        parse_progress("3/4"),
    )
    assert "%%mesh cell [7] · 12 s" in tile
    assert "GPU 1024 MiB/2048 MiB 87%" in tile
    assert "width:75%" in tile


def test_a_rank_without_heartbeats_for_three_intervals_is_marked_stale() -> None:
    tile = tile_html(rank_status(0, RankState.BUSY, heartbeat_age=4.0), heartbeat_s=1.0)
    assert "stale" in tile
    assert "beat 4 s ago" in tile


def test_failure_panel_html_escapes_and_folds_tracebacks() -> None:
    record = RankFailed(
        "m", 2, "ValueError: <bad>", traceback="Traceback ...\nValueError: <bad>", at=0.0
    )
    log = FailureLog()
    log(record)
    panel = failures_html(log.records())
    assert "&lt;bad&gt;" in panel
    assert "<bad>" not in panel
    assert "<details><summary>traceback</summary>" in panel
    assert "no failures" in failures_html(())


def raised(
    rank: int, cause: str = "ValueError: boom", at: float = 0.0, cell: int = 3
) -> RankFailed:
    return RankFailed(
        "m",
        rank,
        cause,
        traceback=f"Traceback ...\n{cause}",
        label=f"cell <mesh-cell-{cell}>",
        at=at,
    )


def test_identical_failures_fold_by_rank_set_newest_first() -> None:
    log = FailureLog()
    for rank in (0, 1, 3):
        log(raised(rank, at=10.0))
    log(raised(2, "KeyError: 'x'", at=11.0))
    log(killed(2))  # at 3600: the newest
    groups = log.groups()
    assert [(g.ranks, g.record.cause) for g in groups] == [
        ((2,), "was killed by signal SIGKILL"),
        ((2,), "KeyError: 'x'"),
        ((0, 1, 3), "ValueError: boom"),
    ]
    text = render_text(mesh_status(rank_status(0)), log.records())
    assert text.splitlines()[-1].startswith("  ranks 0-1,3 · ")
    assert text.splitlines()[-1].endswith(" · ValueError: boom · during %%mesh cell [3]")
    panel = failures_html(log.records())
    assert panel.count('class="mnb-failure"') == 3
    assert 'data-rank="0-1,3"' in panel
    assert panel.index("SIGKILL") < panel.index("KeyError") < panel.index("ranks 0-1,3")


def test_interrupts_are_not_failures() -> None:
    log = FailureLog()
    log(raised(0, "KeyboardInterrupt: ", at=1.0))
    assert log.records() == ()
    log(raised(1, at=2.0))
    assert [r.rank for r in log.records()] == [1]


def test_the_failure_list_is_capped_with_a_count_of_the_older_ones() -> None:
    log = FailureLog()
    for cell in range(8):
        log(raised(0, at=float(cell), cell=cell))
    panel = failures_html(log.records())
    assert panel.count('class="mnb-failure"') == 5
    assert "... and 3 more (older)" in panel
    assert "%%mesh cell [7]" in panel  # the newest are shown
    assert "%%mesh cell [0]" not in panel
    assert "max-height:16em;overflow:auto" in panel  # it scrolls, the page does not grow
    assert render_text(mesh_status(rank_status(0)), log.records()).endswith(
        "  ... and 3 more (older)"
    )


def test_every_tile_has_the_same_fixed_height() -> None:
    tiles = [
        tile_html(rank_status(0)),
        tile_html(rank_status(0, RankState.BUSY, work="cell <mesh-cell-1>"), parse_progress("1/2")),
        tile_html(rank_status(1, RankState.DEAD, returncode=-9, failure="killed " * 40)),
    ]
    heights = {tile.split("height:calc(", 1)[1].split(")", 1)[0] for tile in tiles}
    assert heights == {"8 * 1.3em + 6px"}
    assert all("overflow:hidden" in tile for tile in tiles)


def test_sparklines_draw_resources_from_zero_and_logged_metrics_in_their_range() -> None:
    assert sparkline("cpu_percent", [0.4, 0.6, 0.5]) == "▁▁▁"  # idle: low, and stable
    assert sparkline("cpu_percent", [0.0, 50.0, 100.0])[-1] == "█"
    assert sparkline("rss_bytes", [40e6, 40.1e6]) == "██"  # flat memory is not a wave
    assert sparkline("loss", [2.0, 1.0, 0.5]) == "█▃▁"  # a loss: its own range
    assert sparkline("loss", [1.0]) == ""  # nothing to draw from one point
    row = spark_html("my <metric>", [1.0, 2.0])
    assert 'data-metric="my &lt;metric&gt;"' in row
    assert row.endswith(">my &lt;metr ▁█</span>")  # the name is escaped and cut to 8
    assert 'class="mnb-spark"' in tile_html(rank_status(0), spark=spark_html("loss", [1, 2]))


def test_the_chart_draws_every_rank_up_to_its_limit_then_the_highest() -> None:
    assert chart_ranks({2: 1.0, 0: 5.0, 1: 3.0}) == [0, 1, 2]
    latest = {rank: float(rank % 5) for rank in range(20)}  # 4 at ranks 4, 9, 14, 19
    assert chart_ranks(latest, limit=6) == [3, 4, 8, 9, 14, 19]
