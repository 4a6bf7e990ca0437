"""procs.timeline() / %mesh timeline: who ran which call when, per rank, and who was slow."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kernel_utils import Kernel
from polling import read_until

from monarch_nb import MeshFailure, this_host
from monarch_nb._controller._timeline import TimelineRecorder

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def procs3() -> Iterator:
    with this_host().spawn_procs(per_host={"procs": 3}, name="timeline") as procs:
        yield procs


def test_a_slow_rank_is_the_straggler_of_its_cell(procs3) -> None:
    procs3.run("import time\ntime.sleep(2.0 if rank == 2 else 0.05)", timeout=120)
    timeline = procs3.timeline()
    spans = sorted(timeline.spans, key=lambda s: s.rank)
    assert [(s.rank, s.outcome) for s in spans] == [(0, "ok"), (1, "ok"), (2, "ok")]
    assert len({s.call_id for s in spans}) == 1
    assert "<mesh-cell-" in spans[0].label
    assert spans[2].seconds >= 2.0 > spans[0].seconds
    assert spans[0].start == spans[2].start
    assert spans[0].end < spans[2].end

    [straggler] = timeline.stragglers()
    assert (straggler.rank, straggler.call_id) == (2, spans[2].call_id)
    assert straggler.seconds > 1.5 * straggler.median
    text = str(timeline)
    assert "rank   2 |" in text
    assert "straggler: rank 2 took" in text
    html = timeline._repr_html_()
    assert html.startswith("<svg")
    assert html.count('<rect class="span ') == 3
    assert 'class="span ok straggler" data-rank="2"' in html


def test_errors_running_calls_and_deaths_are_marked(procs3) -> None:
    with pytest.raises(Exception, match="division by zero"):
        procs3.run("1 / (rank - 1)", timeout=60)
    [failed] = [s for s in procs3.timeline().spans if s.outcome == "error"]
    assert failed.rank == 1
    assert failed.detail == "ZeroDivisionError: division by zero"

    pending = procs3.exec("import time\nif rank == 0:\n    time.sleep(600)")
    spans = read_until(
        lambda: procs3.timeline().spans,
        lambda spans: sum(s.outcome == "ok" for s in spans) >= 4,
        60,
        "ranks 1-2 to finish the cell rank 0 still runs",
    )
    running = [s for s in spans if s.outcome == "running"]
    assert [s.rank for s in running] == [0]
    assert running[0].end is None
    assert "rank   0 |" in str(procs3.timeline())

    def outcome_of_rank_0() -> str:
        spans = procs3.timeline().spans
        [span] = [s for s in spans if s.call_id == running[0].call_id and s.rank == 0]
        return span.outcome

    # Whoever the failure wakes finds the timeline already marked (a done-callback
    # runs as the future completes, before any waiter can look).
    seen_on_completion: list[str] = []
    pending.add_done_callback(lambda _: seen_on_completion.append(outcome_of_rank_0()))
    procs3.kill([0])
    with pytest.raises(MeshFailure):
        pending.get(timeout=60)
    assert outcome_of_rank_0() == "died"
    assert seen_on_completion == ["died"]
    [died] = [s for s in procs3.timeline().spans if s.call_id == running[0].call_id and s.rank == 0]
    assert died.end is not None
    assert "rank 0" in died.detail


def test_the_window_and_the_view_choose_the_spans(procs3) -> None:
    procs3.run("rank", timeout=60)
    assert {s.rank for s in procs3.slice(procs=1).timeline().spans} == {1}
    assert procs3.timeline(minutes=1e-9).spans == []
    assert str(procs3.timeline(minutes=1e-9)) == "no calls on ranks 0-2 in this window"
    with pytest.raises(ValueError, match=r"timeline\(minutes=0\)"):
        procs3.timeline(minutes=0)


def test_the_recorder_keeps_the_newest_calls() -> None:
    recorder = TimelineRecorder(max_calls=100, max_entries=10)
    for call_id in range(6):
        recorder.began(call_id, f"call {call_id}", [0, 1, 2])
        recorder.answered(call_id, 0, None)
        recorder.ended(call_id, "KeyboardInterrupt: stopped")
    spans = recorder.timeline([0, 1, 2], since=0).spans
    assert sorted({s.call_id for s in spans}) == [3, 4, 5]  # 9 entries kept, not 12
    assert {s.outcome for s in spans if s.rank == 0} == {"ok"}
    assert {s.outcome for s in spans if s.rank != 0} == {"interrupted"}

    by_calls = TimelineRecorder(max_calls=2)
    for call_id in range(5):
        by_calls.began(call_id, f"call {call_id}", [0])
    assert sorted({s.call_id for s in by_calls.timeline([0], since=0).spans}) == [3, 4]


def test_the_recorder_holds_a_bounded_log() -> None:
    """What is recorded is a log of bounded length: a call whose start fell out
    of it is gone, with whatever came for it later; memory stays flat."""
    recorder = TimelineRecorder(max_calls=3, max_entries=10)
    assert recorder.max_events == 16
    for call_id in range(100):
        recorder.began(call_id, f"call {call_id}", [0])
        recorder.answered_last(call_id, 0)
    recorder.answered(10, 0, "ValueError: late")  # a call long gone: nothing
    assert len(recorder._log) == 16
    spans = recorder.timeline([0], since=0).spans
    assert [(s.call_id, s.outcome) for s in spans] == [(97, "ok"), (98, "ok"), (99, "ok")]


def test_the_reply_that_ends_a_call_marks_it_once() -> None:
    """``answered_last`` is ``answered`` then ``ended`` with no error: the rank is
    ok, the call is over, and a later end or answer changes nothing."""
    recorder = TimelineRecorder()
    recorder.began(1, "A.f", [0, 1])
    recorder.answered(1, 0, "ValueError: no")
    recorder.answered_last(1, 1)
    recorder.ended(1, "KeyboardInterrupt: too late")
    recorder.answered_last(1, 0)
    recorder.began(2, "A.g", [0])
    recorder.ended(2, "CallCancelled: A.g was cancelled")
    recorder.answered_last(2, 0)  # its reply, after the cancel
    spans = {(s.call_id, s.rank): s.outcome for s in recorder.timeline([0, 1], since=0).spans}
    assert spans == {(1, 0): "error", (1, 1): "ok", (2, 0): "cancelled"}


def test_the_timeline_magic_in_a_kernel() -> None:
    with Kernel() as kernel:
        kernel.ok("%load_ext monarch_nb")
        kernel.ok("%mesh start --procs 2 --no-dashboard")
        kernel.ok("%%mesh\nimport time\ntime.sleep(1.5 if rank == 1 else 0.01)")
        [shown] = kernel.ok("%mesh timeline --ranks 0-1").displays()
        assert shown["data"]["text/html"].startswith("<svg")
        assert "straggler: rank 1 took" in shown["data"]["text/plain"]
        bad = kernel.execute("%mesh timeline --minutes -1")
        assert "give a positive number of minutes" in bad.text()
        kernel.ok("%mesh stop")
